"""The project's performance targets (CPU, float32; 1 thread unless a target says otherwise),
evaluated on measured cells."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from portable_verify.bench.cases import FIXED_COST_SHAPE

METRIC_TEXT = {
    "x_floor": "x floor",
    "speedup_vs_dense": "x faster than dense",
    "x_argmax": "x a bare torch.argmax",
    "speedup_vs_vllm_typical": "x faster than vLLM v0 typical",
    "validation_overhead": "x validate=False (validate=True)",
    "x_rejection": "x rejection on the same inputs",
    "thread_scaling_vs_amax": "x torch.amax's speed-up over 1 thread",
    "speedup_vs_torch_backend": "x faster than the torch backend",
}


@dataclass(frozen=True)
class Target:
    """``metric op threshold`` for one variant at one shape (None: every shape) and thread
    count; metrics are ratios of one cell."""

    variant: str  # Variant.label
    shape: tuple[int, int, int] | None
    metric: str  # a key of METRIC_TEXT
    op: str  # "<=" or ">="
    threshold: float
    threads: int = 1
    base_threads: int | None = None  # a sweep's first count the metric is relative to

    @property
    def text(self) -> str:
        where = "every shape" if self.shape is None else str(self.shape)
        if self.threads != 1:
            where += f" at {self.threads} threads"
        return f"{self.variant} {where}: {self.op} {self.threshold:g} {METRIC_TEXT[self.metric]}"

    def met(self, value: float) -> bool:
        return value <= self.threshold if self.op == "<=" else value >= self.threshold


BIG = (64, 5, 128256)
MID = (32, 4, 32000)
SERVING = (1, 2, 32000)  # typical acceptance, k = 2, batch 1, Llama vocabulary
SAMPLED = ("rejection/logits", "rejection/probs", "typical/logits")
VARIANTS = ("greedy/logits", *SAMPLED)
THREAD_SHAPES = ((64, 4, 128256), (256, 3, 32000))
TARGETS: tuple[Target, ...] = (
    # Streaming and dense-baseline targets.
    Target("greedy/logits", MID, "x_floor", "<=", 1.5),
    Target("greedy/logits", BIG, "x_floor", "<=", 1.5),
    Target("rejection/probs", MID, "speedup_vs_dense", ">=", 20.0),
    Target("rejection/probs", BIG, "speedup_vs_dense", ">=", 50.0),
    Target("rejection/logits", MID, "x_floor", "<=", 6.0),  # 3.0 before the serving targets
    Target("rejection/logits", BIG, "x_floor", "<=", 6.0),
    Target("typical/logits", MID, "speedup_vs_dense", ">=", 5.0),
    # The serving operating point: per-call cost at batch 1 and the fixed cost.
    Target("greedy/logits", SERVING, "x_argmax", "<=", 1.0),
    *(Target(v, SERVING, "x_argmax", "<=", 3.0) for v in SAMPLED),
    Target("greedy/logits", FIXED_COST_SHAPE, "x_argmax", "<=", 4.0),
    *(Target(v, FIXED_COST_SHAPE, "x_argmax", "<=", 10.0) for v in SAMPLED),
    Target("typical/logits", None, "speedup_vs_vllm_typical", ">=", 2.0),
    Target("typical/logits", MID, "x_floor", "<=", 6.0),
    Target("typical/logits", BIG, "x_floor", "<=", 6.0),
    *(Target(v, None, "validation_overhead", "<=", 1.25) for v in VARIANTS),
    # Block verification, against rejection timed beside it on the same inputs.
    Target("block/probs", None, "x_rejection", "<=", 1.5),
    Target("block/logits", None, "x_rejection", "<=", 2.0),
    # Threads: a second thread helps as much as it helps a memory-bound reduction, and the
    # compiled kernel stays ahead of the torch backend when both have two threads.
    *(Target(v, shape, "thread_scaling_vs_amax", ">=", 0.85, threads=2, base_threads=1)
      for v in VARIANTS for shape in THREAD_SHAPES),
    *(Target(v, shape, "speedup_vs_torch_backend", ">=", 1.0, threads=2)
      for v in VARIANTS for shape in THREAD_SHAPES),
)


def evaluate(cell: dict[str, Any]) -> list[dict[str, Any]]:
    """Targets that apply to a measured cell (CPU float32 only), each marked met or missed;
    a target whose ratio the run did not measure (e.g. no ``--validation``) is left out."""
    if cell["device"] != "cpu" or cell["dtype"] != "float32":
        return []
    shape = (cell["B"], cell["K"], cell["V"])
    out = []
    for t in TARGETS:
        if t.variant != cell["variant"] or t.shape not in (None, shape):
            continue
        if t.threads != cell.get("threads", 1):
            continue
        if t.base_threads is not None and cell.get("threads_base") != t.base_threads:
            continue
        value = cell["ratios"].get(t.metric)
        if value is None:
            continue
        out.append({
            "target": t.text,
            "metric": t.metric,
            "op": t.op,
            "threshold": t.threshold,
            "value": value,
            "met": t.met(value),
        })
    return out
