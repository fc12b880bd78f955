"""An OpenVINO runtime for the decoding loop: a causal LM converted once, run as a compiled model.

Why: on CPUs the cost of a torch forward grows with the number of new tokens almost as if each
were its own forward, while OpenVINO's CPU plugin scores ``k+1`` tokens for little more than
one; speculative decoding lives on that difference (figures in docs/e2e.md).

Conversion (once, cached beside the model folder): ``openvino.convert_model`` traces the
transformers module wrapped so that the KV cache, the position ids and a 4-D attention mask are
explicit inputs; the cache is then made *stateful* (it stays inside the infer request between
calls, no copies through Python) and optionally weight-compressed (int8 per output channel,
int4 per group of input channels) for drafts.

Rejected positions: the chain loop drops the slots it rejected with ``cache.crop(-n)``, the
tree loop keeps each row's accepted nodes with ``cache.keep(mark, slots)``. A stateful cache
cannot shrink cheaply, so dropped slots stay in the state as dead columns, per row, that the
attention mask hides from every later query; positions come from the loop's ``position_ids``,
never from slot indices, so a dead slot changes nothing but a little attention work. Trees
leave about ``nodes - accepted`` dead slots per step; past a bound ``keep`` compacts the state
(each layer's state gathered to the rows' live slots and written back).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from portable_verify.integrations.models import cache_dir, quiet_transformers

WEIGHT_FORMATS: tuple[str, ...] = ("f32", "int8", "int4")
EXPORT_VERSION = 2
"""Bumped whenever the exported graph's inputs or outputs change (old caches are ignored)."""
INT4_GROUPS = (128, 64, 32)
"""Input channels sharing one int4 scale: the largest of these that divides the layer's width
(else the whole row)."""


