"""Report tables from hand-built JSON: the GPQA layout, per-bucket KL, traffic, the Pareto frontier."""

import json

import pytest

from replayssm_eval.reports import tables
from replayssm_eval.reports.load import Result, load_results

from tests.helpers.reports import kl_report


def test_accuracy_table_in_the_gpqa_layout(results_dir):
    (acc,) = [r for r in load_results([results_dir]) if r.kind == "accuracy"]
    (table,) = tables.accuracy_tables(acc)
    assert table.title.endswith("gpqa_diamond, max_gen_toks 4096")
    assert table.columns == ["generated tokens (fp32)", "n", "fp32 acc (%)", "shared:nvfp4 Δ (pts)",
                             "nvfp4/fp16sr Δ (pts)", "fp32 truncated (%)"]
    assert table.rows[0] == ["1–900", "66", "62.0", "-12.0 [-20.0, -4.0]* (−10/+2)", "+1.0 [-5.0, +7.0] (−3/+4)", "–"]
    assert table.rows[1][:3] == ["901–4096", "66", "30.0"] and table.rows[1][-1] == "20"
    assert table.rows[2][:3] == ["all", "132", "46.0"]  # the pooled row last


def test_degeneration_table_per_bucket(results_dir):
    (acc,) = [r for r in load_results([results_dir]) if r.kind == "accuracy"]
    (table,) = tables.degeneration_tables(acc)
    assert table.title.endswith("gpqa_diamond, degeneration")
    assert table.columns == ["generated tokens (fp32)", "n", "fp32", "shared:nvfp4", "nvfp4/fp16sr"]
    assert table.rows == [["1–900", "66", "–", "–", "–"],
                          ["901–4096", "66", "2500 / 20 / 5", "3900 / 75 / 50", "–"],
                          ["all", "132", "–", "–", "–"]]


def test_kl_bucket_table(results_dir):
    kl = {r.model: r for r in load_results([results_dir]) if r.kind == "kl"}
    table = tables.kl_bucket_table(kl["nemotron-3-nano-4b"])
    assert table.columns == ["generated tokens", "tokens", "fp32 NLL", "shared:nvfp4", "nvfp4/fp16sr", "nvfp4/fp32"]
    assert table.rows[0] == ["1", "3", "1.500", "0.001 [5.00e-04, 0.0015]", "1.00e-04 [5.00e-05, 1.50e-04]",
                             "8.00e-05 [4.00e-05, 1.20e-04]"]
    assert tables.kl_bucket_table(kl["qwen3.5-4b"]).rows[-1][3] == "0.004"  # one document: no interval


def test_pareto_frontier():
    report = kl_report(configs=("shared:nvfp4", "nvfp4/fp16sr", "nvfp4/fp32", "nvfp4/fp8sr"))
    points, bucket = tables.pareto_points(Result("kl", None, report, "run"))
    assert bucket == (8, 16)
    on = {p.config: p.frontier for p in points}
    # traffic: shared:nvfp4 < fp8sr < fp16sr < fp32; KL: fp32 < fp16sr < fp8sr < shared
    assert on == {"shared:nvfp4": True, "nvfp4/fp8sr": True, "nvfp4/fp16sr": True, "nvfp4/fp32": True}
    worse = dict(report, configs=[dict(c, buckets=[*c["buckets"][:-1], dict(c["buckets"][-1], kl_mean=1.0)])
                                  if c["name"] == "nvfp4/fp16sr" else c for c in report["configs"]])
    points, _ = tables.pareto_points(Result("kl", None, worse, "run"))
    assert {p.config for p in points if not p.frontier} == {"nvfp4/fp16sr"}


def test_traffic_from_json_and_computed_when_absent(tmp_path):
    with_traffic = Result("kl", tmp_path / "kl.json", kl_report(), "a")
    rows = tables.traffic_rows([with_traffic])
    recorded = with_traffic.data["configs"][0]["state_traffic"]["per_model"]
    assert rows[0].replay == recorded["replay"] and rows[0].note == ""
    without = Result("kl", tmp_path / "kl.json", kl_report(traffic=False), "b")
    computed = tables.traffic_rows([without])
    assert computed[0].replay == pytest.approx(recorded["replay"]) and "computed" in computed[0].note
    unknown = Result("kl", tmp_path / "kl.json", kl_report(traffic=False) | {"model": "/nonexistent/model"}, "c")
    assert tables.traffic_rows([unknown])[0].replay is None
    assert "not computed" in tables.traffic_rows([unknown])[0].note


def test_load_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_results([tmp_path / "missing"])
    with pytest.raises(ValueError, match="no kl.json or accuracy.json or sensitivity.json in"):
        load_results([tmp_path])
    (tmp_path / "kl.json").write_text(json.dumps({"model": "m"}))
    with pytest.raises(ValueError, match="missing configs, reference; is it a kl result"):
        load_results([tmp_path])


