"""The Triton kernels (run by Triton's interpreter on CPU tensors) agree exactly with the numpy
reference, and the GPU backends explain themselves on a machine without a GPU.

The kernels are the ones ``triton:cuda``/``triton:xpu`` launch; ``portable-verify gpu-check``
runs the same cases on a real GPU. Shapes stay small: the interpreter is slow (docs/benchmarks.md,
"Triton through its interpreter").
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch
from helpers import TEST_DEVICE

import portable_verify as pv
from portable_verify.testing.cases.random_cases import INPUT_FORMS, CaseSpec, build_case

triton = pytest.importorskip("triton")
DEVICE = TEST_DEVICE  # gpu-check sets "cuda"
BACKEND = "triton:interpreter" if DEVICE == "cpu" else f"triton:{DEVICE}"


def _spec(b: int, k: int, v: int, seed: int) -> CaseSpec:
    """Mixed greedy/sampled rows, ragged drafts, -inf logits and zero draft probabilities, with
    drafts that often equal the target's argmax (accepted prefixes of every length)."""
    return CaseSpec(b, k, v, seed, ragged=True, temperature="vector", uniforms=False)


def _check(drafts: torch.Tensor, **kw) -> pv.VerifyResult:
    """Run the reference and the kernels; assert identical outputs; return the kernels' result."""
    want = pv.verify(drafts, backend="numpy", **kw)
    moved = {key: (x.to(DEVICE) if isinstance(x, torch.Tensor) else x) for key, x in kw.items()}
    got = pv.verify(drafts.to(DEVICE), backend=BACKEND, **moved)
    assert got.token_ids.device.type == DEVICE
    assert torch.equal(want.token_ids, got.token_ids.cpu()), (want.token_ids, got.token_ids)
    assert torch.equal(want.num_accepted, got.num_accepted.cpu())
    return got


@pytest.mark.parametrize("method", ["greedy", "rejection", "typical"])
@pytest.mark.parametrize("target", INPUT_FORMS)
def test_random_cases_match_reference(method: str, target: str) -> None:
    seed = zlib.crc32(f"{method}/{target}".encode())
    accepted_lengths: set[int] = set()
    for trial, (b, k, v) in enumerate([(6, 3, 37), (5, 4, 64), (3, 2, 1000)]):
        kw = build_case(_spec(b, k, v, seed + trial).in_form(target))
        got = _check(kw.pop("draft_token_ids"), method=method,
                     seed=torch.arange(b) + 100 * trial, **kw)
        accepted_lengths.update(got.num_accepted.cpu().tolist())
    assert len(accepted_lengths) >= 2  # the cases exercise both rejections and acceptances


@pytest.mark.parametrize("method", ["rejection", "typical"])
def test_explicit_uniforms_cover_the_accept_boundary(method: str) -> None:
    g = torch.Generator().manual_seed(7)
    u = torch.rand(8, 5, generator=g).clamp(min=2**-24)
    u[0] = 1.0  # largest allowed uniform: accept iff q(x) <= p(x); draw threshold = total
    u[1] = 2**-24  # smallest: almost always accept; draw picks the first positive weight
    for target in ("logits+q", "probs"):
        kw = build_case(_spec(8, 4, 48, 7).in_form(target))
        _check(kw.pop("draft_token_ids"), method=method, uniforms=u, **kw)


def test_integer_and_none_seed_forms() -> None:
    case = build_case(CaseSpec(4, 3, 20, seed=11, uniforms=False))
    drafts, logits = case["draft_token_ids"], case["target_logits"]
    _check(drafts, target_logits=logits, seed=12345, seed_offset=3)
    if DEVICE != "cpu":
        return  # seed=None draws seeds from the device's generator, which differs from the CPU's
    torch.manual_seed(0)
    a = pv.verify(drafts.to(DEVICE), target_logits=logits.to(DEVICE), backend=BACKEND)
    torch.manual_seed(0)
    b = pv.verify(drafts, target_logits=logits, backend="numpy")
    assert torch.equal(a.token_ids.cpu(), b.token_ids)  # seed=None: torch's generator decides


