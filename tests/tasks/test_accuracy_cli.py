"""`replayssm-eval accuracy` end to end on the tiny models and the offline fixtures; resume; bad input."""

import json

import pytest

pytest.importorskip("lm_eval")

import lm_eval

from replayssm_eval import cli
from replayssm_eval.accuracy import DEFAULT_TASKS

FAST = ["--data", "fixtures", "--limit", "2", "--max-gen-toks", "6", "--bootstrap-iters", "200", "--max-batch-size", "2"]
CONFIGS = "fp32,nvfp4/fp16sr@4"


def run(*args) -> int:
    return cli.main(["accuracy", *FAST, *args])


@pytest.fixture
def count_runs(monkeypatch):
    """Counts lm-eval evaluations: each one is a (config, task) computed."""
    calls = []
    evaluate = lm_eval.simple_evaluate

    def counted(**kwargs):
        calls.append(kwargs["tasks"][0].config.task)
        return evaluate(**kwargs)

    monkeypatch.setattr(lm_eval, "simple_evaluate", counted)
    return calls


@pytest.mark.parametrize("model, limit", [pytest.param("tiny-nemotron-h", 2, marks=pytest.mark.slow),
                                          ("tiny-qwen3.5", 1)])  # CI time
def test_end_to_end_on_fixtures(tmp_path, model, limit, count_runs):
    out = tmp_path / "run"
    assert run("--model", model, "--configs", CONFIGS, "--output", str(out), "--limit", str(limit)) == 0
    assert len(count_runs) == 2 * len(DEFAULT_TASKS)
    report = json.loads((out / "accuracy.json").read_text())
    assert report["complete"] and report["model"] == model and report["configs"] == ["nvfp4/fp16sr@4"]
    assert {"versions", "git", "seeds", "command", "date"} <= set(report)
    for name, task in report["tasks"].items():
        assert task["n"] == limit and task["max_gen_toks"] == 6
        assert sum(b["n"] for b in task["buckets"]) == limit and task["buckets"][0]["start"] == 1
        stats = task["all"]["configs"]["nvfp4/fp16sr@4"]
        assert set(stats) >= {"acc", "gap", "ci_low", "ci_high", "p_value", "flips_to_wrong", "flips_to_right", "truncated",
                              "mean_gen_tokens", "loop_rate"}
        assert 1 <= task["all"]["fp32_mean_gen_tokens"] <= 6 and task["all"]["fp32_loop_rate"] == 0.0  # 6 tokens: no loop
        for config_dir in ("fp32", "nvfp4+fp16sr@4"):
            samples = [json.loads(line) for line in (out / config_dir / f"samples_{name}.jsonl").open()]
            assert {s["doc_id"] for s in samples} == set(range(limit))
            assert all(1 <= s["gen_tokens"] <= 6 and s["max_gen_toks"] == 6 and s["loop"] is False for s in samples)
            assert all(s["gen_tokens"] == 6 for s in samples if s["hit_max_gen_toks"])
            assert "results" in json.loads((out / config_dir / f"results_{name}.json").read_text())
    assert "| generated tokens (fp32) |" in (out / "accuracy.md").read_text() and ", degeneration" in (out / "accuracy.md").read_text()


@pytest.mark.slow
def test_resume_never_recomputes_a_finished_config_or_task(tmp_path, count_runs):
    out = str(tmp_path / "run")
    assert run("--tasks", "gpqa_diamond", "--configs", CONFIGS, "--output", out) == 0
    assert run("--tasks", "gpqa_diamond,mmlu_pro", "--configs", CONFIGS, "--output", out) == 0
    assert count_runs == ["replayssm_gpqa_diamond_local"] * 2 + ["replayssm_mmlu_pro_local"] * 2
    assert run("--tasks", "gpqa_diamond", "--configs", CONFIGS, "--output", out, "--limit", "1") == 2  # other options


@pytest.mark.parametrize("args, message", [
    (["--tasks", "gpqa_diamond,arc"], "unknown task 'arc'; known: gpqa_diamond, mmlu_pro, math_l5"),
    (["--configs", "fp32,nvfp5"], "unknown state format 'nvfp5'; known:"),
    (["--limit", "0"], "--limit must be >= 1, got 0"),
    (["--max-batch-size", "0"], "--max-batch-size must be a positive integer or auto, got '0'"),
    (["--buckets", "pow2"], "accepted: quantile:K"),
    (["--data", "/nonexistent"], "accepted: hub, fixtures, or a directory"),
    (["--gen-kwargs", "temperature=-1"], "temperature must be >= 0 (0: greedy), got -1.0"),
    (["--gen-kwargs", "temperature=0.6,min_p=0.1"], "bad generation kwarg 'min_p=0.1'; accepted: do_sample=..., "),
    (["--gen-kwargs", "temperature=0.6,top_p=1.2"], "top_p must be in (0, 1], got 1.2"),
    (["--samples", "0"], "--samples must be >= 1, got 0"),
    (["--samples", "4"], "--samples 4 needs sampling: greedy samples are all the same"),
    (["--sampling-seed", "-1"], "--sampling-seed must be >= 0, got -1"),
    (["--step", "graph", "--configs", "fp32,nvfp4/fp16sr#spec=4:0.5"],
     "--step graph covers fixed windows only, got speculative config 'nvfp4/fp16sr#spec=4:0.5'; use --step triton"),
    (["--step", "static", "--configs", "nvfp4/fp16sr+1=fp32"],
     "--step static takes one config for every layer, got mixed config 'nvfp4/fp16sr+1=fp32'; use --step triton"),
])
def test_bad_input_is_one_clear_error(args, message, capsys):
    assert cli.main(["accuracy", *args]) == 2
    assert message in capsys.readouterr().err


