"""The `replayssm` lm-eval model: a hybrid LLM with its SSM state in a ReplaySSM configuration.

    python -m replayssm_eval.accuracy --model replayssm \
        --model_args pretrained=nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16,read=nvfp4,recur=fp16sr,window=16 \
        --tasks replayssm_gpqa_diamond --log_samples --output_path out/

Model args: `pretrained` (bundled fixture name, folder or hub id); the state either as
`config=<ReplayConfig string>` (`shared:nvfp4`, `nvfp4/fp8sr@8#seed=1`) or as `read`, `recur`,
`window`, `seed` (a split config; `fp32` when none is given); `sampling_seed` (the Philox key of sampled
tokens, `generate.sampling`) and `sample` (the sample index of the first answer to a request: its j-th repeat in
lm-eval's `repeats` is sample `sample + j`); `step` (the decode step of
`generate.engine.Engine`: auto = triton on cuda, reference elsewhere; or reference, triton, static, graph:
the whole model's step captured as a CUDA graph, fixed-window configs only); `device` (auto, cpu or cuda;
without it lm-eval's `--device`, whose default cuda:0 means cpu when CUDA is absent), `dtype` (auto:
bfloat16 on cuda, float32 on cpu); `gen_log=PATH` appends one JSON line
per generation (task, doc_id, gen_tokens, hit_max_gen_toks, max_gen_toks, loop), which lm-eval's own
samples lack; `prefill_segment` (prompt tokens per row and prefill call), `prefill_tokens` (per
call), `device_map` (e.g. auto: a large model over several GPUs, accelerate). lm-eval's `--batch_size`
is the most rows decoded at once, or `auto`: the largest batch that fits the GPU (`generate.memory`; 8 on
cpu); a batch that does not fit is refused before any work. Generation: `generate.engine.Engine`,
continuous batching through the decode step `step`; rows enter the batch
longest first when `length_hint` ({(task, doc_id, sample): FP32 gen_tokens}) is set, else in request
order; loglikelihood: `generate.generation.score_continuations`. Generation kwargs: until, max_gen_toks, and
do_sample, temperature, top_p, top_k (`generate.sampling.Sampling.from_gen_kwargs`: do_sample false is greedy).
The accuracy driver sets `samples` = n: each request's samples `sample`..`sample + n - 1` are generated in
one engine run and kept, and it reads them back one sample index per lm-eval evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path

import lm_eval.models  # noqa: F401  registers lm-eval's own models first: `get_model` loads them only into an empty registry
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from replayssm_eval.accuracy.requests import request_kwargs, sample_indices
from replayssm_eval.generate import DECODE_STEPS, FIXED_BUFFER_STEPS
from replayssm_eval.generate.degeneration import is_loop
from replayssm_eval.generate.engine import PREFILL_SEGMENT, PREFILL_TOKENS, Engine
from replayssm_eval.generate.generation import score_continuations
from replayssm_eval.generate.memory import plan_rows
from replayssm_eval.kernels.static_step import check_static_config
from replayssm_eval.replay.config import DEFAULT_REPLAY_WINDOW, ReplayConfig
from replayssm_eval.models import load_model
from replayssm_eval.results.files import check_output_dir

CPU_BATCH = 8  # --batch_size auto on cpu


KNOWN_ARGS = ("pretrained, config, read, recur, window, seed, device, dtype, gen_log, prefill_segment, prefill_tokens, "
              "device_map, step, sampling_seed, sample (batch size: lm-eval's --batch_size)")


class ModelArgsError(ValueError):
    """A bad `replayssm` model arg; `python -m replayssm_eval.accuracy` prints it as one line."""


def int_arg(name: str, value, minimum: int) -> int:
    """A model arg as an int >= `minimum`: an int, an integer string, or the float lm-eval's CLI makes of '-3'."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is out of range; accepted: an integer >= {minimum}")
    return value


