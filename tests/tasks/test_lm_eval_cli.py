"""lm-eval's own `lm_eval` script knows `--model replayssm` once the package is installed (the .pth hook
of `replayssm_eval.accuracy.lm_eval_plugin`), and runs it on our tasks through `--include_path`.

These run real interpreters of this environment: they test the installed package (`pip install -e .`).
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

from replayssm_eval.accuracy import TASKS, YAML_DIR

PTH_NAME = "replayssm_eval_lm_eval.pth"
LM_EVAL = shutil.which("lm_eval", path=sysconfig.get_path("scripts"))
REINSTALL = "reinstall the package: pip install -e . --no-deps"


def run(args: list[str], cwd) -> subprocess.CompletedProcess:
    """`args` in a fresh process outside the checkout (so the installed package is what imports), offline."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run(args, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_installed_pth_hook_is_this_checkouts():
    pths = [Path(p, PTH_NAME) for p in sys.path if Path(p, PTH_NAME).is_file()]  # site dirs are on sys.path
    assert pths, f"replayssm-eval is installed without {PTH_NAME}: {REINSTALL}"
    pytest.importorskip("setuptools")  # the build commands that write it
    from replayssm_eval.accuracy.lm_eval_plugin_build import pth_text

    assert pths[0].read_text() == pth_text(), f"{pths[0]} is from an older lm_eval_plugin.py: {REINSTALL}"