def test_missing_dataset_names_the_task_and_what_is_accepted(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    assert cli.main(["accuracy", "--tasks", "mmlu_pro", "--data", str(tmp_path / "data"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "missing dataset for task mmlu_pro" in err and "data/test*" in err and "--data accepts hub, fixtures" in err
    assert not (tmp_path / "o").exists()


SAMPLED = ["--gen-kwargs", "temperature=1.0,top_p=0.95,top_k=40", "--samples", "2", "--sampling-seed", "5"]
PAIRED = "fp32,fp32#seed=3"  # an SR seed under an FP32 state changes no logit: the same samples as fp32


def samples_by_key(folder, task="gpqa_diamond", field="resps") -> dict:
    """{(doc_id, sample): field} of one config's samples file (the flexible-extract lines)."""
    lines = [json.loads(line) for line in (folder / f"samples_{task}.jsonl").open()]
    return {(s["doc_id"], s["sample"]): s[field] for s in lines if s["filter"] == "flexible-extract"}


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sampled") / "run"
    assert run("--model", "tiny-qwen3.5", "--tasks", "gpqa_diamond", "--configs", PAIRED, "--output", str(out),
               *SAMPLED) == 0
    return out


def test_sampled_run_records_the_settings_and_pairs_identical_samples(sampled_run):
    report = json.loads((sampled_run / "accuracy.json").read_text())
    assert report["sampling"] == {"do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 40, "samples": 2, "seed": 5}
    assert report["seeds"]["sampling"] == 5 and "sign-flip" in report["p_value_method"]
    task = report["tasks"]["gpqa_diamond"]
    assert task["samples"] == 2 and task["n"] == 2
    stats = task["all"]["configs"]["fp32#seed=3"]
    assert (stats["gap"], stats["flips_to_wrong"], stats["flips_to_right"], stats["p_value"]) == (0.0, 0, 0, 1.0)
    fp32, other = samples_by_key(sampled_run / "fp32"), samples_by_key(sampled_run / "fp32#seed=3")
    assert sorted(fp32) == [(0, 0), (0, 1), (1, 0), (1, 1)] and fp32 == other
    assert fp32[(0, 0)] != fp32[(0, 1)] and fp32[(1, 0)] != fp32[(1, 1)]  # two samples, two draws
    assert "avg@2" in (sampled_run / "accuracy.md").read_text()
    options = json.loads((sampled_run / "run.json").read_text())["options"]
    assert (options["gen_kwargs"], options["samples"], options["sampling_seed"]) == (SAMPLED[1], 2, 5)
    # the sampling settings are resume keys
    assert run("--model", "tiny-qwen3.5", "--tasks", "gpqa_diamond", "--configs", PAIRED, "--output", str(sampled_run),
               *SAMPLED[:-1], "6") == 2


def test_offline_export_generate_score_carries_the_sampling(sampled_run, tmp_path, capsys):
    from replayssm_eval.generate.offline import generate_requests

    requests = tmp_path / "requests.jsonl"
    assert run("--tasks", "gpqa_diamond", "--configs", PAIRED, "--export-requests", str(requests), *SAMPLED) == 0
    lines = [json.loads(line) for line in requests.open()]
    assert len(lines) == 2 and all(r["sampling"] == {"temperature": 1.0, "top_p": 0.95, "top_k": 40} and r["samples"] == 2
                                   and r["sampling_seed"] == 5 for r in lines)
    gens = generate_requests(requests, tmp_path / "gens.jsonl", model="tiny-qwen3.5", configs=["fp32", "fp32#seed=3"],
                             batch_size=3, device="cpu")
    answers = [json.loads(line) for line in gens.open()]
    assert sorted((a["config"], a["doc_id"], a["sample"]) for a in answers) == sorted(
        (c, d, j) for c in ("fp32", "fp32#seed=3") for d in (0, 1) for j in (0, 1))
    scored = tmp_path / "scored"
    assert run("--model", "tiny-qwen3.5", "--tasks", "gpqa_diamond", "--configs", PAIRED, "--generations", str(gens),
               "--output", str(scored), *SAMPLED) == 0
    # generated in another process, in other batches: the same draws as the in-process run
    assert samples_by_key(scored / "fp32") == samples_by_key(sampled_run / "fp32")
    assert json.loads((scored / "accuracy.json").read_text())["tasks"] == json.loads(
        (sampled_run / "accuracy.json").read_text())["tasks"]
    capsys.readouterr()
    assert run("--model", "tiny-qwen3.5", "--tasks", "gpqa_diamond", "--configs", PAIRED, "--generations", str(gens),
               "--output", str(tmp_path / "other"), *SAMPLED[:-1], "6") == 2  # another sampling seed
    assert "the generations file answers" in capsys.readouterr().err
