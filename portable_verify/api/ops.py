"""One torch custom op per layout, so ``torch.compile`` traces a step that verifies.

Why: the doors' Python (argument forms, dispatch caches, environment reads, numpy shortcuts)
cannot be traced, and need not be. Dynamo traces each door as its op instead
(``portable_verify::verify_chain``, ``::verify_ragged``, ``::verify_rows``, ``::verify_tree``;
``torch.compiler.substitute_in_graph``), which the graph holds as one opaque call with a fake
implementation for shapes; the op runs the door with ``validate=False``. Eager calls never see
the ops: the doors are not wrapped, so they pay no custom-op dispatch (the ops are registered
through ``torch.library.Library``, as vLLM registers its own).

The schema takes tensors and scalars only (docs/backends.md, "Custom ops"): a door's Python
number or int seed arrives as a scalar, a tensor as a tensor. ``validate=True`` under compile
runs the door outside the graph (a graph break, which ``fullgraph=True`` refuses).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import torch

from portable_verify.api.padded import verify
from portable_verify.api.ragged import verify_ragged
from portable_verify.api.rows import verify_rows
from portable_verify.api.tree import verify_tree
from portable_verify.core.tree import TreeResult
from portable_verify.core.types import DEFAULT_TYPICAL, TypicalParams, VerifyOptions, VerifyResult

NAMESPACE = "portable_verify"
_TAIL = ("Tensor? temperature, float? temperature_value, Tensor? seed, int? seed_value, "
         "Tensor? seed_offset, int? seed_offset_value, Tensor? uniforms, str method, "
         "float typical_eps, float typical_alpha, str backend")
_CHAIN_OUT = "(Tensor token_ids, Tensor num_accepted, Tensor num_draft_tokens)"
SCHEMAS = {
    "verify_chain": "(Tensor draft_token_ids, Tensor target, bool target_is_logits, "
                    "Tensor? draft_probs, Tensor? num_draft_tokens, Tensor? bonus_token_ids, "
                    f"{_TAIL}) -> {_CHAIN_OUT}",
    "verify_ragged": "(Tensor draft_token_ids, Tensor target, bool target_is_logits, "
                     "Tensor? draft_probs, Tensor? num_draft_tokens, "
                     "Tensor? cu_num_draft_tokens, int max_num_draft_tokens, "
                     f"Tensor? bonus_token_ids, {_TAIL}) -> {_CHAIN_OUT}",
    "verify_rows": "(Tensor draft_token_ids, Tensor target, bool target_is_logits, "
                   "Tensor target_rows, Tensor? num_draft_tokens, Tensor? draft_probs, "
                   f"Tensor? draft_rows, Tensor? bonus_token_ids, {_TAIL}) -> {_CHAIN_OUT}",
    "verify_tree": "(Tensor node_token_ids, Tensor parents, Tensor target, "
                   "bool target_is_logits, Tensor? draft_probs, str children, "
                   f"Tensor? num_nodes, int? max_depth, {_TAIL}) "
                   "-> (Tensor token_ids, Tensor node_ids, Tensor num_accepted)",
}
"""Each op's schema (the doors' argument names; a ``*_value`` is the scalar form)."""

_DOORS: dict[str, Callable[..., Any]] = {"verify_chain": verify, "verify_ragged": verify_ragged,
                                          "verify_rows": verify_rows, "verify_tree": verify_tree}
_OP_OF = {door.__name__: op for op, door in _DOORS.items()}
_LIB: list[torch.library.Library] = []  # the registration, once made (register())


def _split(value: Any) -> tuple[torch.Tensor | None, Any]:
    """A door argument as the schema's ``(tensor, scalar)`` pair."""
    return (value, None) if isinstance(value, torch.Tensor) else (None, value)


def _joined(tensor: torch.Tensor | None, scalar: Any) -> Any:
    return tensor if tensor is not None else scalar


