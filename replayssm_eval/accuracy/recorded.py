"""lm-eval models for the offline accuracy run (`generate.offline`): one records the requests, one replays generations."""

from __future__ import annotations

import json
from pathlib import Path

from lm_eval.api.model import LM

from replayssm_eval.accuracy.requests import request_kwargs, sample_indices


def read_generations(path: str | Path) -> list[dict]:
    """The records of a generations .jsonl; ValueError naming the file and line if one is not a JSON record."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"--generations {str(path)!r} line {number} is not valid JSON ({err}; a truncated "
                                 "file?); accepted: a generations .jsonl written by "
                                 "`python -m replayssm_eval.generate.offline`") from err
    return records


class _GenerationOnly(LM):
    def loglikelihood(self, requests, disable_tqdm=False):
        raise NotImplementedError("the offline accuracy run covers generation tasks only")

    loglikelihood_rolling = loglikelihood


class RequestRecorder(_GenerationOnly):
    """Records each generation request (task, doc_id, prompt text, until, max_gen_toks, sampling settings); answers
    with empty text."""

    def __init__(self):
        super().__init__()
        self.requests: list[dict] = []
        self.records: list[dict] = []

    def generate_until(self, requests, disable_tqdm=False):

        for r in requests:
            kwargs = request_kwargs(r.args[1])
            self.requests.append({"task": r.task_name, "doc_id": r.doc_id, "prompt": r.args[0], "until": kwargs["until"],
                                  "max_gen_toks": kwargs["max_gen_toks"], "sampling": kwargs["sampling"].as_dict()})
        return [""] * len(requests)


class RecordedLM(_GenerationOnly):
    """Answers generation requests from a generations file for the config set in `config`, as `ReplaySSMLM` would:
    sample `sample + j` for a request's j-th repeat, drawn with the request's sampling settings and `sampling_seed`."""

    def __init__(self, path: str | Path, config=None, sampling_seed: int = 0):
        super().__init__()
        self.config, self.sampling_seed, self.sample = config, sampling_seed, 0
        self.records: list[dict] = []
        self._answers = {(a["config"], a["task"], a["doc_id"], a.get("sample", 0)): a for a in read_generations(path)}

    def generate_until(self, requests, disable_tqdm=False):
        from replayssm_eval.generate.sampling import Sampling

        keys = [(self.config.name, r.task_name, r.doc_id, j) for r, j in zip(requests, sample_indices(requests, self.sample))]
        missing = [k for k in keys if k not in self._answers]
        if missing:
            raise ValueError(f"the generations file has no answer for {len(missing)} requests, e.g. {missing[0]} "
                             "(config, task, doc_id, sample); generate them with `python -m replayssm_eval.generate.offline`")
        for r, k in zip(requests, keys):  # a line without sampling settings is greedy
            asked, answer = request_kwargs(r.args[1])["sampling"], self._answers[k]
            made, seed = answer.get("sampling", Sampling().as_dict()), answer.get("sampling_seed", 0)
            if made != asked.as_dict() or (not asked.greedy and seed != self.sampling_seed):
                raise ValueError(f"the generations file answers {k} with sampling {made}, seed {seed}; this run asks "
                                 f"for {asked.as_dict()}, seed {self.sampling_seed}: export and generate again")
        self.records = [self._answers[k] for k in keys]
        return [self._answers[k]["text"] for k in keys]
