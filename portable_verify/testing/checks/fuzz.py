"""Property-based fuzzing: hypothesis draws whole calls, in every form a caller may send.

Why: the exact checks cover the decision rules on well-formed inputs; adversarial callers found
the bugs elsewhere (temperatures that overflow, gradients, aliasing, layouts, garbage under
``validate=False``). Hypothesis draws a random case (:mod:`..cases.random_cases`) and then the
form it is sent in: padded or ragged, torch or numpy, float32/float16/bfloat16, int64/int32/
int16/uint8 ids, contiguous, strided, transposed, stride-0 or negative-stride (numpy) arrays,
``requires_grad``, huge logits, tiny/huge/sub-normal temperatures, and broken inputs.

``fuzz.properties`` (validation on), for every drawn call:

* it returns the reference's tokens (``numpy`` on the plain padded form; near-boundary rows
  excused as in the exact checks), or both raise ``ValueError``/``TypeError`` naming an argument;
* no input is written, and no output shares memory with an input;
* every emitted token has positive target probability (a finite logit, a positive probability).

``fuzz.unvalidated`` (``validate=False``) sends garbage in a child process
(:mod:`portable_verify.testing.isolation`): each call may raise, but must not kill the process
or hang; a result keeps the shapes, ``0 <= num_accepted <= K`` and ids in ``[0, V)``; inputs
stay unwritten; and fixed valid probe calls give the same answers after every fifth garbage call
and at the end.

``fuzz.ragged_extremes`` sends the ragged layouts adversarial callers used to crash the
process: counts and offsets far beyond N, int64-extreme and overflowing offsets,
counts whose sum wraps to N, a huge ``max_num_draft_tokens``; as torch tensors, numpy arrays and
int32 tensors, at every validation level, in child processes with a capped address space (an
allocation meant for terabytes fails there instead of swapping the machine). Validated levels
must raise ``ValueError`` naming the argument; ``validate=False`` must not crash or hang
(probed only where the lie does not ask for real work: 10**7 positions would take minutes).

Runs are seeded (``FUZZ_SEED``) with bounded example counts (``examples``), so a failure
reproduces; the failing case is printed in full.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

import portable_verify as pv
from portable_verify.core import methods
from portable_verify.dispatch import torch_device
from portable_verify.testing.cases.call_forms import (
    BROKEN,
    EXTREMES,
    FLOATS,
    GARBAGE,
    IDS,
    STRIDES,
    FuzzCase,
    caller_form,
    garbage_call,
    reference_call,
)
from portable_verify.testing.cases.random_cases import CaseSpec, build_case
from portable_verify.testing.checks.near_boundary import near_boundary_rows
from portable_verify.testing.checks.reference_comparison import REFERENCE, check_shapes, host
from portable_verify.testing.isolation import run_isolated
from portable_verify.testing.kit import CheckResult, check, summarize

FUZZ_SEED = 20261201
EXAMPLES = {"full": 500, "quick": 100, "slow_full": 80, "slow_quick": 30}
"""Examples per check: fast backends (full/quick) and slow ones such as the interpreter."""
EXAMPLES_ENV = "PORTABLE_VERIFY_FUZZ_EXAMPLES"
CHILD_TIMEOUT_S = 1200.0
PROBE_EVERY = 5
"""Probe calls after every 5th garbage call (a poisoned backend stays poisoned) and at the end."""

ARGUMENTS = (
    "draft_token_ids", "target_logits", "target_probs", "draft_probs", "num_draft_tokens",
    "cu_num_draft_tokens", "max_num_draft_tokens", "temperature", "seed", "seed_offset",
    "uniforms", "typical_eps", "typical_alpha", "method", "backend",
)


def examples(backend: str, quick: bool) -> int:
    """How many examples each fuzz check draws on ``backend`` (env override for long runs)."""
    value = os.environ.get(EXAMPLES_ENV, "").strip()
    if value:
        return max(1, int(value))
    slow = _slow(backend)
    return EXAMPLES[("slow_" if slow else "") + ("quick" if quick else "full")]


def _slow(backend: str) -> bool:
    traits = getattr(pv.get_backend(backend), "traits", None)
    return traits is not None and not traits.statistical_sizes


def _methods(backend: str) -> list[str]:
    """The table's chain methods ``backend`` implements (greedy and ``auto`` included)."""
    traits = pv.get_backend(backend).traits
    return [m for m in methods.names(methods.CHAIN)
            if methods.TABLE[m].rule is None or traits.implements(methods.CHAIN,
                                                                  methods.TABLE[m].rule)]


