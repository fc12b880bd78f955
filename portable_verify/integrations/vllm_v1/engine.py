"""Start a local vLLM engine with or without the plugin, generate, and read its counters.

Why here: ``portable-verify serve-check`` and the engine tests need the same few steps (the
environment a CPU engine needs, the plugin switch, a draft model, vLLM's spec-decode counters),
and those steps must import vLLM only when called. Every function spawns vLLM's engine
processes: callers guard their entry point with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from portable_verify.integrations.models import staged_folder
from portable_verify.integrations.vllm_v1.plugin import ENV_VAR

_DRAFT_MARKER = "draft.ok"
DRAFT_LAYERS = 20
"""Layers of the target kept in the default vLLM draft (of SmolLM2-135M's 30). Teacher-forced,
its greedy token agrees with the target's ~30% of the time (10 layers: ~2%, too rare to
exercise acceptance)."""

DEFAULT_PROMPTS = [
    "Count in words, one number per line, and keep going without stopping:\n" + "\n".join(
        ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen", "twenty", "twenty-one", "twenty-two"]) + "\n",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n    return a / b\n\n\n"
    "def mod(a, b):\n    return a % b\n\n\ndef",
    "The days of the week are Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and "
    "Sunday. The months of the year are January, February, March, April, May, June, July, "
    "August, September, October, November and December. The planets of the solar system are "
    "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus and Neptune. The seasons are",
    "Alice said hello to Bob. Bob said hello to Carol. Carol said hello to Dave. Dave said "
    "hello to Erin. Erin said hello to Frank. Frank said hello to Grace. Grace said hello to "
    "Heidi. Heidi said hello to Ivan. Ivan said hello to Judy. Judy said hello to Mallory. "
    "Mallory said hello to",
    "Question: What is the capital of France? Answer: Paris.\nQuestion: What is the capital "
    "of Germany? Answer: Berlin.\nQuestion: What is the capital of Italy? Answer: Rome.\n"
    "Question: What is the capital of Spain? Answer: Madrid.\nQuestion: What is the capital "
    "of Portugal? Answer:",
    "<ul>\n  <li>apple</li>\n  <li>banana</li>\n  <li>cherry</li>\n  <li>date</li>\n"
    "  <li>elderberry</li>\n  <li>fig</li>\n  <li>grape</li>\n  <li>",
    "Write a short story about a robot who learns to paint. The robot lived in a small town "
    "by the sea, and every morning it watched the fishermen leave the harbour. One day the "
    "robot found a box of old paints in the attic of the lighthouse. It carried the box down "
    "the stairs, opened it on the kitchen table, and",
    "SELECT name, age FROM users WHERE age > 30;\nSELECT name, age FROM users WHERE age > 40;"
    "\nSELECT name, age FROM users WHERE age > 50;\nSELECT name, age FROM users WHERE age > 60;"
    "\nSELECT name, age FROM users WHERE age >",
]
"""Prompts of 64+ tokens each (SmolLM2's tokenizer), some with the repetition n-gram drafts
feed on and some without."""
_SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}


def vllm_missing_reason() -> str | None:
    """None when vLLM imports here; else why not (for skips and error messages)."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # ImportError, or a broken build's own error
        return (f"vLLM is not importable ({type(exc).__name__}: {exc}); install it with "
                "`bash scripts/install.sh` or `pip install 'portable-verify[vllm]'`")
    return None


def layer_skip_draft_dir(target: Path, num_layers: int, cache: Path) -> Path:
    """A draft made of the target's first ``num_layers`` layers (plus its embeddings and head).

    Why: the offline model set has one model; a truncated copy is a real, cheaper draft with the
    same tokenizer whose proposals the target sometimes rejects (a copy of the target itself
    would accept everything and leave the rejection path untested). Written once, atomically.
    """
    from safetensors.torch import load_file, save_file

    out = cache / f"{target.name}-first{num_layers}layers"
    if (out / _DRAFT_MARKER).exists():
        return out
    config = json.loads((target / "config.json").read_text())
    if not 0 < num_layers < int(config["num_hidden_layers"]):
        raise ValueError(f"num_layers must lie in [1, {config['num_hidden_layers']}), "
                         f"got {num_layers}")
    weights = load_file(str(target / "model.safetensors"))
    kept = {name: t for name, t in weights.items()
            if ".layers." not in name or int(name.split(".layers.")[1].split(".")[0]) < num_layers}
    with staged_folder(out) as staging:
        for item in target.iterdir():
            if item.is_file() and item.suffix != ".safetensors" and item.name != "converted.ok":
                shutil.copy2(item, staging / item.name)
        config["num_hidden_layers"] = num_layers
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        save_file(kept, str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / _DRAFT_MARKER).write_text(f"first {num_layers} layers of {target.name}\n")
    return out


@dataclass
class EngineConfig:
    """One engine to start: the speculation it uses and the plugin mode of its processes."""

    name: str
    speculative_config: dict[str, Any] | None
    plugin: str  # "off", "fix" (expansion repair only) or "sampler"
    extra: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)  # e.g. the plugin's method