def test_ties_resolve_to_the_lowest_index() -> None:
    v = 12
    logits = torch.zeros(3, 3, v)
    logits[:, :, [3, 7, 9]] = 4.0  # three-way tie for the maximum in every row
    drafts = torch.tensor([[3, 7], [7, 3], [3, 3]])
    got = _check(drafts, target_logits=logits, method="greedy")
    assert got.token_ids.cpu().tolist() == [[3, 3, -1], [3, -1, -1], [3, 3, 3]]
    # Typical: a draft below the threshold is rejected and the recovered token is the first max.
    typical = _check(torch.tensor([[0, 0], [3, 0], [1, 1]]), target_logits=logits,
                     method="typical", typical_eps=0.5, typical_alpha=1.0, seed=1)
    assert typical.token_ids.cpu()[:, 0].tolist() == [3, 3, 3]


def test_rejection_edge_rules() -> None:
    v = 6
    p = torch.tensor([0.0, 0.5, 0.25, 0.25, 0.0, 0.0])
    q_same = p.clone()
    q_zero_at_x = torch.tensor([0.5, 0.0, 0.25, 0.25, 0.0, 0.0])
    probs = p.expand(4, 2, v).clone()
    draft_q = torch.stack([q_same, q_same, q_zero_at_x, q_same]).unsqueeze(1).clone()
    drafts = torch.tensor([[0], [4], [1], [2]])
    u = torch.ones(4, 2)
    got = _check(drafts, target_probs=probs, draft_probs=draft_q, uniforms=u)
    tokens = got.token_ids.cpu()
    # p(x)=0=q(x): rejected; the residual is empty, so the draw comes from p (never 0, 4 or 5).
    assert got.num_accepted.cpu().tolist() == [0, 0, 1, 1]
    assert tokens[0, 0].item() in (1, 2, 3) and tokens[1, 0].item() in (1, 2, 3)
    # q(x)=0<p(x): accepted; p == q: accepted with u=1 (u*q <= p).
    assert tokens[2, 0].item() == 1 and tokens[3, 0].item() == 2


def test_degenerate_shapes() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 1, 9, generator=g)
    empty = torch.zeros(3, 0, dtype=torch.int64)
    for method in ("greedy", "rejection", "typical"):  # K = 0
        got = _check(empty, target_logits=logits, method=method, seed=5)
        assert got.token_ids.shape == (3, 1)
    one = torch.zeros(4, 3, 1)  # V = 1: every argmax and every draw is token 0
    got = _check(torch.zeros(4, 2, dtype=torch.int64), target_logits=one, seed=2,
                 num_draft_tokens=torch.tensor([0, 1, 2, 2]))
    assert got.token_ids.cpu().tolist() == [[0, -1, -1], [0, 0, -1], [0, 0, 0], [0, 0, 0]]
    got = _check(torch.zeros(0, 2, dtype=torch.int64), target_logits=torch.zeros(0, 3, 5),
                 method="rejection", seed=1)
    assert got.token_ids.shape == (0, 3) and got.num_accepted.shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype: torch.dtype) -> None:
    kw = build_case(_spec(5, 3, 40, seed=5).in_form("logits+q"), dtype=dtype)
    _check(kw.pop("draft_token_ids"), seed=9, **kw)


def test_ragged_layout() -> None:
    g = torch.Generator().manual_seed(9)
    counts = torch.tensor([2, 0, 3])
    v = 30
    logits = torch.randn(int(counts.sum()) + 3, v, generator=g)
    drafts = torch.randint(0, v, (int(counts.sum()),), generator=g)
    kw = dict(num_draft_tokens=counts, target_logits=logits, temperature=torch.tensor(
        [0.0, 1.0, 0.7]), seed=torch.tensor([1, 2, 3]))
    want = pv.verify_ragged(drafts, backend="numpy", **kw)
    moved = {key: x.to(DEVICE) for key, x in kw.items()}
    got = pv.verify_ragged(drafts.to(DEVICE), backend=BACKEND, **moved)
    assert torch.equal(want.token_ids, got.token_ids.cpu())


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # NaN inputs, on purpose
def test_garbage_without_validation_still_emits_valid_ids() -> None:
    logits = torch.randn(3, 3, 10)
    logits[0, 0, 4] = float("nan")
    logits[1] = float("nan")
    drafts = torch.tensor([[4, 99], [-3, 2], [1, 2]])
    got = pv.verify(drafts.to(DEVICE), target_logits=logits.to(DEVICE), seed=1,
                    backend=BACKEND, validate=False)
    tokens = got.token_ids.cpu()
    emitted = tokens[tokens != pv.PLACEHOLDER_TOKEN_ID]
    assert ((emitted >= 0) & (emitted < 10)).all()


