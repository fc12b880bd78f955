"""Accepted tokens per target forward of the tree drafters against the chain at equal scored
positions (greedy, torch runtime, batch 1, the packaged SmolLM2 pair; docs/decisions.md,
"Tree drafters"). Prints one JSON line per (config, prompt); every tree output is checked
equal to the chain's (both greedy: target-only decoding).

    python scripts/bench/tree_drafters.py --prompts 0,1 --configs chain:4,spine:2x4,dyn:3x4:4:2:0.5
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from portable_verify.e2e import config, ngram, tree_drafters
from portable_verify.e2e.tree_loop import TreeShape, tree_generate
from portable_verify.integrations import hf, models


def _ids(tok, text: str) -> torch.Tensor:
    chat = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                   add_generation_prompt=True)
    return tok(chat, return_tensors="pt", add_special_tokens=False).input_ids


def _run(target, draft, ids, spec: str, n: int):
    """``chain:K``, ``spine:WxD[:N]``, ``dyn:WxD:N:F:TAU``, or over prompt lookup
    ``ngramchain:K`` and ``ngramtree:WxD[:N]``."""
    kind, _, rest = spec.partition(":")
    if kind == "ngramchain":
        return hf.speculative_generate(target, ngram.NgramDraft(target.config.vocab_size), ids,
                                       max_new_tokens=n, k=int(rest))
    if kind == "ngramtree":
        return tree_generate(target, ngram.NgramDraft(target.config.vocab_size), ids,
                             max_new_tokens=n, shape=TreeShape.parse(rest),
                             drafter=tree_drafters.DRAFTERS["ngram"])
    if kind == "chain":
        return hf.speculative_generate(target, draft, ids, max_new_tokens=n, k=int(rest))
    if kind == "spine":
        return tree_generate(target, draft, ids, max_new_tokens=n, shape=TreeShape.parse(rest))
    w_d, nodes, frontier, tau = rest.split(":")
    return tree_generate(target, draft, ids, max_new_tokens=n,
                         shape=TreeShape.parse(f"{w_d}:{nodes}"), rank_temperature=float(tau),
                         drafter=tree_drafters.DynamicDrafter(int(frontier)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", default="0,1")
    parser.add_argument("--configs", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--prompt-set", default="chat", choices=sorted(config.PROMPT_SETS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, draft, tok = models.load_pair()
    for p in (int(x) for x in args.prompts.split(",")):
        ids = _ids(tok, config.PROMPT_SETS[args.prompt_set][p])
        reference = None
        for spec in args.configs.split(","):
            t0 = time.process_time()
            out = _run(target, draft, ids, spec, args.max_new_tokens)
            m = out.metrics
            reference = reference or out.new_tokens[0]
            print(json.dumps({
                "prompt": p, "config": spec, "steps": m.steps, "accepted": m.accepted_tokens,
                "tokens_per_forward": (m.accepted_tokens + m.steps) / m.steps,
                "equal_to_first": out.new_tokens[0] == reference,
                "cpu_s": round(time.process_time() - t0, 2),
                "draft_s": round(m.draft_time_s, 2), "target_s": round(m.target_time_s, 2),
                "load": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
