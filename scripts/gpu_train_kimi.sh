#!/usr/bin/env bash
# Train tiny-kimi-linear with long-memory KDA heads on one GPU: train the variants below concurrently,
# measure each one's shared-vs-split NVFP4 KL at 32K tokens, install the best as the fixture
# (scripts/fixture_memory.py says which and why). The 128K reproduction on it is a separate command:
# scripts/gpu_kl_repro.sh 131072 tiny-kimi-linear.
#
#   OUT=out scripts/gpu_train_kimi.sh [SECONDS]   # training time per variant (default 240); OUT defaults to out/
#
# Trains on the plays in data/shakespeare/ (the default of scripts/train_tiny.py), installs the chosen model into
# replayssm_eval/models/fixtures/tiny-kimi-linear/ of this checkout. $OUT gets kimi-variants.tgz (every variant's
# training.json and log, the 32K KL runs, the ranking) and kimi-fixture.tgz (the chosen model's files).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
SECONDS_EACH=${1:-240}
# HF's torch KDA chunk rule keeps [B, H, chunks, 64, 64, K] fp32 decay masks for backward (about 2 GB each at
# 16 x 2048): two variants at batch 16 would need about 100 GB, so each trains at batch 8
BATCH=${BATCH:-8}
VARIANTS=(
  "--long-heads 0.5 --beta-penalty 0.05"
  "--long-heads 0.5 --beta-penalty 0.3"
)
work=$OUT/kimi-variants
rm -rf "$work" && mkdir -p "$work"
for i in "${!VARIANTS[@]}"; do
  # shellcheck disable=SC2086
  timeout $((SECONDS_EACH + 120)) python scripts/train_tiny.py --model tiny-kimi-linear \
    --out $work/v$i --time-budget "$SECONDS_EACH" --batch-size "$BATCH" ${VARIANTS[$i]} > $work/train-v$i.log 2>&1 &
done
wait
for i in "${!VARIANTS[@]}"; do
  grep "held-out" $work/train-v$i.log
  model=$work/v$i/tiny-kimi-linear
  [[ -f $model/training.json ]] || { echo "variant $i did not finish"; tail -5 $work/train-v$i.log; continue; }
  timeout 150 python -m replayssm_eval kl --model "$model" --tokens 32768 --num-docs 1 --prompt-len 512 \
    --segment-len 4096 --backend triton --dtype float32 --output $work/kl-v$i \
    --config shared:nvfp4 --config nvfp4/fp32 > $work/kl-v$i.log 2>&1 &
done
wait
pairs=()
for i in "${!VARIANTS[@]}"; do
  [[ -f $work/kl-v$i/kl.json ]] && pairs+=("$work/v$i/tiny-kimi-linear:$work/kl-v$i") || tail -5 $work/kl-v$i.log
done
python scripts/fixture_memory.py "${pairs[@]}" | tee $work/ranking.txt
best=$(tail -1 $work/ranking.txt)
tar czf "$OUT/kimi-variants.tgz" --exclude="*.safetensors" -C "$OUT" kimi-variants
[[ -f $best/training.json ]] || { echo "no variant to install"; exit 1; }
dest=replayssm_eval/models/fixtures/tiny-kimi-linear
mkdir -p $dest && cp "$best"/* $dest/
tar czf "$OUT/kimi-fixture.tgz" -C $dest .
