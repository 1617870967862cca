#!/usr/bin/env bash
# A GPU run of `replayssm-eval accuracy` on the two tiny models, in three phases, so that the GPU machine
# needs neither lm-eval, datasets nor math-verify: lm-eval builds the prompts and scores the answers on a
# CPU machine; the GPU only decodes (Triton decode steps, `python -m replayssm_eval.generate.offline`).
#
#   scripts/gpu_accuracy.sh prepare         # CPU: reports/accuracy-gpu/requests.jsonl (fixtures, all 17 questions)
#   OUT=out scripts/gpu_accuracy.sh gpu     # GPU: cuda generation tests, then $OUT/generations-<model>.jsonl
#                                           #   for every config (H200: under 5 minutes); OUT defaults to out/
#   scripts/gpu_accuracy.sh score DIR       # CPU, DIR = the GPU run's OUT: reports/accuracy-gpu/<model>/accuracy.{json,md}
#
# The configs, tasks, data and max_gen_toks are the same in all three phases (set below). Sampled runs: set
# SAMPLING="--gen-kwargs temperature=0.6,top_p=0.95,top_k=20 --samples 4" for prepare and score (the requests
# file carries the settings to the gpu phase).
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS=(tiny-nemotron-h tiny-qwen3.5)
CONFIGS=fp32,shared:nvfp4,nvfp4/fp16sr,nvfp4/fp8sr
MAX_GEN_TOKS=1024
DIR=reports/accuracy-gpu
COMMON=(--data fixtures --max-gen-toks "$MAX_GEN_TOKS" --configs "$CONFIGS")
read -ra SAMPLED <<< "${SAMPLING:-}"
COMMON+=("${SAMPLED[@]}")

case "${1:-}" in
  prepare)
    mkdir -p "$DIR"
    replayssm-eval accuracy "${COMMON[@]}" --export-requests "$DIR/requests.jsonl"
    ;;
  gpu)
    OUT=${OUT:-out}
    mkdir -p "$OUT"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
    python -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
    # the generation tests on cuda: fp32 == HF greedy generate, Triton decode step == step reference, scoring
    REPLAYSSM_TEST_DEVICE=cuda timeout 80 python -m pytest -q -p no:cacheprovider tests/tasks/test_generation.py \
      2>&1 | tee "$OUT/test_generation_cuda.log" || true
    for model in "${MODELS[@]}"; do
      # each config is appended whole: a rerun continues after the last finished one
      ( time timeout 100 python -m replayssm_eval.generate.offline "$DIR/requests.jsonl" "$OUT/generations-$model.jsonl" \
          --model "$model" --configs "$CONFIGS" --max-batch-size 32 ) 2>&1 | tee "$OUT/generate-$model.log" || true
    done
    ;;
  score)
    FROM=${2:?give the folder holding generations-<model>.jsonl}
    for model in "${MODELS[@]}"; do
      rm -rf "$DIR/$model"
      replayssm-eval accuracy "${COMMON[@]}" --model "$model" --generations "$FROM/generations-$model.jsonl" \
        --output "$DIR/$model"
      cp "$FROM/generate-$model.log" "$DIR/$model/" 2>/dev/null || true
    done
    cp "$FROM"/gpu.txt "$FROM"/test_generation_cuda.log "$DIR/" 2>/dev/null || true
    ;;
  *)
    echo "usage: $0 prepare | gpu | score DIR" >&2
    exit 2
    ;;
esac
