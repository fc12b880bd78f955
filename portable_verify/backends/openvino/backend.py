"""OpenVINO backend: the verification rules as compiled OpenVINO graphs on CPU, GPU or NPU.

``backend="openvino"`` runs on the CPU plugin; ``"openvino:GPU"``, ``"openvino:NPU"`` (or any
name in ``openvino.Core().available_devices``) pick another device. Each graph variant is
compiled once per backend instance, with dynamic shapes, and keeps one infer request, so many
small calls pay only the inference itself. The token-wise graphs live in :mod:`.chain_graphs`,
block verification in :mod:`.block`, trees in :mod:`.tree`; the per-call scalars every graph
reads are one record (:mod:`.record`).

``openvino`` is imported lazily: importing this module never fails, and ``availability()``
says why the backend cannot run when the package is missing or the device is absent.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from portable_verify.backends.base import Availability, Backend, BackendTraits
from portable_verify.backends.openvino.record import argmax_block, call_scalars
from portable_verify.core import methods
from portable_verify.core.tree import TreeInputs
from portable_verify.core.types import PLACEHOLDER_TOKEN_ID, VerifyInputs

__all__ = ["OpenVINOBackend", "argmax_block"]

DEFAULT_DEVICE = "CPU"
ENV_THREADS = "PORTABLE_VERIFY_OPENVINO_THREADS"


Runner = Callable[[Any, VerifyInputs, dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray]]


def _token_wise(backend: Any, inputs: VerifyInputs, arrays: dict[str, np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray]:
    """One compiled token-wise graph (``chain_graphs.SAMPLED`` builds the sampled rule)."""
    from portable_verify.backends.openvino.chain_graphs import input_names

    variant = _variant(inputs, "draft_probs" in arrays)
    return backend.infer(variant, [arrays[name] for name in input_names(variant)])


def _block(backend: Any, inputs: VerifyInputs, arrays: dict[str, np.ndarray]
           ) -> tuple[np.ndarray, np.ndarray]:
    from portable_verify.backends.openvino.block import verify_block

    return verify_block(backend, inputs, arrays)


CHAIN_RULES: dict[str, Runner] = {"rejection": _token_wise, "typical": _token_wise,
                                  "block": _block}
"""The chain rules and what runs each: the family's chain table (its keys are its traits)."""
TREE_RULES = ("rejection", "typical", "traversal")  # narrower: the family's tree rules
"""The tree rules: ``tree.WALKS``' keys (``tests/test_openvino.py`` holds them equal; the
walks import openvino, which declaring the traits must not)."""


