"""An accuracy run's lm-eval and datasets noise is dropped while its calls run, and only then."""

import logging

import pytest

pytest.importorskip("lm_eval")

import lm_eval.evaluator  # noqa: E402

from replayssm_eval.accuracy.quiet import quiet_lm_eval  # noqa: E402

CLI_KWARGS = ("generation_kwargs: {'max_gen_toks': 8} specified through cli, these settings will update set "
              "parameters in yaml tasks. Ensure 'do_sample=True' for non-greedy decoding!")


def test_lm_evals_git_lookup_is_quiet_outside_a_checkout(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)  # not a git checkout
    lookup = lm_eval.evaluator.get_git_commit_hash
    with quiet_lm_eval():
        assert lm_eval.evaluator.get_git_commit_hash() is None
    assert lm_eval.evaluator.get_git_commit_hash is lookup
    assert capfd.readouterr().err == ""


def test_known_lm_eval_warnings_are_dropped_inside_only(caplog):
    logger = logging.getLogger("lm_eval.evaluator")
    with caplog.at_level(logging.WARNING, logger="lm_eval.evaluator"):
        with quiet_lm_eval():
            logger.warning(CLI_KWARGS)
            logger.warning("model_args not specified. Using defaults.")
        logger.warning(CLI_KWARGS)
    assert [r.getMessage() for r in caplog.records] == ["model_args not specified. Using defaults.", CLI_KWARGS]
