#!/usr/bin/env bash
# Retrain tiny-qwen3.5 with long-memory GDN heads on one GPU: train the variants below concurrently,
# measure each one's shared-vs-split NVFP4 KL at 32K tokens, install the best as the fixture
# (scripts/fixture_memory.py says which and why), then run the 128K reproduction on it.
#
#   OUT=out scripts/gpu_retrain_qwen.sh [SECONDS]   # training time per variant (default 270); OUT defaults to out/
#
# Trains on the plays in data/shakespeare/ (the default of scripts/train_tiny.py). Installs the chosen model into
# replayssm_eval/models/fixtures/tiny-qwen3.5/ of this checkout. $OUT gets variants.tgz (every variant's training.json and log, the 32K KL runs, the ranking), fixture.tgz (the
# chosen model's files, for replayssm_eval/models/fixtures/tiny-qwen3.5/) and kl-tiny-qwen3.5-131072.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
export OUT
SECONDS_EACH=${1:-270}
VARIANTS=(
  "--long-heads 0.5 --beta-penalty 0.05"
  "--long-heads 0.5 --beta-penalty 0.3"
  "--long-heads 1.0 --long-decay-min 0.99 --beta-penalty 0.1"
)
work=$OUT/variants
rm -rf "$work" && mkdir -p "$work"
for i in "${!VARIANTS[@]}"; do
  # shellcheck disable=SC2086
  timeout $((SECONDS_EACH + 150)) python scripts/train_tiny.py --model tiny-qwen3.5 \
    --out $work/v$i --time-budget "$SECONDS_EACH" ${VARIANTS[$i]} > $work/train-v$i.log 2>&1 &
done
wait
pairs=()
for i in "${!VARIANTS[@]}"; do
  grep "held-out" $work/train-v$i.log
  model=$work/v$i/tiny-qwen3.5
  [[ -f $model/training.json ]] || { echo "variant $i did not finish"; tail -5 $work/train-v$i.log; continue; }
  timeout 120 python -m replayssm_eval kl --model "$model" --tokens 32768 --num-docs 1 --prompt-len 512 \
    --segment-len 4096 --backend triton --dtype float32 --output $work/kl-v$i \
    --config shared:nvfp4 --config nvfp4/fp32 > $work/kl-v$i.log 2>&1 || tail -5 $work/kl-v$i.log
  [[ -f $work/kl-v$i/kl.json ]] && pairs+=("$model:$work/kl-v$i")
done
python scripts/fixture_memory.py "${pairs[@]}" | tee $work/ranking.txt
best=$(tail -1 $work/ranking.txt)
tar czf "$OUT/variants.tgz" --exclude="*.safetensors" -C "$OUT" variants
[[ -f $best/training.json ]] || { echo "no variant to install"; exit 1; }
dest=replayssm_eval/models/fixtures/tiny-qwen3.5
cp "$best"/* $dest/
tar czf "$OUT/fixture.tgz" -C $dest .
timeout 200 scripts/gpu_kl_repro.sh 131072 tiny-qwen3.5
