"""`--budget`: the exact choice of per-layer and per-head configs (against brute force), the budget's forms, the
compact mixed config of a choice, and studies on the fake model (per layer; with --heads, per head of the most
sensitive layer, and resumed) whose chosen mixed config is then measured beside the uniform candidates."""

import dataclasses
import itertools
import json
import random

import pytest
import torch

from replayssm_eval.kl.budget import budget_bytes, choose, mixed_config, unit_name
from replayssm_eval.kl.options import SensitivityConfig
from replayssm_eval.kl.sensitivity import head_variants, only_head_variants, run_sensitivity
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.reports.load import load_results
from replayssm_eval.reports.sensitivity import budget_table, budget_units_table

from tests.helpers.kl_fakes import FAKE_HEADS, FAKE_LAYERS, FAKE_MODEL, fake_layer_bytes, rounding_mask


def brute_force(units, costs, predicted, budget):
    """(least predicted KL, its assignment) over every assignment within `budget`."""
    return min((sum(predicted[u][c] for u, c in zip(units, combo)), combo)
               for combo in itertools.product(*(costs[u] for u in units))
               if sum(costs[u][c] for u, c in zip(units, combo)) <= budget)


def test_choose_equals_brute_force():
    rng = random.Random(0)
    layer_costs = {"fp32": 100.0, "a": 30.0, "b": 12.0, "c": 5.0}
    layers = [0, 2, 3, 5, 7]
    costs = {layer: layer_costs for layer in layers}
    predicted = {layer: {"fp32": 0.0, "a": rng.uniform(0, 1), "b": rng.uniform(0, 3), "c": rng.uniform(0, 9)}
                 for layer in layers}
    for budget in (25.0, 60.0, 140.0, 333.0, 500.0):
        assignment, kl, used = choose(layers, costs, predicted, budget)
        assert kl == pytest.approx(brute_force(layers, costs, predicted, budget)[0], rel=1e-12) and used <= budget
        assert used == sum(layer_costs[c] for c in assignment.values())
    assert set(choose(layers, costs, predicted, 500.0)[0].values()) == {"fp32"}
    with pytest.raises(ValueError, match=r"^--budget of 24 bytes per token is below the cheapest assignment \(25 bytes"):
        choose(layers, costs, predicted, 24.0)


@pytest.mark.parametrize("seed", range(4))
def test_choose_over_layers_and_heads_equals_brute_force(seed):
    # whole layers and heads of split layers, each unit with its own random costs (a head's a few times below
    # its layer's), candidates not always cheaper than FP32
    rng = random.Random(seed)
    units = [0, (1, 0), (1, 1), (1, 2), 4, (6, 0), (6, 1), (6, 2), (6, 3), 9][: 6 + seed]
    names = ("fp32", "a", "b", "c")
    costs, predicted = {}, {}
    for u in units:
        scale = 1.0 if isinstance(u, int) else rng.uniform(0.15, 0.4)
        costs[u] = {name: scale * rng.uniform(3.0, 110.0) for name in names}
        predicted[u] = {"fp32": 0.0} | {name: scale * rng.uniform(0, 2) ** 3 for name in names[1:]}
    cheapest = sum(min(c.values()) for c in costs.values())
    dearest = sum(max(c.values()) for c in costs.values())
    for fraction in (0.0, 0.13, 0.37, 0.61, 0.89, 1.0):
        budget = cheapest + fraction * (dearest - cheapest)
        assignment, kl, used = choose(units, costs, predicted, budget)
        best, combo = brute_force(units, costs, predicted, budget)
        assert kl == pytest.approx(best, rel=1e-12, abs=1e-15) and used <= budget
        assert used == pytest.approx(sum(costs[u][c] for u, c in assignment.items()), rel=1e-12)
        assert kl == pytest.approx(sum(predicted[u][c] for u, c in assignment.items()), rel=1e-12, abs=1e-15)
        assert list(assignment) == units
    with pytest.raises(ValueError, match=r"^--budget of \d+ bytes per token is below the cheapest assignment"):
        choose(units, costs, predicted, cheapest * 0.999)


def test_budget_forms():
    assert budget_bytes("250000", 1e6) == 250000 and budget_bytes("0.25", 1e6) == 250000 and budget_bytes("1", 8) == 8
    for bad in ("0", "-3", "lots"):
        with pytest.raises(ValueError, match=f"^--budget '{bad}' is not a positive number; accepted: bytes"):
            budget_bytes(bad, 1e6)


