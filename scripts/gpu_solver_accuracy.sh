#!/usr/bin/env bash
# The accuracy table on the scoring fixtures: both synthetic tasks (500 test questions each), greedy under every
# config, one sampled run, and the teacher-forced KL of the same configs over the tasks' own text. Three phases, so
# the GPU machine needs neither lm-eval, datasets nor math-verify:
#
#   scripts/gpu_solver_accuracy.sh prepare        # CPU: requests (greedy and sampled) and the KL text under $DIR
#   OUT=out scripts/gpu_solver_accuracy.sh gpu    # GPU: generations and KL runs into $OUT/results.tgz (H200: ~8 min)
#   scripts/gpu_solver_accuracy.sh score DIR      # CPU, DIR = the unpacked results: accuracy runs, KL runs, report
#
# The GPU phase also runs the fixed-buffer step checks (benchmarks/gpu_check_graph.py) beside the generations.
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS=(tiny-nemotron-h-solver tiny-qwen3.5-solver)
TASKS=synth_sum,synth_swap
CONFIGS=fp32,shared:nvfp4,nvfp4/fp16sr,nvfp4/fp32,nvfp4/fp8sr,shared:fp8sr,vllm:replay-fp16sr,vllm:fp16sr,sglang:fp8,flashinfer:int16,vllm:int8,modelopt:int8-hadamard
GROUPS_OF=(  # the configs after fp32 in three concurrent processes per model (each also starts with fp32's order)
  shared:nvfp4,nvfp4/fp16sr,nvfp4/fp32,nvfp4/fp8sr
  shared:fp8sr,vllm:replay-fp16sr,vllm:fp16sr
  sglang:fp8,flashinfer:int16,vllm:int8,modelopt:int8-hadamard
)
KL_CONFIGS=(${CONFIGS//,/ })
KL_CONFIGS=("${KL_CONFIGS[@]:1}")  # kl compares each with its FP32 reference
SAMPLED_MODEL=tiny-nemotron-h-solver
SAMPLED_CONFIGS=fp32,shared:nvfp4,nvfp4/fp16sr
SAMPLING=(--gen-kwargs "temperature=0.6,top_p=0.95,top_k=20" --samples 4 --sampling-seed 0)
MAX_GEN_TOKS=5120  # the longest gold target is 4,460 bytes
KL=(--prompt-len 256 --tokens 2048 --pack filter --min-doc-tokens 2304 --num-docs 16 --batch-size 16 --dtype float32)
DIR=reports/accuracy-solvers
COMMON=(--tasks "$TASKS" --data fixtures --max-gen-toks "$MAX_GEN_TOKS")

case "${1:-}" in
  prepare)
    mkdir -p "$DIR/text"
    replayssm-eval accuracy "${COMMON[@]}" --configs "$CONFIGS" --export-requests "$DIR/requests.jsonl"
    replayssm-eval accuracy "${COMMON[@]}" --configs "$SAMPLED_CONFIGS" "${SAMPLING[@]}" \
      --export-requests "$DIR/requests-sampled.jsonl"
    for task in ${TASKS//,/ }; do  # 4,000 test questions each: the longer ones are the KL documents
      python -m replayssm_eval.tasks.synthetic --task "$task" --n 4000 --as-text --out "$DIR/text"
    done
    ;;
  gpu)
    OUT=${OUT:-out}
    work=out/solver-accuracy
    mkdir -p "$OUT" "$work"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$work/gpu.txt"
    timeout 420 python benchmarks/gpu_check_graph.py --out "$work/checks" --skip-speed > "$work/gpu_check_graph.log" 2>&1 &
    generate() {  # model, configs, generations file, requests file
      timeout 450 python -m replayssm_eval.tasks.offline "$4" "$3" --model "$1" --configs "$2" --step graph \
        --max-batch-size 1024 >> "${3%.jsonl}.log" 2>&1 || echo "exit $?" >> "${3%.jsonl}.log"
    }
    for model in "${MODELS[@]}"; do
      (
        generate "$model" fp32 "$work/gens-$model-fp32.jsonl" "$DIR/requests.jsonl"
        for g in "${!GROUPS_OF[@]}"; do  # fp32 first in each group's file: it sets the order of the others
          cp "$work/gens-$model-fp32.jsonl" "$work/gens-$model-$g.jsonl"
          generate "$model" "fp32,${GROUPS_OF[$g]}" "$work/gens-$model-$g.jsonl" "$DIR/requests.jsonl" &
        done
        wait
      ) &
      for task in ${TASKS//,/ }; do
        # shellcheck disable=SC2046
        timeout 450 python -m replayssm_eval kl --model "$model" --data-files "$DIR/text/$task/test.text.jsonl" \
          "${KL[@]}" $(printf -- '--config %s ' "${KL_CONFIGS[@]}") --output "$work/kl-$model-$task" \
          > "$work/kl-$model-$task.log" 2>&1 &
      done
    done
    generate "$SAMPLED_MODEL" "$SAMPLED_CONFIGS" "$work/gens-sampled-$SAMPLED_MODEL.jsonl" "$DIR/requests-sampled.jsonl" &
    wait
    tar czf "$OUT/results.tgz" -C out solver-accuracy
    tail -n 3 "$work"/*.log
    ;;
  score)
    FROM=${2:?give the folder holding the unpacked solver-accuracy results}
    for model in "${MODELS[@]}"; do
      gens="$FROM/gens-$model.jsonl"
      python - "$FROM" "$model" "$gens" <<'EOF'
import json, sys
from pathlib import Path
folder, model, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
seen, lines = set(), []
for path in sorted(folder.glob(f"gens-{model}-*.jsonl")):  # one line per (config, task, doc): fp32 is in every file
    for line in path.read_text().splitlines():
        row = json.loads(line)
        key = (row["config"], row["task"], row["doc_id"])
        if key not in seen:
            seen.add(key)
            lines.append(line + "\n")
out.write_text("".join(lines))
EOF
      rm -rf "$DIR/$model"
      replayssm-eval accuracy "${COMMON[@]}" --configs "$CONFIGS" --model "$model" --generations "$gens" \
        --output "$DIR/$model"
      for task in ${TASKS//,/ }; do
        rm -rf "$DIR/kl-$model-$task" && cp -r "$FROM/kl-$model-$task" "$DIR/"
      done
    done
    rm -rf "$DIR/sampled-$SAMPLED_MODEL"
    replayssm-eval accuracy "${COMMON[@]}" --configs "$SAMPLED_CONFIGS" "${SAMPLING[@]}" --model "$SAMPLED_MODEL" \
      --generations "$FROM/gens-sampled-$SAMPLED_MODEL.jsonl" --output "$DIR/sampled-$SAMPLED_MODEL"
    mkdir -p "$DIR/logs" && cp "$FROM"/*.log "$FROM"/gpu.txt "$DIR/logs/"
    cp -r "$FROM/checks" "$DIR/logs/"
    replayssm-eval report "$DIR"/tiny-* "$DIR"/sampled-* "$DIR"/kl-* --output "$DIR/report"
    ;;
  *)
    echo "usage: $0 prepare | gpu | score DIR" >&2
    exit 2
    ;;
esac
