#!/usr/bin/env bash
# The engine's decode step against the fixed-batch step on one GPU: benchmarks/gpu_check_graph.py's bit-for-bit checks
# of the captured whole-model step and of the graph engine's tokens (CHECK_CONFIGS), then benchmarks/generation.py's
# decode rows (an Engine's later call after a --first-tokens call: `step_ms` by difference, `step_host_ms` the host's
# launch of a step) beside its profile rows (the fixed-batch step of the engine's running decoder), for CONFIGS on
# MODEL at BATCH rows of PROMPT + NEW tokens; with PREV (a folder holding a previous checkout's replayssm_eval/), the
# same benchmark's decode rows of PREV_CONFIGS through that checkout's engine in the same run. Logs and JSON go to
# $OUT/engine-steps/.
#
#   PREV=.prev OUT=out scripts/gpu_engine_steps.sh       # H200: about 7 minutes
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_steps.sh engine-steps
MODEL=${MODEL:-qwen3.5-4b}
BATCH=${BATCH:-256}
PROMPT=${PROMPT:-512}
NEW=${NEW:-512}
CONFIGS=${CONFIGS:-nvfp4:scale=head/fp16sr,fp32}
PREV_CONFIGS=${PREV_CONFIGS:-nvfp4:scale=head/fp16sr}
CHECK_CONFIGS=${CHECK_CONFIGS:-fp32 nvfp4/fp16sr@4 nvfp4/fp8sr@4#rt=int8:axis=headdim@every:5}
# shellcheck disable=SC2086  # CHECK_CONFIGS is a list
step checks 200 . python benchmarks/gpu_check_graph.py --out "$dir/checks" --skip-speed --check-configs $CHECK_CONFIGS
generation=(python benchmarks/generation.py --models "$MODEL" --steps graph --batches "$BATCH" --prompt-len "$PROMPT"
            --new-tokens "$NEW" --no-hf --first-tokens 16 --profile-steps 16)
step generation_after 300 . "${generation[@]}" --parts decode,profile --configs "$CONFIGS" --out "$dir/after"
generation[1]=$PWD/benchmarks/generation.py  # this checkout's benchmark, PREV's package
[[ -n $PREV ]] && step generation_before 200 "$PREV" "${generation[@]}" --parts decode --configs "$PREV_CONFIGS" \
  --out "$dir/before"
exit $status
