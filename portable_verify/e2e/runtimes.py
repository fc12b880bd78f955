"""Target and draft for one run, in the runtime asked for, with conversion and load timed apart.

``torch``: transformers modules (the draft ``int8`` is the target dynamically quantised).
``openvino``: the same weights converted once to stateful OpenVINO models and compiled (the
draft ``int8``/``int4`` is the target's model with compressed weights). In both, ``ngram`` is
prompt lookup (no model) and any other draft name is a folder (or hub id) of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from portable_verify.e2e import ngram, openvino_model
from portable_verify.e2e.config import E2EConfig
from portable_verify.integrations import models


@dataclass
class Engines:
    """What the runner decodes with, and what preparing it cost."""

    target: Any
    draft: Any
    tokenizer: Any
    target_label: str
    draft_label: str
    conversion_s: float  # one-time work (GGUF dequantisation, OpenVINO conversion); 0 if cached
    load_s: float  # reading and compiling what was converted


def load_engines(cfg: E2EConfig, say: Callable[[str], None]) -> Engines:
    t0 = time.perf_counter()
    say(f"preparing target {cfg.target!r} (converting once where needed)")
    target_src, target_local = models.resolve(cfg.target)
    draft_src, draft_local = (None, True) if cfg.draft in ("int8", "int4", "ngram") \
        else models.resolve(cfg.draft)
    target_ir = draft_ir = None
    if cfg.runtime == "openvino":
        target_ir = openvino_model.export(target_src, target_local, "f32", say)
        if cfg.draft in ("int8", "int4"):
            draft_ir = openvino_model.export(target_src, target_local, cfg.draft, say)
        elif draft_src is not None:
            draft_ir = openvino_model.export(draft_src, draft_local, "f32", say)
    conversion_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    say(f"loading ({cfg.runtime} runtime)")
    tokenizer = models.load_tokenizer(target_src)
    if cfg.runtime == "openvino":
        target: Any = openvino_model.OpenVINOCausalLM(target_ir, cfg.threads)
        draft: Any = (openvino_model.OpenVINOCausalLM(draft_ir, cfg.threads, exact_kv=False)
                      if draft_ir is not None else None)
        vocab = target.vocab_size
        target_label = f"{cfg.target} (OpenVINO, f32)"
        draft_label = {"int8": "target, int8 weights (OpenVINO)",
                       "int4": "target, int4 weights (OpenVINO)"}.get(
                           cfg.draft, f"{cfg.draft} (OpenVINO, f32)")
    else:
        target = models.load_model(target_src, cfg.dtype)
        draft = None
        if cfg.draft == "int8":
            fp32 = target if cfg.dtype == "float32" else models.load_model(target_src)
            draft = models.int8_draft(fp32)
        elif draft_src is not None:
            draft = models.load_model(draft_src, cfg.dtype)
        vocab = target.config.vocab_size
        target_label = f"{cfg.target} (torch, {cfg.dtype})"
        draft_label = ("target, int8 dynamic (float32 activations)" if cfg.draft == "int8"
                       else f"{cfg.draft} (torch, {cfg.dtype})")
    if cfg.draft == "ngram":
        draft = ngram.NgramDraft(vocab)
        draft_label = "ngram (prompt lookup, no model)"
    return Engines(target, draft, tokenizer, target_label, draft_label, conversion_s,
                   time.perf_counter() - t1)
