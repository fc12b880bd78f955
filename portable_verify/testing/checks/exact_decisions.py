"""Exact conformance: a backend must emit the reference's tokens, case for case.

Every check drives the backend through the public ``verify(..., backend=name)`` and compares
with ``backend="numpy"`` (the executable specification) on seeded random cases
(:mod:`portable_verify.testing.cases.random_cases`) that cover ties, ragged drafts, K=0, B=0, V=1,
logits and probabilities, with and without draft probabilities, and temperature vectors.
Sampled rows get explicit ``uniforms`` so results are comparable bit for bit; how a disagreement
near a rounding boundary is excused is in
:mod:`portable_verify.testing.checks.reference_comparison`.
"""

from __future__ import annotations

import numpy as np
import torch

import portable_verify as pv
from portable_verify.dispatch import torch_device
from portable_verify.testing.cases.dyadic_cases import dyadic_case
from portable_verify.testing.cases.random_cases import (
    CaseSpec,
    as_numpy,
    build_case,
    on_device,
    random_specs,
)
from portable_verify.testing.checks.near_boundary import near_boundary_rows
from portable_verify.testing.checks.reference_comparison import (
    REFERENCE,
    Tally,
    compare,
    host,
)
from portable_verify.testing.kit import CheckResult, check

CASE_SEED = 20260101
QUICK_CASES = 60
FULL_CASES = 400


def _specs(quick: bool, salt: int) -> list[CaseSpec]:
    count = QUICK_CASES if quick else FULL_CASES
    return random_specs(np.random.default_rng(CASE_SEED + salt), count)


@check("exact.greedy")
def greedy_exact(backend: str, quick: bool) -> CheckResult:
    """Greedy tokens equal the reference exactly (ties: lowest index), logits or probs."""
    tally = Tally()
    device = torch_device(backend)
    for spec in _specs(quick, 1):
        kwargs = build_case(spec, device=device)
        compare(tally, backend, spec.label, kwargs, "greedy", tolerate=False)
        kwargs["temperature"] = 0.0  # temperature 0 under any method is greedy too
        kwargs.pop("draft_probs", None)
        compare(tally, backend, spec.label + "/T=0", kwargs, "rejection", tolerate=False)
    return tally.result("exact.greedy")


@check("exact.rejection")
def rejection_exact(backend: str, quick: bool) -> CheckResult:
    """Rejection sampling with explicit uniforms equals the reference (near-ties counted)."""
    tally = Tally()
    device = torch_device(backend)
    for i, spec in enumerate(_specs(quick, 2)):
        kwargs = build_case(spec, device=device)
        got = compare(tally, backend, spec.label, kwargs, "rejection")
        # numpy arrays in: numpy arrays out, the same tokens (host backends: numpy is host data)
        if i % 4 == 0 and device.type == "cpu":
            arrays = as_numpy(kwargs)
            again = pv.verify(**arrays, method="rejection", backend=backend)
            if not isinstance(again.token_ids, np.ndarray):
                tally.failures.append(f"{spec.label}: numpy inputs gave {type(again.token_ids)}")
            elif not np.array_equal(again.token_ids, host(got.token_ids)):
                tally.failures.append(f"{spec.label}: numpy inputs gave other tokens")
    return tally.result("exact.rejection", tolerance_rtol=1e-5)


@check("exact.typical")
def typical_exact(backend: str, quick: bool) -> CheckResult:
    """Typical acceptance with explicit uniforms equals the reference (near-ties counted)."""
    tally = Tally()
    device = torch_device(backend)
    for spec in _specs(quick, 3):
        kwargs = build_case(spec, device=device)
        kwargs.pop("draft_probs", None)  # typical acceptance never reads draft probabilities
        compare(tally, backend, spec.label, kwargs, "typical")
    return tally.result("exact.typical", tolerance_rtol=1e-5)


