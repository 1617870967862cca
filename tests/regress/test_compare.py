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
    assert status_of("kl", 1e-3, math.nan) == "REGRESSED"
    assert status_of("kl", 1e-3, None) == "REGRESSED"


def test_compare_table_and_update():
    base = {"kl/a": {"kind": "kl", "value": 1e-3}, "kl/b": {"kind": "kl", "value": 1e-3},
            "kl/gone": {"kind": "kl", "value": 1e-3}, "kl/same": {"kind": "kl", "value": 1e-3}}
    cur = {"kl/a": {"kind": "kl", "value": 2e-3}, "kl/b": {"kind": "kl", "value": 1e-4},
           "kl/new": {"kind": "kl", "value": 5.0}, "kl/same": {"kind": "kl", "value": 1.01e-3}}
    rows = compare(cur, base)
    assert {r.name: r.status for r in rows} == {"kl/a": "REGRESSED", "kl/b": "improved", "kl/gone": "MISSING",
                                               "kl/new": "new", "kl/same": "ok"}
    table = format_table(rows)
    assert "REGRESSED kl/a" in table and "+0.001 (+100.0%)" in table and "kl/same" not in table.split("\n\n")[0]
    assert "kl             1 MISSING, 1 REGRESSED, 1 improved, 1 new, 1 ok" in table
    assert "kl/same" in format_table(rows, show_all=True)
    kept = updated_metrics(rows, cur, base, accept_regressions=False)
    assert kept == {"kl/a": base["kl/a"], "kl/b": cur["kl/b"], "kl/new": cur["kl/new"], "kl/same": base["kl/same"]}
    assert updated_metrics(rows, cur, base, accept_regressions=True)["kl/a"] == cur["kl/a"]
