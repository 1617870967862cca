#!/usr/bin/env bash
# Decode-step kernels before and after a change, side by side in one run on one GPU: kernel_speed's decode
# tables at batch 256 for FAMILIES (default: all three) from a previous checkout (PREV, a folder holding its
# replayssm_eval/ and benchmarks/) and from this one (QUICK="" adds the launch sweeps of the step kernels, within
# BUDGET seconds a run, default 130; SPEED="" skips this checkout's tables), then the device checks of the families
# in CHECKS (default: all three), then, for the families in NCU (default none), Nsight Compute's profile of one
# launch at batch 256: of the kernel_speed row NCU_ROW (default "non-flush nvfp4 read"; its NVTX range) and the
# kernel NCU_KERNEL (a regex, default _replay_step_kernel; KDA's flush: _replay_fold_kernel), its first NCU_COUNT
# launches there (default 1; KDA's reading step with its head terms: 2): speed of light, memory tables
# (L1/L2 hit rates), occupancy, warp states, instruction mix and source counters per SASS line (benchmarks/
# ncu_stalls.py sums them). Logs, JSON and the .ncu-rep reports go to $OUT/decode-step/.
#
#   PREV=.prev OUT=out scripts/gpu_decode_step.sh     # H200: about 8 minutes
#   FAMILIES=kda CHECKS=kda QUICK="" PREV=.prev OUT=out scripts/gpu_decode_step.sh
#   SPEED= CHECKS= FAMILIES=gdn NCU=gdn NCU_ROW="flush fp32" OUT=out scripts/gpu_decode_step.sh   # H100: 100 s
#   SPEED= CHECKS= FAMILIES=kda NCU=kda NCU_ROW="flush fp32" NCU_KERNEL=_replay_fold_kernel OUT=out \
#     scripts/gpu_decode_step.sh
#   SPEED= CHECKS= FAMILIES=kda NCU=kda NCU_ROW="non-flush fp32 read" NCU_KERNEL="_head_terms_kernel|_replay_step_kernel" \
#     NCU_COUNT=2 OUT=out scripts/gpu_decode_step.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_steps.sh decode-step
# shellcheck disable=SC2206  # QUICK: one flag or none
BUDGET=${BUDGET:-130}
speed=(python benchmarks/kernel_speed.py --skip-chunked ${QUICK---quick} --budget "$BUDGET"
       --families "${FAMILIES:-kda,gdn,mamba2}" --batches 256)
# the budget bounds the sweeps; the decode rows after them took up to 90 s more on an H200 (kda, gdn)
[[ -n $PREV ]] && step speed_before $((BUDGET + 90)) "$PREV" "${speed[@]}" --out "$dir/speed_before.json"
[[ -n ${SPEED-1} ]] && step speed_after $((BUDGET + 90)) . "${speed[@]}" --out "$dir/speed_after.json"
for family in ${CHECKS-kda gdn mamba2}; do
  check=(python benchmarks/gpu_check_delta.py --family "$family")
  [[ $family == mamba2 ]] && check=(python benchmarks/gpu_check_mamba2.py)
  step "check_$family" 150 . "${check[@]}" --quick --out "$dir/check_$family.json"
done
for family in ${NCU-}; do
  step "ncu_$family" 300 . ncu --clock-control none --nvtx \
    --nvtx-include "decode $family ${NCU_ROW:-non-flush nvfp4 read} B=256/" \
    --kernel-name "regex:${NCU_KERNEL:-_replay_step_kernel}" --launch-count "${NCU_COUNT:-1}" --import-source yes \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section Occupancy --section WarpStateStats --section InstructionStats --section SourceCounters \
    -f -o "$dir/ncu_$family" python benchmarks/kernel_speed.py --skip-chunked --quick --families "$family" --batches 256
  step "ncu_${family}_details" 60 . ncu -i "$dir/ncu_$family.ncu-rep" --page details
  step "ncu_${family}_source" 120 . ncu -i "$dir/ncu_$family.ncu-rep" --page source --print-source sass --csv
done
exit $status