@pytest.mark.skipif(DEVICE != "cpu", reason="interpreter isolation is checked on CPU runs")
def test_interpreter_leaves_compiled_triton_untouched() -> None:
    """The interpreter is private to the ``triton`` backend: no env var, stdlib restored."""
    from triton.runtime.jit import JITFunction

    before = os.environ.get("TRITON_INTERPRET")
    _check(torch.tensor([[1]]), target_logits=torch.randn(1, 2, 4), method="typical", seed=0)
    assert os.environ.get("TRITON_INTERPRET") == before
    import triton.language as tl

    assert isinstance(tl.max, JITFunction) and isinstance(tl.standard._sum_combine, JITFunction)
    from portable_verify.backends.triton import chain as triton_kernels

    assert isinstance(triton_kernels._decide_kernel, JITFunction)


@pytest.mark.skipif(DEVICE != "cpu", reason="describes a machine without GPUs")
def test_gpu_backends_explain_why_they_cannot_run_here() -> None:
    status = pv.backend_status()
    interp = status["triton:interpreter"]
    assert interp.available and "interpreter" in interp.reason
    if not torch.cuda.is_available():
        for name in ("triton:cuda", "torch:cuda"):
            assert not status[name].available
            assert "torch.cuda.is_available() is False" in status[name].reason
        with pytest.raises(RuntimeError, match=r"torch\.cuda\.is_available"):
            pv.verify(torch.tensor([[1]]), target_logits=torch.randn(1, 2, 4), backend="cuda")
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        assert not status["triton:xpu"].available
        assert "torch.xpu.is_available() is False" in status["triton:xpu"].reason
        assert "intel-extension-for-pytorch" in status["triton:xpu"].reason


def test_no_kernel_or_device_function_takes_more_than_14_parameters() -> None:
    """Per-call values reach the kernels as grouped arguments (one record per call), so no
    ``@triton.jit`` function of the family grows a long flat parameter list again."""
    from triton.runtime.jit import JITFunction

    from portable_verify.backends.triton import chain, tree

    counts = {f"{module.__name__}.{name}": len(value.params)
              for module in (chain, tree) for name, value in vars(module).items()
              if isinstance(value, JITFunction)}
    assert {"portable_verify.backends.triton.chain._decide_kernel",
            "portable_verify.backends.triton.tree._tree_kernel"} <= counts.keys()
    assert len(counts) >= 20, counts  # every device function is seen, not only the kernels
    assert max(counts.values()) <= 14, {k: n for k, n in counts.items() if n > 14}


@pytest.mark.parametrize(("version", "runs"), [("3.2.0", False), ("2.3.1", False),
                                               ("3.3.0", True), ("3.9.0+git1a2b", True),
                                               ("4.0.0", True)])
def test_a_triton_without_tuple_arguments_is_refused_by_name(version: str, runs: bool) -> None:
    """The kernels take tuple arguments: an older Triton is reported unavailable, with its
    version in the reason, so dispatch falls back to torch instead of failing at launch."""
    from portable_verify.backends.triton.backend import triton_too_old

    reason = triton_too_old(version)
    assert (reason is None) == runs
    if not runs:
        assert version in reason and "3.3" in reason


def test_the_interpreter_is_unavailable_on_an_old_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    from portable_verify.backends.triton import backend as triton_backend

    monkeypatch.setattr(triton, "__version__", "3.2.0")
    triton_backend._interpreter_availability.cache_clear()
    try:
        status = triton_backend._interpreter_availability()
    finally:
        triton_backend._interpreter_availability.cache_clear()
    assert not status.available and "Triton 3.2.0 is older than 3.3" in status.reason


def test_interpreter_refuses_gpu_tensors_clearly() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA tensor")
    with pytest.raises(ValueError, match="interpreter"):
        pv.verify(torch.tensor([[1]], device="cuda"),
                  target_logits=torch.randn(1, 2, 4, device="cuda"),
                  backend="triton:interpreter")


