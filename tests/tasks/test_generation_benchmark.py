"""benchmarks/generation.py --quick runs on CPU with a tiny model and writes its table's rows."""

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "generation.py"


def _benchmark():
    spec = importlib.util.spec_from_file_location("generation_benchmark", BENCHMARK)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.slow
def test_quick_benchmark_runs_on_cpu_with_a_tiny_model(tmp_path):
    bench = _benchmark()
    bench.main(["--tiny", "--quick", "--device", "cpu", "--models", "tiny-nemotron-h", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "generation.json").read_text())["rows"]
    parts = [(r["part"], r["config"], r.get("batching")) for r in rows]
    assert parts == [("prefill", "32-token prompts", None), ("decode", "fp32", None),
                     ("decode", "nvfp4:scale=head/fp16sr", None),
                     ("gpqa", "fp32", "continuous"), ("gpqa", "fp32", "static"),
                     ("gpqa", "nvfp4:scale=head/fp16sr", "continuous"), ("gpqa", "nvfp4:scale=head/fp16sr", "static"),
                     ("profile", "fp32", None), ("profile", "nvfp4:scale=head/fp16sr", None),
                     ("decode", "HF generate", None)]
    assert all(r["tokens_per_s"] > 0 for r in rows)
    ours = [r for r in rows if r["part"] == "decode" and r["config"] != "HF generate"]
    # 8 new tokens: the first from the prefill's logits, 7 decode steps; one batch of 4 rows, never halved
    assert all(r["decode_steps"] == 7 and r["max_batch_after"] == 4 and r["first_seconds"] > 0
               and r["step_host_ms"] > 0 for r in ours)
    gpqa = [r for r in rows if r["part"] == "gpqa"]
    assert all(r["estimated_full_s"] == r["seconds"] * 1024 for r in gpqa)
    for batching in ("continuous", "static"):  # the timed call's steps, not its warm-up's (which differ per config)
        assert len({r["decode_steps"] for r in gpqa if r["batching"] == batching}) == 1
    assert "by CPU time" in (tmp_path / "profile_tiny-nemotron-h_nvfp4_scalehead_fp16sr_b4.txt").read_text()


def test_a_profile_out_of_memory_is_a_row_and_the_others_still_run(tmp_path, monkeypatch):
    """A batch and config the device cannot hold: its profile row carries the error, the next config runs, and the
    table shows both."""
    bench = _benchmark()
    ran = []

    def profile_one(rm, name, batch, config, args, out, emit):
        ran.append(config)
        if config == "fp32":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB.\nmore detail")
        emit({"part": "profile", "model": name, "batch": batch, "config": config, "step": "graph", "seconds": 0.02,
              "tokens_per_s": batch / 0.02, "peak_gib": 1.5})

    monkeypatch.setattr(bench, "profile_one", profile_one)
    rows = []
    args = argparse.Namespace(batches=[256], configs=["fp32", "nvfp4:scale=head/fp16sr"], steps=["graph"], device="cpu")
    bench.profile(None, "qwen3.5-4b", args, tmp_path, rows.append)
    assert ran == ["fp32", "nvfp4:scale=head/fp16sr"]
    assert rows[0] == {"part": "profile", "model": "qwen3.5-4b", "batch": 256, "config": "fp32", "step": "graph",
                       "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB."}
    table = bench.table(rows).splitlines()
    assert "| OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. |" in table[2]
    assert table[3].startswith("| profile | qwen3.5-4b | 256 | nvfp4:scale=head/fp16sr | graph |  | 0.02 | 12800 | "
                               "20.00 |")
