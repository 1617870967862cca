"""`replayssm-eval sensitivity`: which SSM layers, and which heads of them, drive the KL of one config C; and,
with --budget, the per-layer (with --heads, also per-head) configs that fit a byte budget.

Every variant is a mixed config (docs/semantics.md, "Mixed configs") run by the KL driver, in stages,
each a plain kl run directory inside the sensitivity run's:

    layers/   C, and for every SSM layer L: `fp32+L=C` (only L in C) and `C+L=fp32` (only L in FP32);
              with --budget also each other candidate ck and `fp32+L=ck`
    heads/    (--heads K) every head h of the K layers whose only-L KL is largest:
              `fp32+L.hH=C` and `C+L.hH=fp32`; with --budget also `fp32+L.hH=ck` for each other candidate
    budget/   (--budget B) the mixed config `kl.budget.choose` picks, beside every candidate uniformly (the
              traffic-vs-KL Pareto plot of this kl run shows them): one choice per SSM layer from the layers
              stage, and with --heads one per head of the K layers from the heads stage

So each stage has the kl run's machinery: one FP32 reference pass per document, every variant in lock
step, the resumable store, atomic writes and the progress bar. `--resume DIR` continues the stage in
flight (a finished stage is not run again). sensitivity.json (docs/sensitivity_json_schema.md) is
rendered from the stages' kl.json after each stage.
"""

from __future__ import annotations

import dataclasses
import sys
from datetime import datetime, timezone
from pathlib import Path

from replayssm_eval.kl import runner as runner_module
from replayssm_eval.kl.budget import budget_bytes, choose, mixed_config, unit_name
from replayssm_eval.kl.driver import REFERENCE, make_plan, resolve_configs, run_kl
from replayssm_eval.kl.driver import command_line as kl_command_line
from replayssm_eval.kl.options import KLConfig, SensitivityConfig
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.results.files import atomic_write_json, check_output_dir, read_json
from replayssm_eval.results.kl_store import RUN_FILE
from replayssm_eval.results.provenance import git_state, versions

SCHEMA_VERSION = 1
RESULT_FILE = "sensitivity.json"
STAGES = ("layers", "heads", "budget")


def run_sensitivity(options: SensitivityConfig) -> Path:
    """Run (or resume) a sensitivity study and return its directory."""
    if options.resume:
        options = _options_for_resume(options)
    config, extra = study_config(options), candidate_configs(options)
    layers, heads = runner_module.ssm_layout(options.model)
    if not 0 <= options.heads <= len(layers):
        raise ValueError(f"--heads {options.heads} is out of range; accepted: 0..{len(layers)} (the model's SSM layers)")
    if options.budget is not None:
        budget_bytes(options.budget, 1.0)  # checked before any work
    run_dir = _output_dir(options)
    kl_options = kl_options_of(options)
    variants = layer_variants(config, layers) + tuple(v for c in extra for v in only_variants(c, layers))
    make_plan(dataclasses.replace(kl_options, config=variants))  # bad options fail before any work
    if not options.resume:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run_dir / RUN_FILE, {"kind": "sensitivity",
                                               "options": dataclasses.asdict(dataclasses.replace(options, output=str(run_dir)))})
    try:
        _run_stage(kl_options, run_dir / "layers", variants)
        render(run_dir, options)
        if options.heads:
            layer_kl = read_json(run_dir / "layers" / "kl.json")
            chosen = most_sensitive(summarise_layers(layer_kl, config, layers), options.heads)
            variants = head_variants(config, chosen, heads) + tuple(
                v for c in extra for v in only_head_variants(c, chosen, heads))
            _run_stage(kl_options, run_dir / "heads", variants)
            render(run_dir, options)
        if options.budget is not None:
            heads_kl = read_json(run_dir / "heads" / "kl.json") if options.heads else None
            plan = plan_budget(read_json(run_dir / "layers" / "kl.json"), heads_kl, options, layers)
            _run_stage(kl_options, run_dir / "budget", tuple(dict.fromkeys((plan["config"], *plan["candidates"][:-1]))))
            render(run_dir, options)
    except KeyboardInterrupt:
        print(f"continue the study with: replayssm-eval sensitivity --resume {run_dir}", file=sys.stderr)
        raise
    print(f"wrote {run_dir / RESULT_FILE}", file=sys.stderr)
    return run_dir


def study_config(options: SensitivityConfig) -> ReplayConfig:
    """The one plain config the study measures (--config, or the short form)."""
    configs = resolve_configs(kl_options_of(options))
    if len(configs) != 1 or configs[0].overrides or configs[0].is_reference:
        names = ", ".join(c.name for c in configs)
        raise ValueError(f"--config {names}: sensitivity studies one config; accepted: one plain config that is not "
                         "FP32, e.g. --config nvfp4/fp16sr")
    return configs[0]


