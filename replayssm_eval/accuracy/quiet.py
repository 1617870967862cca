"""lm-eval's and datasets' known noise during an accuracy run, dropped only while the run's calls execute.

    lm_eval.api.task        "Custom kwargs can be passed to `--metadata`", once per task and config: our
                            local tasks load through a custom dataset function on purpose
    lm_eval.evaluator       "generation_kwargs ... specified through cli", once per evaluation: the run
                            sets max_gen_toks and the sampling settings on purpose
    datasets.fingerprint    our tasks' document functions cannot be hashed (a random cache key is used)
    git                     lm-eval records the commit of the working directory with `git describe`,
                            whose "fatal: not a git repository" reaches stderr outside a checkout; the
                            run records this package's own commit (`results.provenance.git_state`)

datasets' progress bars (the few-document maps of each task load) are switched off for the same span.
"""

from __future__ import annotations

import subprocess
from contextlib import contextmanager

from replayssm_eval.models.quiet import MODEL_NOISE, quiet_logs

LM_EVAL_NOISE = {
    **MODEL_NOISE,
    "lm_eval.api.task": ("Custom kwargs can be passed to `--metadata`",),
    "lm_eval.evaluator": ("specified through cli, these settings will update set parameters in yaml tasks",),
    "datasets.fingerprint": ("couldn't be hashed properly, a random hash was used instead",),
}


def git_describe() -> str | None:
    """What lm-eval's `get_git_commit_hash` records (`git describe --always` here), with git's stderr captured; None
    outside a checkout."""
    try:
        done = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@contextmanager
def quiet_lm_eval():
    """Within the block: `LM_EVAL_NOISE` dropped, no datasets progress bars, lm-eval's git lookup quiet."""
    import datasets
    import lm_eval.evaluator

    bars_were_off = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    lookup = lm_eval.evaluator.get_git_commit_hash
    lm_eval.evaluator.get_git_commit_hash = git_describe
    try:
        with quiet_logs(LM_EVAL_NOISE):
            yield
    finally:
        lm_eval.evaluator.get_git_commit_hash = lookup
        if not bars_were_off:
            datasets.enable_progress_bars()
