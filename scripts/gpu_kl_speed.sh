#!/usr/bin/env bash
# The KL path at full size on one GPU, with a plain HF forward beside it in the same run: teacher-forced tokens/s of
# each config (benchmarks/full_size.py) on both random-weight 4B presets, each config's profile (top operators and
# kernels by GPU and CPU time), then the GPU checks of what these paths run (the static step's and encode_triton's
# tests on the GPU; the graph step's bit-for-bit checks of CONFIGS_CHECK on the bundled fixtures). Logs and JSON go
# to $OUT/kl-speed/.
#
#   OUT=out scripts/gpu_kl_speed.sh                         # H200: about 9 minutes
#   TOKENS=8192 CONFIGS=fp32,nvfp4/fp16sr OUT=out scripts/gpu_kl_speed.sh
set -uo pipefail
cd "$(dirname "$0")/.."
FILTER='^ *[-=]*$'
source scripts/gpu_steps.sh kl-speed
TOKENS=${TOKENS:-32768}
CONFIGS=${CONFIGS:-fp32,nvfp4/fp16sr,nvfp4:scale=row/fp16sr,vllm:int8,vllm:int16sr,flashinfer:int16}
CONFIGS_CHECK=${CONFIGS_CHECK:-}
step full_size 300 . python benchmarks/full_size.py --models qwen3.5-4b,nemotron-3-nano-4b --tokens "$TOKENS" \
  --configs "$CONFIGS" --profile-tokens 4096 --out "$dir/full_size.json"
[[ -n $CONFIGS_CHECK ]] && step graph_check 140 . python benchmarks/gpu_check_graph.py --out "$dir/graph" --skip-speed \
  --check-configs "$CONFIGS_CHECK"
step tests 130 . env REPLAYSSM_TEST_DEVICE=cuda python -m pytest -q -x -p no:cacheprovider tests/kernels/test_static_step.py \
  tests/formats/test_encode_triton.py
exit $status