class _ExplicitCacheLM(torch.nn.Module):
    """The traced function: new tokens + past K/V + 4-D mask -> selected logits + present K/V."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor, logit_index: torch.Tensor,
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for i, layer in enumerate(cache.layers):  # filled directly: `update` would trace a cat
            layer.dtype, layer.device = past[2 * i].dtype, past[2 * i].device
            layer.keys, layer.values = past[2 * i], past[2 * i + 1]
            layer.is_initialized = True
        hidden = self.model.get_decoder()(
            input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
            past_key_values=cache, use_cache=True).last_hidden_state
        logits = self.model.get_output_embeddings()(hidden.index_select(1, logit_index))
        out = [logits]
        for layer in cache.layers:
            out += [layer.keys, layer.values]
        return tuple(out)


def _kv_shape(config: Any) -> tuple[int, int, int]:
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return layers, heads, head_dim


def _convert(source: str, local: bool) -> Any:
    """The f32 stateful OpenVINO model of a transformers causal LM (``source``: folder or id)."""
    import openvino as ov
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=torch.float32, attn_implementation="sdpa", local_files_only=local).eval()
    layers, heads, head_dim = _kv_shape(model.config)
    b, s, p = 1, 3, 5
    example = [torch.ones(b, s, dtype=torch.int64), torch.arange(p, p + s).unsqueeze(0),
               torch.ones(b, 1, s, p + s, dtype=torch.bool), torch.arange(s)]
    example += [torch.randn(b, heads, p, head_dim) for _ in range(2 * layers)]
    shapes = [[-1, -1], [-1, -1], [-1, 1, -1, -1], [-1]]
    shapes += [[-1, heads, -1, head_dim]] * (2 * layers)
    names = ["input_ids", "position_ids", "attention_mask", "logit_index"]
    names += [f"past.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about constants that are constant
        ov_model = ov.convert_model(_ExplicitCacheLM(model), example_input=tuple(example),
                                    input=[ov.PartialShape(x) for x in shapes])
    for port, name in zip(ov_model.inputs, names, strict=True):
        port.get_tensor().set_names({name})
    outputs = ["logits"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    for port, name in zip(ov_model.outputs, outputs, strict=True):
        port.get_tensor().set_names({name})
    _make_stateful(ov_model, layers)
    return ov_model


def _make_stateful(ov_model: Any, layers: int) -> None:
    """Keep the KV cache inside the infer request, starting empty at the batch of ``input_ids``."""
    import openvino.opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    apply_make_stateful_transformation(ov_model, {
        f"past.{i}.{kv}": f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")})
    batch = ops.gather(ops.shape_of(ov_model.input("input_ids"), "i64"),
                       ops.constant(np.array([0], np.int64)), ops.constant(np.int64(0)))
    # A row-reordering Gather between each cached tensor and its use: the form the CPU plugin
    # fuses (with the cache concatenation) into one attention node that appends in place
    # instead of copying the whole cache every call. The loop passes the identity order.
    beam_idx = ops.parameter([-1], np.int32, name="beam_idx")
    beam_idx.output(0).get_tensor().set_names({"beam_idx"})
    for op in ov_model.get_ops():
        if op.get_type_name() != "ReadValue":
            continue
        dims = list(op.get_output_partial_shape(0))[1:]  # [heads, 0 slots, head_dim]
        parts = [batch] + [ops.constant(np.array([d.get_length() if d.is_static else 0],
                                                 np.int64)) for d in dims]
        op.set_arguments([ops.broadcast(ops.constant(np.float32(0)), ops.concat(parts, 0))])
        users = list(op.output(0).get_target_inputs())
        reordered = ops.gather(op.output(0), beam_idx, ops.constant(np.int32(0)))
        for user in users:
            user.replace_source_output(reordered.output(0))
    ov_model.add_parameters([beam_idx])
    ov_model.validate_nodes_and_infer_types()


def compress_weights(ov_model: Any, weights: str) -> int:
    """Replace every 2-D f32 MatMul weight by int8 (per output channel) or int4 (per group of
    :data:`INT4_GROUPS` inputs) with f32 scales; returns how many were compressed.

    The result has the ``Constant(low) -> Convert -> Multiply -> MatMul`` form that OpenVINO's
    CPU plugin runs as a compressed-weight matmul (weights stay low precision in memory).
    """
    import openvino as ov
    import openvino.opset13 as ops

    if weights == "f32":
        return 0
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {weights!r}")
    count = 0
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        const = op.input_value(1).get_node()
        if const.get_type_name() != "Constant" or const.get_output_element_type(0) != ov.Type.f32:
            continue
        w = const.get_data()
        if w.ndim != 2:
            continue
        if not op.get_attributes().get("transpose_b", False):
            w = w.T  # rows = output channels from here on
        out_dim, in_dim = w.shape
        if weights == "int8":
            scale = np.maximum(np.abs(w).max(axis=1, keepdims=True), 1e-12) / 127.0
            q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
            low = ops.constant(q, dtype=ov.Type.i8)
            dequant = ops.multiply(ops.convert(low, ov.Type.f32),
                                   ops.constant(scale.astype(np.float32)))
        else:
            group = next((g for g in INT4_GROUPS if in_dim % g == 0), in_dim)
            g = w.reshape(out_dim, in_dim // group, group)
            scale = np.maximum(np.abs(g).max(axis=2, keepdims=True), 1e-12) / 7.0
            q = np.clip(np.round(g / scale), -8, 7).astype(np.int8)
            low = ov.op.Constant(ov.Type.i4, ov.Shape(list(q.shape)), q.flatten().tolist())
            grouped = ops.multiply(ops.convert(low, ov.Type.f32),
                                   ops.constant(scale.astype(np.float32)))
            dequant = ops.reshape(grouped, ops.constant(np.array([out_dim, in_dim], np.int64)),
                                  special_zero=False)
        if not op.get_attributes().get("transpose_b", False):
            dequant = ops.transpose(dequant, ops.constant(np.array([1, 0], np.int64)))
        op.input(1).replace_source_output(dequant.output(0))
        count += 1
    ov_model.validate_nodes_and_infer_types()
    return count


def export_dir(folder: str, local: bool) -> Path:
    """Where converted models of ``folder`` live: beside it when writable, else in the cache."""
    if local and os.access(folder, os.W_OK):
        return Path(folder) / "openvino"
    return cache_dir() / "openvino" / folder.strip("/").replace("/", "--")


def export(folder: str, local: bool, weights: str = "f32",
           say: Callable[[str], None] | None = None) -> Path:
    """The OpenVINO IR (``.xml``) of ``folder``'s model with ``weights``, converting once."""
    import openvino as ov

    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {weights!r}")
    out = export_dir(folder, local)
    xml = out / f"model-{weights}-v{EXPORT_VERSION}.xml"
    if xml.exists() and xml.with_suffix(".bin").exists():
        return xml
    if weights == "f32":
        if say:
            say(f"converting {folder} to OpenVINO (once; cached in {out})")
        ov_model = _convert(folder, local)
    else:
        f32 = export(folder, local, "f32", say)
        if say:
            say(f"compressing {f32.name} to {weights} weights (once)")
        ov_model = ov.Core().read_model(f32)
        if compress_weights(ov_model, weights) == 0:
            raise ValueError(f"no weight of {folder} could be compressed to {weights}")
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        ov.save_model(ov_model, staging / xml.name, compress_to_fp16=False)
        os.replace(staging / xml.with_suffix(".bin").name, xml.with_suffix(".bin"))
        os.replace(staging / xml.name, xml)  # the .xml last: its presence means complete
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return xml


