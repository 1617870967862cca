"""The `replayssm` lm-eval model: a hybrid LLM with its SSM state in a ReplaySSM configuration.

    python -m replayssm_eval.tasks --model replayssm \
        --model_args pretrained=nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16,read=nvfp4,recur=fp16sr,window=16 \
        --tasks replayssm_gpqa_diamond --log_samples --output_path out/

Model args: `pretrained` (bundled fixture name, folder or hub id); the state either as
`config=<ReplayConfig string>` (`shared:nvfp4`, `nvfp4/fp8sr@8#seed=1`) or as `read`, `recur`,
`window`, `seed` (a split config; `fp32` when none is given); `device` (auto, or lm-eval's
`--device`; cpu when CUDA is absent), `dtype` (auto: bfloat16 on cuda, float32 on cpu); `gen_log=PATH` appends one JSON line
per generation (task, doc_id, gen_tokens, hit_max_gen_toks, max_gen_toks), which lm-eval's own
samples lack. Generation: `generation.greedy_generate` (Triton decode steps on cuda, the step
reference on cpu); loglikelihood: `generation.score_continuations`.
"""

from __future__ import annotations

import json
from pathlib import Path

import lm_eval.models  # noqa: F401  registers lm-eval's own models first: `get_model` loads them only into an empty registry
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from replayssm_eval.kernels.config import DEFAULT_REPLAY_WINDOW, ReplayConfig
from replayssm_eval.models import load_model
from replayssm_eval.tasks.generation import greedy_generate, score_continuations

GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature")
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default when a task sets none


def replay_config(config=None, read=None, recur=None, window=None, seed=None) -> ReplayConfig:
    """`config`, or the split config read/recur@window#seed=... (fp32 when nothing is given)."""
    short = {"read": read, "recur": recur, "window": window, "seed": seed}
    if config is not None:
        given = [k for k, v in short.items() if v is not None]
        if given:
            raise ValueError(f"give the state either as config= or as read/recur/window/seed, not both ({', '.join(given)})")
        return ReplayConfig.parse(str(config))
    if read is None and recur is None and window is None:
        return ReplayConfig(seed=int(seed or 0))
    text = f"{read or 'fp32'}/{recur or 'fp32'}@{window or DEFAULT_REPLAY_WINDOW}"
    return ReplayConfig.parse(text + (f"#seed={seed}" if seed else ""))


@register_model("replayssm")
class ReplaySSMLM(TemplateLM):
    """lm-eval model over a `ReplayModel`; `config` may be switched between runs (the driver does)."""

    def __init__(self, pretrained=None, config=None, read=None, recur=None, window=None, seed=None, batch_size=8,
                 device="auto", dtype="auto", gen_log=None, **unknown):
        super().__init__()
        if unknown:
            raise ValueError(f"unknown model args {', '.join(unknown)}; known: pretrained, config, read, recur, window, "
                             "seed, device, dtype, gen_log (batch size: lm-eval's --batch_size)")
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.config = replay_config(config, read, recur, window, seed)
        self.batch_size = int(batch_size)
        if device == "auto" or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            device = "cuda" if torch.cuda.is_available() else "cpu"  # lm-eval's CLI asks for cuda:0 by default
        cuda = str(device).startswith("cuda")
        dtype = dtype if dtype != "auto" else ("bfloat16" if cuda else "float32")
        self.rm = load_model(pretrained, dtype=dtype, device=device, backend="triton" if cuda else "torch")
        self.tokenizer = self.rm.tokenizer
        self._device = self.rm.model.device
        self.gen_log = gen_log
        if gen_log:
            Path(gen_log).parent.mkdir(parents=True, exist_ok=True)  # before the generation work, not after
        self.records: list[dict] = []  # one per generate_until request, in request order

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens))

    def apply_chat_template(self, chat_history, add_generation_prompt=True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        pairs = [(ctx, cont) for _, ctx, cont in requests]
        return self._batched(pairs, lambda batch: score_continuations(
            self.rm, batch, config=self.config, backend=self.rm.backend), key=lambda p: -len(p[0]) - len(p[1]),
            disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError("replayssm scores continuations (loglikelihood) and generates; rolling perplexity is "
                                  "`replayssm-eval kl`'s job")

    def generate_until(self, requests, disable_tqdm=False) -> list[str]:
        settings = [greedy_kwargs(r.args[1]) for r in requests]
        groups: dict[int, list[int]] = {}  # requests with the same max_gen_toks batch together
        for i, s in enumerate(settings):
            groups.setdefault(s["max_gen_toks"], []).append(i)
        texts: list[str | None] = [None] * len(requests)
        self.records = [{} for _ in requests]
        for max_gen_toks, indices in groups.items():
            rows = [(i, self.tok_encode(requests[i].args[0])) for i in indices]
            gens = self._batched(rows, lambda batch, limit=max_gen_toks: greedy_generate(
                self.rm, [p for _, p in batch], config=self.config, step=self.step, max_gen_toks=limit,
                until=[settings[i]["until"] for i, _ in batch]), key=lambda row: -len(row[1]), disable_tqdm=disable_tqdm)
            for (i, _), gen in zip(rows, gens):
                texts[i] = gen.text
                self.records[i] = {"task": requests[i].task_name, "doc_id": requests[i].doc_id,
                                   "gen_tokens": gen.gen_tokens, "hit_max_gen_toks": gen.hit_max_gen_toks,
                                   "max_gen_toks": gen.max_gen_toks}
        if self.gen_log:
            with open(self.gen_log, "a", encoding="utf-8") as f:
                f.writelines(json.dumps({"config": self.config.name, **r}) + "\n" for r in self.records)
        return texts

    @property
    def step(self) -> str:
        """The decode step: Triton kernels on a GPU, the pure-torch step reference elsewhere."""
        return "triton" if self._device.type == "cuda" else "reference"

    def _batched(self, items: list, run, key, disable_tqdm: bool) -> list:
        """run(batch) over batches of `items` sorted by `key` (similar lengths together); results in input order."""
        order = sorted(range(len(items)), key=lambda i: key(items[i]))
        results = [None] * len(items)
        for start in tqdm(range(0, len(order), self.batch_size), disable=disable_tqdm or self.rank != 0,
                          desc=f"replayssm {self.config.name}"):
            chunk = order[start:start + self.batch_size]
            for i, result in zip(chunk, run([items[i] for i in chunk])):
                results[i] = result
        return results


def greedy_kwargs(gen_kwargs: dict) -> dict:
    """`greedy_generate` keywords from an lm-eval request's generation kwargs; anything but greedy is refused."""
    unknown = sorted(set(gen_kwargs) - set(GEN_KWARGS))
    if unknown:
        raise ValueError(f"unsupported generation kwargs {', '.join(unknown)}; replayssm decodes greedily and "
                         f"accepts {', '.join(GEN_KWARGS)}")
    if gen_kwargs.get("do_sample") or float(gen_kwargs.get("temperature") or 0.0) > 0.0:
        raise ValueError("replayssm decodes greedily: do_sample must be false and temperature 0")
    until = gen_kwargs.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    return {"until": until, "max_gen_toks": int(gen_kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))}
