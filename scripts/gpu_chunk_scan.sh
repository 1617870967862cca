#!/usr/bin/env bash
# The chunked kernels before and after a change, on one GPU: the CUDA tests in TESTS (default: Mamba-2's) and
# benchmarks/gpu_check_mamba2.py, then benchmarks/layer_speed.py for FAMILIES (default mamba2: Nemotron-3-Nano-4B's
# geometry) from this checkout (saving the first segment's output and stored copies) and from each previous checkout
# in PREVS (space-separated folders holding a checkout's replayssm_eval/ and benchmarks/), each compared bit for bit
# with this one's; with SWEEP (a comma-separated list of configs) also this checkout's launch sweep of them (LAUNCHES:
# layer_speed.py's --launches, as JSON the launch configs swept in some families). TESTS=""
# skips the tests and the check; TEST_SECONDS (300) limits the tests (138 of the 211 quick tests of the three
# chunked test files ran in 320 s on an H200, most of it compiling); TEST_K selects tests by pytest's -k and
# TEST_WORKERS runs them over that many pytest-xdist workers; SPEED_SECONDS (200) limits each checkout's speed run.
# NCU (a comma-separated list of configs) profiles each one's launch LAUNCH_SKIP (default 1: the first timed one
# where the warm-up call is one launch; GDN's calls of 2048 one-token windows are two) of the kernel matching KERNEL
# (a regex, default _token_scan_kernel) with Nsight Compute (where the machine lets it read the counters): its
# details page and its source counters per SASS line (benchmarks/ncu_stalls.py sums them). Logs, JSON and the
# .ncu-rep reports go to $OUT/chunk-scan/.
#
#   PREVS=.prev OUT=out scripts/gpu_chunk_scan.sh      # H200: about 5 minutes
#   FAMILIES=mamba2,gdn TESTS="tests/kernels/test_mamba2_triton.py tests/kernels/test_delta_triton.py" PREVS=.prev \
#     OUT=out scripts/gpu_chunk_scan.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_steps.sh chunk-scan
PREVS=${PREVS:-}
TOKENS=${TOKENS:-8192}
CONFIGS=${CONFIGS:-nvfp4/fp16sr@16,nvfp4:scale=row/fp16sr@16,fp32/fp32@16,shared:nvfp4:scale=head@16,vllm:int16sr}
TESTS=${TESTS-tests/kernels/test_mamba2_triton.py}
FAMILIES=${FAMILIES:-mamba2}
NCU=${NCU:-}
if [[ -n $TESTS ]]; then
  # shellcheck disable=SC2086  # TESTS is a list of paths
  step tests "${TEST_SECONDS:-300}" . env REPLAYSSM_TEST_DEVICE=cuda python -m pytest -q -x -m "not slow" -p no:cacheprovider \
    ${TEST_K:+-k "$TEST_K"} ${TEST_WORKERS:+-n "$TEST_WORKERS"} $TESTS
  step gpu_check_mamba2 150 . python benchmarks/gpu_check_mamba2.py --quick --out "$dir/gpu_check_mamba2.json"
fi
# each checkout runs its own benchmarks/layer_speed.py
speed=(python benchmarks/layer_speed.py --families "$FAMILIES" --tokens "$TOKENS" --configs "$CONFIGS")
step speed_after "${SPEED_SECONDS:-200}" . "${speed[@]}" --save-outputs "$dir/outputs.pt" --out "$dir/speed_after.json" \
  ${SWEEP:+--sweep "$SWEEP"} ${LAUNCHES:+--launches "$LAUNCHES"}
for prev in $PREVS; do
  step "speed_$(basename "$prev" | tr -d .)" "${SPEED_SECONDS:-200}" "$prev" "${speed[@]}" --compare-outputs "$dir/outputs.pt" \
    --out "$dir/speed_$(basename "$prev" | tr -d .).json"
done
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
          --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats
          --section SourceCounters --import-source yes)
for config in ${NCU//,/ }; do
  name=ncu_$(printf %s "$config" | tr -c "A-Za-z0-9" _)
  step "$name" 200 . ncu --clock-control none \
    --kernel-name "regex:${KERNEL:-_token_scan_kernel}" --launch-skip "${LAUNCH_SKIP:-1}" --launch-count 1 "${sections[@]}" \
    -f -o "$dir/$name" python benchmarks/layer_speed.py --families "$FAMILIES" --tokens 4096 --configs "$config"
  step "${name}_details" 60 . ncu -i "$dir/$name.ncu-rep" --page details
  step "${name}_source" 120 . ncu -i "$dir/$name.ncu-rep" --page source --print-source sass --csv
done
exit $status
