#!/usr/bin/env bash
# One prepared command for a machine with an NVIDIA GPU and preinstalled torch + triton:
#   bash bench/gpu_check.sh OUT_DIR
# Runs bench/gpu_check.py (exactness vs the numpy reference, CUDA-graph capture, Triton vs torch
# vs memory-floor timings, tests/test_triton.py and the quick conformance kit on device="cuda")
# and leaves gpu_check.json, gpu_check.txt and the test logs in OUT_DIR. No install needed: the
# repository is put on PYTHONPATH. Hard limit: 6 minutes.
set -uo pipefail
OUT="${1:?usage: bench/gpu_check.sh OUT_DIR}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="$(command -v python || command -v python3)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
# A private, writable Triton cache; compiled kernels are reused between sections.
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-${TMPDIR:-/tmp}/portable_verify_triton_cache}"
unset TRITON_INTERPRET PORTABLE_VERIFY_BACKEND
cd "$ROOT"
{
  echo "# $(date -u +%FT%TZ) $(uname -a)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
} > "$OUT/machine.txt"
timeout -k 10 355 "$PY" bench/gpu_check.py "$OUT" 2>&1 | tee "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
echo "gpu_check exit status: $rc (0 = every section ran; see $OUT/gpu_check.json)"
exit "$rc"
