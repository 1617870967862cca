"""One row of a generation and the session that decodes it: what the engine and the scoring share.

`Generation` is a row's result, `sequence_id` its key (the SR bits and the sampled tokens), `cut_text` its
text as lm-eval's HF model cuts it; `decode_session` opens a session whose one-token calls run one decode
step (`generation` describes the steps); `left_pad` batches prompts of different lengths.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from replayssm_eval.models.adapter import ReplayModel
from replayssm_eval.models.session import ReplaySession

SESSION_STEPS = ("reference", "triton", "static")  # the steps of a session's one-token calls


@dataclass(frozen=True)
class Generation:
    """One row's generation: `tokens` (ids generated, stop token included) and `text` (cut before any stop string)."""

    tokens: tuple[int, ...]
    text: str
    stopped: bool
    max_gen_toks: int

    @property
    def gen_tokens(self) -> int:
        return len(self.tokens)

    @property
    def hit_max_gen_toks(self) -> bool:
        return not self.stopped


def sequence_id(tokens) -> int:
    """A stable 63-bit sequence id from token ids: keys the SR bits by content, whatever the batching."""
    digest = hashlib.blake2b(str(list(tokens)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def decode_session(rm: ReplayModel, config, seq_ids, step: str) -> ReplaySession:
    """A fresh session whose one-token calls run the decode step `step` (see the module docstring)."""
    if step == "graph":
        raise ValueError("step 'graph' drives the whole model (models.model_graph.StaticDecoder), not a session; "
                         "use engine.Engine or greedy_generate")
    if step not in SESSION_STEPS:
        raise ValueError(f"unknown decode step {step!r}; known: {', '.join(SESSION_STEPS)}, graph")
    if step == "reference":
        return rm.new_session(config, seq_ids=seq_ids, engine="reference")
    if step == "static":
        from replayssm_eval.models.static_session import StaticStepSession

        return StaticStepSession(config, seq_ids=seq_ids, new_cache=rm._new_cache, graphs=rm.model.device.type == "cuda")
    return rm.new_session(config, seq_ids=seq_ids, engine="step", backend="triton")


def left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ids [B, T] left-padded with `pad_id`, and the mask [B, T] (1 = real), None without padding."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row):] = 1
    return ids.to(device), (None if bool(mask.all()) else mask.to(device))


def cut_text(tokenizer, tokens: list[int], until) -> str:
    """The generated text without the eos token, cut before the first stop string (as lm-eval's HF model)."""
    text = tokenizer.decode([t for t in tokens if t != tokenizer.eos_token_id])
    for stop in until:
        text = text.split(stop)[0]
    return text
