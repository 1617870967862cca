#!/usr/bin/env bash
# The fixed-buffer decode step (`--step graph`'s) per fold variant, before and after a change, side by side in one
# run on one GPU, and the whole model on it. PARTS picks (default "speed tests engine"):
#   speed   benchmarks/static_step_speed.py from a previous checkout (PREV, a folder holding its replayssm_eval/ and
#           benchmarks/) and from this one, with the "some rows fold" step's kernel profile (FAMILIES, default all;
#           CONFIGS, default the script's)
#   tests   the static step's, encode_triton's and the delta-rule steps' tests on the GPU
#   checks  gpu_check_graph.py's checks on the bundled tiny models (graphs against eager, bit for bit)
#   graph   gpu_check_graph.py's fixed-batch speed of Qwen3.5-4B at batch 256 (`fp32` beside
#           `nvfp4:scale=head/fp16sr`, 1024-column cache, 256 new tokens), PREV's and this checkout's
#   engine  Qwen3.5-4B through the engine (`--step graph`, batch 256, 512-token prompts, 512 new tokens, `fp32`
#           beside `nvfp4:scale=head/fp16sr`)
# Logs and JSON go to $OUT/static-step/.
#
#   PREV=.prev OUT=out scripts/gpu_static_step.sh                                  # H200: about 7 minutes
#   PARTS="speed tests checks" FAMILIES=gdn,kda PREV=.prev OUT=out scripts/gpu_static_step.sh
#   PARTS="speed tests" FAMILIES=mamba2,gdn CONFIGS=sglang:fp8,pimba:mx8sr PREV=.prev OUT=out scripts/gpu_static_step.sh
set -uo pipefail
cd "$(dirname "$0")/.."
FILTER='^ *[-=]*$|^\s+(aten|cuda|void|Memcpy|Memset|Activity|triton_|_)'  # the profiles' noise
source scripts/gpu_steps.sh static-step
PARTS=" ${PARTS:-speed tests engine} "
part() { [[ $PARTS == *" $1 "* ]]; }
speed=(python benchmarks/static_step_speed.py --profile --families "${FAMILIES:-gdn,mamba2,kda}"
       ${CONFIGS:+--configs "$CONFIGS"})
if part speed; then
  [[ -n $PREV ]] && step speed_before 150 "$PREV" "${speed[@]}" --out "$dir/speed_before.json"
  step speed_after 150 . "${speed[@]}" --out "$dir/speed_after.json"
fi
part tests && step tests 240 . env REPLAYSSM_TEST_DEVICE=cuda python -m pytest -q -x -p no:cacheprovider \
  tests/kernels/test_static_step.py tests/formats/test_encode_triton.py tests/kernels/test_delta_triton.py
part checks && step checks 240 . python benchmarks/gpu_check_graph.py --out "$dir/checks" --skip-speed \
  --check-models tiny-qwen3.5 tiny-kimi-linear
graph=(python benchmarks/gpu_check_graph.py --skip-checks --no-hf --models qwen3.5-4b --batches 256 --new-tokens 256)
if part graph; then
  [[ -n $PREV ]] && step graph_before 240 "$PREV" "${graph[@]}" --out "$dir/graph_before"
  step graph_after 240 . "${graph[@]}" --out "$dir/graph_after"
fi
part engine && step engine 200 . python benchmarks/generation.py --out "$dir/engine" --models qwen3.5-4b \
  --parts decode --steps graph --batches 256 --prompt-len 512 --new-tokens 512 --no-hf
exit $status
