#!/usr/bin/env bash
# An Engine's first generate call against a later one, each under torch.profiler (benchmarks/generation.py
# --profile-decode): the split config's later calls measured 1.5x slower than its first (BENCHMARKS.md, Engine steps
# against the fixed-batch step). Each call's wall seconds, GPU kernel seconds and top kernels and operators, for
# CONFIGS on MODEL at BATCH, PROMPT + NEW tokens. Logs, JSON and profiles go to $OUT/engine-calls/.
#
#   OUT=out scripts/gpu_engine_calls.sh                        # H200: about 4 minutes
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_steps.sh engine-calls
MODEL=${MODEL:-qwen3.5-4b}
BATCH=${BATCH:-256}
PROMPT=${PROMPT:-512}
NEW=${NEW:-512}
CONFIGS=${CONFIGS:-nvfp4:scale=head/fp16sr,fp32}
FILTER='^ *[-=]*$|^ +[a-z_:<]|^Self|^Name'
for first in 0 16; do
  step "first$first" 280 . python benchmarks/generation.py --out "$dir/first$first" --models "$MODEL" --parts decode \
    --steps graph --batches "$BATCH" --prompt-len "$PROMPT" --new-tokens "$NEW" --configs "$CONFIGS" --no-hf \
    --first-tokens "$first" --profile-decode
done
exit $status
