"""A draft-free proposer: prompt lookup (n-gram matching over the context).

Why: its draft cost is zero, so every accepted token is pure gain. It proposes the token that
followed the latest earlier occurrence of the context's last ``n`` tokens (longest ``n`` first),
which pays off where outputs copy from the prompt (code edits, summaries, extraction).

It speaks the loop's step protocol (:class:`portable_verify.integrations.hf.StepModel`): its
"cache" is the token history, its "logits" put 0 on the proposed token and ``-inf`` elsewhere,
so greedy drafting takes it and sampled drafting sees a one-hot draft distribution (exact for
rejection sampling).
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view


class TokenHistory:
    """Each row's tokens so far (every slot the loop fed in, with its mask bit)."""

    def __init__(self) -> None:
        self.tokens = np.zeros((0, 0), dtype=np.int64)
        self.alive = np.zeros((0, 0), dtype=bool)

    def append(self, ids: torch.Tensor, mask: torch.Tensor | None) -> None:
        new = ids.detach().cpu().numpy().astype(np.int64)
        if self.tokens.shape[0] == 0:
            self.tokens = np.zeros((new.shape[0], 0), dtype=np.int64)
            self.alive = np.zeros((new.shape[0], 0), dtype=bool)
        self.tokens = np.concatenate([self.tokens, new], axis=1)
        if mask is None:
            self.alive = np.concatenate([self.alive, np.ones_like(new, dtype=bool)], axis=1)
        else:  # the loop's mask covers every slot: it also marks earlier slots as holes
            self.alive = mask.detach().cpu().numpy()[:, -self.tokens.shape[1]:].astype(bool)

    def crop(self, n: int) -> None:
        """Drop the last ``-n`` slots (``DynamicCache.crop``'s convention: ``n < 0``)."""
        if n >= 0:
            raise ValueError(f"crop takes a negative count, got {n}")
        self.tokens = self.tokens[:, :n]
        self.alive = self.alive[:, :n]

    def row(self, i: int) -> np.ndarray:
        return self.tokens[i][self.alive[i]]

    def mark(self) -> int:
        """Where the next slot goes (the tree loop counts tree slots from here)."""
        return int(self.tokens.shape[1])

    def keep(self, mark: int, slots: torch.Tensor) -> None:
        """Keep the slots ``mark + slots`` (``[B, n]`` or ``[n]``, ``-1`` padding) after each
        row's history and drop the rest since ``mark``: the tree loop's ``keep_slots``."""
        idx = slots.detach().cpu().numpy().astype(np.int64).reshape(-1, slots.shape[-1]) \
            if slots.numel() else np.zeros((self.tokens.shape[0], 0), dtype=np.int64)
        idx = np.broadcast_to(idx, (self.tokens.shape[0], idx.shape[1]))
        # Left-pack each row's kept slots and drop the columns no row keeps: a dropped slot
        # must not stay as a dead column that every later lookup scans.
        valid = idx >= 0
        width = int(valid.sum(1).max()) if idx.size else 0
        order = np.argsort(~valid, axis=1, kind="stable")[:, :width]
        idx = np.where(np.take_along_axis(valid, order, 1), np.take_along_axis(idx, order, 1), -1)
        tail, live = self.tokens[:, mark:], self.alive[:, mark:]
        safe = np.clip(idx, 0, max(tail.shape[1] - 1, 0))
        kept = np.take_along_axis(tail, safe, 1) if tail.shape[1] else np.zeros_like(idx)
        alive = (idx >= 0) & (np.take_along_axis(live, safe, 1) if tail.shape[1] else False)
        self.tokens = np.concatenate([self.tokens[:, :mark], kept], axis=1)
        self.alive = np.concatenate([self.alive[:, :mark], alive], axis=1)


def lookup(seq: np.ndarray, max_ngram: int) -> int:
    """The token after the latest earlier match of ``seq``'s last ``n`` tokens, longest first.

    Falls back to the last token (any proposal is allowed; a wrong one is only rejected).

    >>> int(lookup(np.array([5, 6, 7, 1, 5, 6]), 3))
    7
    """
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        windows = sliding_window_view(seq[:-1], n)
        hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        if hits.size:
            return int(seq[hits[-1] + n])
    return int(seq[-1])


class NgramDraft:
    """Prompt-lookup drafting behind the loop's step protocol (no weights, no forward)."""

    def __init__(self, vocab_size: int, max_ngram: int = 3) -> None:
        if vocab_size < 1 or max_ngram < 1:
            raise ValueError(f"vocab_size and max_ngram must be >= 1, got {vocab_size}, "
                             f"{max_ngram}")
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram

    def new_cache(self) -> TokenHistory:
        return TokenHistory()

    def prefill(self, ids: torch.Tensor, cache: TokenHistory, pos: torch.Tensor,
                mask: torch.Tensor | None) -> None:
        cache.append(ids, mask)

    def logits(self, ids: torch.Tensor, cache: TokenHistory, pos: torch.Tensor,
               mask: torch.Tensor | None, last_only: bool = False) -> torch.Tensor:
        """``[B, V]`` one-hot log-probabilities of each row's proposal (the last position only:
        a proposer has nothing to say about earlier positions)."""
        if not last_only:
            raise ValueError("NgramDraft proposes the next token only (last_only=True)")
        cache.append(ids, mask)
        b = ids.shape[0]
        out = torch.full((b, self.vocab_size), float("-inf"))
        picks = [min(lookup(cache.row(i), self.max_ngram), self.vocab_size - 1)
                 for i in range(b)]
        out[torch.arange(b), torch.tensor(picks)] = 0.0
        return out.to(ids.device)

    def __repr__(self) -> str:
        return f"NgramDraft(max_ngram={self.max_ngram})"

