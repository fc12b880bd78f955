"""Token trees on the OpenVINO runtime at batch > 1: the dead-slot bound end to end.

Why: a tree step leaves about ``nodes - accepted`` dead slots per row in both caches; the
bound decides when ``SlotCache.keep`` compacts them. This runs ``tree_generate`` on the e2e
default pair (SmolLM2-135M f32 target, its int8 copy as draft) over one left-padded batch of
chat prompts with the default bound, a tight one and none (compaction off), interleaved, and
checks every greedy output against target-only decoding of the same batch token for token.

    python scripts/bench/ov_tree_bound.py [--threads 1] [--rounds 3] [--tree 2x4]
        [--batch 3] [--max-new-tokens 96]

Tokens/s over decode steps on the process CPU clock (one thread: waiting for a core on a
shared machine is left out); per round, each bound's ratio to the default's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from portable_verify.e2e import config, openvino_model, runner
from portable_verify.e2e.tree_loop import TreeShape, tree_generate
from portable_verify.integrations import hf, models

BOUNDS: dict[str, int | None] = {"default": None, "tight (8)": 8, "none": 1 << 30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", default="2x4")
    parser.add_argument("--batch", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder, local = models.resolve("default")
    tok = models.load_tokenizer(folder)
    cfg = config.E2EConfig(num_prompts=args.batch, batch=args.batch)
    ids, mask = runner.prompt_batches(tok, cfg)[0]
    f32, int8 = (openvino_model.export(folder, local, w) for w in ("f32", "int8"))
    pairs = {name: (openvino_model.OpenVINOCausalLM(f32, args.threads, max_dead_slots=b),
                    openvino_model.OpenVINOCausalLM(int8, args.threads, exact_kv=False,
                                                    max_dead_slots=b))
             for name, b in BOUNDS.items()}
    n, shape = args.max_new_tokens, TreeShape.parse(args.tree)
    kw = dict(attention_mask=mask, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    want = hf.target_only_generate(pairs["default"][0], ids, max_new_tokens=n, **kw).sequences
    names = list(BOUNDS)
    tps: dict[str, list[float]] = {name: [] for name in names}
    last: dict[str, dict] = {}
    for rnd in range(args.rounds + 1):  # round 0 warms up, untimed
        for name in names[rnd % len(names):] + names[: rnd % len(names)]:
            target, draft = pairs[name]
            out = tree_generate(target, draft, ids, max_new_tokens=n, shape=shape,
                                clock=time.process_time, **kw)
            if not torch.equal(out.sequences, want):
                raise SystemExit(f"GREEDY MISMATCH: bound {name}")
            if rnd:
                tps[name].append(out.metrics.tokens_per_s)
                last[name] = out.metrics.as_dict()
    rows = [{"bound": name, "tokens_per_s_median": statistics.median(tps[name]),
             "ratio_to_default": [t / d for t, d in zip(tps[name], tps["default"], strict=True)],
             "dead_slots_end": last[name]["dead_slots"],
             "max_dead_slots": last[name]["max_dead_slots"],
             "compactions": last[name]["compactions"],
             "accepted_per_forward": last[name]["mean_accepted_length"]} for name in names]
    print(json.dumps({"tree": shape.label, "batch": args.batch, "max_new_tokens": n,
                      "threads": args.threads, "rounds": args.rounds,
                      "greedy_equal_to_target_only": True, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