def _strategy(backend: str, garbage: bool) -> Any:
    from hypothesis import strategies as st

    small = _slow(backend)
    host_inputs = torch_device(backend).type == "cpu"  # numpy arrays live there
    spec = st.builds(
        CaseSpec,
        batch=st.integers(0, 3 if small else 5),
        positions=st.integers(0, 3 if small else 4),
        vocab=st.integers(1, 8 if small else 40),
        seed=st.integers(0, 2**31 - 1),
        target=st.sampled_from(["logits", "probs"]),
        ties=st.booleans(),
        draft_probs=st.booleans(),
        temperature=st.sampled_from(["none", "scalar", "vector", "zero"]),
        ragged=st.booleans(),
        coarse_uniforms=st.booleans(),
    )
    return st.builds(
        FuzzCase,
        spec=spec,
        method=st.sampled_from(_methods(backend)),
        ragged=st.booleans(),
        numpy=st.booleans() if host_inputs else st.just(False),
        float_dtype=st.sampled_from(FLOATS),
        id_dtype=st.sampled_from(IDS),
        stride=st.sampled_from(STRIDES),
        requires_grad=st.booleans(),
        extreme=st.sampled_from(EXTREMES),
        broken=st.just("none") if garbage else st.sampled_from(BROKEN),
        garbage=st.sampled_from(GARBAGE) if garbage else st.just("none"),
        salt=st.integers(0, 2**16),
    )


