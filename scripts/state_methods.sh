#!/usr/bin/env bash
# What engines do to a state between steps, on each bundled tiny model (CPU): the engines' 8-bit presets,
# error feedback, SGLang's 32-row FP8 tiles, prefix-cache round trips (SGLang's INT8 pool at the prompt's end
# and every 64 tokens), published state-quantization methods (Pimba's MX8 with and without stochastic rounding and
# its INT8 with one scale per 32 elements; STEPQuant's dual-axis codes at 8 and 6 bits) and the ReplaySSM split
# default, in one KL run per model, then one report over the three.
#
#   OUT=reports/state-methods scripts/state_methods.sh     # 2 shared cores: about 20 minutes
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-reports/state-methods}
configs=(int8 int8:ef=fp32 int8:ef=bf16 sglang:fp8 modelopt:int8-hadamard sglang:int8-pool
         'fp32#rt=int8:axis=headdim@every:64' pimba:mx8sr pimba:mx8 pimba:int8sr
         stepquant:dualaxis8 stepquant:dualaxis6 nvfp4/fp16sr)
args=()
for c in "${configs[@]}"; do args+=(--config "$c"); done
for model in tiny-nemotron-h tiny-qwen3.5 tiny-kimi-linear; do
  if [[ ! -f $OUT/$model/kl.json ]]; then
    python -m replayssm_eval kl --model "$model" --device cpu "${args[@]}" --num-docs 2 --prompt-len 64 \
      --tokens 256 --output "$OUT/$model"
  fi
done
python -m replayssm_eval report "$OUT"/tiny-* --output "$OUT/report" --title "State handling between steps, tiny models"
