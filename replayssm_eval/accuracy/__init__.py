"""Downstream accuracy under ReplaySSM state formats: the run, the lm-eval model, the tasks.

    replayssm-eval accuracy --model M --tasks gpqa_diamond,mmlu_pro,math_l5 \
        --configs fp32,shared:nvfp4,nvfp4/fp16sr,nvfp4/fp8sr          # our driver (`accuracy`)
    python -m replayssm_eval.accuracy --model replayssm --model_args pretrained=M,read=nvfp4,recur=fp16sr,window=16 \
        --tasks replayssm_gpqa_diamond                                  # lm-eval's own CLI (`__main__`)
    lm_eval --model replayssm --model_args ... --include_path <YAML_DIR> --tasks ...   # the same (`lm_eval_plugin`)

`options` + `driver` (the `accuracy` run) and `output` (its accuracy.json, accuracy.md), `lm_model` (the
`replayssm` lm-eval model, decoding through `generate`), `requests` (what a generation request asks: stop
strings, limit, sampling, sample index), `recorded` (the lm-eval models of the offline run: generate with
`generate.offline` on a machine without lm-eval, score here), `task_base` + `yaml/` (task configs built on
lm-eval's own YAMLs), `lm_eval_plugin` + `lm_eval_plugin_build` (the .pth hook that registers the model with
the plain `lm_eval` script), `fixtures/` (a handful of offline questions per task, in the hub datasets'
schemas), `synthetic` (generated MATH- and MMLU-Pro-shaped tasks that small byte-level models can be trained
on: synth_sum, synth_swap). Buckets, statistics and the accuracy.json tables are `results`'.
This module imports neither torch nor lm-eval.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

YAML_DIR = Path(__file__).parent / "yaml"
FIXTURES_DIR = Path(__file__).parent / "fixtures"


@dataclass(frozen=True)
class TaskSpec:
    """One benchmark: its lm-eval task names and the per-sample score it is judged by.

    hub / local: task names in `yaml/<name>/` (hub data; local copies in the hub's file layout,
    `<data dir>/<name>/...`, the bundled fixtures by default: see that folder's `*_local.yaml`).
    metric, filter: the sample field (0/1) and the lm-eval filter whose samples carry it.
    """

    name: str
    metric: str
    filter: str

    @property
    def hub(self) -> str:
        return f"replayssm_{self.name}"

    @property
    def local(self) -> str:
        return f"replayssm_{self.name}_local"


TASKS = {
    spec.name: spec
    for spec in (
        TaskSpec("gpqa_diamond", "exact_match", "flexible-extract"),
        TaskSpec("mmlu_pro", "exact_match", "custom-extract"),
        TaskSpec("math_l5", "exact_match", "none"),  # math_verify's verdict (leaderboard_math_hard)
        TaskSpec("synth_sum", "exact_match", "none"),  # scored as math_l5 (`synthetic`)
        TaskSpec("synth_swap", "exact_match", "custom-extract"),  # scored as mmlu_pro (`synthetic`)
    )
}
# what `accuracy` runs without --tasks: the real benchmarks
DEFAULT_TASKS = ("gpqa_diamond", "mmlu_pro", "math_l5")


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name]

