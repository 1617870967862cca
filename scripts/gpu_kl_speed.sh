#!/usr/bin/env bash
# The KL path at full size on one GPU, with a plain HF forward beside it in the same run: teacher-forced tokens/s of
# each config (benchmarks/full_size.py) on both random-weight 4B presets, and each config's profile (top operators
# and kernels by GPU and CPU time); with PREV (a folder holding a previous checkout's replayssm_eval/ and benchmarks/),
# the CONFIGS_BEFORE rows from that code first, in the same run. Logs and JSON go to $OUT/kl-speed/.
#
#   OUT=out scripts/gpu_kl_speed.sh                                     # H200: about 5 minutes
#   PREV=.prev CONFIGS_BEFORE=nvfp4/fp16sr OUT=out scripts/gpu_kl_speed.sh
#   TOKENS=8192 CONFIGS=fp32,nvfp4/fp16sr PROFILE=0 OUT=out scripts/gpu_kl_speed.sh
set -uo pipefail
cd "$(dirname "$0")/.."
FILTER='^ *[-=]*$'
source scripts/gpu_steps.sh kl-speed
TOKENS=${TOKENS:-32768}
MODELS=${MODELS:-qwen3.5-4b,nemotron-3-nano-4b}
CONFIGS=${CONFIGS:-nvfp4/fp16sr,nvfp4:scale=row/fp16sr,fp32,vllm:int8,vllm:int16sr,flashinfer:int16}
CONFIGS_BEFORE=${CONFIGS_BEFORE:-nvfp4/fp16sr}
PROFILE=${PROFILE:-4096}
[[ -n $PREV ]] && step before 300 "$PREV" python benchmarks/full_size.py --models "$MODELS" --tokens "$TOKENS" \
  --configs "$CONFIGS_BEFORE" --out "$dir/before.json"
step full_size 400 . python benchmarks/full_size.py --models "$MODELS" --tokens "$TOKENS" --configs "$CONFIGS" \
  --profile-tokens "$PROFILE" --out "$dir/full_size.json"
exit $status
