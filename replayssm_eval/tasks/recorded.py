"""lm-eval models for the offline accuracy run (`offline`): one records the requests, one replays generations."""

from __future__ import annotations

import json
from pathlib import Path

from lm_eval.api.model import LM


class _GenerationOnly(LM):
    def loglikelihood(self, requests, disable_tqdm=False):
        raise NotImplementedError("the offline accuracy run covers generation tasks only")

    loglikelihood_rolling = loglikelihood


class RequestRecorder(_GenerationOnly):
    """Records each generation request (task, doc_id, prompt text, until, max_gen_toks); answers with empty text."""

    def __init__(self):
        super().__init__()
        self.requests: list[dict] = []
        self.records: list[dict] = []

    def generate_until(self, requests, disable_tqdm=False):
        from replayssm_eval.tasks.lm_model import greedy_kwargs

        for r in requests:
            self.requests.append({"task": r.task_name, "doc_id": r.doc_id, "prompt": r.args[0], **greedy_kwargs(r.args[1])})
        return [""] * len(requests)


class RecordedLM(_GenerationOnly):
    """Answers generation requests from a generations file for the config set in `config`, as `ReplaySSMLM` would."""

    def __init__(self, path: str | Path, config=None):
        super().__init__()
        self.config = config
        self.records: list[dict] = []
        with open(path, encoding="utf-8") as f:
            self._answers = {(a["config"], a["task"], a["doc_id"]): a for a in map(json.loads, f)}

    def generate_until(self, requests, disable_tqdm=False):
        keys = [(self.config.name, r.task_name, r.doc_id) for r in requests]
        missing = [k for k in keys if k not in self._answers]
        if missing:
            raise ValueError(f"the generations file has no answer for {len(missing)} requests, e.g. {missing[0]}; "
                             "generate them with `python -m replayssm_eval.tasks.offline`")
        self.records = [self._answers[k] for k in keys]
        return [self._answers[k]["text"] for k in keys]