def _run_hypothesis(backend: str, quick: bool, garbage: bool, body: Any) -> int:
    """Run ``body(case)`` on ``examples()`` seeded draws; returns how many ran."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    ran = [0]

    @hypothesis_seed(FUZZ_SEED + (1 if garbage else 0))
    @settings(max_examples=examples(backend, quick), deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(_strategy(backend, garbage))
    def draw(case: FuzzCase) -> None:
        ran[0] += 1
        body(case)

    draw()
    return ran[0]


# --- properties ----------------------------------------------------------------------------


def _snapshot(kwargs: dict[str, Any]) -> dict[str, bytes]:
    out = {}
    for key, val in kwargs.items():
        if isinstance(val, torch.Tensor):
            dense = torch.empty_like(val, memory_format=torch.contiguous_format)
            out[key] = dense.copy_(val.detach()).view(torch.uint8).cpu().numpy().tobytes() \
                if val.numel() else b""
        elif isinstance(val, np.ndarray):
            out[key] = np.ascontiguousarray(val).tobytes()
    return out


def _shares(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.shares_memory(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
            return False
        sa, sb = a.untyped_storage(), b.untyped_storage()
        return sa.data_ptr() < sb.data_ptr() + sb.nbytes() and \
            sb.data_ptr() < sa.data_ptr() + sa.nbytes()
    return False


def aliasing(result: pv.VerifyResult, kwargs: dict[str, Any]) -> list[str]:
    """Outputs that share memory with an input."""
    return [f"{out_name} shares memory with {key}"
            for out_name in ("token_ids", "num_accepted", "num_emitted", "num_draft_tokens")
            for key, val in kwargs.items() if _shares(getattr(result, out_name), val)]


def zero_probability_tokens(result: pv.VerifyResult, kwargs: dict[str, Any]) -> list[str]:
    """Emitted tokens the target gives probability 0 (a -inf logit, a 0 probability).

    Takes the padded reference call; for sampled rows and greedy rows alike the answer is exact
    (a finite logit has positive probability at any finite T > 0).
    """
    is_logits = "target_logits" in kwargs
    target = kwargs["target_logits" if is_logits else "target_probs"]
    target = host(target.float() if isinstance(target, torch.Tensor) else target).astype(float)
    tokens, accepted = host(result.token_ids), host(result.num_accepted)
    counts = kwargs.get("num_draft_tokens")
    k = tokens.shape[1] - 1
    found = []
    for i, a in enumerate(accepted):
        n = k if counts is None else int(host(counts)[i])
        for j in range(int(a) + 1):
            t = int(tokens[i, j])
            value = target[i, min(j, n), t]
            if (np.isneginf(value) if is_logits else value <= 0):
                found.append(f"row {i} position {j}: token {t} has target probability 0")
    return found


def names_an_argument(exc: Exception) -> bool:
    return isinstance(exc, (ValueError, TypeError)) and any(a in str(exc) for a in ARGUMENTS)


def check_validated_call(backend: str, case: FuzzCase) -> list[str]:
    """Every property of a validated call (the list of what broke)."""
    ref_kwargs = reference_call(case)
    try:
        want = pv.verify(**ref_kwargs, method=case.method, backend=REFERENCE)
    except Exception as exc:  # any exception is a verdict here
        want = exc
    call = caller_form(case, ref_kwargs, torch_device(backend))
    before = _snapshot(call)
    fn = pv.verify_ragged if case.ragged else pv.verify
    try:
        got = fn(**call, method=case.method, backend=backend)
    except Exception as exc:
        got = exc
    problems = []
    if _snapshot(call) != before:
        problems.append("an input was written")
    if isinstance(want, Exception) and not isinstance(got, Exception):
        # validate=True reads only what the decision reads (docs/semantics.md, Validation
        # levels); the reference scans every row, so the backend must refuse at "full".
        try:
            fn(**call, method=case.method, backend=backend, validate="full")
        except Exception as exc:
            got = exc
    if isinstance(got, Exception) or isinstance(want, Exception):
        for who, outcome in (("backend", got), ("reference", want)):
            if isinstance(outcome, Exception) and not names_an_argument(outcome):
                problems.append(f"{who} raised {type(outcome).__name__}: {outcome}")
        if isinstance(got, Exception) != isinstance(want, Exception):
            problems.append(f"backend {'raised' if isinstance(got, Exception) else 'returned'},"
                            f" reference {'raised' if isinstance(want, Exception) else 'returned'}"
                            f": {got if isinstance(got, Exception) else want}")
        return problems
    b, k = ref_kwargs["draft_token_ids"].shape
    v = ref_kwargs.get("target_logits", ref_kwargs.get("target_probs")).shape[-1]
    shape_problem = check_shapes(got, b, k, v)
    if shape_problem:
        return [*problems, shape_problem]
    problems += aliasing(got, call)
    problems += zero_probability_tokens(got, ref_kwargs)
    bad = (host(want.token_ids) != host(got.token_ids)).any(1)
    if bad.any() and "uniforms" in ref_kwargs:
        bad &= ~near_boundary_rows(ref_kwargs,
                                   methods.TABLE[case.method].rule or case.method)
    for i in np.flatnonzero(bad):
        problems.append(f"row {i}: reference {host(want.token_ids)[i].tolist()}, "
                        f"{backend} {host(got.token_ids)[i].tolist()}")
    return problems


@check("fuzz.properties")
def fuzz_properties(backend: str, quick: bool) -> CheckResult:
    """Hypothesis-drawn calls in every input form: reference tokens or a named error."""
    failures: list[str] = []

    def body(case: FuzzCase) -> None:
        problems = check_validated_call(backend, case)
        if problems:
            failures.append(f"{'; '.join(problems[:3])} [in {case}]")

    ran = _run_hypothesis(backend, quick, garbage=False, body=body)
    detail = summarize(failures, limit=2) or f"{ran} drawn calls, every property held"
    return CheckResult("fuzz.properties", not failures, detail,
                       {"examples": ran, "seed": FUZZ_SEED, "failures": len(failures),
                        "problems": [f[:300] for f in failures[:50]]})


# --- garbage under validate=False, in a child process --------------------------------------


def _probes(device: torch.device) -> list[tuple[str, dict[str, Any]]]:
    """Fixed valid calls whose answers must not change after any garbage call."""
    out = []
    for i, spec in enumerate([CaseSpec(2, 2, 5, 11, draft_probs=True, ragged=True),
                              CaseSpec(2, 3, 6, 12, target="probs", temperature="vector"),
                              CaseSpec(1, 1, 4, 13, ties=True)]):
        method = ("auto", "typical", "greedy")[i]  # narrower: one of each kind
        out.append((method, build_case(spec, device=device)))
    return out


def _probe_answers(backend: str) -> list[list[list[int]]]:
    return [host(pv.verify(**kw, method=m, backend=backend).token_ids).tolist()
            for m, kw in _probes(torch_device(backend))]


def garbage_child(backend: str, quick: bool) -> dict[str, Any]:
    """Runs inside the child process: every garbage call, then the probes (see module doc)."""
    baseline = _probe_answers(backend)
    failures: list[str] = []
    count = [0]
    device = torch_device(backend)

    def body(case: FuzzCase) -> None:
        kwargs = caller_form(replace(case, requires_grad=False),
                             garbage_call(case, reference_call(replace(case, broken="none"))),
                             device)
        fn = pv.verify_ragged if case.ragged else pv.verify
        target_name = "target_logits" if "target_logits" in kwargs else "target_probs"
        k = kwargs["draft_token_ids"].shape[1] if not case.ragged else kwargs.get(
            "max_num_draft_tokens", 0)
        if case.garbage == "ragged_max_k_low" and case.ragged:
            kwargs["max_num_draft_tokens"] = k = max(0, int(k) - 1)
        if case.garbage == "ragged_rows_missing" and case.ragged and len(kwargs[target_name]):
            kwargs[target_name] = kwargs[target_name][:-1]
        target = kwargs[target_name]
        before = _snapshot(kwargs)
        try:
            result = fn(**kwargs, method=case.method, validate=False, backend=backend)
        except Exception:  # validate=False may raise; it may not crash
            result = None
        if _snapshot(kwargs) != before:
            failures.append(f"an input was written [in {case}]")
        if result is not None:
            b = host(result.num_accepted).shape[0]
            problem = check_shapes(result, b, int(k), target.shape[-1])
            if problem:
                failures.append(f"{problem} [in {case}]")
        count[0] += 1
        if count[0] % PROBE_EVERY == 0 and _probe_answers(backend) != baseline:
            failures.append(f"later valid calls changed their answers [after {case}]")

    ran = _run_hypothesis(backend, quick, garbage=True, body=body)
    if _probe_answers(backend) != baseline:
        failures.append("later valid calls changed their answers by the end")
    return {"ran": ran, "failures": failures}


@check("fuzz.unvalidated")
def fuzz_unvalidated(backend: str, quick: bool) -> CheckResult:
    """Garbage with validate=False in a child process: no crash, hang, poisoning or bad ids."""
    outcome = run_isolated("portable_verify.testing.checks.fuzz:garbage_child", backend, quick,
                           timeout=CHILD_TIMEOUT_S)
    if not outcome.ok or outcome.value is None:
        return CheckResult("fuzz.unvalidated", False,
                           f"the child process died: {outcome.describe()}",
                           {"stderr_tail": outcome.stderr_tail[-500:]})
    failures = outcome.value["failures"]
    detail = summarize(failures, limit=2) or (
        f"{outcome.value['ran']} garbage calls: no crash, no hang, contract kept, no poisoning")
    return CheckResult("fuzz.unvalidated", not failures, detail,
                       {"examples": outcome.value["ran"], "seed": FUZZ_SEED + 1,
                        "failures": len(failures), "problems": [f[:300] for f in failures[:50]]})


# --- ragged layouts at the extremes, in child processes ------------------------------------


@dataclass(frozen=True)
class RaggedExtreme:
    """A ragged call whose counts or offsets lie about the layout; ``argument`` must be named."""

    name: str
    argument: str  # the argument the error must name
    layout: tuple[int, ...]  # the values of ``argument`` (counts or cu offsets)
    num_drafts: int  # N
    target_rows: int  # rows of the target (N + B for a consistent call)
    max_num_draft_tokens: int | None = None
    unvalidated: bool = True  # also probe validate=False (see RAGGED_EXTREMES)

    def forms(self) -> tuple[str, ...]:
        fits_int32 = all(-(2**31) <= x < 2**31 for x in self.layout)
        return ("torch", "numpy", "torch_int32") if fits_int32 else ("torch", "numpy")


_COUNTS, _CU = "num_draft_tokens", "cu_num_draft_tokens"
RAGGED_EXTREMES: tuple[RaggedExtreme, ...] = (
    # validate=False is not probed where the lie asks for real work: with no checks, a count of
    # 10**7 is 10**7 positions to decide (tens of seconds on torch:cpu: docs/benchmarks.md,
    # "Figures behind code comments"), which is the caller's request.
    RaggedExtreme("counts far beyond N", _COUNTS, (10**7,), 2, 3, unvalidated=False),
    RaggedExtreme("counts one beyond N", _COUNTS, (3,), 2, 3),
    RaggedExtreme("count near 2**31", _COUNTS, (2**31 - 1,), 2, 3, unvalidated=False),
    RaggedExtreme("counts summing past int64 to N", _COUNTS, (2**62,) * 4, 0, 4),
    RaggedExtreme("negative count, sum equals N", _COUNTS, (-1, 3), 2, 4),
    RaggedExtreme("offsets far beyond N", _CU, (0, 2**21), 2, 3, unvalidated=False),
    RaggedExtreme("offsets one beyond N", _CU, (0, 3), 2, 3),
    RaggedExtreme("int64-extreme overflowing offsets", _CU, (0, 2**62, -(2**63) + 5, 3), 3, 6),
    RaggedExtreme("decreasing offsets", _CU, (0, 3, 2), 2, 4),
    RaggedExtreme("offsets not starting at 0", _CU, (1, 3), 2, 3),
    RaggedExtreme("max_num_draft_tokens 2**40", "max_num_draft_tokens", (2,), 2, 3,
                  max_num_draft_tokens=2**40),
)
RAGGED_LEVELS: tuple[bool | str, ...] = (True, "full", False)
RAGGED_PROBE_BUDGET_S = 60
"""A probe still running after this long counts as a hang (each takes well under a second)."""
CHILD_ADDRESS_SPACE = 8 << 30
"""The child's address-space cap (bytes): several times what importing every backend reserves, far
below an allocation sized by a bogus count, so that allocation fails instead of exhausting RAM."""
ANY_BACKEND = "*"
RAGGED_PENDING: dict[tuple[str, str], str] = {}
"""``(case name, backend or "*") -> reason``: known failures being fixed on other branches. A
pending case that fails is reported, not failed; one whose every probe passes fails the check,
so the mark is removed as soon as the fix lands (like a strict xfail)."""


def _pending(case: str, backend: str) -> str | None:
    return RAGGED_PENDING.get((case, backend)) or RAGGED_PENDING.get((case, ANY_BACKEND))


def ragged_probes() -> list[tuple[RaggedExtreme, str, bool | str]]:
    """Every (case, array form, validation level), in a fixed order (the children index it);
    ``validate=False`` takes the torch form only (the forms differ in validation, not after)."""
    return [(case, form, level) for case in RAGGED_EXTREMES for form in case.forms()
            for level in RAGGED_LEVELS
            if level is not False or (form == "torch" and case.unvalidated)]


def _ragged_call(case: RaggedExtreme, form: str, device: torch.device | str = "cpu"
                 ) -> dict[str, Any]:
    """The probe's call; torch forms on ``device`` (the backend's), numpy on the host."""
    as_array: Any = {
        "torch": lambda x: torch.tensor(x, dtype=torch.int64, device=device),
        "torch_int32": lambda x: torch.tensor(x, dtype=torch.int32, device=device),
        "numpy": lambda x: np.array(x, dtype=np.int64),
    }[form]
    g = torch.Generator().manual_seed(len(case.name))
    logits = torch.randn(case.target_rows, 8, generator=g)
    kwargs: dict[str, Any] = {
        "draft_token_ids": as_array([1 + i % 7 for i in range(case.num_drafts)]),
        "target_logits": logits.numpy() if form == "numpy" else logits.to(device),
        "seed": 1,
    }
    layout_name = _CU if case.argument == _CU else _COUNTS
    kwargs[layout_name] = as_array(list(case.layout))
    if case.max_num_draft_tokens is not None:
        kwargs["max_num_draft_tokens"] = case.max_num_draft_tokens
    return kwargs


def _ragged_outcome(case: RaggedExtreme, level: bool | str, backend: str, form: str) -> str:
    """``""`` when the probe behaved, else what went wrong."""
    call = _ragged_call(case, form, torch_device(backend))
    try:
        signal.alarm(RAGGED_PROBE_BUDGET_S)
        try:
            result = pv.verify_ragged(**call, backend=backend, validate=level)
        finally:
            signal.alarm(0)
    except _ProbeTimeout:
        return f"still running after {RAGGED_PROBE_BUDGET_S} s (a hang)"
    except Exception as exc:
        if level is False:
            return ""  # validate=False may raise anything; it may not crash
        if isinstance(exc, ValueError) and case.argument in str(exc):
            return ""
        return f"{type(exc).__name__}: {str(exc)[:160]}"
    if level is not False:
        return "returned instead of raising"
    b = len(case.layout) - (1 if case.argument == _CU else 0)
    k = int(host(result.token_ids).shape[1]) - 1
    return check_shapes(result, b, k, 8) or ""


class _ProbeTimeout(BaseException):
    """Raised by the alarm; a BaseException so the verifier's own handlers do not catch it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _ProbeTimeout


