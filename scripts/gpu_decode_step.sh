#!/usr/bin/env bash
# Decode-step kernels before and after a change, side by side in one run on one GPU: kernel_speed's decode
# tables at batch 256 for the three families from a previous checkout (PREV, a folder holding its
# replayssm_eval/ and benchmarks/) and from this one, then the step kernels' device checks. Logs and JSON go
# to $OUT/decode-step/.
#
#   PREV=.prev OUT=out scripts/gpu_decode_step.sh     # H200: about 8 minutes
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_steps.sh decode-step
speed=(python benchmarks/kernel_speed.py --skip-chunked --quick --families kda,gdn,mamba2 --batches 256)
[[ -n $PREV ]] && step speed_before 150 "$PREV" "${speed[@]}" --out "$dir/speed_before.json"
step speed_after 150 . "${speed[@]}" --out "$dir/speed_after.json"
step check_kda 150 . python benchmarks/gpu_check_delta.py --family kda --quick --out "$dir/check_kda.json"
step check_gdn 150 . python benchmarks/gpu_check_delta.py --family gdn --quick --out "$dir/check_gdn.json"
step check_mamba2 150 . python benchmarks/gpu_check_mamba2.py --quick --out "$dir/check_mamba2.json"
exit $status
