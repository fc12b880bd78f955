"""The custom ops under the doors (issue 38 item 3, item 7 (d)): ``torch.library.opcheck`` on
each, and ``torch.compile(fullgraph=True, backend="aot_eager")`` of a step calling each door."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import portable_verify as pv
from portable_verify.api import ops

B, K, N, V = 2, 3, 4, 37
ops.register()  # what importing torch._dynamo does by itself
BACKEND = "torch"


def _chain() -> dict:
    g = torch.Generator().manual_seed(0)
    return dict(drafts=torch.randint(0, V, (B, K), generator=g),
                logits=torch.randn(B, K + 1, V, generator=g),
                q=torch.softmax(torch.randn(B, K, V, generator=g), -1),
                seeds=torch.tensor([3, -4]), temps=torch.tensor([0.0, 0.8]))


def _doors(c: dict, validate: bool | str = False) -> dict:
    """One step per door; each returns its result's tensors."""
    rows = torch.arange(B * (K + 1)).view(B, K + 1).flip(1)
    counts = torch.tensor([K, 1])
    common = dict(temperature=c["temps"], seed=c["seeds"], seed_offset=7, backend=BACKEND,
                  validate=validate)
    parents = torch.tensor([[-1, 0, 0, 1]] * B)
    typical = pv.VerifyOptions("typical")  # an engine builds it once, outside its step

    def chain(r):  # type: ignore[no-untyped-def]
        return r.token_ids, r.num_accepted, r.num_emitted, r.num_draft_tokens

    return {
        "verify": lambda: chain(pv.verify(c["drafts"], target_logits=c["logits"],
                                          draft_probs=c["q"], method="block", **common)),
        "verify_ragged": lambda: chain(pv.verify_ragged(
            c["drafts"].view(-1), num_draft_tokens=torch.tensor([K, K]),
            target_logits=c["logits"].view(-1, V), max_num_draft_tokens=K, **common)),
        "verify_rows": lambda: chain(pv.verify_rows(
            c["drafts"], target_rows=rows, target_logits=c["logits"].view(-1, V),
            num_draft_tokens=counts, options=typical, **common)),
        "verify_tree": lambda: (lambda r: (r.token_ids, r.node_ids, r.num_accepted))(
            pv.verify_tree(c["drafts"][:, :1].repeat(1, N), parents,
                           target_logits=c["logits"][:, :N].softmax(-1).log(), method="rejection",
                           **common)),
    }


@pytest.mark.parametrize("door", ["verify", "verify_ragged", "verify_rows", "verify_tree"])
def test_a_compiled_step_traces_each_door_without_a_break(door: str) -> None:
    step = _doors(_chain())[door]
    eager = step()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")()
    for want, got in zip(eager, compiled, strict=True):
        assert torch.equal(want, got), (door, want, got)


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.seen.append(func.namespace)
        return func(*args, **(kwargs or {}))


def test_eager_doors_do_not_dispatch_through_the_ops() -> None:
    c = _chain()
    with _Ops() as mode:
        for step in _doors(c).values():
            step()
    assert ops.NAMESPACE not in mode.seen and mode.seen
    with _Ops() as control:  # negative control: the op itself is seen
        torch.ops.portable_verify.verify_chain(
            c["drafts"], c["logits"], True, None, None, None, None, 1.0, None, 5, None, 0, None,
            "greedy", 0.1, 0.3, BACKEND)
    assert ops.NAMESPACE in control.seen


def _op_arguments(c: dict) -> dict:
    return {
        "verify_chain": (c["drafts"], c["logits"], True, c["q"], torch.tensor([K, 2]), None,
                         c["temps"], None, c["seeds"], None, None, 7, None, "rejection", 0.1,
                         0.3, BACKEND),
        "verify_ragged": (c["drafts"].view(-1), c["logits"].view(-1, V), True, None,
                          torch.tensor([K, K]), None, K, torch.tensor([5, 6]), None, 0.8, None,
                          11, None, 0, None, "typical", 0.2, 0.4, BACKEND),
        "verify_rows": (c["drafts"], c["logits"].view(-1, V), True,
                        torch.arange(B * (K + 1)).view(B, K + 1), None, None, None, None,
                        c["temps"], None, c["seeds"], None, torch.tensor([1, 2]), None, None,
                        "greedy", 0.1, 0.3, BACKEND),
        "verify_tree": (c["drafts"][:, :1].repeat(1, N), torch.tensor([[-1, 0, 0, 1]] * B),
                        c["logits"][:, :N], True, None, "deterministic", None, 2, None, 0.8,
                        c["seeds"], None, None, 0, None, "rejection", 0.1, 0.3, BACKEND),
    }


@pytest.mark.parametrize("op", list(ops.SCHEMAS))
def test_opcheck(op: str) -> None:
    args = _op_arguments(_chain())[op]
    torch.library.opcheck(getattr(torch.ops.portable_verify, op), args)


def test_opcheck_on_the_triton_lean_path() -> None:
    """The lean path returns views of one buffer: the op's outputs are still fresh tensors."""
    args = (*_op_arguments(_chain())["verify_chain"][:-1], "triton:interpreter")
    torch.library.opcheck(torch.ops.portable_verify.verify_chain, args)


def test_validate_true_under_compile_breaks_the_graph() -> None:
    """Documented: validate=True runs the door outside the graph; fullgraph refuses that."""
    step = _doors(_chain(), validate=True)["verify"]
    eager = step()
    broken = torch.compile(step, backend="aot_eager")()
    assert all(torch.equal(a, b) for a, b in zip(eager, broken, strict=True))
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(step, fullgraph=True, backend="aot_eager")()


def test_a_bad_value_with_validate_true_is_still_refused_under_compile() -> None:
    c = _chain()
    c["drafts"][0, 0] = V + 5
    step = _doors(c, validate=True)["verify"]
    with pytest.raises(ValueError, match="draft_token_ids"):
        torch.compile(step, backend="aot_eager")()


def test_the_ops_register_when_dynamo_loads_and_not_before() -> None:
    """``import portable_verify`` does not load torch._dynamo (seconds) nor register the ops;
    importing dynamo registers them (what torch.compile's first call does)."""
    import subprocess
    import sys

    script = ("import sys, torch, portable_verify\n"
              "assert 'torch._dynamo' not in sys.modules\n"
              "assert not hasattr(torch.ops.portable_verify, 'verify_chain')\n"
              "import torch._dynamo\n"
              "print(torch.ops.portable_verify.verify_tree)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and "portable_verify.verify_tree" in out.stdout, out.stderr
