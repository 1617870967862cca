"""`replayssm-eval formats`: bits, bytes of one SSM state and round-trip error of every state format.

    replayssm-eval formats --geometry qwen3.5-4b --distribution student-t3 --json
    replayssm-eval formats --presets        (engine presets: expansions, sources, what each reproduces bit for bit)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import pandas as pd

from replayssm_eval.cli import command
from replayssm_eval.models.presets import PRESETS, state_shape
from replayssm_eval.formats.measure import DISTRIBUTIONS, format_error_table


@dataclass(frozen=True)
class FormatsConfig:
    geometry: str = field(default="nemotron-3-nano-4b", metadata={
        "help": f"state geometry: a model preset ({', '.join(PRESETS)}), or custom 'H,P,N' (heads, head_dim, d_state)"})
    distribution: str = field(default="gaussian", metadata={
        "help": "synthetic state values", "choices": DISTRIBUTIONS})
    formats: tuple[str, ...] = field(default_factory=tuple, metadata={
        "help": "format spec, e.g. nvfp4:axis=headdim,scale=head, fp8:scale=tile:32x0,max=240 (R x C scale tiles), "
                "int8:ef=bf16 (error feedback; its residual counts in the bytes); all formats with default options "
                "if none"})
    states: int = field(default=2, metadata={"help": "independent states sampled for the error"})
    seed: int = field(default=0, metadata={"help": "seed of the sampled states and of stochastic rounding"})
    json: bool = field(default=False, metadata={"help": "print JSON instead of a table"})
    presets: bool = field(default=False, metadata={
        "help": "list the engine presets (e.g. vllm:fp16sr): the config each expands to, its source and what "
                "it reproduces bit for bit"})


@command("formats")
def run_formats(config: FormatsConfig) -> int:
    if config.states < 1:
        raise ValueError(f"--states {config.states} is out of range; accepted: an integer >= 1")
    if config.seed < 0:
        raise ValueError(f"--seed {config.seed} is out of range; accepted: an integer >= 0")
    if config.presets:
        return _print_presets(config.json)
    h, p, n = state_shape(config.geometry)
    rows = format_error_table(list(config.formats) or None, (h, p, n), config.distribution, config.seed, config.states)
    if config.json:
        # strict JSON has no Infinity: an error-free format (fp32) reports sqnr_db null
        rows = [{**row, "sqnr_db": row["sqnr_db"] if math.isfinite(row["sqnr_db"]) else None} for row in rows]
        print(json.dumps({"geometry": config.geometry, "shape": [h, p, n], "distribution": config.distribution,
                          "seed": config.seed, "states": config.states, "formats": rows}, indent=2, allow_nan=False))
        return 0
    print(f"geometry {config.geometry} ({h} x {p} x {n}), {config.distribution}, {config.states} states, seed {config.seed}")
    table = pd.DataFrame(rows).set_index("format")
    print(table.to_string(formatters={"bits_per_element": "{:g}".format, "rel_rms_error": "{:.3e}".format,
                                      "sqnr_db": "{:.2f}".format}))
    return 0


def _print_presets(as_json: bool) -> int:
    from replayssm_eval.replay.config import ReplayConfig
    from replayssm_eval.replay.engine_presets import PRESETS

    rows = [{"preset": p.name, "expansion": ReplayConfig.parse(p.expansion).name, "source": p.source,
             "description": p.description, "engine_bits": p.engine_bits} for p in PRESETS.values()]
    if as_json:
        print(json.dumps({"presets": rows}, indent=2))
        return 0
    print("| preset | expansion | source | description | bit-identical to the engine |\n|" + " --- |" * 5)
    for row in rows:
        print(f"| {row['preset']} | `{row['expansion']}` | {row['source']} | {row['description']} "
              f"| {row['engine_bits']} |")
    return 0
