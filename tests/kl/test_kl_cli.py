"""`replayssm-eval kl` in-process: options from KLConfig, files written, errors and Ctrl-C exit codes."""

import json

import pytest

from replayssm_eval.cli import main

from tests.helpers.kl_fakes import FAKE_MODEL

ARGS = ["kl", "--model", FAKE_MODEL, "--device", "cpu", "--num-docs", "2", "--prompt-len", "16",
        "--tokens", "100", "--segment-len", "32", "--buckets", "log:5"]


def test_kl_command_writes_the_report(fake, tmp_path):
    fake()
    out = tmp_path / "run"
    code = main([*ARGS, "--config", "fp32", "--read", "bf16", "--window", "8", "--output", str(out)])
    assert code == 0
    assert {p.name for p in out.iterdir()} == {"run.json", "kl.json", "kl_buckets.csv", "kl_vs_length.png"}
    report = json.loads((out / "kl.json").read_text())
    assert [c["name"] for c in report["configs"]] == ["fp32", "bf16/fp32@8"]
    assert report["resolved"]["source"] == "bundled text" and report["complete"]
    assert report["command"] == (
        f"replayssm-eval kl --model {FAKE_MODEL} --config fp32 --read bf16 --window 8 --num-docs 2 --prompt-len 16 "
        f"--tokens 100 --segment-len 32 --buckets log:5 --device cpu --output {out}"
    )
    lines = (out / "kl_buckets.csv").read_text().splitlines()
    assert lines[0].startswith("config,start,end,count,kl_mean,kl_median,kl_p99,kl_ci_low,kl_ci_high,top1_agree")
    assert lines[0].endswith(",delta_p_rms,delta_p_rms_se,same_top_p_pct,same_top_p_se_pct")  # llama.cpp's statistics
    assert len(lines) == 1 + 2 * len(report["configs"][0]["buckets"])
    fp32, bf16 = report["configs"]  # fp32 is the reference itself; bf16 reads move the distributions
    assert (fp32["kl_max"], fp32["delta_p_rms"], fp32["same_top_p_pct"]) == (0.0, 0.0, 100.0)
    assert bf16["kl_max"] >= bf16["kl_p99_9"] > 0 and bf16["delta_p_rms"] > 0
    assert bf16["same_top_p_pct"] == 100 * bf16["top1_agree"]


def test_default_configs_and_output_folder(fake, tmp_path, monkeypatch):
    fake()
    monkeypatch.chdir(tmp_path)
    assert main(ARGS) == 0
    (run,) = (tmp_path / "reports").iterdir()
    assert run.name.startswith(f"kl-{FAKE_MODEL}-") and run.name.endswith("Z")
    names = [c["name"] for c in json.loads((run / "kl.json").read_text())["configs"]]
    assert names == ["shared:nvfp4", "nvfp4/fp32", "nvfp4/fp16sr"]


def test_bad_config_is_one_line_and_exit_2(fake, tmp_path, capsys):
    fake()
    assert main([*ARGS, "--config", "nvfp5/fp32", "--output", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "replayssm-eval kl: error:" in err and "nvfp5" in err
    assert not (tmp_path / "x").exists()


def test_unknown_dataset_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["kl", "--dataset", "pg20"])
    assert exc.value.code == 2 and "invalid choice: 'pg20'" in capsys.readouterr().err


def test_ctrl_c_exits_130_with_a_resume_hint(fake, tmp_path, capsys):
    fake(fail_after=2)
    out = tmp_path / "run"
    assert main([*ARGS, "--output", str(out)]) == 130
    assert f"--resume {out}" in capsys.readouterr().err
    fake()
    assert main(["kl", "--resume", str(out)]) == 0
    assert json.loads((out / "kl.json").read_text())["complete"]
