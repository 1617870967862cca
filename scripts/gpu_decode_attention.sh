#!/usr/bin/env bash
# Decode attention on one GPU: its CUDA tests, benchmarks/decode_attention_speed.py (against HF's SDPA, with the launch
# sweep), benchmarks/gpu_check_graph.py's bit-for-bit checks of the captured whole-model step (CHECK_CONFIGS), and its
# decode speed at MODELS x BATCHES from this checkout and, with PREV (a folder holding a previous checkout's
# replayssm_eval/ and benchmarks/), from that one in the same run. PARTS picks the parts (default "tests checks
# generation"; "tests" includes the kernel benchmark). Logs and JSON go to $OUT/decode-attention/.
#
#   PREV=.prev OUT=out scripts/gpu_decode_attention.sh                      # H200: about 8 minutes
#   PARTS=generation MODELS=qwen3.5-4b BATCHES=256 PREV=.prev OUT=out scripts/gpu_decode_attention.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_steps.sh decode-attention
PARTS=${PARTS:-tests checks generation}
MODELS=${MODELS:-qwen3.5-4b}
BATCHES=${BATCHES:-256}
NEW_TOKENS=${NEW_TOKENS:-256}
CHECK_CONFIGS=${CHECK_CONFIGS:-fp32 nvfp4/fp16sr@4 nvfp4/fp8sr@4#rt=int8:axis=headdim@every:5}
if [[ $PARTS == *tests* ]]; then
  step tests 200 . env REPLAYSSM_TEST_DEVICE=cuda python -m pytest -q -p no:cacheprovider tests/models/test_decode_attention.py
  step kernel_speed 200 . python benchmarks/decode_attention_speed.py --out "$dir/decode_attention_speed.json"
fi
if [[ $PARTS == *checks* ]]; then
  # shellcheck disable=SC2086  # CHECK_CONFIGS is a list
  step checks 300 . python benchmarks/gpu_check_graph.py --out "$dir/checks" --skip-speed --check-configs $CHECK_CONFIGS
fi
if [[ $PARTS == *generation* ]]; then
  speed=(python benchmarks/gpu_check_graph.py --skip-checks --no-hf --models ${MODELS//,/ } --batches ${BATCHES//,/ }
         --new-tokens "$NEW_TOKENS")
  step generation_after 300 . "${speed[@]}" --out "$dir/after"
  [[ -n $PREV ]] && step generation_before 300 "$PREV" "${speed[@]}" --out "$dir/before"
fi
exit $status
