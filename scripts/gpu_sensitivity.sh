#!/usr/bin/env bash
# `replayssm-eval sensitivity` at full size on one GPU: a random-weight preset saved as a model folder
# (benchmarks/save_random_model.py), then the per-layer study of one config over one document, timed
# end to end. sensitivity.json, the layers stage's kl.json and the log go to $OUT/sensitivity/.
#
#   MODEL=qwen3.5-4b TOKENS=32768 OUT=out scripts/gpu_sensitivity.sh      # H200: about 7 minutes
#   MODEL=tiny-qwen3.5 TOKENS=64 OUT=out scripts/gpu_sensitivity.sh       # a bundled fixture: the same steps on CPU
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-out}")
MODEL=${MODEL:-qwen3.5-4b}
TOKENS=${TOKENS:-32768}
CONFIG=${CONFIG:-nvfp4/fp16sr}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
dir=$OUT/sensitivity
mkdir -p "$dir"
work=$(mktemp -d)
model=$MODEL
if python -c "import sys; from replayssm_eval.models.presets import full_size_config; full_size_config(sys.argv[1])" \
    "$MODEL" 2>/dev/null; then
  model=$work/$MODEL
  python benchmarks/save_random_model.py --model "$MODEL" --out "$model" 2>&1 | tee "$dir/save.log"
fi
start=$(date +%s)
python -m replayssm_eval sensitivity --model "$model" --config "$CONFIG" --tokens "$TOKENS" --num-docs 1 \
  --prompt-len 512 --output "$work/study" 2>&1 | tee "$dir/sensitivity.log" | tr "\r" "\n" | grep -v "tok/s\]$" | tail -40
echo "sensitivity of $MODEL, $CONFIG, $TOKENS tokens: $(( $(date +%s) - start )) s end to end" | tee -a "$dir/sensitivity.log"
cp "$work/study/sensitivity.json" "$dir/"
cp "$work/study/layers/kl.json" "$dir/layers_kl.json"
nvidia-smi --query-gpu=name,memory.used --format=csv 2>/dev/null | tee -a "$dir/sensitivity.log" || true
