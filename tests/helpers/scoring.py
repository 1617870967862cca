"""lm-eval helpers: `ScriptedLM`, a model that answers from the processed document, and `evaluate` (need lm-eval:
import this module after `pytest.importorskip("lm_eval")`)."""

import lm_eval
from lm_eval.api.model import LM


class ScriptedLM(LM):
    """Answers every generation request with `answer(doc)`; loglikelihood favours `choice(doc)`."""

    def __init__(self, answer, choice=None):
        super().__init__()
        self.answer, self.choice = answer, choice

    def generate_until(self, requests, disable_tqdm=False):
        return [self.answer(r.doc) for r in requests]

    def loglikelihood(self, requests, disable_tqdm=False):
        return [(0.0 if r.args[1].strip() == self.choice(r.doc) else -10.0, False) for r in requests]

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError


def evaluate(lm, task_manager, names, **kwargs) -> dict:
    """lm-eval's simple_evaluate on tasks `names` with samples kept and no bootstrap."""
    return lm_eval.simple_evaluate(model=lm, tasks=list(names), task_manager=task_manager, log_samples=True,
                                   bootstrap_iters=0, **kwargs)
