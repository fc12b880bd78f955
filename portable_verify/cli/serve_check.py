"""``portable-verify serve-check``: vLLM with and without the plugin, side by side, on CPU or GPU.

Starts vLLM on the default local model (SmolLM2-135M) without speculation, with n-gram
speculation (k=3) and with a draft model (the target's first layers, k=2), each speculative one
once with the plugin and once with vLLM's own sampler (its broken expansion repaired, so the
comparison is fair). Reports tokens/s as ratios to the no-speculation engine and plugin/vLLM
ratios, vLLM's own spec-decode counters (acceptance rate, mean acceptance length), whether
greedy output is token-identical to no speculation, and the host time each verification
decision took inside the engine (plugin and vLLM's own function timed alike, after a warm-up),
plus an engine-free, interleaved timing of the two decisions.

Each engine start costs 30-120 s, so engines are not interleaved batch by batch; instead every
repeat starts every engine once, and the order alternates (ABBA): even repeats run
``no speculation, ngram + vllm, ngram + plugin, draft + vllm, draft + plugin``, odd repeats
the reverse, so each engine sees both positions and slow drift of the machine's load cancels
in the medians and in the per-repeat plugin/vLLM ratios (the two engines of a pair run
back to back).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

from portable_verify.cli import checks
from portable_verify.cli.jsonout import add_json_option, json_only, to_stdout, write_json
from portable_verify.cli.progress import Progress, add_quiet_option, verdict

_VERIFIERS = {"plugin": "sampler", "vllm": "fix", "vllm-unrepaired": "off"}


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve-check",
        help="vLLM with and without the portable_verify plugin: speed, acceptance, identity")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    p.add_argument("--repeats", type=int, default=4,
                   help="engine starts per engine; the order reverses every other repeat "
                        "(ABBA), so an even number balances it")
    p.add_argument("--batches", type=int, default=1,
                   help="timed batches of each workload per engine start (after a warm-up)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="temperature of the sampled workload (seeded per request)")
    p.add_argument("--methods", default="ngram,draft",
                   help="speculation methods to compare (comma-separated: ngram, draft)")
    p.add_argument("--unrepaired", action="store_true",
                   help="also run vLLM's own sampler without the expansion repair")
    p.add_argument("--draft-layers", type=int, default=None,
                   help="layers of the target kept in the draft model (default 20)")
    p.add_argument("--seam", action="store_true",
                   help="engine-free: time vLLM's own rejection_sample against the plugin's "
                        "on the same inputs (no engine starts; docs/benchmarks.md)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch (and numba) threads for --seam (default 1)")
    add_json_option(p, "every figure and the run's context")
    add_quiet_option(p)
    checks.register(p, run, check)


METHODS = ("ngram", "draft")


def check(args: argparse.Namespace) -> None:
    """Counts, the temperature, the methods and the JSON path, before any engine starts."""
    for flag, value in (("--max-tokens", args.max_tokens), ("--repeats", args.repeats),
                        ("--batches", args.batches), ("--draft-layers", args.draft_layers),
                        ("--threads", args.threads)):
        checks.at_least(flag, value, 1)
    checks.finite("--temperature", args.temperature, low=0.0)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise checks.UsageError("--methods", f"unknown {unknown or args.methods!r}; choose "
                                f"from {', '.join(METHODS)} (comma-separated)")
    checks.writable_file("--json", args.json, stdout_ok=True)


def _spread(values: list[float]) -> dict[str, Any]:
    """Median, min, max and the values themselves (in repeat order)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def engine_order(names: list[str], repeats: int) -> list[list[str]]:
    """The engines of each repeat: ``names`` in even repeats, reversed in odd ones (ABBA)."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(repeats)]


def _per_start(gens: dict[str, Any], kind: str) -> tuple[float, dict[str, int]]:
    """tokens/s of one engine start (median over its batches) and its summed counters."""
    batches = [g for name, g in gens.items() if name.startswith(kind)]
    rate = statistics.median(g.num_tokens / g.seconds for g in batches)
    return rate, {k: sum(g.counters[k] for g in batches) for k in batches[0].counters}


def _acceptance(counters: dict[str, int]) -> dict[str, Any]:
    drafted, drafts = counters["num_draft_tokens"], counters["num_drafts"]
    return {"acceptance_rate": counters["num_accepted_tokens"] / drafted if drafted else None,
            "mean_acceptance_length": (1 + counters["num_accepted_tokens"] / drafts
                                       if drafts else None),
            "counters": counters}


def _decision(state: dict[str, Any]) -> tuple[float, int, float, int]:
    """Decision seconds and calls in the timed batches, then in the warm-up."""
    warm = state.get("after_warmup") or {}
    ws, wc = float(warm.get("decision_seconds", 0.0)), int(warm.get("decision_calls", 0))
    return (float(state.get("decision_seconds", 0.0)) - ws,
            int(state.get("decision_calls", 0)) - wc, ws, wc)


def decision_cost(b: int = 8, k: int = 3, v: int = 49152, reps: int = 30) -> dict[str, Any]:
    """ms per verification step, the plugin's decision vs vLLM's ``rejection_sample``.

    Engine-free, one thread, the two interleaved call by call on the same inputs (vLLM's shapes
    for SmolLM2: ``V = 49152``); medians with min and max, after one untimed first call of each
    (reported as ``first_call_ms``: a JIT compile or cache load lands there). Greedy and sampled
    batches.
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
            first: dict[str, float] = {}
            for name, fn in (("plugin", ours), ("vllm", theirs)):  # untimed: JIT, caches
                start = time.perf_counter()
                fn(drafts, counts, k, cu, None, logits, bonus, md)
                first[name] = (time.perf_counter() - start) * 1e3
            for _ in range(reps):
                for name, fn in (("plugin", ours), ("vllm", theirs)):
                    start = time.perf_counter()
                    fn(drafts, counts, k, cu, None, logits, bonus, md)
                    times[name].append((time.perf_counter() - start) * 1e3)
            out[kind] = {name: {"median_ms": statistics.median(t), "min_ms": min(t),
                                "max_ms": max(t)} for name, t in times.items()}
            for name, ms in first.items():
                out[kind][name]["first_call_ms"] = ms
            out[kind]["ratio_plugin_to_vllm"] = (out[kind]["plugin"]["median_ms"]
                                                 / out[kind]["vllm"]["median_ms"])
    finally:
        torch.set_num_threads(threads)
    return out


