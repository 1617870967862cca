#!/usr/bin/env bash
# The KL path at full size on one GPU, with a plain HF forward beside it in the same run: teacher-forced tokens/s of
# each config (benchmarks/full_size.py) on both random-weight 4B presets, and each config's profile (top operators
# and kernels by GPU and CPU time); with PREV (a folder holding a previous checkout's replayssm_eval/ and benchmarks/),
# the CONFIGS_BEFORE rows from that code first, in the same run. REFERENCE_SCANS: what runs the fp32 reference's
# segments, a row each (kernels, hf or kernels,hf; default kernels, as the KL driver on a GPU). With KL_MODEL (a
# full-size preset), also `replayssm-eval kl` end to end on that model saved with random weights, once per reference
# scan, with KL_CONFIG (default nvfp4/fp16sr): wall clock, the config's KL against each reference and the reference's
# checks against HF's scan. Logs and JSON go to $OUT/kl-speed/.
#
#   OUT=out scripts/gpu_kl_speed.sh                                     # H200: about 5 minutes
#   PREV=.prev CONFIGS_BEFORE=nvfp4/fp16sr OUT=out scripts/gpu_kl_speed.sh
#   TOKENS=8192 CONFIGS=fp32,nvfp4/fp16sr PROFILE=0 OUT=out scripts/gpu_kl_speed.sh
#   CONFIGS=fp32,nvfp4/fp16sr REFERENCE_SCANS=kernels,hf KL_MODEL=nemotron-3-nano-4b PROFILE=0 OUT=out scripts/gpu_kl_speed.sh
set -uo pipefail
cd "$(dirname "$0")/.."
FILTER='^ *[-=]*$'
source scripts/gpu_steps.sh kl-speed
TOKENS=${TOKENS:-32768}
MODELS=${MODELS:-qwen3.5-4b,nemotron-3-nano-4b}
CONFIGS=${CONFIGS:-nvfp4/fp16sr,nvfp4:scale=row/fp16sr,fp32,vllm:int8,vllm:int16sr,flashinfer:int16}
CONFIGS_BEFORE=${CONFIGS_BEFORE:-nvfp4/fp16sr}
PROFILE=${PROFILE:-4096}
REFERENCE_SCANS=${REFERENCE_SCANS:-kernels}
[[ -n $PREV ]] && step before 300 "$PREV" python benchmarks/full_size.py --models "$MODELS" --tokens "$TOKENS" \
  --configs "$CONFIGS_BEFORE" --out "$dir/before.json"
step full_size "${LIMIT:-400}" . python benchmarks/full_size.py --models "$MODELS" --tokens "$TOKENS" --configs "$CONFIGS" \
  --profile-tokens "$PROFILE" --reference-scans "$REFERENCE_SCANS" --out "$dir/full_size.json"
if [[ -n ${KL_MODEL:-} ]]; then
  model=$(mktemp -d)/$KL_MODEL
  step save_model 300 . python benchmarks/save_random_model.py --model "$KL_MODEL" --out "$model"
  for scan in kernels hf; do
    step "kl_$scan" 400 . python -m replayssm_eval kl --model "$model" --tokens "$TOKENS" --num-docs 1 \
      --prompt-len 512 --config "${KL_CONFIG:-nvfp4/fp16sr}" --reference-scan "$scan" --output "$dir/kl_$scan"
  done
  step kl_compare 60 . python - "$dir" <<'PY'
import json, sys
for scan in ("kernels", "hf"):
    report = json.load(open(f"{sys.argv[1]}/kl_{scan}/kl.json"))
    checks = report["reference"]["scan_checks"]
    worst = {k: max((c[k] for c in checks.values()), default=None) for k in ("output", "state")}
    print(scan, "reference nll", report["reference"]["nll_mean"],
          *(f"{c['name']} kl_mean {c['kl_mean']:.6e} top1 {c['top1_agree']:.6f}" for c in report["configs"]),
          "largest check", worst)
PY
fi
exit $status