def ragged_extremes_child(backend: str, start: int, progress: str) -> int:
    """Runs inside a child: probes ``start..``, appending ``{"i": .., "problem": ..}`` lines to
    ``progress`` (a ``{"start": i}`` line first, so a crash names its probe)."""
    import resource

    # Host backends only: a GPU runtime reserves more address space than the cap, and a bogus
    # size there fails as a device allocation instead of exhausting RAM.
    if torch_device(backend).type == "cpu":
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE, CHILD_ADDRESS_SPACE))
    signal.signal(signal.SIGALRM, _on_alarm)
    probes = ragged_probes()
    with open(progress, "a", encoding="utf-8", buffering=1) as f:
        for i in range(start, len(probes)):
            case, form, level = probes[i]
            f.write(json.dumps({"start": i}) + "\n")
            f.flush()
            os.fsync(f.fileno())
            f.write(json.dumps({"i": i, "problem": _ragged_outcome(case, level, backend, form)})
                    + "\n")
    return len(probes)


RAGGED_CHILD = "portable_verify.testing.checks.fuzz:ragged_extremes_child"


def run_ragged_extremes(backend: str, child: str = RAGGED_CHILD) -> dict[int, str]:
    """Problem (or ``""``) per probe index, restarting a fresh child after each crash;
    ``child`` is the function the children run (tests swap in one that crashes)."""
    total, problems, start = len(ragged_probes()), {}, 0
    with tempfile.TemporaryDirectory() as tmp:
        while start < total:
            progress = os.path.join(tmp, f"from_{start}.jsonl")
            outcome = run_isolated(child, backend, start, progress, timeout=CHILD_TIMEOUT_S)
            started = None
            if not os.path.exists(progress):  # died before writing anything
                open(progress, "w").close()
            with open(progress, encoding="utf-8") as f:
                for line in f:
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short by the crash
                        continue
                    if "start" in entry:
                        started = entry["start"]
                    else:
                        problems[entry["i"]] = entry["problem"]
                        started = None
            if outcome.ok:
                break
            if started is None:  # died between probes: blame the next one, or the exit
                started = max((i + 1 for i in problems if i >= start), default=start)
            if started >= total:
                problems[total - 1] = f"process crashed after the last probe: " \
                                      f"{outcome.describe()}"
            else:
                problems[started] = f"process crashed: {outcome.describe()}"
            start = started + 1
    return problems


