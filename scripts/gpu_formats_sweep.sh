#!/usr/bin/env bash
# The read-format, engine-preset, buffer-dtype and decay-skip sweep behind the formats table in BENCHMARKS.md.
#
#   scripts/gpu_formats_sweep.sh [TOKENS] [BUDGET_S] [MODEL ...]   # OUT set by the runner; default 16384 tokens,
#                                                                   # 450 s, both tiny fixtures
#
# Per tiny fixture (tiny-nemotron-h, then tiny-qwen3.5): the KL of every config against the FP32 reference,
# 2 documents of the bundled text (batch 2), a 512-token prompt, TOKENS teacher-forced tokens, Triton kernels,
# float32 weights (as scripts/gpu_kl_repro.sh). Configs:
#   - every read format of 4-8 bits per element as a read copy over an FP16+SR recurrence and shared:
#     nvfp4 with scale head (the default), row, tensor and rowcol (two axes), mxfp4, int8 (per row),
#     int8 in a 32-point Hadamard basis, fp8 (per row);
#   - the engine presets (`formats --presets`) whose formats the chunked kernels run; window-1 presets of
#     torch-rounded formats (vllm:int8, vllm:int16, flashinfer:int16) are left out: one launch per token;
#   - nvfp4/fp16sr with a bf16 buffer (#buf=bf16) against the same config with FP32 buffers;
#   - nvfp4/fp16sr with #skip=0.001, 0.01 and 0.1 (kl.json records the reads each skips).
# Time (estimated from reports/kl-tiny-128k: 54 s / 73 s for 7 / 9 streams of 2 x 131072 tokens, and
# 6-17x per layer for formats torch rounds): 17 Triton-rounded streams ~1 s and 11 torch-rounded streams
# ~8 s each at 16384 tokens, plus model load and Triton compiles: ~150-250 s per model, ~400 s in all.
# Each model gets a share of BUDGET_S (timeout); a run cut short keeps progress.json and its inflight metrics.
# Each run directory is packed into $OUT/sweep-<model>-<TOKENS>.tgz; the table: scripts/formats_table.py.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder whose files come back}"
TOKENS=${1:-16384}
BUDGET=${2:-450}
shift 2 || shift $#
MODELS=(${*:-tiny-nemotron-h tiny-qwen3.5})
READS=(nvfp4 nvfp4:scale=row nvfp4:scale=tensor nvfp4:scale=rowcol mxfp4 int8 int8:rot=hadamard:32 fp8)
CONFIGS=()
for r in "${READS[@]}"; do CONFIGS+=("$r/fp16sr" "shared:$r"); done
CONFIGS+=(vllm:fp16sr vllm:fp8 vllm:fp8sr sglang:fp8 vllm:replay-fp16sr vllm:replay-fp8sr modelopt:int8-hadamard)
CONFIGS+=("nvfp4/fp16sr#buf=bf16" "nvfp4/fp16sr#skip=0.001" "nvfp4/fp16sr#skip=0.01" "nvfp4/fp16sr#skip=0.1")

# every config must parse (and name a distinct canonical config): fail before any GPU work
python - "${CONFIGS[@]}" <<'PY'
import sys
from replayssm_eval.replay.config import ReplayConfig
names = [ReplayConfig.parse(c).name for c in sys.argv[1:]]
dups = {n for n in names if names.count(n) > 1}
if dups:
    sys.exit(f"configs expanding to the same config: {sorted(dups)}")
print(f"{len(names)} configs:", " ".join(names))
PY

args=()
for c in "${CONFIGS[@]}"; do args+=(--config "$c"); done
start=$SECONDS
for i in "${!MODELS[@]}"; do
  model=${MODELS[$i]}
  left=$((BUDGET - (SECONDS - start)))
  limit=$((i + 1 == ${#MODELS[@]} ? left : left * 45 / 100))  # with two models the first gets 45%
  run=sweep-$model-$TOKENS
  rm -rf "/tmp/$run"
  t0=$SECONDS
  ( timeout "$limit" python -m replayssm_eval kl --model "$model" --tokens "$TOKENS" --num-docs 2 --batch-size 2 \
      --prompt-len 512 --segment-len 4096 --backend triton --dtype float32 --output "/tmp/$run" "${args[@]}" ) 2>&1 \
    | tr '\r' '\n' | grep -v "^ *$" | awk 'NR % 20 == 1 || !/it\/s|tok\/s/' | tee "/tmp/$run.log" || true
  echo "$model: $((SECONDS - t0)) s (limit $limit s)" | tee -a "/tmp/$run.log"
  cp "/tmp/$run.log" "/tmp/$run/" 2>/dev/null || true
  tar czf "$OUT/$run.tgz" --exclude='*.pt' -C /tmp "$run"  # a cut run's snapshots are too large to bring back
done