def _tail(kw: dict[str, Any]) -> dict[str, Any]:
    """The schema's shared tail from a door's keywords (``options`` or method and typical)."""
    options = kw.pop("options", None)
    method = options.method if options is not None else kw.pop("method", "auto")
    typical = options.typical if options is not None else DEFAULT_TYPICAL
    t, t_value = _split(kw.pop("temperature", None))
    s, s_value = _split(kw.pop("seed", None))
    o, o_value = _split(kw.pop("seed_offset", None))
    return dict(temperature=t, temperature_value=t_value, seed=s, seed_value=s_value,
                seed_offset=o, seed_offset_value=o_value, uniforms=kw.pop("uniforms", None),
                method=method, typical_eps=kw.pop("typical_eps", typical.eps),
                typical_alpha=kw.pop("typical_alpha", typical.alpha),
                backend=kw.pop("backend", "auto"))


def _target(kw: dict[str, Any]) -> dict[str, Any]:
    logits, probs = kw.pop("target_logits", None), kw.pop("target_probs", None)
    return dict(target=logits if logits is not None else probs,
                target_is_logits=logits is not None)


def _door_keywords(op: str, args: dict[str, Any]) -> dict[str, Any]:
    """The door's keywords back from the schema's arguments (``validate=False``)."""
    kw = dict(args)
    target, is_logits = kw.pop("target"), kw.pop("target_is_logits")
    kw["target_logits" if is_logits else "target_probs"] = target
    for name in ("temperature", "seed", "seed_offset"):
        kw[name] = _joined(kw[name], kw.pop(f"{name}_value"))
    if op == "verify_rows":
        kw["options"] = VerifyOptions(kw.pop("method"), TypicalParams(kw.pop("typical_eps"),
                                                                      kw.pop("typical_alpha")))
    return dict(kw, validate=False)


