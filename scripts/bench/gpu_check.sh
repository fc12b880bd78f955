#!/usr/bin/env bash
# One prepared command for a machine with an NVIDIA GPU and preinstalled torch + triton:
#   bash scripts/bench/gpu_check.sh OUT_DIR
# A thin wrapper of `portable-verify gpu-check` (see its --help) with the repository on
# PYTHONPATH (no install needed), a private Triton cache and a hard time limit. Leaves
# gpu_check.json, machine.txt and the logs in OUT_DIR.
set -uo pipefail
OUT="${1:?usage: scripts/bench/gpu_check.sh OUT_DIR}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="$(command -v python || command -v python3)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-${TMPDIR:-/tmp}/portable_verify_triton_cache}"
unset TRITON_INTERPRET PORTABLE_VERIFY_BACKEND
cd "$ROOT"
{
  echo "# $(date -u +%FT%TZ) $(uname -a)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
} > "$OUT/machine.txt"
timeout -k 10 270 "$PY" -m portable_verify.cli.main gpu-check --out "$OUT" --budget 230 \
  ${GPU_CHECK_DRY_RUN:+--dry-run} 2>&1 | tee "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
echo "gpu_check exit status: $rc (0 = every section passed, 1 = one failed, 2 = no GPU; see $OUT/gpu_check.json)"
exit "$rc"
