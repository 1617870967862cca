#!/usr/bin/env bash
# The accuracy table on the scoring fixtures: both synthetic tasks (500 test questions each), greedy under every
# config, one sampled run, and the teacher-forced KL of the main configs over the tasks' own text. The generations
# run on a GPU machine that needs neither lm-eval, datasets nor math-verify:
#
#   scripts/gpu_solver_accuracy.sh prepare        # CPU: the requests (greedy and sampled) under $DIR
#   OUT=out scripts/gpu_solver_accuracy.sh gpu    # GPU: the generations into $OUT/results.tgz (H200: ~8 min)
#       GPU_SECONDS (default 470): then everything is packed, whatever is unfinished;
#       CHECKS=0 leaves out the device checks, SAMPLED=0 the sampled run;
#       SOLVERS=model,...: only those models; RESUME=model,...: those models start from their committed generations (same weights): only the configs
#       missing there run
#   scripts/gpu_solver_accuracy.sh score DIR      # CPU, DIR = the unpacked results (or the committed generations/,
#                                                 # gunzipped): the accuracy runs
#   scripts/gpu_solver_accuracy.sh kl             # CPU or GPU (needs datasets): the KL runs (2 idle CPU cores: 1 to 3 min a run)
#   scripts/gpu_solver_accuracy.sh report         # the rendered report of all of them, $DIR/report/
#
# The GPU phase also runs the fixed-buffer step checks (benchmarks/gpu_check_graph.py) and the sampler's and the KDA
# static step's tests on the device, beside the generations.
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS=()  # the scoring fixtures the package holds
for model in tiny-nemotron-h-solver tiny-qwen3.5-solver tiny-kimi-linear-solver; do
  [[ -d replayssm_eval/models/fixtures/$model && ,${SOLVERS:-$model}, == *,$model,* ]] && MODELS+=("$model")
done
TASKS=synth_sum,synth_swap
CONFIGS=fp32,shared:nvfp4,nvfp4/fp16sr,nvfp4/fp32,nvfp4/fp8sr,shared:fp8sr,vllm:replay-fp16sr,vllm:fp16sr,sglang:fp8,flashinfer:int16,vllm:int8,modelopt:int8-hadamard
GROUPS_OF=(  # the configs after fp32, in four concurrent groups per model, the paper's configs first
  shared:nvfp4,nvfp4/fp32,vllm:int8
  nvfp4/fp16sr,shared:fp8sr,flashinfer:int16
  nvfp4/fp8sr,vllm:replay-fp16sr,modelopt:int8-hadamard
  sglang:fp8,vllm:fp16sr
)
KL_CONFIGS=(shared:nvfp4 nvfp4/fp16sr nvfp4/fp32 shared:fp8sr nvfp4/fp8sr)  # each against its FP32 reference
SAMPLED_MODEL=tiny-qwen3.5-solver
SAMPLED_CONFIGS=fp32,shared:nvfp4,nvfp4/fp16sr
SAMPLING=(--gen-kwargs "temperature=0.6,top_p=0.95,top_k=20" --samples 4 --sampling-seed 0)
MAX_GEN_TOKS=5120  # the longest gold target is 4,460 bytes
# the KL documents: whole test questions (of the first 4,000) of at least 2,304 bytes, the first 256 as the prompt
KL=(--prompt-len 256 --tokens 2048 --pack filter --min-doc-tokens 2304 --num-docs 4 --batch-size 4 --dtype float32)
DIR=reports/accuracy-solvers
COMMON=(--tasks "$TASKS" --data fixtures --max-gen-toks "$MAX_GEN_TOKS")

