"""Numeric constants every backend and the validation share (one definition each)."""

from __future__ import annotations

FLOAT32_TINY = 1.1754943508222875e-38
"""The smallest normal float32 (2**-126): the lower clamp of a temperature."""

FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: the upper clamp of a temperature."""

FLOAT32_LOWEST = -FLOAT32_MAX
"""The most negative finite float32: the lower clamp of ``z - max z`` in an entropy's terms."""

DRAW_BLOCK = 256
"""Weights per block of a draw's two-level search (block sums, then a scan in one block)."""

PROB_SUM_ATOL = 1e-3
"""How far a float32 (or float64) probability row's sum may be from 1."""

PROB_SUM_ATOL_HALF = 1e-2
"""The same for float16 / bfloat16 rows (their rounding alone moves a sum by ~1e-3)."""