DEAD_SLOTS_FLOOR = 32
DEAD_SLOTS_SCALE = 6
"""Default bound on removable dead slots: ``max(DEAD_SLOTS_FLOOR, sqrt(DEAD_SLOTS_SCALE *
live))``, the square-root rule (a compaction costs about as much per slot moved as a dead slot
costs per step, docs/decisions.md "Dead slots on the OpenVINO runtime")."""


class SlotCache:
    """One generation's KV cache: the infer request holding the state, and which of its
    physical slots each row still attends to (``live [B, phys]``: ``crop`` and ``keep`` mark
    slots dead instead of moving memory; ``compact`` moves it once they pile up).

    ``max_dead``: compact when the slots a compaction would remove (``phys`` minus the most
    live slots of any row) exceed it; ``None``: the default bound (:data:`DEAD_SLOTS_SCALE`).
    """

    def __init__(self, request: Any, max_dead: int | None = None) -> None:
        if max_dead is not None and max_dead < 0:
            raise ValueError(f"max_dead must be >= 0 or None, got {max_dead}")
        self.request = request
        request.reset_state()
        self.live = np.zeros((0, 0), dtype=bool)  # [B, phys], B set by the first forward
        self.max_dead = max_dead
        self.compactions = 0
        self.most_dead = 0  # the most dead slots any row had (before a compaction)

    def crop(self, n: int) -> None:
        """Drop the loop's last ``-n`` slots (the chain loop's: slots live in any row)."""
        if n >= 0:
            raise ValueError(f"crop takes a negative count, got {n}")
        live = np.flatnonzero(self.live.any(0))
        self.live[:, live[n:]] = False
        self._note_dead()

    def mark(self) -> int:
        """Where the next appended slot goes (physical: dead slots included)."""
        return int(self.live.shape[1])

    def keep(self, mark: int, slots: Any) -> None:
        """Per row, keep the slots ``mark + slots[row]`` (``-1`` entries ignored) among those
        appended since ``mark``; the rest become that row's dead slots. Kept entries stay where
        they are: attention is blind to slot order (positions are baked into the keys)."""
        idx = np.asarray(slots.cpu() if isinstance(slots, torch.Tensor) else slots, np.int64)
        b = self.live.shape[0]
        idx = np.broadcast_to(idx.reshape(1, -1) if idx.ndim == 1 else idx, (b, idx.shape[-1]))
        if mark < 0 or mark > self.mark() or (idx >= self.mark() - mark).any():
            raise ValueError(f"slots must lie among the {self.mark() - mark} slots appended "
                             f"since mark {mark}")
        tail = np.zeros((b, self.mark() - mark), dtype=bool)
        rows, cols = np.nonzero(idx >= 0)
        tail[rows, idx[rows, cols]] = True
        self.live[:, mark:] = tail
        longest = self._note_dead()
        if self.mark() - longest > self._bound(longest):  # what a compaction would remove
            self.compact()

    @property
    def dead_slots(self) -> int:
        """The most dead slots of any row (what its attention reads and ignores)."""
        if self.live.size == 0:
            return 0
        return int((~self.live).sum(1).max())

    @property
    def removable(self) -> int:
        """Slots a compaction would remove: physical slots beyond the longest row's live."""
        return self.mark() - (int(self.live.sum(1).max()) if self.live.size else 0)

    @property
    def bound(self) -> int:
        """The removable slots past which :meth:`keep` compacts."""
        return self._bound(int(self.live.sum(1).max()) if self.live.size else 0)

    def _bound(self, longest: int) -> int:
        if self.max_dead is not None:
            return self.max_dead
        return max(DEAD_SLOTS_FLOOR, math.isqrt(DEAD_SLOTS_SCALE * longest))

    def _note_dead(self) -> int:
        """Note the most dead slots of any row; return the longest row's live slots (one pass
        over ``live`` per step for both)."""
        if self.live.size == 0:
            return 0
        counts = self.live.sum(1)
        self.most_dead = max(self.most_dead, self.mark() - int(counts.min()))
        return int(counts.max())

    def compact(self) -> None:
        """Rewrite every layer's state with each row's live slots first, in their order; a
        shorter row is padded with dead slots at its end."""
        counts = self.live.sum(1)
        width = int(counts.max()) if counts.size else 0
        # Stable sort puts each row's live slots first, in physical order.
        order = np.argsort(~self.live, axis=1, kind="stable")[:, :width]
        for state in self.request.query_state():
            data = state.state.data  # [B, heads, phys, head_dim]
            state.state = type(state.state)(np.ascontiguousarray(
                np.take_along_axis(data, order[:, None, :, None], axis=2)))
        self.live = np.arange(width)[None, :] < counts[:, None]
        self.compactions += 1