case "${1:-}" in
  prepare)
    mkdir -p "$DIR"
    replayssm-eval accuracy "${COMMON[@]}" --configs "$CONFIGS" --export-requests "$DIR/requests.jsonl"
    replayssm-eval accuracy "${COMMON[@]}" --configs "$SAMPLED_CONFIGS" "${SAMPLING[@]}" \
      --export-requests "$DIR/requests-sampled.jsonl"
    ;;
  gpu)
    OUT=${OUT:-out}
    work=out/solver-accuracy
    mkdir -p "$OUT" "$work"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$work/gpu.txt"
    [[ ${CHECKS:-1} == 0 ]] || (  # the fixed-buffer step and the sampler on the device, beside the generations
      timeout 300 python benchmarks/gpu_check_graph.py --out "$work/checks" --skip-speed > "$work/gpu_check_graph.log" 2>&1
      REPLAYSSM_TEST_DEVICE=cuda timeout 150 python -m pytest -q -p no:cacheprovider -m "" tests/tasks/test_sampling.py \
        tests/tasks/test_sampled_generation.py tests/kernels/test_static_step.py -k "gpu or kda" > "$work/pytest_cuda.log" 2>&1
    ) &
    deadline=$((SECONDS + ${GPU_SECONDS:-470}))
    generate() {  # model, configs, generations file, requests file; each config is appended whole when done
      local left=$((deadline - SECONDS))
      ((left > 15)) || { echo "no time left for $2" >> "${3%.jsonl}.log"; return; }
      timeout "$left" python -m replayssm_eval.generate.offline "$4" "$3" --model "$1" --configs "$2" --step graph \
        --max-batch-size 1024 >> "${3%.jsonl}.log" 2>&1 || echo "exit $?" >> "${3%.jsonl}.log"
    }
    for model in "${MODELS[@]}"; do
      (
        if [[ ,${RESUME:-}, == *,$model,* ]]; then
          gunzip -c "$DIR/generations/gens-$model.jsonl.gz" > "$work/gens-$model-fp32.jsonl"
        fi
        generate "$model" fp32 "$work/gens-$model-fp32.jsonl" "$DIR/requests.jsonl"
        for g in "${!GROUPS_OF[@]}"; do  # fp32 first in each group's file: it sets the order of the others
          cp "$work/gens-$model-fp32.jsonl" "$work/gens-$model-$g.jsonl"
          (  # one process per config: a config that fails costs only itself
            for config in ${GROUPS_OF[$g]//,/ }; do
              generate "$model" "fp32,$config" "$work/gens-$model-$g.jsonl" "$DIR/requests.jsonl"
            done
          ) &
        done
        wait
      ) &
    done
    [[ ${SAMPLED:-1} == 0 ]] ||
      generate "$SAMPLED_MODEL" "$SAMPLED_CONFIGS" "$work/gens-sampled-$SAMPLED_MODEL.jsonl" "$DIR/requests-sampled.jsonl" &
    wait
    tar czf "$OUT/results.tgz" -C out solver-accuracy
    tail -n 3 "$work"/*.log
    ;;
  score)
    FROM=${2:?give the folder holding the unpacked solver-accuracy results}
    present() {  # the configs of the list $1 (in its order) that the generations files $2... hold
      python -c 'import json, sys; from replayssm_eval.replay.config import ReplayConfig
found = {json.loads(line)["config"] for path in sys.argv[2:] for line in open(path)}
print(",".join(c for c in sys.argv[1].split(",") if ReplayConfig.parse(c).name in found))' "$@" 2>/dev/null
    }
    for model in "${MODELS[@]}"; do
      gens="$FROM/gens-$model.jsonl"  # the GPU's group files merged (fp32 heads each), or as committed (gunzipped)
      [[ -f $gens ]] || cat "$FROM/gens-$model"-[0-9].jsonl | awk '!seen[$0]++' > "$gens"
      rm -rf "$DIR/$model"
      replayssm-eval accuracy "${COMMON[@]}" --configs "$(present "$CONFIGS" "$gens")" --model "$model" \
        --generations "$gens" --output "$DIR/$model"
    done
    gens="$FROM/gens-sampled-$SAMPLED_MODEL.jsonl"
    if [[ -f $gens ]]; then  # not there from a run with SAMPLED=0
      rm -rf "$DIR/sampled-$SAMPLED_MODEL"
      replayssm-eval accuracy "${COMMON[@]}" --configs "$(present "$SAMPLED_CONFIGS" "$gens")" "${SAMPLING[@]}" \
        --model "$SAMPLED_MODEL" --generations "$gens" --output "$DIR/sampled-$SAMPLED_MODEL"
    fi
    if [[ -f $FROM/gpu.txt ]]; then  # a GPU run's results (not the committed generations)
      mkdir -p "$DIR/logs" && cp "$FROM"/*.log "$FROM"/gpu.txt "$DIR/logs/" && cp -r "$FROM/checks" "$DIR/logs/"
    fi
    ;;
  kl)
    text=out/solver-text
    for task in ${TASKS//,/ }; do
      python -m replayssm_eval.accuracy.synthetic --task "$task" --n 4000 --as-text --out "$text"
    done
    for model in "${MODELS[@]}"; do
      for task in ${TASKS//,/ }; do
        rm -rf "$DIR/kl-$model-$task"
        # shellcheck disable=SC2046
        replayssm-eval kl --model "$model" --data-files "$text/$task/test.text.jsonl" "${KL[@]}" \
          $(printf -- '--config %s ' "${KL_CONFIGS[@]}") --output "$DIR/kl-$model-$task"
      done &  # the two models side by side
    done
    wait
    ;;
  report)
    replayssm-eval report "$DIR"/tiny-* "$DIR"/sampled-* "$DIR"/kl-* --output "$DIR/report"
    ;;
  *)
    echo "usage: $0 prepare | gpu | score DIR | kl | report" >&2
    exit 2
    ;;
esac
