"""`regress --kernel`: the package's Triton step conforms to the reference; broken kernels fail, readably."""

import dataclasses
from pathlib import Path

import pytest

from replayssm_eval.cli import main
from replayssm_eval.regress import conformance

ADAPTERS = Path(__file__).parents[1] / "helpers" / "regress_adapters.py"
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


def _kernel(name, *extra):
    return ["regress", "--kernel", f"{ADAPTERS}:{name}", "--kernel-grid", "quick", *extra]


@pytest.mark.slow
def test_sample_triton_adapter_conforms(capsys):
    code = main(_kernel("triton_step", "--kernel-configs", "nvfp4/fp16sr@{L}", "--kernel-configs", "shared:nvfp4@{L}"))
    out = capsys.readouterr().out
    assert code == 0, out
    assert "6 passed, 0 failed, 0 skipped" in out


# one split-format case per family: sequences at different phases, flushes, stochastic rounding
CASES = conformance.grid_cases("quick", configs=("nvfp4/fp16sr@{L}",))


def test_triton_step_conforms(device):
    """The implementation (the package's Triton decode step) against `decode_reference`, every family."""
    results = conformance.check_kernel(conformance.triton_adapter, CASES, device)
    assert {r.case.family for r in results} == set(conformance.FAMILIES)
    assert all(r.status == "pass" for r in results), conformance.format_results(results)


def _off_by_one_percent(family, inputs, state, config):
    """The Triton step with its outputs 1% too large (the state right)."""
    y, new_state = conformance.triton_adapter(family, inputs, state, config)
    return 1.01 * y, new_state


def _shifted_state(family, inputs, state, config):
    """The Triton step with every element of S_hi 1e-3 of its largest one too large."""
    y, new_state = conformance.triton_adapter(family, inputs, state, config)
    return y, dataclasses.replace(new_state, hi=new_state.hi + 1e-3 * new_state.hi.abs().max())


@pytest.mark.parametrize("kernel, problem", [
    pytest.param(_off_by_one_percent, "outputs: RMS error ratio", marks=pytest.mark.slow),
    pytest.param(_shifted_state, "S_hi: 100.0% of elements differ", marks=pytest.mark.slow)])
def test_a_wrong_kernel_fails(kernel, problem, device):
    """The same check fails kernels a little off the reference, in every family."""
    results = conformance.check_kernel(kernel, CASES, device)
    assert [r.status for r in results] == ["FAIL"] * len(results)
    assert all(problem in r.message for r in results), conformance.format_results(results)


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
    assert {"nvfp4/fp16sr#seed=1", "fp32", "nvfp4/fp8sr@4", "shared:fp32@4#buf=bf16"} <= {c.config for c in full}
    assert {c.family for c in full if c.config == "shared:fp32@4#closed#buf=fp16"} == {"gdn", "kda"}
    assert len(full) == 264 and len(conformance.grid_cases("quick")) == 17
    with pytest.raises(ValueError, match="unknown conformance grid 'huge'; known: full, quick"):
        conformance.grid_cases("huge")