class OpenVINOCausalLM:
    """A compiled OpenVINO causal LM speaking the loop's step protocol.

    ``mask`` as the loop passes it (``None`` or 2-D over the loop's slots plus the new tokens)
    becomes the 4-D boolean mask over physical slots: dead slots hidden, causal among the new
    tokens, and every token always sees itself (so a left-padding token's attention row is
    never empty, which would turn its hidden state, and then its cache entries, into NaN).
    """

    def __init__(self, xml: Path | str, threads: int = 1, device: str = "CPU",
                 exact_kv: bool = True, max_dead_slots: int | None = None) -> None:
        import openvino as ov

        config: dict[str, Any] = {
            # The CPU plugin may default to bf16 where the CPU has it: ask for f32 explicitly.
            "INFERENCE_PRECISION_HINT": "f32",
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": "1",
        }
        if exact_kv:  # keep the cache in f32 (the plugin may store it quantised otherwise)
            config["KV_CACHE_PRECISION"] = "f32"
        if threads:
            config["INFERENCE_NUM_THREADS"] = str(threads)
        self.xml = Path(xml)
        self.compiled = ov.Core().compile_model(str(xml), device, config)
        self.vocab_size = int(self.compiled.output("logits").get_partial_shape()[2].get_length())
        self.max_dead_slots = max_dead_slots  # each new cache's bound (SlotCache.max_dead)

    def new_cache(self) -> SlotCache:
        return SlotCache(self.compiled.create_infer_request(), self.max_dead_slots)

    def _infer(self, ids: torch.Tensor, cache: SlotCache, pos: torch.Tensor,
               seen: np.ndarray, logit_index: np.ndarray) -> np.ndarray:
        """One forward with ``seen [B, S, phys + S]`` (which slots each new token attends to;
        every token is made to see itself); appends ``S`` live slots per row."""
        b, s = ids.shape
        if cache.live.shape[0] != b:
            if cache.live.shape[1]:
                raise ValueError(f"ids: batch {b} on a cache holding batch {cache.live.shape[0]}")
            cache.live = np.zeros((b, 0), dtype=bool)
        phys = cache.live.shape[1]
        seen[:, np.arange(s), phys + np.arange(s)] = True
        result = cache.request.infer({
            "input_ids": ids.cpu().numpy().astype(np.int64),
            "position_ids": pos.cpu().numpy().astype(np.int64),
            "attention_mask": seen[:, None],
            "logit_index": logit_index,
            "beam_idx": np.arange(b, dtype=np.int32),
        }, share_inputs=True)
        cache.live = np.concatenate([cache.live, np.ones((b, s), dtype=bool)], 1)
        return result["logits"]

    def _run(self, ids: torch.Tensor, cache: SlotCache, pos: torch.Tensor,
             mask: torch.Tensor | None, logit_index: np.ndarray) -> np.ndarray:
        """The chain loop's forward: ``mask`` (2-D over the loop's slots, i.e. those live in
        any row, plus the new tokens) or None, causal among the new tokens."""
        b, s = ids.shape
        live = cache.live if cache.live.shape[0] == b else np.zeros((b, 0), dtype=bool)
        phys = live.shape[1]
        seen = np.zeros((b, phys + s), dtype=bool)
        seen[:, :phys] = live
        seen[:, phys:] = True
        if mask is not None:
            m = mask.cpu().numpy().astype(bool)
            seen[:, np.flatnonzero(live.any(0))] &= m[:, : m.shape[1] - s]
            seen[:, phys:] = m[:, m.shape[1] - s:]
        causal = np.tri(s, phys + s, phys, dtype=bool)  # query i sees slots < phys + i + 1
        return self._infer(ids, cache, pos, seen[:, None, :] & causal[None], logit_index)

    def tree_logits(self, ids: torch.Tensor, cache: SlotCache, pos: torch.Tensor, mark: int,
                    visible: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """The tree step protocol's forward (``tree_loop.tree_forward``): each new token sees
        its row's live slots before ``mark`` and the slots since ``mark`` that ``visible
        [B, S, T + S]`` allows (and that are still live)."""
        b, s = ids.shape
        live = cache.live if cache.live.shape[0] == b else np.zeros((b, 0), dtype=bool)
        phys = live.shape[1]
        vis = visible.cpu().numpy().astype(bool)
        if vis.shape != (b, s, phys - mark + s):
            raise ValueError(f"visible must be [B, S, T + S] = {(b, s, phys - mark + s)} "
                             f"(T: slots since mark {mark}), got {vis.shape}")
        seen = np.empty((b, s, phys + s), dtype=bool)
        seen[:, :, :mark] = live[:, None, :mark]
        seen[:, :, mark:phys] = vis[:, :, : phys - mark] & live[:, None, mark:]
        seen[:, :, phys:] = vis[:, :, phys - mark:]
        index = np.array([s - 1] if last_only else range(s), dtype=np.int64)
        out = torch.from_numpy(np.array(self._infer(ids, cache, pos, seen, index)))  # owned
        return out[:, -1] if last_only else out

    def prefill(self, ids: torch.Tensor, cache: SlotCache, pos: torch.Tensor,
                mask: torch.Tensor | None) -> None:
        self._run(ids, cache, pos, mask, np.array([ids.shape[1] - 1], dtype=np.int64))

    def logits(self, ids: torch.Tensor, cache: SlotCache, pos: torch.Tensor,
               mask: torch.Tensor | None, last_only: bool = False) -> torch.Tensor:
        s = ids.shape[1]
        index = np.array([s - 1] if last_only else range(s), dtype=np.int64)
        out = torch.from_numpy(np.array(self._run(ids, cache, pos, mask, index)))  # owned copy
        return out[:, -1] if last_only else out

    def __repr__(self) -> str:
        return f"OpenVINOCausalLM({self.xml.name})"