@pytest.mark.parametrize("assignment, name", [
    ({0: "fp8", 2: "fp32", 4: "fp8", 6: "nvfp4/fp16sr"}, "fp8+2=fp32+6=nvfp4/fp16sr"),
    # layer 4 per head: most of its heads FP32 (its base), head 2 and 4 apart; the default is the most used base
    ({0: "fp8", 2: "fp8", (4, 0): "fp32", (4, 1): "fp32", (4, 2): "nvfp4/fp16sr", (4, 3): "fp32", (4, 4): "fp8",
      6: "nvfp4/fp16sr"}, "fp8+4=fp32+6=nvfp4/fp16sr+4.h2=nvfp4/fp16sr+4.h4=fp8"),
    # adjacent heads with one choice share a range; heads in their layer's base need no part
    ({(1, h): c for h, c in enumerate(["fp8", "fp8", "fp8", "fp32", "fp8", "fp32", "fp32"])} | {3: "fp32"},
     "fp32+1=fp8+1.h3=fp32+1.h5-6=fp32"),
    ({(1, h): "fp8" for h in range(3)} | {(5, h): c for h, c in enumerate(["fp32", "fp8", "fp32"])} | {7: "fp32"},
     "fp32+1=fp8+5.h1=fp8"),
])
def test_mixed_config_of_layers_and_heads(assignment, name):
    config = mixed_config(assignment)
    assert config.name == name and ReplayConfig.parse(name) == config
    heads = {}
    for unit in assignment:
        if isinstance(unit, tuple):
            heads[unit[0]] = max(heads.get(unit[0], 0), unit[1] + 1)
    for unit, chosen in assignment.items():  # every layer and head runs its choice, and only it
        layer, head = (unit, None) if isinstance(unit, int) else unit
        runs = {h: c.name for c, hs in config.layer_parts(layer, heads.get(layer, 3)) for h in hs}
        assert (set(runs.values()) == {chosen}) if head is None else runs[head] == chosen, unit


def test_budget_study_on_the_fake_model(fake, tmp_path):
    fake()
    c, other = ReplayConfig.parse("bf16/fp32@8"), ReplayConfig.parse("shared:fp8@8")
    costs = {c.name: fake_layer_bytes(c), other.name: fake_layer_bytes(other), "fp32": fake_layer_bytes(ReplayConfig())}
    budget = costs["fp32"] + 2 * costs[other.name]  # one layer in FP32 and two in the cheapest candidate
    options = SensitivityConfig(model=FAKE_MODEL, config=(c.name,), candidates=(other.name,), budget=str(budget),
                                num_docs=2, prompt_len=40, tokens=64, segment_len=32, device="cpu",
                                output=str(tmp_path / "study"))
    run_dir = run_sensitivity(options)
    report = json.loads((run_dir / "sensitivity.json").read_text())
    plan = report["budget"]
    assert report["complete"] and plan["bytes"] == budget and plan["chosen_bytes"] <= budget
    assert plan["bytes_per_layer"] == costs and plan["candidates"] == [c.name, other.name, "fp32"]
    assignment = {int(k): v for k, v in plan["assignment"].items()}
    assert sorted(assignment) == list(FAKE_LAYERS)
    assert plan["config"] == mixed_config(assignment).name
    budget_kl = json.loads((run_dir / "budget" / "kl.json").read_text())
    measured = {e["name"]: e for e in budget_kl["configs"]}
    assert plan["measured_kl"] == measured[plan["config"]]["kl_mean"]
    assert plan["measured_over_predicted"] == pytest.approx(plan["measured_kl"] / plan["predicted_kl"])
    assert [u["name"] for u in plan["uniform"]] == [c.name, other.name]
    assert measured[plan["config"]]["state_traffic"]["per_model"]["replay"] == plan["chosen_bytes"]
    results = load_results([run_dir])  # the study, and its budget stage as a kl run (Pareto plot)
    assert sorted((r.kind, r.run) for r in results) == [("kl", "study/budget"), ("sensitivity", "study")]
    table = budget_table(next(r for r in results if r.kind == "sensitivity"))
    assert table.rows[0][0] == f"chosen: {plan['config']}" and [r[0] for r in table.rows[1:]] == [c.name, other.name]
    with pytest.raises(ValueError, match="--candidates shared:fp8@8 without --budget"):
        run_sensitivity(dataclasses.replace(options, budget=None, output=str(tmp_path / "other")))


@pytest.fixture
def per_head_study(tmp_path):
    c, other = ReplayConfig.parse("bf16/fp32@8"), ReplayConfig.parse("shared:fp8@8")

    def make(name):  # at 1500 bytes the fake's most sensitive layer splits: some heads FP32, some in shared:fp8@8
        return SensitivityConfig(model=FAKE_MODEL, config=(c.name,), candidates=(other.name,), heads=1, budget="1500",
                                 num_docs=2, prompt_len=40, tokens=64, segment_len=32, device="cpu",
                                 output=str(tmp_path / name))

    return c, other, make


