"""The performance targets of issue 4 (CPU, float32, 1 thread), evaluated on measured cells."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    """``metric op threshold`` for one (variant, shape); metrics are ratios from one cell."""

    variant: str  # Variant.label
    shape: tuple[int, int, int]
    metric: str  # "x_floor" (verify / floor) or "speedup_vs_dense" (dense / verify)
    op: str  # "<=" or ">="
    threshold: float

    @property
    def text(self) -> str:
        what = "x floor" if self.metric == "x_floor" else "x faster than dense"
        return f"{self.variant} {self.shape}: {self.op} {self.threshold:g} {what}"

    def met(self, value: float) -> bool:
        return value <= self.threshold if self.op == "<=" else value >= self.threshold


BIG = (64, 5, 128256)
MID = (32, 4, 32000)
TARGETS: tuple[Target, ...] = (
    Target("greedy/logits", MID, "x_floor", "<=", 1.5),
    Target("greedy/logits", BIG, "x_floor", "<=", 1.5),
    Target("rejection/probs", MID, "speedup_vs_dense", ">=", 20.0),
    Target("rejection/probs", BIG, "speedup_vs_dense", ">=", 50.0),
    Target("rejection/logits", MID, "x_floor", "<=", 3.0),
    Target("rejection/logits", BIG, "x_floor", "<=", 3.0),
    Target("typical/logits", MID, "speedup_vs_dense", ">=", 5.0),
)


def evaluate(cell: dict[str, Any]) -> list[dict[str, Any]]:
    """Targets that apply to a measured cell (CPU float32 only), each marked met or missed."""
    if cell["device"] != "cpu" or cell["dtype"] != "float32":
        return []
    shape = (cell["B"], cell["K"], cell["V"])
    out = []
    for t in TARGETS:
        if t.variant != cell["variant"] or t.shape != shape:
            continue
        value = cell["ratios"].get(t.metric)
        out.append({
            "target": t.text,
            "metric": t.metric,
            "op": t.op,
            "threshold": t.threshold,
            "value": value,
            "met": value is not None and t.met(value),
        })
    return out
