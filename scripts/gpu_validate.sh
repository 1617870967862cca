#!/usr/bin/env bash
# Correctness of every Triton path on a GPU, before any timing: the Triton tests of the formats and
# both kernel families on the device (REPLAYSSM_TEST_DEVICE=cuda), then both families' check scripts (Triton
# vs the step reference, bit-level agreement of the stored copies). Logs and JSON go to $OUT/validate/.
#
#   OUT=out scripts/gpu_validate.sh     # on one GPU (H200: about 5 minutes); OUT defaults to out/
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
dir=$OUT/validate
mkdir -p "$dir"
status=0
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $dir/NAME.log, remember a failure
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*"
  timeout "$limit" "$@" 2>&1 | tee "$dir/$name.log" | tail -25
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc"
  [[ $rc == 0 ]] || status=1
}
step pytest_cuda 270 env REPLAYSSM_TEST_DEVICE=cuda python -m pytest -q -p no:cacheprovider \
  tests/formats/test_encode_triton.py tests/formats/test_triton.py tests/formats/test_philox.py \
  tests/kernels/test_delta_triton.py tests/kernels/test_gdn_triton.py tests/kernels/test_mamba2_triton.py
step gpu_check_mamba2 150 python benchmarks/gpu_check_mamba2.py --quick --out "$dir/gpu_check_mamba2.json"
step gpu_check_gdn 150 python benchmarks/gpu_check_delta.py --family gdn --quick --out "$dir/gpu_check_gdn.json"
exit $status