def test_skip_reads_move_traffic_and_show_in_the_tables(tmp_path):
    """A #skip config's point uses the traffic less its skipped reads; bits per element come from the read copy."""
    from replayssm_eval.models.traffic import skip_savings

    report = kl_report(configs=("nvfp4/fp16sr", "nvfp4/fp16sr#skip=0.01"))
    skip = report["configs"][1]
    counts = {0: {"reads": 1000, "skipped_read_copy": 90, "skipped_recur_copy": 10}}
    skip["skip_reads"] = skip_savings(skip["state_traffic"], counts)
    result = Result("kl", tmp_path / "kl.json", report, "run")
    points = {p.config: p for p in tables.pareto_points(result)[0]}
    full, skipped = points["nvfp4/fp16sr"], points["nvfp4/fp16sr#skip=0.01"]
    saved = (90 * skip["state_traffic"]["bytes_per_copy"]["read"] + 10 * skip["state_traffic"]["bytes_per_copy"]["recur"]) / 1000
    assert skipped.traffic == pytest.approx(full.traffic - saved) and skipped.skipped == pytest.approx(0.1)
    assert 4.5 < full.bits < 4.51  # NVFP4: 4-bit codes + an E4M3 scale per 16 + a global scale per head
    row = tables.pareto_table(result, list(points.values()), (8, 16)).rows[0]
    assert row[0] == "nvfp4/fp16sr#skip=0.01" and row[3] == "10.00%"
    traffic = tables.traffic_table(tables.traffic_rows([result]))
    assert traffic.columns[-2:] == ["reads skipped", "ReplaySSM with skip"]
    assert traffic.rows[1][-2] == "10.00%" and traffic.rows[0][-2] == "–"


def test_formats_table_joins_runs_and_names_presets(tmp_path):
    a = Result("kl", tmp_path / "a.json", kl_report(configs=("nvfp4/fp16sr", "fp16sr:words=pair")), "a")
    b = Result("kl", tmp_path / "b.json", kl_report(model="qwen3.5-4b", configs=("nvfp4/fp16sr",)), "b")
    table = tables.formats_table([a, b])
    assert table.columns[:3] == ["config", "read bits/element", "nemotron-3-nano-4b: KiB/token"]
    assert table.columns[-1] == "qwen3.5-4b: KL" and len(table.columns) == 8
    first, second = table.rows
    assert first[0] == "`nvfp4/fp16sr`" and first[4] == "2.00e-04" and first[-1] == "2.00e-04"
    assert second[0] == "`fp16sr:words=pair` (vllm:fp16sr, sglang:fp16sr)"
    assert second[1] == "16.00" and second[-3:] == ["–", "–", "–"]


def test_kl_statistics_table_as_llama_cpp_prints_them():
    report = kl_report(configs=("nvfp4/fp16sr", "nvfp4/fp32"))
    llama = {"kl_se": 2e-5, "kl_p99_9": 0.0125, "kl_max": 0.5, "delta_p_mean": -0.00125, "delta_p_se": 0.0005,
             "delta_p_rms": 0.0375, "delta_p_rms_se": 0.001, "same_top_p_pct": 98.5, "same_top_p_se_pct": 0.25}
    report["configs"][0] |= llama
    table = tables.kl_statistics_table(Result("kl", None, report, "run"))
    assert table.columns[2:] == ["KL mean ± se", "KL p99.9", "KL max", "Δp mean ± se (%)", "RMS Δp (%)",
                                 "same top p (%)"]
    assert table.rows[0] == ["nvfp4/fp16sr", "all", "2.00e-04 ± 2.00e-05", "0.0125", "0.5", "-0.125 ± 0.050",
                             "3.750 ± 0.100", "98.500 ± 0.250"]
    assert len(table.rows) == 2 * (1 + len(report["configs"][0]["buckets"]))
    # a run written before these fields (nvfp4/fp32, its last bucket: 4 x 8e-5): the mean alone, dashes elsewhere
    assert table.rows[-1][2:] == ["3.20e-04", "–", "–", "–", "–", "–"]


def test_read_bits_of_a_mixed_config_is_the_mean_over_layers():
    from replayssm_eval.models.traffic import state_traffic

    nvfp4 = tables.read_bits(state_traffic("nemotron-3-nano-4b", "nvfp4/fp16sr"))  # 21 SSM layers
    assert nvfp4 == pytest.approx(4.503125)  # 4 bits, E4M3 block scales, one FP32 scale per head
    mixed = tables.read_bits(state_traffic("nemotron-3-nano-4b", "nvfp4/fp16sr+0,1,2=fp32"))
    assert mixed == pytest.approx((18 * nvfp4 + 3 * 32) / 21, rel=1e-12)
