"""``portable-verify serve-check``: vLLM with and without the plugin, side by side, on CPU or GPU.

Starts vLLM on the default local model (SmolLM2-135M) once without speculation, then with n-gram
speculation (k=3) and with a draft model (the target's first layers, k=2), each once with the
plugin and once with vLLM's own sampler (its broken-expansion repaired, so the comparison is
fair). Reports tokens/s as ratios to the no-speculation engine, vLLM's own spec-decode counters
(acceptance rate, mean acceptance length), whether greedy output is token-identical to no
speculation, and the host time each verification decision took inside the engine (plugin and
vLLM's own function timed alike), plus an engine-free, interleaved timing of the two
decisions. Engines run one after another (each start costs 30-120 s), so engines are not
interleaved; each workload is repeated and reported as median [min, max].
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from portable_verify.cli.jsonout import add_json_option, to_stdout, write_json

_VERIFIERS = {"plugin": "sampler", "vllm": "fix", "vllm-unrepaired": "off"}


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve-check",
        help="vLLM with and without the portable_verify plugin: speed, acceptance, identity")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions of each workload")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="temperature of the sampled workload (seeded per request)")
    p.add_argument("--methods", default="ngram,draft",
                   help="speculation methods to compare (comma-separated: ngram, draft)")
    p.add_argument("--unrepaired", action="store_true",
                   help="also run vLLM's own sampler without the expansion repair")
    p.add_argument("--draft-layers", type=int, default=None,
                   help="layers of the target kept in the draft model (default 20)")
    add_json_option(p, "every figure and the run's context")
    p.set_defaults(func=run)


def _summary(gens: list[Any]) -> dict[str, Any]:
    rates = [g.num_tokens / g.seconds for g in gens]
    counters = {k: sum(g.counters[k] for g in gens) for k in gens[0].counters}
    drafted, drafts = counters["num_draft_tokens"], counters["num_drafts"]
    return {
        "tokens_per_s": {"median": statistics.median(rates), "min": min(rates),
                         "max": max(rates)},
        "acceptance_rate": counters["num_accepted_tokens"] / drafted if drafted else None,
        "mean_acceptance_length": (1 + counters["num_accepted_tokens"] / drafts
                                   if drafts else None),
        "counters": counters,
    }


def decision_cost(b: int = 8, k: int = 3, v: int = 49152, reps: int = 30) -> dict[str, Any]:
    """ms per verification step, the plugin's decision vs vLLM's ``rejection_sample``.

    Engine-free, one thread, the two interleaved call by call on the same inputs (vLLM's shapes
    for SmolLM2: ``V = 49152``); medians with min and max. Greedy and sampled batches.
    """
    import time
    import types

    import torch
    import vllm.v1.sample.rejection_sampler as module
    from vllm.platforms import current_platform

    from portable_verify.integrations.vllm_v1.sampler import make_rejection_sample

    current_platform.register_triton_kernel_overrides()
    theirs = getattr(module.rejection_sample, "vllm_original", module.rejection_sample)
    ours = make_rejection_sample(theirs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n = b * k
    logits = torch.randn(n, v, generator=g)
    drafts = torch.where(torch.rand(n, generator=g) < 0.5, logits.argmax(-1),
                         torch.randint(0, v, (n,), generator=g)).to(torch.int32)
    counts = [k] * b
    cu = torch.arange(1, b + 1, dtype=torch.int32) * k
    bonus = torch.randint(0, v, (b, 1), generator=g)
    out: dict[str, Any] = {"shape": {"B": b, "K": k, "V": v}, "threads": 1}
    try:
        for kind, temperature in (("greedy", None), ("sampled", torch.full((b,), 0.8))):
            md = types.SimpleNamespace(temperature=temperature, all_greedy=temperature is None,
                                       all_random=temperature is not None, generators={})
            times: dict[str, list[float]] = {"plugin": [], "vllm": []}
            for _ in range(reps):
                for name, fn in (("plugin", ours), ("vllm", theirs)):
                    start = time.perf_counter()
                    fn(drafts, counts, k, cu, None, logits, bonus, md)
                    times[name].append((time.perf_counter() - start) * 1e3)
            out[kind] = {name: {"median_ms": statistics.median(t), "min_ms": min(t),
                                "max_ms": max(t)} for name, t in times.items()}
            out[kind]["ratio_plugin_to_vllm"] = (out[kind]["plugin"]["median_ms"]
                                                 / out[kind]["vllm"]["median_ms"])
    finally:
        torch.set_num_threads(threads)
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run every engine and return the figures (plain data)."""
    from vllm import SamplingParams

    from portable_verify.bench import environment
    from portable_verify.integrations import models
    from portable_verify.integrations.vllm_v1 import engine

    target = models.converted_default_dir()
    prompts = engine.DEFAULT_PROMPTS
    greedy = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    sampled = [SamplingParams(temperature=args.temperature, seed=i, max_tokens=args.max_tokens)
               for i in range(len(prompts))]
    workloads = {f"{kind}{r}": (prompts, params) for r in range(args.repeats)
                 for kind, params in (("greedy", greedy), ("sampled", sampled))}
    specs: dict[str, dict[str, Any] | None] = {"none": None}
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if "ngram" in methods:
        specs["ngram"] = {"method": "ngram", "num_speculative_tokens": 3,
                          "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if "draft" in methods:
        layers = args.draft_layers or engine.DRAFT_LAYERS
        draft = engine.layer_skip_draft_dir(target, layers, models.cache_dir())
        specs["draft"] = {"method": "draft_model", "model": str(draft),
                          "num_speculative_tokens": 2}
    verifiers = ["plugin", "vllm"] + (["vllm-unrepaired"] if args.unrepaired else [])
    runs: dict[str, Any] = {}
    reference: list[list[int]] | None = None
    for method, spec in specs.items():
        for verifier in (["vllm"] if spec is None else verifiers):
            name = "no speculation" if spec is None else f"{method} + {verifier}"
            config = engine.EngineConfig(name, spec, _VERIFIERS[verifier])
            gens, state = engine.run_engine(target, config, workloads)
            greedy_ids = gens["greedy0"].token_ids
            if spec is None:
                reference = greedy_ids
            runs[name] = {
                "method": method, "verifier": verifier, "worker_state": state,
                "greedy": _summary([g for k, g in gens.items() if k.startswith("greedy")]),
                "sampled": _summary([g for k, g in gens.items() if k.startswith("sampled")]),
                "greedy_identical": greedy_ids == reference,
                # Host time of the verification decision inside the engine, per step.
                "decision_ms_per_step": (1e3 * state["decision_seconds"] / state["decision_calls"]
                                         if state.get("decision_calls") else None),
            }
    base = runs["no speculation"]
    for run in runs.values():
        for kind in ("greedy", "sampled"):
            run[kind]["speed_ratio"] = (run[kind]["tokens_per_s"]["median"]
                                        / base[kind]["tokens_per_s"]["median"])
    return {"machine": environment.machine(), "cpu_flags": _cpu_flags(),
            "decision_cost": decision_cost(),
            "versions": environment.library_versions(), "max_tokens": args.max_tokens,
            "repeats": args.repeats, "temperature": args.temperature,
            "num_prompts": len(prompts), "runs": runs}


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return []
    return sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))