def _fresh(outputs: tuple[torch.Tensor, ...], args: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """Outputs that share no storage with an input or with each other, dense from offset 0 (a
    custom op's outputs are fresh tensors, as its fake says; the lean Triton path returns
    views of one buffer, copied here: the compiled path's only extra device work)."""
    taken = {a.untyped_storage().data_ptr() for a in args.values()
             if isinstance(a, torch.Tensor) and a.numel()}
    fresh = []
    for o in outputs:
        where = o.untyped_storage().data_ptr() if o.numel() else None
        own = where not in taken and not o.storage_offset() and o.is_contiguous()
        fresh.append(o if own else o.clone())
        taken.add(where)
    return tuple(fresh)


def _run(op: str) -> Callable[..., tuple[torch.Tensor, ...]]:
    names = [a.name for a in torch._C.parse_schema(f"{op}{SCHEMAS[op]}").arguments]

    def run(*values: Any) -> tuple[torch.Tensor, ...]:
        given = dict(zip(names, values, strict=True))
        args = dict(given)
        first = args.pop("node_token_ids" if op == "verify_tree" else "draft_token_ids")
        if op == "verify_tree":
            parents = args.pop("parents")
            result = _DOORS[op](first, parents, **_door_keywords(op, args))
            out = (result.token_ids, result.node_ids, result.num_accepted)
        else:
            result = _DOORS[op](first, **_door_keywords(op, args))
            out = (result.token_ids, result.num_accepted, result.num_draft_tokens)
        return _fresh(tuple(torch.as_tensor(o) for o in out), given)

    return run


def _fake_chain(b: int, k: int, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
    i64 = dict(dtype=torch.int64, device=like.device)
    return torch.empty((b, k + 1), **i64), torch.empty((b,), **i64), torch.empty((b,), **i64)


def _fake(op: str) -> Callable[..., tuple[torch.Tensor, ...]]:
    names = [a.name for a in torch._C.parse_schema(f"{op}{SCHEMAS[op]}").arguments]

    def fake(*values: Any) -> tuple[torch.Tensor, ...]:
        a = dict(zip(names, values, strict=True))
        if op == "verify_tree":
            b, n = a["node_token_ids"].shape
            w = n if a["max_depth"] is None else a["max_depth"] + 1
            i64 = dict(dtype=torch.int64, device=a["node_token_ids"].device)
            return (torch.empty((b, w), **i64), torch.empty((b, w), **i64),
                    torch.empty((b,), **i64))
        drafts = a["draft_token_ids"]
        if op == "verify_ragged":
            counts = a["num_draft_tokens"]
            b = counts.shape[0] if counts is not None else a["cu_num_draft_tokens"].shape[0] - 1
            return _fake_chain(b, a["max_num_draft_tokens"], drafts)
        return _fake_chain(drafts.shape[0], drafts.shape[1], drafts)

    return fake


def _schema_arguments(op: str, door_args: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    """The op's arguments from a door call (traced: plain Python on the arguments)."""
    kw = dict(kw)
    if op == "verify_tree":
        node_ids, parents = door_args
        head = dict(node_token_ids=node_ids, parents=parents, **_target(kw),
                    draft_probs=kw.pop("draft_probs", None),
                    children=kw.pop("children", "auto"), num_nodes=kw.pop("num_nodes", None),
                    max_depth=kw.pop("max_depth", None))
    else:
        (drafts,) = door_args
        head = dict(draft_token_ids=drafts, **_target(kw),
                    draft_probs=kw.pop("draft_probs", None),
                    num_draft_tokens=kw.pop("num_draft_tokens", None),
                    bonus_token_ids=kw.pop("bonus_token_ids", None))
        if op == "verify_ragged":
            if kw.get("max_num_draft_tokens") is None:
                raise ValueError("verify_ragged under torch.compile needs max_num_draft_tokens "
                                 "(an int: the result's width)")
            head.update(cu_num_draft_tokens=kw.pop("cu_num_draft_tokens", None),
                        max_num_draft_tokens=kw.pop("max_num_draft_tokens"))
        if op == "verify_rows":
            head.update(target_rows=kw.pop("target_rows"), draft_rows=kw.pop("draft_rows", None))
    tail = _tail(kw)
    if kw:
        raise TypeError(f"{op}() under torch.compile got unexpected arguments {sorted(kw)}")
    return {**head, **tail}


def _stand_in(op: str, door: Callable[..., Any]) -> Callable[..., Any]:
    """What dynamo traces in place of ``door``: its op (``validate=True``: the door, outside
    the graph)."""
    outside = torch.compiler.disable(
        door, reason="validate=True reads device values on the host: pass validate=False")

    def traced(*args: Any, **kw: Any) -> Any:
        if kw.get("validate", True):
            return outside(*args, **kw)
        del kw["validate"]
        out = getattr(torch.ops.portable_verify, op)(**_schema_arguments(op, args, kw))
        if op == "verify_tree":
            return TreeResult(out[0], out[1], out[2], out[2] + 1)
        return VerifyResult(out[0], out[1], out[1] + 1, out[2])

    return traced


def register() -> None:
    """Register the ops, and have dynamo trace each door as its op
    (``torch.compiler.substitute_in_graph``: the eager doors are untouched). Runs by itself
    when torch._dynamo is imported (:func:`_after_dynamo`: registering costs tens of
    milliseconds, which ``import portable_verify`` does not pay); engines that call the ops
    directly call it first. Idempotent."""
    if _LIB:
        return
    lib = torch.library.Library(NAMESPACE, "DEF")
    _LIB.append(lib)
    for op, schema in SCHEMAS.items():
        lib.define(f"{op}{schema}")
        lib.impl(op, _run(op), "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{op}", _fake(op), lib=lib)
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    for door in _DOORS.values():
        stand_in = _stand_in(_OP_OF[door.__name__], door)
        torch.compiler.substitute_in_graph(door, skip_signature_check=True)(stand_in)
        # Called as a frame of its own (after a graph break), a door runs eagerly, whole.
        set_code_exec_strategy(door.__code__, FrameExecStrategy(FrameAction.SKIP,
                                                                FrameAction.SKIP))


def _after_dynamo(register: Callable[[], None]) -> None:
    """Call ``register`` once ``torch._dynamo`` is imported: now, or when it first is (torch
    imports it lazily, at the first ``torch.compile``; importing it here would add seconds to
    every ``import portable_verify``)."""
    if "torch._dynamo" in sys.modules:
        register()
        return

    class AfterDynamo(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name != "torch._dynamo":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.loader is not None:
                load = spec.loader.exec_module

                def exec_module(module: Any) -> None:
                    load(module)
                    register()

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, AfterDynamo())


_after_dynamo(register)