@check("fuzz.ragged_extremes")
def fuzz_ragged_extremes(backend: str, quick: bool) -> CheckResult:
    """Lying ragged counts/offsets: a ValueError naming the argument, never a crash."""
    probes = ragged_probes()
    problems = run_ragged_extremes(backend)
    failures, pending = [], []
    failing_cases: set[str] = set()
    for i, (case, form, level) in enumerate(probes):
        problem = problems.get(i, "never ran")
        if not problem:
            continue
        failing_cases.add(case.name)
        reason = _pending(case.name, backend)
        line = f"{case.name} ({form}, validate={level!r}): {problem}"
        (pending if reason else failures).append(line + (f" [pending: {reason}]" if reason
                                                          else ""))
    fixed = [f"{name!r} now passes on {backend}: remove it from RAGGED_PENDING"
             for name, b in RAGGED_PENDING
             if b in (backend, ANY_BACKEND) and name not in failing_cases]
    bad = failures + fixed
    detail = summarize(bad, limit=3) or (
        f"{len(probes)} probes: every validated call named its argument, none crashed"
        if not pending else f"{len(probes) - len(pending)} of {len(probes)} probes held; "
        f"{len(pending)} fail as known (RAGGED_PENDING): {pending[0]}")
    return CheckResult("fuzz.ragged_extremes", not bad, detail,
                       {"probes": len(probes), "failures": failures, "fixed": fixed,
                        "pending": pending})
