"""`--budget`: the exact choice of per-layer configs (against brute force), the budget's forms, and a study on the
fake model whose chosen mixed config is then measured beside the uniform candidates."""

import dataclasses
import itertools
import json
import random

import pytest

from replayssm_eval.kl.budget import budget_bytes, choose, mixed_config
from replayssm_eval.kl.options import SensitivityConfig
from replayssm_eval.kl.sensitivity import run_sensitivity
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.reports.load import load_results
from replayssm_eval.reports.sensitivity import budget_table

from tests.helpers.kl_fakes import FAKE_LAYERS, FAKE_MODEL, fake_layer_bytes


def test_choose_equals_brute_force():
    rng = random.Random(0)
    costs = {"fp32": 100.0, "a": 30.0, "b": 12.0, "c": 5.0}
    layers = [0, 2, 3, 5, 7]
    predicted = {layer: {"fp32": 0.0, "a": rng.uniform(0, 1), "b": rng.uniform(0, 3), "c": rng.uniform(0, 9)}
                 for layer in layers}
    for budget in (25.0, 60.0, 140.0, 333.0, 500.0):
        assignment, kl, used = choose(layers, costs, predicted, budget)
        best = min((sum(predicted[l][c] for l, c in zip(layers, combo)), combo)
                   for combo in itertools.product(costs, repeat=len(layers))
                   if sum(costs[c] for c in combo) <= budget)
        assert kl == pytest.approx(best[0], rel=1e-12) and used <= budget
        assert used == sum(costs[c] for c in assignment.values())
    assert set(choose(layers, costs, predicted, 500.0)[0].values()) == {"fp32"}
    with pytest.raises(ValueError, match=r"^--budget of 24 bytes per token is below the cheapest assignment \(25 bytes"):
        choose(layers, costs, predicted, 24.0)


def test_budget_forms_and_the_mixed_config():
    assert budget_bytes("250000", 1e6) == 250000 and budget_bytes("0.25", 1e6) == 250000 and budget_bytes("1", 8) == 8
    for bad in ("0", "-3", "lots"):
        with pytest.raises(ValueError, match=f"^--budget '{bad}' is not a positive number; accepted: bytes"):
            budget_bytes(bad, 1e6)
    assert mixed_config({0: "fp8", 2: "fp32", 4: "fp8", 6: "nvfp4/fp16sr"}).name == "fp8+2=fp32+6=nvfp4/fp16sr"


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
