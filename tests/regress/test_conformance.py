"""`regress --kernel`: the sample adapter conforms, broken ones fail with a readable report."""

from pathlib import Path

import pytest

from replayssm_eval.cli import main
from replayssm_eval.regress import conformance

ADAPTERS = Path(__file__).with_name("adapters.py")
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


def _kernel(name, *extra):
    return ["regress", "--kernel", f"{ADAPTERS}:{name}", "--kernel-grid", "quick", *extra]


@pytest.mark.slow
def test_sample_triton_adapter_conforms(capsys):
    code = main(_kernel("triton_step", "--kernel-configs", "nvfp4/fp16sr@{L}", "--kernel-configs", "shared:nvfp4@{L}"))
    out = capsys.readouterr().out
    assert code == 0, out
    assert "6 passed, 0 failed, 0 skipped" in out


def test_reference_adapter_is_exact():
    results = conformance.check_kernel(conformance.reference_adapter, conformance.grid_cases("quick", ("gdn",)))
    assert all(r.status == "pass" and r.y_rel_rms == 0.0 for r in results)


@pytest.mark.slow
def test_kernel_dropping_d_fails_readably(capsys):
    code = main(_kernel("drops_d_term", "--kernel-configs", "nvfp4/fp16sr@{L}"))
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL    mamba2 nvfp4/fp16sr@4 small seed=0" in out
    assert "FAIL: mamba2 nvfp4/fp16sr@4 small seed=0: outputs: RMS error ratio" in out and "first at token 0" in out
    assert "pass    gdn nvfp4/fp16sr@4 small seed=0" in out  # GDN has no D term
    assert "pass    kda nvfp4/fp16sr@4 small seed=0" in out
    assert "2 passed, 1 failed, 0 skipped" in out


def test_truncating_rounding_mode_fails_readably(capsys):
    code = main(_kernel("truncating_recurrence", "--kernel-configs", "fp8/fp16@{L}", "--kernel-family", "mamba2"))
    out = capsys.readouterr().out
    assert code == 1
    assert "S_hi:" in out and "of elements differ (allowed 2%)" in out, out


def test_unsupported_family_is_skipped(capsys):
    code = main(_kernel("mamba2_only", "--kernel-configs", "shared:nvfp4@{L}"))
    out = capsys.readouterr().out
    assert code == 0
    assert "skipped: gdn shared:nvfp4@4 small seed=0: no Gated DeltaNet kernel in this engine" in out


def test_bad_kernel_spec_names_what_is_accepted(capsys):
    assert main(["regress", "--kernel", "no_colon"]) == 2
    assert "expected module:function or path/to/file.py:function" in capsys.readouterr().err
    assert main(["regress", "--kernel", f"{ADAPTERS}:nope"]) == 2
    assert "has no function 'nope'" in capsys.readouterr().err


def test_grid_cases():
    full = conformance.grid_cases("full")
    assert {c.family for c in full} == {"mamba2", "gdn", "kda"}
    assert not [c for c in full if c.family == "mamba2" and "closed" in c.config]
    assert {"nvfp4/fp16sr#seed=1", "fp32", "nvfp4/fp8sr@4"} <= {c.config for c in full}
    with pytest.raises(ValueError, match="unknown conformance grid 'huge'; known: full, quick"):
        conformance.grid_cases("huge")
