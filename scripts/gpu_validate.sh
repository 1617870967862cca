#!/usr/bin/env bash
# Correctness of every Triton path on a GPU, before any timing: the Triton tests of the formats, the kernel families,
# the fixed-buffer step and the round trips on the device (REPLAYSSM_TEST_DEVICE=cuda, the quick tier), then the
# three families' check scripts (Triton vs the step reference, bit-level agreement of the stored copies) and the
# captured step's checks of CONFIGS_CHECK on the bundled fixtures (when set). Logs and JSON go to $OUT/validate/.
#
#   OUT=out scripts/gpu_validate.sh     # on one GPU (H200: about 7 minutes); OUT defaults to out/
#   CONFIGS_CHECK='nvfp4/fp16sr@4#rt=int8@every:3 shared:fp8sr@4#rt=fp8sr@at:9,20' OUT=out scripts/gpu_validate.sh
#   TESTS=tests/kernels/test_static_step.py TESTS_K='some or trips' OUT=out scripts/gpu_validate.sh   # some tests
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_steps.sh validate
CONFIGS_CHECK=${CONFIGS_CHECK:-}
TESTS=${TESTS:-tests/formats/test_encode_triton.py tests/formats/test_triton.py tests/formats/test_philox.py \
  tests/formats/test_sr_words.py tests/kernels/test_static_step.py tests/kernels/test_round_trip_kernels.py \
  tests/kernels/test_delta_triton.py tests/kernels/test_gdn_triton.py tests/kernels/test_mamba2_triton.py}
TESTS_K=${TESTS_K:-}
# shellcheck disable=SC2086  # TESTS is a list of paths
step pytest_cuda 300 . env REPLAYSSM_TEST_DEVICE=cuda python -m pytest -q -x -m "not slow" -p no:cacheprovider \
  ${TESTS_K:+-k "$TESTS_K"} $TESTS
step gpu_check_mamba2 120 . python benchmarks/gpu_check_mamba2.py --quick --out "$dir/gpu_check_mamba2.json"
step gpu_check_gdn 150 . python benchmarks/gpu_check_delta.py --family gdn --quick --out "$dir/gpu_check_gdn.json"
step gpu_check_kda 150 . python benchmarks/gpu_check_delta.py --family kda --quick --out "$dir/gpu_check_kda.json"
# shellcheck disable=SC2086  # CONFIGS_CHECK is a list of configs
[[ -n $CONFIGS_CHECK ]] && step graph_check 150 . python benchmarks/gpu_check_graph.py --out "$dir/graph" \
  --skip-speed --check-configs $CONFIGS_CHECK
exit $status
