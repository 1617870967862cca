#!/usr/bin/env bash
# Train the three scoring fixtures concurrently on one GPU and install them into the package:
#
#   OUT=out scripts/gpu_train_solvers.sh [SECONDS] [EVAL_QUESTIONS] [MODELS] [EXTRA]
#       SECONDS: training seconds each (default 480); EVAL_QUESTIONS: test questions per task scored after (default 0);
#       MODELS: comma-separated (default all three); EXTRA: more train_solvers.py options, with {model} replaced by
#       the model's name (e.g. "--init-from out/prev/{model} --seed 1" continues earlier runs)
#
# KDA trains with fla's Triton chunk rule (`--scan-kernels fla`, checked against transformers' torch rule first): its
# wheels must be in .whl/ (`pip download --no-deps -d .whl fla-core==0.6.0 einops==0.8.2`), installed for that
# model's process only.
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
declare -A SCAN=([tiny-nemotron-h-solver]=torch [tiny-qwen3.5-solver]=torch [tiny-kimi-linear-solver]=fla)
if [[ ,$MODELS, == *,tiny-kimi-linear-solver,* ]]; then
  [[ -d out/fla-site/fla ]] ||  # concurrent invocations: install it first, once
    python -m pip install -q --no-index --no-deps --target out/fla-site .whl/fla_core-*.whl .whl/einops-*.whl || exit
fi
for model in ${MODELS//,/ }; do
  (
    [[ ${SCAN[$model]} == fla ]] && export PYTHONPATH="$PWD/out/fla-site:$PYTHONPATH"
    # shellcheck disable=SC2086
    timeout $((SECONDS_EACH + 100)) python scripts/train_solvers.py --model "$model" --out out/solvers \
      --time-budget "$SECONDS_EACH" --batch-size 8 --scan-kernels "${SCAN[$model]}" --eval-questions "$EVAL" \
      ${EXTRA//\{model\}/$model} > "$OUT/train-$model.log" 2>&1
    echo "exit $?" >> "$OUT/train-$model.log"
    if [[ -f out/solvers/$model/model.safetensors ]]; then
      tar czf "$OUT/$model.tgz" -C out/solvers "$model"
      mkdir -p "replayssm_eval/models/fixtures/$model" && cp out/solvers/"$model"/* "replayssm_eval/models/fixtures/$model/"
    fi
  ) &
done
wait
tail -n 4 "$OUT"/train-*.log