def candidate_configs(options: SensitivityConfig) -> tuple[ReplayConfig, ...]:
    """The --budget candidates besides --config (plain, not FP32, each once)."""
    config = study_config(options)
    extra = []
    for text in options.candidates:
        candidate = ReplayConfig.parse(text)
        if candidate.overrides or candidate.is_reference:
            raise ValueError(f"--candidates {candidate.name}: a candidate is one plain config that is not FP32 (FP32 is "
                             "always a candidate); accepted: e.g. --candidates fp8/fp16sr")
        if candidate != config and candidate not in extra:
            extra.append(candidate)
    if extra and options.budget is None:
        raise ValueError(f"--candidates {extra[0].name} without --budget; accepted: --candidates with --budget")
    return tuple(extra)


def kl_options_of(options: SensitivityConfig) -> KLConfig:
    """The kl options the stages share (a stage sets its configs and directory)."""
    return KLConfig(**{f.name: getattr(options, f.name) for f in dataclasses.fields(KLConfig)
                       if f.name not in ("output", "resume")})


def layer_variants(config: ReplayConfig, layers: list[int]) -> tuple[str, ...]:
    """C, then per layer: only it in C, only it in FP32."""
    pairs = [(f"{REFERENCE.name}+{layer}={config.name}", f"{config.name}+{layer}={REFERENCE.name}") for layer in layers]
    return (config.name, *(name for pair in pairs for name in pair))


def only_variants(config: ReplayConfig, layers: list[int]) -> tuple[str, ...]:
    """A budget candidate's variants: itself, then per layer only that layer in it."""
    return (config.name, *(f"{REFERENCE.name}+{layer}={config.name}" for layer in layers))


def plan_budget(layers_kl: dict, heads_kl: dict | None, options: SensitivityConfig, layers: list[int]) -> dict:
    """The budget's choice (docs/sensitivity_json_schema.md, "budget") from the layers stage's kl.json and, with
    --heads, the heads stage's: the layers it measured are chosen per head, every other SSM layer as a whole."""
    fp32 = REFERENCE.name
    by_name = {c["name"]: c for c in layers_kl["configs"]}
    names = [study_config(options).name, *(c.name for c in candidate_configs(options))]
    traffic = by_name[names[0]]["state_traffic"]
    costs = {name: by_name[name]["state_traffic"]["replay"]["total"] for name in names}
    costs[fp32] = traffic["conventional_fp32"]  # conventional decoding of the FP32 state
    head_rows = summarise_heads(heads_kl, study_config(options)) if heads_kl else []
    heads = [(row["layer"], row["head"]) for row in head_rows]
    units, unit_costs, predicted = [], {}, {}
    for layer in layers:
        if not any(unit[0] == layer for unit in heads):
            units.append(layer)
            unit_costs[layer] = costs
            predicted[layer] = {name: by_name[f"{fp32}+{layer}={name}"]["kl_mean"] for name in names} | {fp32: 0.0}
    heads_by_name = {c["name"]: c for c in heads_kl["configs"]} if heads_kl else {}
    for layer, head in heads:
        only = {name: heads_by_name[f"{fp32}+{layer}.h{head}={name}"] for name in names}
        parts = {name: _head_part(entry, layer, head) for name, entry in only.items()}
        units.append((layer, head))
        unit_costs[(layer, head)] = ({name: part["replay"]["total"] for name, part in parts.items()}
                                     | {fp32: parts[names[0]]["conventional_fp32"]})
        predicted[(layer, head)] = {name: entry["kl_mean"] for name, entry in only.items()} | {fp32: 0.0}
    fp32_bytes = traffic["per_model"]["conventional_fp32"]
    limit = budget_bytes(options.budget, fp32_bytes)
    assignment, kl_sum, total = choose(units, unit_costs, predicted, limit)
    return {"given": options.budget, "bytes": limit, "fp32_bytes": fp32_bytes, "candidates": [*names, fp32],
            "bytes_per_layer": costs,
            "units": [{"unit": unit_name(u), "layer": u if isinstance(u, int) else u[0],
                       "head": None if isinstance(u, int) else u[1], "bytes": unit_costs[u],
                       "predicted_kl": predicted[u], "choice": assignment[u]} for u in units],
            "assignment": {unit_name(u): c for u, c in assignment.items()},
            "config": mixed_config(assignment).name, "chosen_bytes": total, "predicted_kl": kl_sum}