def measure(args: argparse.Namespace,
            say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run every engine ``args.repeats`` times in alternating order; return plain data
    (``say`` hears each engine start as it ends)."""
    from vllm import SamplingParams

    from portable_verify.bench import environment
    from portable_verify.integrations import models
    from portable_verify.integrations.vllm_v1 import engine

    target = models.converted_default_dir()
    prompts = engine.DEFAULT_PROMPTS
    greedy = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    sampled = [SamplingParams(temperature=args.temperature, seed=i, max_tokens=args.max_tokens)
               for i in range(len(prompts))]
    workloads = {f"{kind}{b}": (prompts, params) for b in range(args.batches)
                 for kind, params in (("greedy", greedy), ("sampled", sampled))}
    # Untimed, short: first-call costs (the plugin's JIT compile, vLLM's lazy set-up) land here.
    warmup = {"warmup_greedy": (prompts, SamplingParams(temperature=0, max_tokens=8)),
              "warmup_sampled": (prompts, [SamplingParams(temperature=args.temperature,
                                                          seed=1000 + i, max_tokens=8)
                                           for i in range(len(prompts))])}
    specs: dict[str, dict[str, Any]] = {}
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if "ngram" in methods:
        specs["ngram"] = {"method": "ngram", "num_speculative_tokens": 3,
                          "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if "draft" in methods:
        layers = args.draft_layers or engine.DRAFT_LAYERS
        draft = engine.layer_skip_draft_dir(target, layers, models.cache_dir())
        specs["draft"] = {"method": "draft_model", "model": str(draft),
                          "num_speculative_tokens": 2}
    verifiers = ["vllm", "plugin"] + (["vllm-unrepaired"] if args.unrepaired else [])
    configs: dict[str, tuple[str, str, dict[str, Any] | None]] = {
        "no speculation": ("none", "vllm", None)}
    for method, spec in specs.items():
        for verifier in verifiers:
            configs[f"{method} + {verifier}"] = (method, verifier, spec)
    order = engine_order(list(configs), args.repeats)

    starts: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for r, names in enumerate(order):
        for position, name in enumerate(names):
            method, verifier, spec = configs[name]
            gens, state = engine.run_engine(target, engine.EngineConfig(
                name, spec, _VERIFIERS[verifier]), workloads, warmup=warmup)
            start: dict[str, Any] = {"repeat": r, "position": position,
                                     "greedy_ids": gens["greedy0"].token_ids}
            for kind in ("greedy", "sampled"):
                start[kind], start[f"{kind}_counters"] = _per_start(gens, kind)
            start["decision"] = _decision(state)
            start["worker_state"] = state
            starts[name].append(start)
            say(f"repeat {r + 1}/{len(order)}: {name}: greedy {start['greedy']:.1f}, sampled "
                f"{start['sampled']:.1f} tokens/s")

    reference = starts["no speculation"][0]["greedy_ids"]
    runs: dict[str, Any] = {}
    for name, (method, verifier, _) in configs.items():
        s = starts[name]
        seconds, calls, warm_seconds, warm_calls = (
            sum(x) for x in zip(*(st["decision"] for st in s), strict=True))
        run: dict[str, Any] = {
            "method": method, "verifier": verifier,
            "positions": [st["position"] for st in s],
            "worker_state": s[-1]["worker_state"],
            "greedy_identical": all(st["greedy_ids"] == reference for st in s),
            # Host time of the verification decision inside the engine, per step, in the timed
            # batches (after the warm-up) and in the warm-up (first calls: JIT compile etc.).
            "decision_ms_per_step": 1e3 * seconds / calls if calls else None,
            "decision_warmup_ms_per_step": 1e3 * warm_seconds / warm_calls if warm_calls
            else None,
        }
        for kind in ("greedy", "sampled"):
            counters = {k: sum(st[f"{kind}_counters"][k] for st in s)
                        for k in s[0][f"{kind}_counters"]}
            base = starts["no speculation"]
            run[kind] = {"tokens_per_s": _spread([st[kind] for st in s]),
                         # ratio to no speculation within each repeat
                         "speed_ratio": _spread([st[kind] / b[kind]
                                                 for st, b in zip(s, base, strict=True)]),
                         **_acceptance(counters)}
        runs[name] = run

    pairs: dict[str, Any] = {}
    for method in specs:
        for verifier in verifiers[:1] + verifiers[2:]:
            ours, theirs = starts[f"{method} + plugin"], starts[f"{method} + {verifier}"]
            pairs[f"{method}: plugin / {verifier}"] = {
                "first": ["plugin" if o["position"] < t["position"] else verifier
                          for o, t in zip(ours, theirs, strict=True)],
                **{kind: _spread([o[kind] / t[kind]
                                  for o, t in zip(ours, theirs, strict=True)])
                   for kind in ("greedy", "sampled")}}
    return {"machine": environment.machine(), "cpu_flags": _cpu_flags(),
            "decision_cost": decision_cost(),
            "versions": environment.library_versions(), "max_tokens": args.max_tokens,
            "repeats": args.repeats, "batches": args.batches, "temperature": args.temperature,
            "num_prompts": len(prompts), "order": order, "runs": runs, "pairs": pairs}


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return []
    return sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))


def _fmt(s: dict[str, Any], digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}, {s['max']:.{digits}f}]"


def _table(title: str, columns: tuple[str, ...]) -> Any:
    """A left-titled rich table with these columns (rich is imported only to print)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    return table


def run_seam(args: argparse.Namespace) -> int:
    """``--seam``: the engine-free decision benchmark; skips (exit 0) where vLLM is missing."""
    from portable_verify.bench import environment, vllm_seam

    problem = vllm_seam.vllm_missing_reason()
    if problem:
        print(f"serve-check --seam skipped: {problem}")
        if args.json:
            write_json(args.json, {"skipped": problem})
        return 0
    with Progress("serve-check", quiet=args.quiet) as progress:
        progress.say(f"timing the verification seam engine-free on {args.threads} thread(s)")
        data = {"machine": environment.machine(), "cpu_flags": _cpu_flags(),
                "versions": environment.library_versions(), **vllm_seam.measure(args.threads)}
    if json_only(args, data):
        verdict("serve-check", _seam_verdict(data), to_stderr=True)
        return 0
    from rich.console import Console

    table = _table(f"vLLM seam, engine-free ({data['threads']} thread(s); drafts equal the "
                   f"target argmax with probability {data['draft_hit_probability']} per "
                   "position; interleaved; median [min, max] ms)",
                   ("B, K, V", "mode", "plugin ms", "vLLM ms", "vLLM / plugin", "greedy equal"))

    def ms(t: dict[str, Any]) -> str:
        return f"{t['median_ms']:.3f} [{t['min_ms']:.3f}, {t['max_ms']:.3f}]"

    for c in data["cells"]:
        equal = "-" if c["greedy_identical"] is None else "yes" if c["greedy_identical"] else "NO"
        table.add_row(f"{c['B']}, {c['K']}, {c['V']}", c["mode"], ms(c["plugin"]),
                      ms(c["vllm"]), f"{c['vllm_over_plugin']:.2f}x", equal)
    console = Console()
    console.print(table)
    t = data["typical"]
    console.print(f"typical (plugin, all sampled) at B={t['B']} K={t['K']} V={t['V']}: "
                  f"{ms(t['plugin typical (sampled)'])} ms vs vLLM's all-greedy step "
                  f"{ms(t['vllm all greedy'])} ms: ratio {t['typical_over_vllm_greedy']:.2f} "
                  "(target <= 1)")
    verdict("serve-check", _seam_verdict(data))
    return 0


def _seam_verdict(data: dict[str, Any]) -> str:
    """Cells timed, greedy equality, and the median vLLM / plugin ratio."""
    cells = data["cells"]
    ratios = [c["vllm_over_plugin"] for c in cells]
    unequal = sum(c["greedy_identical"] is False for c in cells)
    return (f"seam: {len(cells)} cells, vLLM / plugin median {statistics.median(ratios):.2f}x"
            f" ({min(ratios):.2f}-{max(ratios):.2f}); greedy "
            + ("equal wherever checked" if not unequal else f"DIFFERS in {unequal} cell(s)"))


def _engine_verdict(data: dict[str, Any]) -> str:
    """Greedy identity across engines and the plugin / vLLM sampled tokens/s ratios."""
    runs = data["runs"]
    differ = [name for name, r in runs.items() if not r["greedy_identical"]]
    pairs = ", ".join(f"{name} {p['sampled']['median']:.2f}x sampled"
                      for name, p in data["pairs"].items())
    held = ("greedy identical to no speculation in every engine" if not differ
            else f"greedy DIFFERS in {', '.join(differ)}")
    return f"{len(runs)} engines x {data['repeats']} repeats; {held}; {pairs or 'no pairs'}"


def run(args: argparse.Namespace) -> int:
    if args.seam:
        return run_seam(args)
    from portable_verify.integrations.vllm_v1.engine import vllm_missing_reason

    problem = vllm_missing_reason()
    if problem:
        raise SystemExit(f"serve-check needs vLLM: {problem}")
    with Progress("serve-check", quiet=args.quiet) as progress:
        data = measure(args, progress.say)
    if json_only(args, data):
        verdict("serve-check", _engine_verdict(data), to_stderr=to_stdout(args))
        return 0
    from rich.console import Console

    table = _table(f"vLLM serve-check ({data['num_prompts']} requests x {data['max_tokens']} "
                   f"tokens; {data['repeats']} repeats, order alternating; speed = ratio to no "
                   f"speculation in the same repeat, median [min, max]; CPU flags "
                   f"{' '.join(data['cpu_flags']) or '-'})",
                   ("engine", "greedy speed", "greedy accept", "identical", "sampled speed",
                    "sampled accept", "decision ms/step"))

    def speed(s: dict[str, Any]) -> str:
        return f"{_fmt(s['speed_ratio'])} ({_fmt(s['tokens_per_s'], 0)} tok/s)"

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
    pairs = _table("plugin / vLLM tokens/s, per repeat (engines of a pair back to back)",
                   ("pair", "first", "greedy per repeat", "greedy median [min, max]",
                    "sampled per repeat", "sampled median [min, max]"))
    for name, p in data["pairs"].items():
        pairs.add_row(name, " ".join(p["first"]),
                      " ".join(f"{v:.2f}" for v in p["greedy"]["values"]), _fmt(p["greedy"]),
                      " ".join(f"{v:.2f}" for v in p["sampled"]["values"]), _fmt(p["sampled"]))
    console.print(pairs)
    for r, names in enumerate(data["order"]):
        console.print(f"order, repeat {r}: {', '.join(names)}")
    cost = data["decision_cost"]
    for kind in ("greedy", "sampled"):
        c = cost[kind]
        console.print(f"decision only ({kind}, B={cost['shape']['B']} K={cost['shape']['K']} "
                      f"V={cost['shape']['V']}, 1 thread): plugin "
                      f"{c['plugin']['median_ms']:.2f} ms, vLLM {c['vllm']['median_ms']:.2f} ms "
                      f"(ratio {c['ratio_plugin_to_vllm']:.2f}; first calls "
                      f"{c['plugin']['first_call_ms']:.0f} / {c['vllm']['first_call_ms']:.0f} ms)")
    verdict("serve-check", _engine_verdict(data))
    return 0
