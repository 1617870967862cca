#!/usr/bin/env bash
# Train the three scoring fixtures concurrently on one GPU and install them into the package:
#
#   OUT=out scripts/gpu_train_solvers.sh [SECONDS] [EVAL_QUESTIONS] [MODELS] [EXTRA]
#       SECONDS: training seconds each (default 480); EVAL_QUESTIONS: test questions per task scored after (default 0);
#       MODELS: comma-separated (default all three); EXTRA: more train_solvers.py options, with {model} replaced by
#       the model's name (e.g. "--init-from out/prev/{model} --seed 1" continues earlier runs)
#
# $OUT gets <model>.tgz (config, bf16 weights, tokenizer, training.json) and train-<model>.log per model; the models
# are also copied into replayssm_eval/models/fixtures/<model>/ of this checkout. Each run is killed after
# SECONDS + 100 s; a model is packed as soon as its script ends.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
SECONDS_EACH=${1:-480}
EVAL=${2:-0}
MODELS=${3:-tiny-nemotron-h-solver,tiny-qwen3.5-solver,tiny-kimi-linear-solver}
EXTRA=${4:-}
export PYTHONPATH="$PWD/scripts:$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT" out/solvers
# HF's torch KDA chunk rule keeps [B, H, chunks, 64, 64, K] fp32 decay masks for backward: KDA trains at batch 4
declare -A BATCH=([tiny-nemotron-h-solver]=8 [tiny-qwen3.5-solver]=8 [tiny-kimi-linear-solver]=4)
for model in ${MODELS//,/ }; do
  (
    # shellcheck disable=SC2086
    timeout $((SECONDS_EACH + 100)) python scripts/train_solvers.py --model "$model" --out out/solvers \
      --time-budget "$SECONDS_EACH" --batch-size "${BATCH[$model]}" --eval-questions "$EVAL" ${EXTRA//\{model\}/$model} \
      > "$OUT/train-$model.log" 2>&1
    echo "exit $?" >> "$OUT/train-$model.log"
    if [[ -f out/solvers/$model/model.safetensors ]]; then
      tar czf "$OUT/$model.tgz" -C out/solvers "$model"
      mkdir -p "replayssm_eval/models/fixtures/$model" && cp out/solvers/"$model"/* "replayssm_eval/models/fixtures/$model/"
    fi
  ) &
done
wait
tail -n 4 "$OUT"/train-*.log
