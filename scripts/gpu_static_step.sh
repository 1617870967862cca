#!/usr/bin/env bash
# The fixed-buffer decode step (`--step graph`'s) per fold variant, before and after a change, side by side in one
# run on one GPU: benchmarks/static_step_speed.py from a previous checkout (PREV, a folder holding its
# replayssm_eval/ and benchmarks/) and from this one, with the "some rows fold" step's kernel profile; the static
# step's, encode_triton's and the delta-rule steps' tests on the GPU; then Qwen3.5-4B through the engine (`--step
# graph`, batch 256, 512-token prompts, 512 new tokens, `fp32` beside `nvfp4:scale=head/fp16sr`). Logs and JSON go
# to $OUT/static-step/.
#
#   PREV=.prev OUT=out scripts/gpu_static_step.sh     # H200: about 7 minutes
set -uo pipefail
cd "$(dirname "$0")/.."
FILTER='^ *[-=]*$|^\s+(aten|cuda|void|Memcpy|Memset|Activity|triton_|_)'  # the profiles' noise
source scripts/gpu_steps.sh static-step
speed=(python benchmarks/static_step_speed.py --profile)
[[ -n $PREV ]] && step speed_before 150 "$PREV" "${speed[@]}" --out "$dir/speed_before.json"
step speed_after 150 . "${speed[@]}" --out "$dir/speed_after.json"
step tests 240 . env REPLAYSSM_TEST_DEVICE=cuda python -m pytest -q -x -p no:cacheprovider tests/kernels/test_static_step.py \
  tests/formats/test_encode_triton.py tests/kernels/test_delta_triton.py
step engine 200 . python benchmarks/generation.py --out "$dir/engine" --models qwen3.5-4b --parts decode --steps graph \
  --batches 256 --prompt-len 512 --new-tokens 512 --no-hf
exit $status