def _head_part(entry: dict, layer: int, head: int) -> dict:
    """The traffic model's figures of head `head`'s own part of `layer` (per-layer fields), from the kl.json entry
    of a config that gives that head alone a config of its own (a one-head layer has no parts: the layer's)."""
    named = entry["state_traffic"]["per_layer"][str(layer)]
    return next(p for p in named.get("parts", [{**named, "heads": [head]}]) if p["heads"] == [head])


def head_variants(config: ReplayConfig, layers: list[int], heads: int) -> tuple[str, ...]:
    """Per layer and head: only that head in C, only that head in FP32."""
    return tuple(name for layer in layers for h in range(heads)
                 for name in (f"{REFERENCE.name}+{layer}.h{h}={config.name}", f"{config.name}+{layer}.h{h}={REFERENCE.name}"))


def only_head_variants(config: ReplayConfig, layers: list[int], heads: int) -> tuple[str, ...]:
    """A budget candidate's variants in the heads stage: per layer and head, only that head in it."""
    return tuple(f"{REFERENCE.name}+{layer}.h{h}={config.name}" for layer in layers for h in range(heads))


def most_sensitive(rows: list[dict], count: int) -> list[int]:
    """The `count` layers with the largest only-layer KL, in layer order."""
    ranked = sorted(rows, key=lambda row: row["only"]["kl_mean"], reverse=True)
    return sorted(row["layer"] for row in ranked[:count])


def summarise_layers(kl: dict, config: ReplayConfig, layers: list[int]) -> list[dict]:
    """One row per layer: its only-C and only-FP32 variants' numbers, and its rank (1: largest only-C KL)."""
    by_name = {c["name"]: c for c in kl["configs"]}
    rows = [{"layer": layer, "only": _variant(by_name[f"{REFERENCE.name}+{layer}={config.name}"]),
             "all_but": _variant(by_name[f"{config.name}+{layer}={REFERENCE.name}"])} for layer in layers]
    for rank, row in enumerate(sorted(rows, key=lambda r: r["only"]["kl_mean"], reverse=True), start=1):
        row["rank"] = rank
    return rows


def summarise_heads(kl: dict, config: ReplayConfig) -> list[dict]:
    """One row per (layer, head) of the heads stage (its budget candidates' variants aside)."""
    by_name = {c["name"]: c for c in kl["configs"]}
    rows = []
    for part in (p for c in kl["configs"] for p in c.get("parts", [])
                 if c["name"].startswith(f"{REFERENCE.name}+") and p["config"] == config.name):
        layer, head = part["layer"], part["heads"][0]
        rows.append({"layer": layer, "head": head,
                     "only": _variant(by_name[f"{REFERENCE.name}+{layer}.h{head}={config.name}"]),
                     "all_but": _variant(by_name[f"{config.name}+{layer}.h{head}={REFERENCE.name}"])})
    return rows


def render(run_dir: Path, options: SensitivityConfig) -> dict:
    """Write sensitivity.json from the stages' kl.json (those that exist) and return it."""
    config = study_config(options)
    layers_kl = read_json(run_dir / "layers" / "kl.json")
    layers, _ = runner_module.ssm_layout(options.model)
    rows = summarise_layers(layers_kl, config, layers)
    uniform = _variant(next(c for c in layers_kl["configs"] if c["name"] == config.name))
    stage_kl = {stage: read_json(run_dir / stage / "kl.json") for stage in STAGES
                if (run_dir / stage / "kl.json").is_file()}
    wanted = ["layers", *(["heads"] if options.heads else []), *(["budget"] if options.budget is not None else [])]
    total = sum(row["only"]["kl_mean"] for row in rows)
    heads = summarise_heads(stage_kl["heads"], config) if "heads" in stage_kl else []
    heads_done = "heads" in stage_kl and stage_kl["heads"]["complete"]
    budget = None
    if options.budget is not None and (heads_done or not options.heads):  # a plan with --heads needs every head
        budget = _budget_result(layers_kl, stage_kl.get("heads"), stage_kl.get("budget"), options, layers)
    report = {
        "schema_version": SCHEMA_VERSION,
        "kind": "sensitivity",
        "complete": all(stage in stage_kl and stage_kl[stage]["complete"] for stage in wanted),
        "model": options.model,
        "config": config.name,
        "reference": REFERENCE.name,
        "command": command_line(options, run_dir),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "options": dataclasses.asdict(options),
        "tokens": layers_kl["tokens"],
        "num_docs": layers_kl["num_docs"],
        "buckets": layers_kl["resolved"]["buckets"],
        "uniform": uniform,
        "layers": rows,
        "heads": heads,
        "additive": {"sum_only": total, "uniform": uniform["kl_mean"],
                     "ratio": total / uniform["kl_mean"] if uniform["kl_mean"] else None,
                     "heads": _heads_additive(rows, heads)},
        "budget": budget,
        "stages": {stage: stage for stage in stage_kl},
        "versions": versions(),
        "git": git_state(),
    }
    atomic_write_json(run_dir / RESULT_FILE, report)
    return report


