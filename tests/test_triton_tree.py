"""The Triton tree kernel (backends/triton/tree.py) beyond the conformance kit's tree checks
(which run it on random small-V trees): rows longer than one chunk, edge rules, degenerate
shapes, compilation for real GPUs, and a small law check with a negative control.

The kernel runs in Triton's interpreter on CPU tensors (slow: sizes stay small);
``portable-verify gpu-check`` runs this file on CUDA (``PORTABLE_VERIFY_TEST_DEVICE=cuda``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import TEST_DEVICE

import portable_verify as pv
from portable_verify.testing.cases.tree_cases import random_parents

triton = pytest.importorskip("triton")
DEVICE = TEST_DEVICE
BACKEND = "triton:interpreter" if DEVICE == "cpu" else f"triton:{DEVICE}"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _check(method: str = "auto", **kw) -> pv.TreeResult:
    """The kernel's answer equals the reference's (tokens, nodes, counts); returns it."""
    want = pv.verify_tree(**kw, method=method, backend="numpy")
    moved = {k: (x.to(DEVICE) if isinstance(x, torch.Tensor) else x) for k, x in kw.items()}
    got = pv.verify_tree(**moved, method=method, backend=BACKEND)
    for name in ("token_ids", "node_ids", "num_accepted"):
        assert torch.equal(getattr(want, name), getattr(got, name).cpu()), (name, want, got)
    return got


def _wide_call(rng: np.random.Generator, b: int, n: int, v: int, mode: str) -> dict:
    """Trees whose children are often the parent row's likeliest tokens, over rows of several
    chunks (the interpreter's chunk is 1024), so acceptances and rejections both occur."""
    logits = torch.tensor(rng.normal(size=(b, n, v)) * 3, dtype=torch.float32)
    top = torch.topk(logits, 3, dim=-1).indices.numpy()
    parents = random_parents(rng, b, n)
    tokens = np.empty((b, n), dtype=np.int64)
    for i in range(n):
        tokens[:, i] = top[np.arange(b), parents[:, i].clip(0), rng.integers(0, 3, size=b)]
    tokens[:, 1::5] = rng.integers(0, v, size=tokens[:, 1::5].shape)  # unlikely children too
    call = {"node_token_ids": torch.from_numpy(tokens), "parents": torch.from_numpy(parents),
            "target_logits": logits, "children": mode,
            "temperature": torch.tensor([0.0, 0.8, 1.0, 1.3][:b]), "seed": torch.arange(b)}
    if mode != "deterministic":
        noise = torch.tensor(rng.normal(size=(b, n, v)), dtype=torch.float32)
        call["draft_probs"] = torch.softmax(logits + noise, -1)
    return call


@pytest.mark.parametrize("mode", ["deterministic", "iid", "without_replacement"])
def test_rows_of_several_chunks_match_reference(mode: str) -> None:
    rng = np.random.default_rng(["deterministic", "iid", "without_replacement"].index(mode))
    call = _wide_call(rng, 4, 7, 2500, mode)
    methods = ["rejection", "greedy"] + (["typical"] if mode == "deterministic" else [])
    accepted = set()
    for method in methods:
        accepted.update(_check(method, **call).num_accepted.cpu().tolist())
    assert len(accepted) >= 2  # both rejections and acceptances were exercised


def test_edge_rules_by_hand() -> None:
    """Root row p = (0.5, 0.3, 0.2, 0). Children: 0, a duplicate 0, -1 (no proposal), 3
    (p = 0: never accepted), 1. Deterministic: child 0 fails at u = 0.6, its duplicate then
    has r(0) = 0, -1 is skipped, 3 fails, 1 passes at u <= 0.6 (r = (0, .6, .4, 0))."""
    p = torch.tensor([0.5, 0.3, 0.2, 0.0]).expand(1, 6, 4).clone()
    tokens = torch.tensor([[0, 0, 0, -1, 3, 1]])
    parents = torch.tensor([[-1, 0, 0, 0, 0, 0]])

    def run(u_last_child: float) -> list[int]:
        u = torch.tensor([[0.6, 0.01, 1.0, 0.01, u_last_child, 0.99]])
        res = _check(node_token_ids=tokens, parents=parents, target_probs=p, uniforms=u)
        return res.token_ids[0].tolist()

    assert run(0.6) == [1, 2, -1, -1, -1, -1]  # child 5 accepted; its row draws at u = 0.99
    assert run(0.61) == [2, -1, -1, -1, -1, -1]  # all rejected: the residual's only token


def test_empty_residual_keeps_the_previous_one() -> None:
    """p = q = (0, .5, .5): child 0 has p(0) = 0 and is rejected; max(0, p - q) is empty, so
    the residual stays p and the draw at v = 0.5 is token 1 (never the rejected 0)."""
    p = torch.tensor([0.0, 0.5, 0.5]).expand(1, 2, 3).clone()
    got = _check(node_token_ids=torch.tensor([[0, 0]]), parents=torch.tensor([[-1, 0]]),
                 target_probs=p, draft_probs=p.clone(), children="iid",
                 uniforms=torch.tensor([[1.0, 0.5]]))
    assert got.token_ids[0].tolist() == [1, -1]


def test_ragged_depth_limit_and_degenerate_shapes() -> None:
    rng = np.random.default_rng(5)
    b, n, v = 4, 6, 9
    parents = torch.from_numpy(random_parents(rng, b, n))
    tokens = torch.from_numpy(rng.integers(-1, v, size=(b, n)))
    logits = torch.randn(b, n, v, generator=torch.Generator().manual_seed(5))
    for method in ("greedy", "rejection", "typical"):
        got = _check(method, node_token_ids=tokens, parents=parents, target_logits=logits,
                     num_nodes=torch.tensor([1, 3, 6, 2]), max_depth=2, seed=3)
        assert got.token_ids.shape == (b, 3)
    only_root = _check(node_token_ids=torch.zeros(3, 1, dtype=torch.int64),
                       parents=torch.full((3, 1), -1), target_logits=torch.randn(3, 1, 5),
                       seed=1)
    assert (only_root.num_accepted == 0).all()
    empty = _check(node_token_ids=torch.zeros(0, 3, dtype=torch.int64),
                   parents=torch.zeros(0, 3, dtype=torch.int64),
                   target_logits=torch.zeros(0, 3, 4), seed=1)
    assert empty.token_ids.shape == (0, 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rows(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(11)
    call = _wide_call(rng, 3, 5, 40, "iid")
    call["target_logits"] = call["target_logits"].to(dtype)
    call["draft_probs"] = call["draft_probs"].to(dtype)
    _check(**call)


_COMPILE_CASES = [  # RULE: the kernel's switch (RULE_CODES: token-level, typical, traversal)
    ("cuda", 90, 32, dict(IS_LOGITS=True, HAS_U=True, HAS_GREEDY=True, RULE=0,
                          CHILDREN=2, STATS_BLOCK=4096, BLOCK=2048, NB=64, WB=8), "bf16"),
    ("cuda", 80, 32, dict(IS_LOGITS=False, HAS_U=True, HAS_GREEDY=False, RULE=1,
                          CHILDREN=0, STATS_BLOCK=4096, BLOCK=2048, NB=8, WB=8), "fp32"),
    ("hip", "gfx942", 64, dict(IS_LOGITS=True, HAS_U=True, HAS_GREEDY=True, RULE=0,
                               CHILDREN=1, STATS_BLOCK=4096, BLOCK=2048, NB=32, WB=4), "fp16"),
    ("cuda", 90, 32, dict(IS_LOGITS=True, HAS_U=True, HAS_GREEDY=True, RULE=2,
                          CHILDREN=2, STATS_BLOCK=4096, BLOCK=2048, NB=16, WB=8), "fp32"),
]
_GROUP_TYPES = {  # each grouped argument's element types, as verify_tree_triton's _records
    "rows": ("*{dtype}", "i32", "*{dtype}", "i32"),
    "request": ("*i64", "*i64", "*i64", "*fp32", "*fp32"),
    "scratch": ("*fp32", "*fp32"),
    "out": ("*i64", "*i64", "*i64"),
    "scalars": ("i32", "i32", "i32", "fp32", "fp32"),
}


@pytest.mark.skipif(DEVICE != "cpu", reason="the GPU run compiles for real")
@pytest.mark.parametrize("case", _COMPILE_CASES,
                         ids=lambda c: f"{c[0]}{c[1]}-{c[3]['CHILDREN']}-rule{c[3]['RULE']}")
def test_tree_kernel_compiles_for_gpus_without_a_gpu(case: tuple) -> None:
    """The interpreter is not the compiler: compile the tree kernel ahead of time for real GPU
    targets, so a construct only the interpreter accepts fails here, not on a GPU."""
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from portable_verify.backends.triton import tree as triton_tree

    backend, arch, warp, constexprs, dtype = case
    if {"cuda": "nvidia", "hip": "amd"}[backend] not in backends:
        pytest.skip(f"this Triton build has no {backend} compiler")
    kernel = triton_tree._tree_kernel
    signature = {param.name: "constexpr" if param.is_constexpr else
                 tuple(t.format(dtype=dtype) for t in _GROUP_TYPES[param.name])
                 for param in kernel.params}
    source = ASTSource(kernel, signature, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget(backend, arch, warp),
                              options={"num_warps": 8, "enable_fp_fusion": False})
    assert compiled.asm.get("cubin" if backend == "cuda" else "hsaco")


LAW_TRIALS = {"deterministic": 300, "without_replacement": 150} if DEVICE == "cpu" else {
    "deterministic": 6000, "without_replacement": 6000}
LAW_ALPHA = 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["deterministic", "without_replacement"])
def test_tree_law_with_a_negative_control(mode: str) -> None:
    """The kernel's sequences follow the target's law (the ``stat.tree_law`` scenario: V = 4,
    depth 3, N = 22, completed to 4 tokens), at a size the interpreter affords: 300 trials
    (deterministic) and 150 (without replacement) on CPU, 6,000 on a GPU; ``alpha = 1e-3`` per
    fit (fixed seeds: a correct kernel fails with probability <= 1e-3 over the seeds, and never
    flakes). Negative control, on the kernel itself: one uniform shared by the siblings of a
    level (deterministic mode) must be rejected; estimated power at 300 trials 0.97
    (``estimated_power`` on the reference, docs/testing.md). The without-replacement fit's
    estimated power against removing the token before the subtraction is 1.00 at 150 trials
    (that control is a reference-side backend). The subtler controls (iid rule on draws
    without replacement, an un-renormalised residual) are invisible at these sizes (power
    ~0.001-0.09): they are left to ``stat.tree_law`` at 6,000 trials on a GPU
    (``portable-verify gpu-check``) and to the bit-for-bit
    ``tree.exact`` comparison with the reference."""
    from portable_verify.testing.checks import tree_law
    from portable_verify.testing.stats.tree_laws import make_scenario, shared_sibling_uniforms

    fit, _ = tree_law._fit(mode, BACKEND, mode, LAW_TRIALS[mode], LAW_ALPHA,
                           tree_law.SEED)
    assert fit.passed, fit.line()
    if mode != "deterministic":
        return
    shared = shared_sibling_uniforms(make_scenario(), LAW_TRIALS[mode], tree_law.SEED + 10,
                                     DEVICE)
    control, _ = tree_law._fit("shared uniform", BACKEND, mode, LAW_TRIALS[mode], LAW_ALPHA,
                               tree_law.SEED + 10, uniforms=shared)
    assert not control.passed, control.line()


@pytest.mark.parametrize(("parents", "path"), [
    ([-1, 2**32, 1, 2], []),  # read as 32 bits: the root
    ([-1, -(2**32), 1, 2], []),
    ([-1, 0, 2**32 + 1, 2], [1]),  # read as 32 bits: node 1, the path would go on to 2 and 3
])
@pytest.mark.parametrize("method", ["greedy", "rejection"])
def test_out_of_range_parent_is_absent_without_validation(parents: list[int], path: list[int],
                                                           method: str) -> None:
    """Unvalidated parents are read at 64 bits: a parent that only its low 32 bits would put
    in range is absent, as on the numpy reference, so its node and the nodes below it are
    unreachable. Every node's id is every row's argmax, so a reachable node is accepted."""
    logits = torch.zeros(1, 4, 6)
    logits[..., 3] = 5.0
    got = _check(method, node_token_ids=torch.tensor([[0, 3, 3, 3]]),
                 parents=torch.tensor([parents]), target_logits=logits, validate=False, seed=0)
    assert got.node_ids.cpu().tolist() == [path + [-1] * (4 - len(path))]
    assert got.num_accepted.cpu().tolist() == [len(path)]
