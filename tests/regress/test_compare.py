"""Statuses and the diff table of `regress.compare`."""

import math

from replayssm_eval.regress.compare import compare, format_table, status_of, updated_metrics


def test_status_per_kind():
    assert status_of("bits", "ab12", "ab12") == "ok"
    assert status_of("bits", "ab12", "ab13") == "REGRESSED"
    assert status_of("format_error", 0.1, 0.1 * (1 + 5e-5)) == "ok"
    assert status_of("format_error", 0.1, 0.1 * (1 + 2e-4)) == "REGRESSED"
    assert status_of("format_error", 0.1, 0.1 * (1 - 2e-4)) == "improved"
    assert status_of("kernel_error", 1e-7, 5e-6) == "ok"  # noise: one flipped FP16 element
    assert status_of("kernel_error", 1e-7, 1e-3) == "REGRESSED"
    assert status_of("kl", 1e-3, 1.05e-3) == "ok"
    assert status_of("kl", 1e-3, 0.5e-3) == "REGRESSED"  # both ways: a format's cost that halved is a change too
    assert status_of("kl", 1e-3, math.nan) == "REGRESSED"
    assert status_of("kl", 1e-3, None) == "REGRESSED"


def test_compare_table_and_update():
    base = {"format/a": {"kind": "format_error", "value": 1e-3}, "format/b": {"kind": "format_error", "value": 1e-3},
            "format/gone": {"kind": "format_error", "value": 1e-3}, "format/same": {"kind": "format_error", "value": 1e-3}}
    cur = {"format/a": {"kind": "format_error", "value": 2e-3}, "format/b": {"kind": "format_error", "value": 1e-4},
           "format/new": {"kind": "format_error", "value": 5.0},
           "format/same": {"kind": "format_error", "value": 1e-3 * (1 + 5e-5)}}
    rows = compare(cur, base)
    assert {r.name: r.status for r in rows} == {"format/a": "REGRESSED", "format/b": "improved",
                                               "format/gone": "MISSING", "format/new": "new", "format/same": "ok"}
    table = format_table(rows)
    assert "REGRESSED format/a" in table and "+0.001 (+100.0%)" in table and "format/same" not in table.split("\n\n")[0]
    assert "format_error   1 MISSING, 1 REGRESSED, 1 improved, 1 new, 1 ok" in table
    assert "format/same" in format_table(rows, show_all=True)
    kept = updated_metrics(rows, cur, base, accept_regressions=False)
    assert kept == {"format/a": base["format/a"], "format/b": cur["format/b"], "format/new": cur["format/new"],
                    "format/same": base["format/same"]}
    assert updated_metrics(rows, cur, base, accept_regressions=True)["format/a"] == cur["format/a"]