class OpenVINOBackend(Backend):
    """Verification as OpenVINO graphs; compiled per (variant, device) and cached."""

    name = "openvino"
    description = "OpenVINO runtime graphs (CPU by default; openvino:GPU, openvino:NPU)"
    array_kind = "numpy"
    devices = ("CPU", "GPU", "NPU")  # any OpenVINO device name is accepted; these are listed
    traits = BackendTraits(layouts=(methods.CHAIN, methods.TREE),
                           chain_rules=tuple(CHAIN_RULES), tree_rules=TREE_RULES)

    def __init__(self, device: str | None = None, *, num_threads: int | None = None) -> None:
        """``num_threads`` (default: ``$PORTABLE_VERIFY_OPENVINO_THREADS``, else OpenVINO's own
        choice) sets ``INFERENCE_NUM_THREADS`` where the device supports it."""
        self.device = (device or DEFAULT_DEVICE).upper()
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self._config_error = ""  # reported by availability(): `info` must not crash on it
        env = os.environ.get(ENV_THREADS, "").strip()
        if num_threads is None and env:
            if env.isdigit() and int(env) >= 1:
                num_threads = int(env)
            else:
                self._config_error = f"${ENV_THREADS} must be an integer >= 1, got {env!r}"
        self.num_threads = num_threads
        self._core: Any = None
        self._compiled: dict[Any, Any] = {}
        self._requests: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self._availability: Availability | None = None

    def availability(self) -> Availability:
        """Cached: dispatch asks on every call, and listing devices is slow."""
        if self._availability is None:
            self._availability = self._check_availability()
        return self._availability

    def _check_availability(self) -> Availability:
        if self._config_error:
            return Availability(False, self._config_error)
        try:
            import openvino as ov
        except ImportError as exc:
            return Availability(False, f"openvino is not installed ({exc}); pip install openvino")
        try:
            devices = self._available_devices()
        except Exception as exc:  # a broken plugin must not break `info`
            return Availability(False, f"openvino {ov.__version__} cannot list devices: {exc}")
        if not _device_present(self.device, devices):
            return Availability(
                False,
                f"OpenVINO device {self.device!r} is not available; available devices: {devices}",
            )
        return Availability(True, f"openvino {ov.__version__} on {self.device}")

    def _available_devices(self) -> list[str]:
        return list(self._get_core().available_devices)

    def _get_core(self) -> Any:
        if self._core is None:
            import openvino as ov

            self._core = ov.Core()
        return self._core

    def compiled_model(self, variant: Any, build: Callable[[], Any] | None = None) -> Any:
        """The compiled model of ``variant`` (a hashable graph key), built once: by ``build``
        when given, else as a ``chain_graphs.Variant``."""
        model = self._compiled.get(variant)
        if model is None:
            from portable_verify.backends.openvino import chain_graphs

            devices = self._available_devices()
            if not _device_present(self.device, devices):
                raise RuntimeError(
                    f"OpenVINO device {self.device!r} is not available; "
                    f"available devices: {devices}"
                )
            core = self._get_core()
            graph = build() if build is not None else chain_graphs.build(variant)
            model = core.compile_model(graph, self.device, self._compile_config())
            self._compiled[variant] = model
            self._requests[variant] = model.create_infer_request()
        return model

    def infer(self, variant: Any, arrays: list[np.ndarray],
              build: Callable[[], Any] | None = None) -> list[np.ndarray]:
        """Run the graph of ``variant`` on ``arrays`` (its inputs, in order); its outputs.

        Every input is shared (zero-copy): copying into the request's own dynamic-shape
        buffers is slower (docs/benchmarks.md, "OpenVINO"), and mixing shared and copied inputs
        on one request is a known CPU-plugin pitfall. Setting the tensors directly skips the
        Python ``infer(dict)`` dispatcher's per-call cost.
        """
        from openvino import Tensor

        with self._lock:
            self.compiled_model(variant, build)
            request = self._requests[variant]
            try:
                for i, array in enumerate(arrays):
                    request.set_input_tensor(i, Tensor(array, shared_memory=True))
                request.infer()
            except Exception:
                # A request that failed mid-inference keeps broken internal shapes and fails
                # every later call; a fresh one keeps the failure to this call.
                self._requests[variant] = self._compiled[variant].create_infer_request()
                raise
            return [request.get_output_tensor(i).data.copy()
                    for i in range(len(self._compiled[variant].outputs))]

    def _compile_config(self) -> dict[str, Any]:
        """f32 precision (the CPU plugin would pick bf16 on AVX-512 BF16 parts), latency hint,
        and no CPU pinning: a pinned call cannot migrate off a busy core, so on a shared host it
        waits for that core (docs/benchmarks.md, "OpenVINO")."""
        supported = set(self._get_core().get_property(self.device, "SUPPORTED_PROPERTIES"))
        wanted: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": "f32",
            "PERFORMANCE_HINT": "LATENCY",
            "ENABLE_CPU_PINNING": False,
        }
        if self.num_threads is not None:
            wanted["INFERENCE_NUM_THREADS"] = int(self.num_threads)
        return {key: value for key, value in wanted.items() if key in supported}

    def run(self, inputs: VerifyInputs) -> tuple[np.ndarray, np.ndarray]:
        b, k = inputs.batch_size, inputs.num_positions
        if b == 0:
            return np.zeros((0, k + 1), np.int64), np.zeros(0, np.int64)
        runner = _token_wise if inputs.all_greedy else CHAIN_RULES.get(inputs.sampled_method)
        if runner is None:
            raise methods.unknown_rule(inputs.sampled_method, self.qualified_name, methods.CHAIN)
        tokens, accepted = runner(self, inputs, _graph_arrays(inputs))
        if k == 0:  # undo the host padding of K = 0 to one unused position
            tokens = np.ascontiguousarray(tokens[:, :1])
        return tokens, accepted

    def run_tree(self, inputs: TreeInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from portable_verify.backends.openvino.tree import verify_tree_openvino

        inputs.check_layout()
        if not inputs.all_greedy and inputs.sampled_method not in TREE_RULES:
            raise methods.unknown_rule(inputs.sampled_method, self.qualified_name, methods.TREE)
        return verify_tree_openvino(self, inputs, call_scalars(inputs.vocab_size, inputs.typical))


def _variant(inputs: VerifyInputs, has_draft_probs: bool) -> Any:
    """The ``chain_graphs.Variant`` that decides ``inputs`` (token-wise methods)."""
    from portable_verify.backends.openvino.chain_graphs import Variant

    if inputs.all_greedy:
        return Variant()
    return Variant(
        inputs.sampled_method,
        is_logits=inputs.target_is_logits,
        # A rule that never reads the draft distribution (typical) gets a graph without it.
        has_draft_probs=has_draft_probs and methods.reads_draft_probs(inputs.sampled_method),
        with_greedy_rows=not inputs.none_greedy,
    )


def _device_present(device: str, devices: list[str]) -> bool:
    """``GPU`` matches ``GPU`` and ``GPU.0``; ``GPU.1`` must be listed itself."""
    return any(d == device or d.split(".", 1)[0] == device for d in devices)


def _graph_arrays(inputs: VerifyInputs) -> dict[str, np.ndarray]:
    """Contiguous arrays of the graph's dtypes, by input name; ``K = 0`` padded to ``K = 1``.

    The padding (one draft position no row uses, n stays 0) keeps zero-sized dimensions out of
    the graph; the uniforms keep their draw column last.
    """
    inputs.check_layout()
    drafts = inputs.draft_token_ids
    rows = inputs.target_rows
    u = inputs.uniforms
    k = drafts.shape[1]
    q = inputs.draft_probs if k > 0 else None  # with K = 0 no draft distribution is read
    if k == 0:
        drafts = np.full((drafts.shape[0], 1), PLACEHOLDER_TOKEN_ID, np.int64)
        rows = np.repeat(rows, 2, axis=1)
        u = None if u is None else np.repeat(u, 2, axis=1)
    arrays = {
        "target": np.ascontiguousarray(inputs.target, np.float32),
        "target_rows": np.ascontiguousarray(rows, np.int64),
        "draft_token_ids": np.ascontiguousarray(drafts, np.int64),
        "num_draft_tokens": np.ascontiguousarray(inputs.num_draft_tokens, np.int64),
        "scalars": call_scalars(int(inputs.target.shape[-1]), inputs.options.typical),
    }
    if u is not None:
        arrays["uniforms"] = np.ascontiguousarray(u, np.float32)
        arrays["temperature"] = np.ascontiguousarray(inputs.temperature, np.float32)
    if q is not None:
        arrays["draft_probs"] = np.ascontiguousarray(q, np.float32)
        arrays["draft_rows"] = np.ascontiguousarray(inputs.draft_rows, np.int64)
    return arrays