def test_gpu_without_triton_falls_back_to_torch_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Pretend CUDA is present on this CPU machine: Triton has no active driver here, so the
    ``cuda`` alias (automatic choice for CUDA tensors) must pick ``torch:cuda``, warning once."""
    from portable_verify import dispatch
    from portable_verify.backends.triton import backend as triton_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "pretend GPU")
    triton_backend._gpu_availability.cache_clear()
    dispatch._warn_once.cache_clear()
    try:
        if triton_backend._gpu_availability("cuda").available:
            pytest.skip("Triton can drive this machine's GPU; the fallback is not taken")
        with caplog.at_level("WARNING", logger="portable_verify"):
            chosen = [dispatch.select_backend(name, "cuda").qualified_name
                      for name in ("cuda", "auto", "cuda")]
    finally:
        triton_backend._gpu_availability.cache_clear()
    assert chosen == ["torch:cuda"] * 3
    warnings = [r for r in caplog.records if "skipped triton:cuda" in r.getMessage()]
    assert len(warnings) == 1


_GROUP_TYPES = {  # each grouped argument's element types, as chain.launch passes them
    ("_decide_kernel", "target"): ("*{dtype}", "i32", "*i64"),
    ("_decide_kernel", "draft"): ("*i64", "*{dtype}", "i32", "*i64"),
    ("_decide_kernel", "request"): ("*i64", "*fp32", "*fp32"),
    "stats": ("*i32", "*fp32", "*fp32", "*fp32", "*fp32", "*i32", "i32", "i32"),
    "out": ("*i32", "*i64", "*i64"),
    "bonus": ("*i64", "i32", "*i64"),
    "scalars": ("i32", "i32", "i32", "i32", "fp32", "fp32"),
    "source": ("*i32", "i32", "i32", "i32", "*i32", "i32"),
    "given": ("*i64", "i32", "i32", "*i64", "i32", "i32"),
    ("_layout_kernel", "request"): ("*i64", "*fp64", "i32", "fp32"),
    "randomness": ("*fp32", "i32", "i32", "*i64", "i32", "i64", "i64", "*i64", "i32", "i64"),
    ("_layout_kernel", "target"): ("*{dtype}", "i32"),
    "work": ("*i64", "*i64", "*i64", "*i64", "*i64", "*fp32", "*fp32", "*i32"),
    "draw": ("*fp64", "*i32", "*i32", "i32"),
}


def _signature(kernel, target_dtype: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Triton argument types as ``chain.launch`` passes them: a tuple of element types per
    grouped argument (scalars i32 except the floats and the 64-bit seed words)."""
    name = kernel.fn.__name__
    return {param.name: "constexpr" if param.is_constexpr else
            tuple(t.format(dtype=target_dtype) for t in
                  _GROUP_TYPES.get((name, param.name), _GROUP_TYPES.get(param.name)))
            for param in kernel.params}


def _layout(**kw):  # type: ignore[no-untyped-def]
    from portable_verify.backends.triton import spec

    return spec.pack(spec.LAYOUT_BITS, **{"SIZES": 0, "FLAT": 0, "COUNT_MINUS": 0,
                                          "DRAFT_SHIFT": 0, "BONUS_ROWS": 1, "ROWS_GIVEN": 0,
                                          "QROWS_GIVEN": 0, **kw})


def _sources(**kw):  # type: ignore[no-untyped-def]
    from portable_verify.backends.triton import spec

    return spec.pack(spec.SOURCE_BITS, **{"TEMP": 0, "U_SRC": 0, "OFFSETS": 0, "REQ_MAP": 0,
                                          **kw})


def _flags(**kw):  # type: ignore[no-untyped-def]
    from portable_verify.backends.triton import spec

    return spec.pack(spec.DECIDE_BITS, **{"IS_LOGITS": 1, "HAS_Q": 0, "HAS_U": 1,
                                          "HAS_GREEDY": 1, "HAS_BONUS": 0, "SPLIT": 0,
                                          "SPLIT_DRAW": 0, **kw})