def _heads_additive(layer_rows: list[dict], heads: list[dict]) -> list[dict]:
    """Per layer of the heads stage: its only-head KLs summed, against its only-layer KL."""
    only_layer = {row["layer"]: row["only"]["kl_mean"] for row in layer_rows}
    result = []
    for layer in sorted({h["layer"] for h in heads}):
        total = sum(h["only"]["kl_mean"] for h in heads if h["layer"] == layer)
        result.append({"layer": layer, "sum_only": total, "only_layer": only_layer[layer],
                       "ratio": total / only_layer[layer] if only_layer[layer] else None})
    return result


def _budget_result(layers_kl: dict, heads_kl: dict | None, budget_kl: dict | None, options: SensitivityConfig,
                   layers: list[int]) -> dict:
    """The plan, and once the budget stage has run, what it measured: the chosen config and every candidate."""
    plan = plan_budget(layers_kl, heads_kl, options, layers)
    measured = {}
    if budget_kl is not None:
        measured = {c["name"]: {"name": c["name"], "bytes": c["state_traffic"]["per_model"]["replay"],
                                "kl_mean": c["kl_mean"]} for c in budget_kl["configs"]}
    chosen = measured.get(plan["config"])
    return {**plan, "measured_bytes": chosen and chosen["bytes"], "measured_kl": chosen and chosen["kl_mean"],
            "measured_over_predicted": chosen["kl_mean"] / plan["predicted_kl"] if chosen and plan["predicted_kl"] else None,
            "uniform": [measured[name] for name in plan["candidates"][:-1] if name in measured]}


def command_line(options: SensitivityConfig, run_dir: Path) -> str:
    """The `replayssm-eval sensitivity` command that gives `options`."""
    return kl_command_line(dataclasses.replace(options, output=str(run_dir), resume=None), "sensitivity")


def _variant(entry: dict) -> dict:
    """What sensitivity.json keeps of one kl.json config: its name, mean KL, top-1 agreement, KL per bucket."""
    return {"name": entry["name"], "kl_mean": entry["kl_mean"], "top1_agree": entry["top1_agree"],
            "buckets": [b["kl_mean"] for b in entry["buckets"]]}


def _run_stage(kl_options: KLConfig, stage_dir: Path, variants: tuple[str, ...]) -> None:
    """One stage's kl run: resumed where it has begun, else started."""
    if (stage_dir / RUN_FILE).is_file():
        run_kl(KLConfig(resume=str(stage_dir)))
    else:
        run_kl(dataclasses.replace(kl_options, config=variants, output=str(stage_dir)))


def _output_dir(options: SensitivityConfig) -> Path:
    """--resume, --output, or reports/sensitivity-<model>-<UTC time>; a new one must be empty and writable."""
    if options.resume:
        return Path(options.resume)
    if options.output:
        path = Path(options.output)
    else:
        model = options.model.rstrip("/").replace("/", "_")
        path = Path("reports") / f"sensitivity-{model}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"--output {str(path)!r} exists and is not an empty directory; "
                         f"choose another, or continue it with --resume {path}")
    return check_output_dir(path)


def _options_for_resume(given: SensitivityConfig) -> SensitivityConfig:
    """The stored options of the study in `given.resume`; other options given must match them or be left out."""
    run_dir = Path(given.resume)
    stored = read_json(run_dir / RUN_FILE) if (run_dir / RUN_FILE).is_file() else {}
    if stored.get("kind") != "sensitivity":
        raise ValueError(f"--resume {str(run_dir)!r}: no sensitivity {RUN_FILE} there; accepted: a sensitivity run "
                         "directory")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in stored["options"].items()}
    for f in dataclasses.fields(SensitivityConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        value = getattr(given, f.name)
        if f.name not in ("resume", "output") and value != default and value != values[f.name]:
            raise ValueError(f"--{f.name.replace('_', '-')} {value!r} differs from the resumed study's "
                             f"{values[f.name]!r}; leave it out when resuming")
    return dataclasses.replace(SensitivityConfig(**values), output=str(run_dir), resume=str(run_dir))
