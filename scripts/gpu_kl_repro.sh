#!/usr/bin/env bash
# The paper's qualitative result (docs/semantics.md, The paper's results) on the two tiny models, on one GPU.
#
#   OUT=out scripts/gpu_kl_repro.sh [TOKENS [MODEL ...]]   # default: 131072 tokens, both tiny models; OUT: out/
#
# Two documents of the bundled text (concatenated plays, batch 2), a 512-token prompt, TOKENS
# teacher-forced tokens, segments of 4096, Triton kernels, float32 weights and activations (in bf16
# any FP32-noise difference of an SSM output flips bf16 roundings downstream: the KL floor of a
# bf16 run of these models is 4e-5 to 1e-4, above some formats' effect). NVFP4 has its default per-head
# global scales, which the chunked Triton kernels round in the kernel.
# Each run directory is packed into $OUT/kl-<model>-<TOKENS>.tgz (kl.json, kl_buckets.csv, kl_vs_length.png, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
work=$OUT/kl-repro-work
mkdir -p "$work"
TOKENS=${1:-131072}
shift || true
MODELS=${*:-tiny-nemotron-h tiny-qwen3.5}
CONFIGS=(shared:nvfp4 nvfp4/fp32 nvfp4/fp16sr shared:fp8 shared:fp8sr fp32@16)
CLOSED_FOLD=(nvfp4/fp32#closed nvfp4/fp16sr#closed)  # the delta-rule models (GDN, KDA)

for model in $MODELS; do
  args=()
  for c in "${CONFIGS[@]}"; do args+=(--config "$c"); done
  if [[ $model == *qwen* || $model == *kimi* ]]; then for c in "${CLOSED_FOLD[@]}"; do args+=(--config "$c"); done; fi
  run=kl-$model-$TOKENS
  rm -rf "${work:?}/$run"
  ( time python -m replayssm_eval kl --model "$model" --tokens "$TOKENS" --num-docs 2 --batch-size 2 \
      --prompt-len 512 --segment-len 4096 --backend triton --dtype float32 --output "$work/$run" "${args[@]}" ) 2>&1 \
    | tr '\r' '\n' | grep -v "^ *$" | awk 'NR % 20 == 1 || !/it\/s|tok\/s/' | tee "$work/$run.log" || true
  cp "$work/$run.log" "$work/$run/" 2>/dev/null || true
  tar czf "$OUT/$run.tgz" -C "$work" "$run"
done
rm -rf "$work"