def start_engine(model: Path, config: EngineConfig, max_model_len: int = 512) -> Any:
    """A ``vllm.LLM`` on ``model`` (float32, eager, offline) with ``config``'s plugin mode.

    The mode travels in the environment, which vLLM's spawned engine and worker processes read
    when they load plugins; spawn (not fork) makes each engine's processes read it afresh.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    os.environ[ENV_VAR] = {"off": "0", "fix": "fix", "sampler": "1"}[config.plugin]
    os.environ.update(config.environment)
    import vllm

    return vllm.LLM(model=str(model), dtype="float32", max_model_len=max_model_len,
                    enforce_eager=True, speculative_config=config.speculative_config,
                    disable_log_stats=False, seed=0, **config.extra)


def stop_engine(llm: Any) -> None:
    """Shut the engine's processes down now (not at garbage collection)."""
    shutdown = getattr(llm, "shutdown", None)
    if callable(shutdown):
        shutdown()
    else:
        llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def spec_counters(llm: Any) -> dict[str, int]:
    """vLLM's own cumulative spec-decode counters (zeros for an engine without speculation)."""
    out = dict.fromkeys(_SPEC_COUNTERS.values(), 0)
    for metric in llm.get_metrics():
        key = _SPEC_COUNTERS.get(metric.name)
        if key is not None:
            out[key] = int(metric.value)
    return out


@dataclass
class Generation:
    """Token ids per prompt, wall time, and the spec-decode counters this call added."""

    token_ids: list[list[int]]
    seconds: float
    counters: dict[str, int]

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)

    @property
    def acceptance_rate(self) -> float:
        drafted = self.counters["num_draft_tokens"]
        return self.counters["num_accepted_tokens"] / drafted if drafted else float("nan")


def generate(llm: Any, prompts: list[str], params: Any | list[Any]) -> Generation:
    """Generate ``prompts`` in one batch; ``params`` one ``SamplingParams`` or one per prompt."""
    before = spec_counters(llm)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    after = spec_counters(llm)
    return Generation([list(o.outputs[0].token_ids) for o in outputs], seconds,
                      {k: after[k] - before[k] for k in after})


def worker_plugin_state(worker: Any = None) -> dict[str, Any]:
    """What the plugin installed in this process (run in vLLM's workers via ``collective_rpc``)."""
    import vllm.v1.sample.rejection_sampler as module

    sample = module.rejection_sample
    expand = module.expand_batch_to_tokens
    return {
        "sampler": bool(getattr(sample, "portable_verify", False)),
        "decision_calls": int(getattr(sample, "calls", 0)),
        "calls_with_draft_probs": int(getattr(sample, "calls_with_draft_probs", 0)),
        "method": getattr(sample, "method", None),
        "decision_seconds": float(getattr(sample, "seconds", 0.0)),
        "expansion": getattr(expand, "__module__", "?") + "." + getattr(expand, "__name__", "?"),
    }


def _worker_state(llm: Any) -> dict[str, Any]:
    try:
        return llm.collective_rpc(worker_plugin_state)[0]
    except Exception as exc:  # an engine build without callable RPCs
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_engine(model: Path, config: EngineConfig, workloads: dict[str, tuple[list[str], Any]],
               max_model_len: int = 512,
               warmup: dict[str, tuple[list[str], Any]] | None = None,
               ) -> tuple[dict[str, Generation], dict[str, Any]]:
    """Start one engine, run each named workload in order, stop it.

    Returns the generations by name and what the plugin installed in the engine's workers
    (read through ``collective_rpc``; ``{"error": ...}`` where the engine refuses the call).
    ``warmup`` workloads, if any, run first and are not returned; the workers' state after
    them is returned as ``state["after_warmup"]`` (so first-call costs, e.g. a JIT compile,
    can be told apart from the timed workloads'). One engine lives at a time, so several
    configurations fit in a small machine's memory.
    """
    saved = dict(os.environ)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # for worker_plugin_state
    try:
        llm = start_engine(model, config, max_model_len)
        try:
            before = None
            if warmup:
                for prompts, params in warmup.values():
                    generate(llm, prompts, params)
                before = _worker_state(llm)
            results = {name: generate(llm, prompts, params)
                       for name, (prompts, params) in workloads.items()}
            state = _worker_state(llm)
            if before is not None:
                state["after_warmup"] = before
        finally:
            stop_engine(llm)
    finally:  # the plugin switch must not leak into whatever this process does next
        os.environ.clear()
        os.environ.update(saved)
    return results, state