@pytest.mark.skipif(find_spec("lm_eval") is None, reason="lm-eval is not installed (pip install -e '.[eval]')")
def test_lm_eval_registers_replayssm_lazily(tmp_path):
    code = ("import sys, lm_eval.models; from lm_eval.api.registry import get_model, model_registry; "
            "assert dict(model_registry.items())['replayssm'] == 'replayssm_eval.accuracy.lm_model:ReplaySSMLM'; "
            "assert 'torch' not in sys.modules and 'replayssm_eval' not in sys.modules, 'not lazy'; "
            "model = get_model('replayssm'); print(model.__module__, model.__name__, get_model('hf').__name__)")
    proc = run([sys.executable, "-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["replayssm_eval.accuracy.lm_model", "ReplaySSMLM", "HFLM"]


@pytest.mark.skipif(LM_EVAL is None, reason=f"no lm_eval console script in {sysconfig.get_path('scripts')} "
                                            "(pip install -e '.[eval]')")
@pytest.mark.slow
def test_lm_eval_script_runs_replayssm_on_our_tasks(tmp_path):
    gen_log, out = tmp_path / "gen.jsonl", tmp_path / "out"
    tasks = [spec.local for spec in TASKS.values()]
    proc = run([LM_EVAL, "--model", "replayssm",
                "--model_args", f"pretrained=tiny-nemotron-h,read=nvfp4,recur=fp16sr,window=16,gen_log={gen_log}",
                "--include_path", str(YAML_DIR), "--tasks", ",".join(tasks), "--limit", "2",
                "--gen_kwargs", "max_gen_toks=6", "--device", "cpu", "--batch_size", "2",
                "--output_path", str(out), "--log_samples"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = out.glob("*/results_*.json")
    report = json.loads(results.read_text())
    assert report["config"]["model"] == "replayssm" and set(report["results"]) == set(tasks)
    records = {(r["task"], r["doc_id"]): r for r in map(json.loads, gen_log.read_text().splitlines())}
    samples = {(task, json.loads(line)["doc_id"]) for task in tasks  # a line per doc and filter
               for line in next(out.glob(f"*/samples_{task}_*.jsonl")).read_text().splitlines()}
    assert samples == set(records) and len(samples) == 2 * len(tasks)
    for r in records.values():
        assert r["config"] == "nvfp4/fp16sr" and r["max_gen_toks"] == 6 and 1 <= r["gen_tokens"] <= 6


def test_gen_log_folder_is_created_before_generating(tmp_path):
    from replayssm_eval.accuracy.lm_model import ReplaySSMLM

    log = tmp_path / "out" / "gen.jsonl"
    ReplaySSMLM(pretrained="tiny-nemotron-h", device="cpu", gen_log=str(log))
    assert log.parent.is_dir()


LM_EVAL_SETTINGS = {"batch_size": "2", "max_batch_size": None, "device": "cuda:0"}  # what its CLI passes by default


@pytest.mark.skipif(find_spec("lm_eval") is None, reason="lm-eval is not installed (pip install -e '.[eval]')")
@pytest.mark.parametrize("as_string", [True, False])
def test_model_args_through_lm_evals_construction_keep_device_and_integers(as_string):
    """lm-eval builds the model as simple_evaluate does: from its CLI's parsed dict (values already converted,
    '-3' to -3.0) or from a string, with its own --device and --batch_size beside the model args."""
    from lm_eval._cli.utils import key_val_to_dict
    from lm_eval.api.registry import get_model

    from replayssm_eval.replay.config import ReplayConfig

    cls = get_model("replayssm")

    def build(args: str):
        if as_string:
            return cls.create_from_arg_string(args, LM_EVAL_SETTINGS)
        return cls.create_from_arg_obj(key_val_to_dict(args), LM_EVAL_SETTINGS)

    lm = build("pretrained=tiny-nemotron-h,read=nvfp4,recur=fp16sr,window=4,seed=3,device=cpu")
    assert lm.rm.model.device.type == "cpu" and lm.batch_size == 2
    assert lm.config == ReplayConfig.parse("nvfp4/fp16sr@4#seed=3")
    with pytest.raises(ValueError, match=r"^replayssm model args: seed=-3 is out of range; accepted: an integer >= 0$"):
        build("pretrained=tiny-nemotron-h,window=4,seed=-3")


@pytest.mark.skipif(find_spec("lm_eval") is None or torch.cuda.is_available(), reason="needs lm-eval and no GPU")
def test_lm_evals_default_device_means_cpu_but_a_device_model_arg_is_strict():
    from lm_eval.api.registry import get_model

    cls = get_model("replayssm")
    assert cls.create_from_arg_string("pretrained=tiny-nemotron-h", LM_EVAL_SETTINGS).rm.model.device.type == "cpu"
    with pytest.raises(ValueError, match="device='cuda': no CUDA device is available; accepted here: cpu or auto"):
        cls.create_from_arg_string("pretrained=tiny-nemotron-h,device=cuda", LM_EVAL_SETTINGS)


SAMPLING_ARGS = "max_gen_toks=6,do_sample=true,temperature=1.0,top_p=0.95,top_k=40"


@pytest.mark.skipif(find_spec("lm_eval") is None, reason="lm-eval is not installed (pip install -e '.[eval]')")
def test_lm_eval_repeats_are_successive_samples_and_sample_sets_the_first():
    from lm_eval.api.instance import Instance

    from replayssm_eval.accuracy.lm_model import ReplaySSMLM

    lm = ReplaySSMLM(pretrained="tiny-nemotron-h", device="cpu", sampling_seed=5)
    kwargs = {"until": ["\n\n"], "max_gen_toks": 6, "do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 40}
    a = Instance("generate_until", {}, ("ROMEO:\nBut soft, what light", kwargs), 0, ("t", 0, 2))
    b = Instance("generate_until", {}, ("HAMLET:\nAlas, poor", kwargs), 0, ("t", 1, 2))
    first = lm.generate_until([a, a, b, b])  # lm-eval's repeats: each request twice in a row
    assert [r["sample"] for r in lm.records] == [0, 1, 0, 1]
    assert first[0] != first[1] and first[2] != first[3]
    lm.sample = 1
    assert lm.generate_until([b, a]) == [first[3], first[1]]  # sample=1 answers with the second draws
    lm.samples, lm.sample = 2, 0  # the accuracy driver: both samples in one engine run, one answered per evaluation
    assert lm.generate_until([b, a]) == [first[2], first[0]] and len(lm._ahead) == 2
    lm.sample = 1
    assert lm.generate_until([b, a]) == [first[3], first[1]] and not lm._ahead
    greedy = {**kwargs, "do_sample": False}
    lm.samples, lm.sample = 1, 0
    plain = ReplaySSMLM(pretrained="tiny-nemotron-h", device="cpu")
    assert lm.generate_until([Instance("generate_until", {}, (a.args[0], greedy), 0, ("t", 0, 1))]) == \
        plain.generate_until([Instance("generate_until", {}, (a.args[0], {"until": ["\n\n"], "max_gen_toks": 6}), 0, ("t", 0, 1))])
    with pytest.raises(ValueError, match="top_p must be in \\(0, 1\\], got 2.0"):
        lm.generate_until([Instance("generate_until", {}, (a.args[0], {**kwargs, "top_p": 2}), 0, ("t", 0, 1))])
    with pytest.raises(ValueError, match="unsupported generation kwargs min_p; replayssm accepts until, max_gen_toks, do_sample"):
        lm.generate_until([Instance("generate_until", {}, (a.args[0], {**kwargs, "min_p": 0.1}), 0, ("t", 0, 1))])


@pytest.mark.skipif(LM_EVAL is None, reason=f"no lm_eval console script in {sysconfig.get_path('scripts')} "
                                            "(pip install -e '.[eval]')")
@pytest.mark.slow
def test_lm_eval_script_samples_with_do_sample(tmp_path):
    from lm_eval.api.instance import Instance

    from replayssm_eval.accuracy.lm_model import ReplaySSMLM

    task = TASKS["gpqa_diamond"].local
    answers = {}
    for sample in (0, 1):
        out, gen_log = tmp_path / f"out{sample}", tmp_path / f"gen{sample}.jsonl"
        proc = run([LM_EVAL, "--model", "replayssm", "--model_args",
                    f"pretrained=tiny-nemotron-h,config=nvfp4/fp16sr@4,sampling_seed=5,sample={sample},gen_log={gen_log}",
                    "--include_path", str(YAML_DIR), "--tasks", task, "--limit", "2", "--gen_kwargs", SAMPLING_ARGS,
                    "--device", "cpu", "--batch_size", "2", "--output_path", str(out), "--log_samples"], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [json.loads(line) for line in next(out.glob(f"*/samples_{task}_*.jsonl")).read_text().splitlines()]
        answers[sample] = {s["doc_id"]: (tuple(s["arguments"]["gen_args_0"].values()), s["resps"][0][0]) for s in lines}
        assert {r["sample"] for r in map(json.loads, gen_log.read_text().splitlines())} == {sample}
    assert answers[0].keys() == answers[1].keys() == {0, 1}
    assert all(answers[0][d][1] != answers[1][d][1] for d in (0, 1))  # another sample index, other draws
    # the in-process model draws the same tokens (lm-eval's repeats: samples 0 and 1)
    lm = ReplaySSMLM(pretrained="tiny-nemotron-h", config="nvfp4/fp16sr@4", device="cpu", sampling_seed=5)
    for doc, ((prompt, kwargs), _) in answers[0].items():
        request = Instance("generate_until", {}, (prompt, kwargs), 0, (task, doc, 2))
        assert kwargs["do_sample"] is True and kwargs["temperature"] == 1.0
        assert lm.generate_until([request, request]) == [answers[0][doc][1], answers[1][doc][1]]