def test_per_head_budget_study_on_the_fake_model(fake, per_head_study):
    fake()
    c, other, make = per_head_study
    run_dir = run_sensitivity(make("study"))
    report = json.loads((run_dir / "sensitivity.json").read_text())
    plan = report["budget"]
    top = report["heads"][0]["layer"]
    heads_kl = {e["name"]: e for e in json.loads((run_dir / "heads" / "kl.json").read_text())["configs"]}
    # the heads stage runs C's two variants per head and the other candidate's only-this-head variant
    expected = head_variants(c, [top], FAKE_HEADS) + only_head_variants(other, [top], FAKE_HEADS)
    assert sorted(heads_kl) == sorted(expected)
    units = [layer for layer in FAKE_LAYERS if layer != top] + [(top, h) for h in range(FAKE_HEADS)]
    assert [u["unit"] for u in plan["units"]] == [unit_name(u) for u in units]
    candidates = (c, other, ReplayConfig())
    costs, predicted = {}, {}
    for unit, row in zip(units, plan["units"]):
        heads = FAKE_HEADS if isinstance(unit, int) else 1  # the fake's per-head part stores one head's copies
        costs[unit] = {k.name: fake_layer_bytes(k, heads) for k in candidates}
        assert row["bytes"] == costs[unit] and row["choice"] == plan["assignment"][row["unit"]]
        if isinstance(unit, tuple):
            assert row["predicted_kl"] == {k.name: heads_kl[f"fp32+{top}.h{unit[1]}={k.name}"]["kl_mean"]
                                           for k in candidates[:2]} | {"fp32": 0.0}
        predicted[unit] = row["predicted_kl"]
    assert plan["predicted_kl"] == pytest.approx(brute_force(units, costs, predicted, 1500.0)[0], rel=1e-12)
    assignment = {u: plan["assignment"][unit_name(u)] for u in units}
    config = ReplayConfig.parse(plan["config"])
    assert config == mixed_config(assignment) and any(p.heads for p in config.overrides)  # per head where it pays
    # the chosen config rounds exactly the layers and heads whose choice is not FP32
    expected = torch.zeros(len(FAKE_LAYERS), FAKE_HEADS, dtype=torch.bool)
    for unit, choice in assignment.items():
        layer, heads = (unit, slice(None)) if isinstance(unit, int) else (unit[0], unit[1])
        expected[FAKE_LAYERS.index(layer), heads] = choice != "fp32"
    channels = len(rounding_mask(config)) // expected.numel()
    assert torch.equal(rounding_mask(config), expected.repeat_interleave(channels))
    measured = {e["name"]: e for e in json.loads((run_dir / "budget" / "kl.json").read_text())["configs"]}
    assert plan["measured_kl"] == measured[plan["config"]]["kl_mean"]
    traffic = measured[plan["config"]]["state_traffic"]["per_model"]["replay"]
    assert plan["measured_bytes"] == plan["chosen_bytes"] == traffic  # the fake's heads share nothing
    results = load_results([run_dir])
    units_table = budget_units_table(next(r for r in results if r.kind == "sensitivity"))
    assert [row[:2] for row in units_table.rows] == [[unit_name(u), assignment[u]] for u in units]


@pytest.mark.parametrize("stage", [2, 3])  # Ctrl-C in the heads stage, in the budget stage
def test_per_head_budget_study_resumed(fake, per_head_study, tmp_path, stage):
    fake()
    _, _, make = per_head_study
    straight = json.loads((run_sensitivity(make("a")) / "sensitivity.json").read_text())
    loaded = {}

    def in_stage():  # each stage loads its own runner
        if len(loaded["runners"]) == stage:
            raise KeyboardInterrupt

    loaded["runners"] = fake(fail_after=5, fault=in_stage)
    with pytest.raises(KeyboardInterrupt):
        run_sensitivity(make("b"))
    partial = json.loads((tmp_path / "b" / "sensitivity.json").read_text())
    assert not partial["complete"] and (partial["budget"] is None) == (stage == 2)  # the plan waits for every head
    fake()
    resumed_dir = run_sensitivity(SensitivityConfig(resume=str(tmp_path / "b")))
    resumed = json.loads((resumed_dir / "sensitivity.json").read_text())
    for key in ("uniform", "layers", "heads", "additive", "budget", "complete"):
        assert resumed[key] == straight[key], key