def replay_config(config=None, read=None, recur=None, window=None, seed=None) -> ReplayConfig:
    """`config`, or the split config read/recur@window#seed=... (fp32 when nothing is given)."""
    short = {"read": read, "recur": recur, "window": window, "seed": seed}
    if config is not None:
        given = [k for k, v in short.items() if v is not None]
        if given:
            raise ValueError(f"give the state either as config= or as read/recur/window/seed, not both ({', '.join(given)})")
        return ReplayConfig.parse(str(config))
    seed = 0 if seed is None else int_arg("seed", seed, 0)
    if read is None and recur is None and window is None:
        return ReplayConfig(seed=seed)
    window = DEFAULT_REPLAY_WINDOW if window is None else int_arg("window", window, 1)
    return ReplayConfig.parse(f"{read or 'fp32'}/{recur or 'fp32'}@{window}" + (f"#seed={seed}" if seed else ""))


def resolve_device(device) -> str:
    """`device` as given, or for auto cuda if available, else cpu; cuda without a CUDA device is a ValueError."""
    device = str(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: no CUDA device is available; accepted here: cpu or auto")
    return device


@register_model("replayssm")
class ReplaySSMLM(TemplateLM):
    """lm-eval model over a `ReplayModel`; `config` may be switched between runs (the driver does)."""

    def __init__(self, pretrained=None, config=None, read=None, recur=None, window=None, seed=None, batch_size=8,
                 device="auto", dtype="auto", gen_log=None, prefill_segment=PREFILL_SEGMENT,
                 prefill_tokens=PREFILL_TOKENS, device_map=None, step="auto", sampling_seed=0, sample=0, **unknown):
        super().__init__()
        try:  # every arg is checked before the model loads
            if pretrained is None:
                raise ValueError("pretrained= is missing; accepted: a bundled fixture name, a local directory or a hub id")
            if unknown:
                raise ValueError(f"unknown model args {', '.join(unknown)}; known: {KNOWN_ARGS}")
            if step != "auto" and step not in DECODE_STEPS:
                raise ValueError(f"step must be auto or one of {', '.join(DECODE_STEPS)}, got {step!r}")
            self.batch_size = "auto" if str(batch_size) == "auto" else int_arg("batch_size", batch_size, 1)
            self.prefill_segment = int_arg("prefill_segment", prefill_segment, 1)
            self.prefill_tokens = int_arg("prefill_tokens", prefill_tokens, 1)
            self.sampling_seed, self.sample = int_arg("sampling_seed", sampling_seed, 0), int_arg("sample", sample, 0)
            self.config = replay_config(config, read, recur, window, seed)
            if step in FIXED_BUFFER_STEPS:
                check_static_config(self.config, f"step {step!r}", "step triton")
            device = resolve_device(device)
            if gen_log:
                if Path(gen_log).is_dir():
                    raise ValueError(f"gen_log={str(gen_log)!r} is a folder; accepted: a file path (lines are appended)")
                check_output_dir(Path(gen_log).parent, "gen_log's folder")
        except ValueError as err:
            raise ModelArgsError(f"replayssm model args: {err}") from None
        self.samples = 1  # samples generated per request at once (the accuracy driver's --samples)
        self._ahead: dict[tuple, tuple[str, dict]] = {}  # (config, task, doc_id, sample) -> (text, record), kept
        self._step = step
        self.length_hint: dict | None = None
        cuda = device.startswith("cuda")
        dtype = dtype if dtype != "auto" else ("bfloat16" if cuda else "float32")
        self.rm = load_model(pretrained, dtype=dtype, device=device, device_map=device_map,
                             backend="triton" if cuda else "torch")
        try:
            self.rm.check_config(self.config)
        except ValueError as err:
            raise ModelArgsError(f"replayssm model args: {err}") from None
        self.tokenizer = self.rm.tokenizer
        self._device = self.rm.model.device
        self.gen_log = gen_log
        if gen_log:
            Path(gen_log).parent.mkdir(parents=True, exist_ok=True)  # before the generation work, not after
        self.records: list[dict] = []  # one per generate_until request, in request order

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "ReplaySSMLM":
        """lm-eval's construction: the model args win; lm-eval's own settings (batch_size, device) fill the rest.
        lm-eval's --device defaults to cuda:0, so from there a CUDA device that is absent means cpu."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        if str(extra.get("device", "")).startswith("cuda") and not torch.cuda.is_available():
            extra["device"] = "cpu"
        return cls(**arg_dict, **extra)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "ReplaySSMLM":
        """`create_from_arg_obj` of "key=value,key=value" (values stay strings: the constructor reads them)."""
        items = [item for item in arg_string.split(",") if item.strip()]
        bad = [item for item in items if "=" not in item]
        if bad:
            raise ModelArgsError(f"replayssm model args: {bad[0]!r} is not key=value; known keys: {KNOWN_ARGS}")
        return cls.create_from_arg_obj(dict(item.strip().split("=", 1) for item in items), additional_config)

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
        """One answer per request: sample `sample + j` for its j-th repeat; missing samples are generated first."""
        if not requests:
            return []
        settings = [request_kwargs(r.args[1]) for r in requests]
        indices = sample_indices(requests, self.sample)  # [R]
        keys = [(self.config.name, r.task_name, r.doc_id, j) for r, j in zip(requests, indices)]
        if any(k not in self._ahead for k in keys):
            self._generate(requests, settings, indices)
        answers = [self._ahead.pop(k) for k in keys]
        self.records = [record for _, record in answers]
        if self.gen_log:
            with open(self.gen_log, "a", encoding="utf-8") as f:
                f.writelines(json.dumps({"config": self.config.name, **r}) + "\n" for r in self.records)
        return [text for text, _ in answers]

    def _generate(self, requests, settings: list[dict], indices: list[int]) -> None:
        """Generate samples j..j + samples - 1 of each request (j: its index) in one engine run, into `_ahead`."""
        rows, seen = [], set()  # (request, sample), each once: lm-eval's repeats may ask for a sample twice
        for i, j in enumerate(indices):
            for m in range(self.samples):
                key = (requests[i].task_name, requests[i].doc_id, j + m)
                if key not in seen:
                    seen.add(key)
                    rows.append((i, j + m))
        prompts = [self.tok_encode(requests[i].args[0]) for i, _ in rows]
        limits = [settings[i]["max_gen_toks"] for i, _ in rows]
        order = None
        if self.length_hint:
            hints = [self.length_hint.get((requests[i].task_name, requests[i].doc_id, j), 0) for i, j in rows]
            order = sorted(range(len(rows)), key=lambda k: -hints[k])
        engine = Engine(self.rm, self.config, step=self.step, max_batch=self.rows(prompts, limits),
                        prefill_segment=self.prefill_segment, prefill_tokens=self.prefill_tokens,
                        sampling_seed=self.sampling_seed)
        gens = engine.generate(prompts, max_gen_toks=limits, until=[settings[i]["until"] for i, _ in rows], order=order,
                               sampling=[settings[i]["sampling"] for i, _ in rows], samples=[j for _, j in rows])
        for (i, j), g in zip(rows, gens):
            r = requests[i]
            self._ahead[(self.config.name, r.task_name, r.doc_id, j)] = (g.text, {
                "task": r.task_name, "doc_id": r.doc_id, "sample": j, "gen_tokens": g.gen_tokens,
                "hit_max_gen_toks": g.hit_max_gen_toks, "max_gen_toks": g.max_gen_toks, "loop": is_loop(g.tokens)})

    def rows(self, prompts: list[list[int]], limits: list[int]) -> int:
        """The batch size for these requests: --batch_size checked against the free memory, or `auto` (`generate.memory`)."""
        length = max(len(p) + m for p, m in zip(prompts, limits))
        return min(len(prompts), plan_rows(self.rm, self.config, self.batch_size, length, step=self.step,
                                           prefill_segment=self.prefill_segment, prefill_tokens=self.prefill_tokens,
                                           default=CPU_BATCH))

    @property
    def step(self) -> str:
        """The decode step: as given, or for auto Triton kernels on a GPU, the pure-torch step reference elsewhere."""
        if self._step != "auto":
            return self._step
        return "triton" if self._device.type == "cuda" else "reference"

    def _batched(self, items: list, run, key, disable_tqdm: bool) -> list:
        """run(batch) over batches of `items` sorted by `key` (similar lengths together); results in input order."""
        order = sorted(range(len(items)), key=lambda i: key(items[i]))
        results = [None] * len(items)
        size = self.batch_size if isinstance(self.batch_size, int) else CPU_BATCH
        for start in tqdm(range(0, len(order), size), disable=disable_tqdm or self.rank != 0,
                          desc=f"replayssm {self.config.name}"):
            chunk = order[start:start + size]
            for i, result in zip(chunk, run([items[i] for i in chunk])):
                results[i] = result
        return results
