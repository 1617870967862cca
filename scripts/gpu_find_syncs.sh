#!/usr/bin/env bash
# Host syncs of one teacher-forced KL call on each bundled fixture (benchmarks/find_syncs.py), per config.
#   OUT=out scripts/gpu_find_syncs.sh       # needs a GPU; about a minute
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_steps.sh syncs
for model in tiny-nemotron-h tiny-qwen3.5 tiny-kimi-linear; do
  for config in ${CONFIGS:-fp32 nvfp4/fp16sr}; do
    step "${model}_${config//\//-}" 120 . python benchmarks/find_syncs.py --model "$model" --config "$config"
  done
done
exit $status
