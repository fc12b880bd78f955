"""Hugging Face assisted generation beside this project's loop, torch runtime, one process.

Contenders on the same prompts (``e2e``'s, chat-formatted, batch 1), greedy, float32, run in
rotating order per prompt so load bursts hit all alike:
``generate()`` target-only, ``generate(assistant_model=draft)``, and portable_verify's
``target_only_generate`` / ``speculative_generate``. Tokens/s excludes prefill for all (for
``generate()`` through a streamer's timestamps: the clock starts when the first new token is
streamed). transformers reads the assistant's draft length from the *draft's*
``generation_config`` (``num_assistant_tokens``, ``num_assistant_tokens_schedule``); keyword
arguments to ``generate()`` are ignored for those, so they are set there.

Usage (main environment)::

    python scripts/bench/e2e_peers/hf_assisted.py TARGET_DIR DRAFT_DIR [--k 3] [--max-new-tokens 48]
        [--prompts 3] [--prompt-set chat] [--rounds 1] [--threads 1] [--clock cpu]
        [--schedule constant] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

from portable_verify.e2e.config import E2EConfig
from portable_verify.e2e.runner import cpu_flags, prefix_match, prompt_batches
from portable_verify.integrations import hf, models


class _Clock:
    """A ``generate()`` streamer that notes when the first new token arrives."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.calls = 0
        self.first_new: float | None = None

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2 and self.first_new is None:  # call 1 carries the prompt
            self.first_new = self.clock()

    def end(self) -> None:
        pass


def _hf(target: Any, ids: torch.Tensor, n: int, eos: int, clock: Any, draft: Any = None
        ) -> tuple[list[int], float]:
    stream = _Clock(clock)
    with torch.no_grad():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                              do_sample=False, assistant_model=draft, streamer=stream,
                              eos_token_id=eos, pad_token_id=eos)
    end = clock()
    new = out[0, ids.shape[1]:].tolist()
    if eos in new:
        new = new[: new.index(eos) + 1]
    decode_s = end - (stream.first_new or end)
    return new, (len(new) - 1) / decode_s if decode_s > 0 else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target")
    p.add_argument("draft")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--prompt-set", default="chat", help="e2e's prompt set (chat, code-edit)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--schedule", default="constant",
                   choices=("constant", "heuristic", "transformers-default"),
                   help="the assistant's num_assistant_tokens_schedule (default constant, with "
                   "--k tokens and no confidence cut); transformers-default leaves the draft's "
                   "generation_config as transformers makes it (--k still sets ours)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall clock, or process CPU time (leaves out waiting for a core on a "
                   "shared machine; --threads 1 only)")
    p.add_argument("--skip-ours", action="store_true", help="only generate() and assisted")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu sums every thread's time: use it with --threads 1")
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    target = models.load_model(args.target)
    draft = models.load_model(args.draft)
    if args.schedule != "transformers-default":
        draft.generation_config.num_assistant_tokens = args.k
        draft.generation_config.num_assistant_tokens_schedule = args.schedule
        draft.generation_config.assistant_confidence_threshold = 0.0  # no early stop
    assistant = {k: getattr(draft.generation_config, k, None) for k in (
        "num_assistant_tokens", "num_assistant_tokens_schedule",
        "assistant_confidence_threshold")}
    tok = models.load_tokenizer(args.target)
    cfg = E2EConfig(target=args.target, num_prompts=args.prompts, batch=1,
                    prompt_set=args.prompt_set)
    prompts = [ids for ids, _ in prompt_batches(tok, cfg)]
    eos = tok.eos_token_id

    def ours(ids: torch.Tensor, spec: bool) -> tuple[list[int], float]:
        if spec:
            r = hf.speculative_generate(target, draft, ids, max_new_tokens=args.max_new_tokens,
                                        k=args.k, eos_token_id=eos, pad_token_id=eos, clock=clock)
        else:
            r = hf.target_only_generate(target, ids, max_new_tokens=args.max_new_tokens,
                                        eos_token_id=eos, pad_token_id=eos, clock=clock)
        return r.new_tokens[0], r.metrics.tokens_per_s

    contenders = {
        "hf target-only": lambda ids: _hf(target, ids, args.max_new_tokens, eos, clock),
        "hf assisted": lambda ids: _hf(target, ids, args.max_new_tokens, eos, clock,
                                       draft),
    }
    if not args.skip_ours:
        contenders["ours target-only (torch)"] = lambda ids: ours(ids, False)
        contenders[f"ours spec k={args.k} (torch)"] = lambda ids: ours(ids, True)
    names = list(contenders)
    for name in names:  # warm-up
        contenders[name](prompts[0][:, :8])
    tps: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names}
    match: dict[str, list[int]] = {n: [0, 0, 0] for n in names}  # matched, compared, equal
    slot = 0
    for rnd in range(args.rounds):
        for pi, ids in enumerate(prompts):
            order = names[slot % len(names):] + names[: slot % len(names)]
            slot += 1
            got: dict[str, tuple[list[int], float]] = {n: contenders[n](ids) for n in order}
            ref = got["hf target-only"][0]
            for n in names:
                tps[n].append(got[n][1])
                base = "hf target-only" if n.startswith("hf") else "ours target-only (torch)"
                ratios[n].append(got[n][1] / got[base][1])
                match[n][0] += prefix_match(got[n][0], ref)
                match[n][1] += len(ref)
                match[n][2] += int(got[n][0] == ref)
                print(f"hf_assisted: round {rnd + 1} prompt {pi}: {n}: {got[n][1]:.2f} "
                      "tokens/s", file=sys.stderr, flush=True)

    results = []
    for n in names:
        r = ratios[n]
        results.append({
            "name": n, "tokens_per_s_median": statistics.median(tps[n]),
            "speedup_vs_own_target_only": {"min": min(r), "median": statistics.median(r),
                                           "max": max(r), "n": len(r)},
            "match_rate_vs_hf_greedy": match[n][0] / match[n][1],
            "rows_equal_to_hf_greedy": f"{match[n][2]}/{len(r)}"})
    data = {"command": " ".join(sys.argv), "k": args.k, "assistant_generation_config": assistant,
            "max_new_tokens": args.max_new_tokens, "threads": args.threads, "clock": args.clock,
            "prompt_set": args.prompt_set,
            "cpu_flags": cpu_flags(), "torch": torch.__version__, "results": results}
    for r in results:
        s = r["speedup_vs_own_target_only"]
        print(f"{r['name']:28s} {r['tokens_per_s_median']:6.2f} tokens/s  "
              f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})  equal rows "
              f"{r['rows_equal_to_hf_greedy']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