_COMPILE_CASES = [
    ("cuda", 90, 32, "_layout_kernel", "bf16",
     dict(LAYOUT=_layout(SIZES=3, FLAT=1, BONUS_ROWS=0), SOURCES=_sources(TEMP=2, U_SRC=2),
          STATS=7, BLOCK=4096, KB=8, SUM_BLOCK=256)),
    ("cuda", 90, 32, "_layout_kernel", "fp32",
     dict(LAYOUT=_layout(SIZES=2, FLAT=1, COUNT_MINUS=1, DRAFT_SHIFT=1, BONUS_ROWS=0),
          SOURCES=_sources(TEMP=2, U_SRC=2, OFFSETS=2, REQ_MAP=1), STATS=3, BLOCK=4096, KB=4,
          SUM_BLOCK=256)),
    ("cuda", 90, 32, "_layout_kernel", "fp16",
     dict(LAYOUT=_layout(SIZES=1, FLAT=1), SOURCES=_sources(TEMP=1, U_SRC=3, OFFSETS=1),
          STATS=0, BLOCK=4096, KB=4, SUM_BLOCK=256)),
    ("cuda", 80, 32, "_layout_kernel", "fp32",
     dict(LAYOUT=_layout(SIZES=1, ROWS_GIVEN=1, QROWS_GIVEN=1), SOURCES=_sources(U_SRC=1),
          STATS=4, BLOCK=4096, KB=2, SUM_BLOCK=256)),
    ("cuda", 90, 32, "_layout_kernel", "fp32",
     dict(LAYOUT=_layout(SIZES=2, FLAT=1), SOURCES=_sources(TEMP=1, U_SRC=2), STATS=15,
          BLOCK=2048, KB=8, SUM_BLOCK=256)),
    ("cuda", 90, 32, "_decide_kernel", "fp32",
     dict(FLAGS=_flags(HAS_Q=1, HAS_BONUS=1), RULE=0, BLOCK=2048, KB=8, DB=2)),
    ("cuda", 90, 32, "_decide_kernel", "bf16",
     dict(FLAGS=_flags(HAS_Q=1, SPLIT=1, SPLIT_DRAW=1), RULE=0, BLOCK=2048, KB=8, DB=64)),
    ("cuda", 90, 32, "_decide_kernel", "bf16",
     dict(FLAGS=_flags(SPLIT=1), RULE=1, BLOCK=2048, KB=8, DB=2)),
    ("cuda", 80, 32, "_decide_kernel", "fp16",
     dict(FLAGS=_flags(IS_LOGITS=0), RULE=1, BLOCK=2048, KB=2, DB=2)),
    ("cuda", 90, 32, "_decide_kernel", "bf16",
     dict(FLAGS=_flags(HAS_GREEDY=0), RULE=2, BLOCK=2048, KB=8, DB=2)),
    ("hip", "gfx942", 64, "_decide_kernel", "fp32",
     dict(FLAGS=_flags(HAS_U=0), RULE=0, BLOCK=2048, KB=4, DB=2)),
]


@pytest.mark.skipif(DEVICE != "cpu", reason="the GPU run compiles for real")
@pytest.mark.parametrize("case", _COMPILE_CASES,
                         ids=lambda c: f"{c[0]}{c[1]}-{c[3]}-{c[4]}-{hash(str(c[5])) % 1000}")
def test_kernels_compile_for_gpus_without_a_gpu(case: tuple) -> None:
    """The interpreter is not the compiler: compile ahead of time (to cubin / hsaco) for real
    GPU targets, so a construct only the interpreter accepts fails here, not on a GPU."""
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from portable_verify.backends.triton import chain as triton_kernels

    backend, arch, warp, name, dtype, constexprs = case
    if {"cuda": "nvidia", "hip": "amd"}[backend] not in backends:
        pytest.skip(f"this Triton build has no {backend} compiler")
    kernel = getattr(triton_kernels, name)
    source = ASTSource(kernel, _signature(kernel, dtype), constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget(backend, arch, warp),
                              options={"num_warps": 4, "enable_fp_fusion": False})
    assert compiled.asm.get("cubin" if backend == "cuda" else "hsaco")


def test_ipex_is_optional_and_its_failure_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """IPEX installed but broken beside this torch: the XPU reason says so; nothing raises."""
    import importlib
    import importlib.util

    from portable_verify.backends.triton import backend as xpu

    real_find_spec, real_import = importlib.util.find_spec, importlib.import_module

    def find_spec(name: str, *args):  # type: ignore[no-untyped-def]
        return object() if name == xpu.IPEX_MODULE else real_find_spec(name, *args)

    def import_module(name: str, *args):  # type: ignore[no-untyped-def]
        if name == xpu.IPEX_MODULE:
            raise ImportError("built for torch 2.8")
        return real_import(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(importlib, "import_module", import_module)
    xpu.ipex_status.cache_clear()
    try:
        xpu._gpu_availability.cache_clear()
        reason = xpu.TritonBackend("xpu").availability().reason
    finally:
        xpu.ipex_status.cache_clear()
    assert "cannot be imported beside torch" in reason and "built for torch 2.8" in reason