@check("exact.large_vocab_draws")
def large_vocab_draws(backend: str, quick: bool) -> CheckResult:
    """Recovered and bonus draws at serving vocabularies equal the reference (near-ties counted).

    Small-V cases cannot see prefix-sum drift: a float32 scan over 128k entries moves ~1 draw in
    5 to a neighbour. Here every row draws once at V = 32000 (and 128256 in the full run), from
    the residual on some rows and from ``p`` on others, with softmax rows of varied sharpness.
    """
    tally = Tally()
    gen = torch.Generator().manual_seed(CASE_SEED + 9)
    vocabs = (32000,) if quick else (32000, 128256)
    b, k = (8, 2) if quick else (32, 2)
    for v in vocabs:
        scale = torch.linspace(0.5, 4.0, b).reshape(b, 1, 1)
        probs = torch.softmax(torch.randn(b, k + 1, v, generator=gen) * scale, -1)
        q = torch.softmax(torch.randn(b, k, v, generator=gen) * scale, -1)
        drafts = torch.randint(0, v, (b, k), generator=gen)
        u = torch.rand(b, k + 1, generator=gen).clamp_(min=2**-24)
        u[: b // 2, :k] = 1.0  # accept-all rows need p(x) >= q(x): force a bonus by q(x)=p(x)
        rows = torch.arange(b // 2)
        for j in range(k):
            q[rows, j] = probs[rows, j]
        kwargs = on_device({"draft_token_ids": drafts, "target_probs": probs, "draft_probs": q,
                            "uniforms": u}, torch_device(backend))
        compare(tally, backend, f"V={v}", kwargs, "rejection")
    return tally.result("exact.large_vocab_draws", tolerance_rtol=1e-5)


@check("exact.mixed_greedy_rows")
def mixed_greedy_rows(backend: str, quick: bool) -> CheckResult:
    """In a batch mixing temperature-0 and sampled rows, greedy rows equal a greedy-only call."""
    tally = Tally()
    gen = np.random.default_rng(CASE_SEED + 4)
    device = torch_device(backend)
    for i in range(10 if quick else 60):
        spec = CaseSpec(batch=int(gen.integers(2, 7)), positions=int(gen.integers(0, 4)),
                        vocab=int(gen.integers(1, 10)), seed=i, temperature="vector",
                        target="logits" if i % 2 else "probs", ties=i % 3 == 0,
                        draft_probs=i % 4 < 2, ragged=i % 5 < 3)
        kwargs = build_case(spec, device=device)
        for method in ("rejection", "typical"):  # narrower: block's: block_verification
            mixed = compare(tally, backend, spec.label, kwargs, method)
            greedy = host(kwargs["temperature"]) == 0
            if not greedy.any() or tally.failures:
                continue
            idx = torch.from_numpy(np.flatnonzero(greedy)).to(device)
            sub = {
                key: val[idx] if isinstance(val, torch.Tensor) else val
                for key, val in kwargs.items() if key not in ("temperature", "uniforms")
            }
            alone = pv.verify(**sub, method="greedy", backend=backend)
            if not np.array_equal(host(mixed.token_ids)[np.flatnonzero(greedy)],
                                  host(alone.token_ids)):
                tally.failures.append(f"{spec.label} {method}: greedy rows differ from greedy-only")
    return tally.result("exact.mixed_greedy_rows")


@check("exact.boundaries")
def exact_boundaries(backend: str, quick: bool) -> CheckResult:
    """Exact ties (u*q == p, cumsum == threshold, p == q) follow the documented rules exactly."""
    tally = Tally()
    gen = np.random.default_rng(CASE_SEED + 5)
    for i in range(20 if quick else 150):
        kwargs = dyadic_case(gen, b=8, k=int(gen.integers(0, 4)), v=int(gen.integers(1, 7)),
                             device=torch_device(backend))
        compare(tally, backend, f"dyadic#{i}", kwargs, "rejection", tolerate=False)
    return tally.result("exact.boundaries")


@check("exact.dtypes")
def dtypes(backend: str, quick: bool) -> CheckResult:
    """float16/bfloat16 inputs behave as the same values upcast to float32."""
    tally = Tally()
    failures = tally.failures
    for spec in _specs(quick, 6)[: 15 if quick else 120]:
        for dtype in (torch.float16, torch.bfloat16):
            low = build_case(spec, device=torch_device(backend), dtype=dtype)
            label = f"{spec.label}/{str(dtype)[6:]}"
            got = pv.verify(**low, method="greedy", backend=backend)
            same = pv.verify(**low, method="rejection", backend=backend)
            up = {key: val.float() if isinstance(val, torch.Tensor) and val.is_floating_point()
                  and key != "uniforms" else val for key, val in on_device(low, "cpu").items()}
            # The half call was validated; upcast half rows may miss the float32 sum tolerance.
            want = pv.verify(**up, method="greedy", backend=REFERENCE, validate=False)
            tally.cases += 1
            tally.rows += spec.batch
            if not np.array_equal(host(got.token_ids), host(want.token_ids)):
                failures.append(f"{label} greedy differs from the upcast reference")
            # Sampled rows: the backend on half inputs == the reference on upcast inputs.
            ref = pv.verify(**up, method="rejection", backend=REFERENCE, validate=False)
            bad = (host(same.token_ids) != host(ref.token_ids)).any(1)
            near = near_boundary_rows(up, "rejection")
            tally.mismatched_rows += int(bad.sum())
            tally.excused_near_boundary += int((bad & near).sum())
            if (bad & ~near).any():
                failures.append(f"{label} rejection differs from the upcast reference")
    return tally.result("exact.dtypes")