def run(args: argparse.Namespace) -> int:
    from portable_verify.integrations.vllm_v1.engine import vllm_missing_reason

    problem = vllm_missing_reason()
    if problem:
        raise SystemExit(f"serve-check needs vLLM: {problem}")
    data = measure(args)
    if args.json:
        write_json(args.json, data)
    if to_stdout(args):
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"vLLM serve-check ({data['num_prompts']} requests x "
                        f"{data['max_tokens']} tokens; ratios to no speculation; "
                        f"CPU flags {' '.join(data['cpu_flags']) or '-'})",
                  title_justify="left")
    for col in ("engine", "greedy speed", "greedy accept", "identical", "sampled speed",
                "sampled accept", "decision ms/step"):
        table.add_column(col)

    def speed(s: dict[str, Any]) -> str:
        t = s["tokens_per_s"]
        return f"{s['speed_ratio']:.2f}x ({t['median']:.0f} [{t['min']:.0f}, {t['max']:.0f}] tok/s)"

    def accept(s: dict[str, Any]) -> str:
        rate = s["acceptance_rate"]
        return "-" if rate is None else f"{rate:.2f} (len {s['mean_acceptance_length']:.2f})"

    for name, r in data["runs"].items():
        table.add_row(name, speed(r["greedy"]), accept(r["greedy"]),
                      "yes" if r["greedy_identical"] else "[red]NO[/]",
                      speed(r["sampled"]), accept(r["sampled"]),
                      "-" if r["decision_ms_per_step"] is None
                      else f"{r['decision_ms_per_step']:.2f}")
    console = Console()
    console.print(table)
    cost = data["decision_cost"]
    for kind in ("greedy", "sampled"):
        c = cost[kind]
        console.print(f"decision only ({kind}, B={cost['shape']['B']} K={cost['shape']['K']} "
                      f"V={cost['shape']['V']}, 1 thread): plugin "
                      f"{c['plugin']['median_ms']:.2f} ms, vLLM {c['vllm']['median_ms']:.2f} ms "
                      f"(ratio {c['ratio_plugin_to_vllm']:.2f})")
    return 0
