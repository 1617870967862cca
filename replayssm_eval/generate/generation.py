"""Batched greedy ReplaySSM generation and continuation scoring: what the lm-eval model runs.

    gens = greedy_generate(rm, [prompt_ids, ...], config="nvfp4/fp16sr", max_gen_toks=2048,
                           until=["Question:"], seq_ids=[...], step="reference")
    gens[0].text, gens[0].gen_tokens, gens[0].hit_max_gen_toks

Generation runs through `engine.Engine`: the prompt is prefilled in segments through the FP32
scan (the exact anchor state; the padding mask keeps pad tokens out of every SSM state,
`models.adapter`), each row's window phase starts at its own prompt end; then one token per call
for every row, greedy (argmax, as HF's greedy search) or sampled (`sampling`: common random numbers
keyed by seq_id, sample index and position), each SSM layer through the decode step of
`step`:

- "reference": `decode_reference`, the pure-torch step reference (CPU);
- "triton": the Triton decode step of the layer's kernel family (the session engine "step"; GPU,
  the Triton interpreter on CPU);
- "static": the same step on preallocated state buffers without host syncs
  (`models.static_session`), bit-identical to "triton"; fixed-window configs, one for every layer
  (round trips included, `kernels.static_step`);
  on CUDA each SSM layer's step is captured as a CUDA graph and replayed (`models.layer_graph`);
- "graph": the whole model's step on fixed buffers (Hugging Face's StaticCache for attention,
  `models.model_graph.StaticDecoder`), captured as a CUDA graph on CUDA and replayed per token;
  elsewhere the same step runs eagerly. The configs of "static". Rows leave
  and join as under the other steps: new rows take stopped rows' places in the running decoder where
  they fit, else the engine regroups the rows into a new decoder (`engine`).

A row stops at the eos token or once its text contains a stop string, or at `max_gen_toks`; with
a `max_batch` below the number of prompts, a stopped row leaves the batch and a waiting prompt
takes its place (continuous batching). `gen_tokens` counts the tokens a row generated up to and
including the one that stopped it; `hit_max_gen_toks` is true when it never stopped.

`score_continuations` answers lm-eval's loglikelihood requests: the context is the prompt (one
prefill call, left-padded), the continuation follows in one teacher-forced call through the
chunked kernels, so its tokens are scored under the config's state format from the anchor on.
"""

from __future__ import annotations

import torch

from replayssm_eval.generate.decode import Generation, left_pad, sequence_id
from replayssm_eval.generate.engine import PREFILL_SEGMENT, PREFILL_TOKENS, Engine
from replayssm_eval.models.adapter import ReplayModel


def greedy_generate(
    rm: ReplayModel, prompts: list[list[int]], *, config, max_gen_toks, until=(), seq_ids=None,
    step: str = "reference", max_batch: int | None = None, prefill_segment: int = PREFILL_SEGMENT,
    prefill_tokens: int = PREFILL_TOKENS, order=None,
) -> list[Generation]:
    """Greedy generations of `prompts` (token id lists) under `config`, through `engine.Engine`.

    step: see the module docstring; max_gen_toks: one limit or one per prompt; until: stop strings
    of every row, or one list per row (`[[...], [...]]`); max_batch: rows decoded at once (default:
    all, one batch); order: the order prompts enter the batch (default: input order). Results in
    input order.
    """
    engine = Engine(rm, config, step=step, max_batch=max_batch or len(prompts), prefill_segment=prefill_segment,
                    prefill_tokens=prefill_tokens)
    return engine.generate(prompts, max_gen_toks=max_gen_toks, until=until, seq_ids=seq_ids, order=order)


@torch.no_grad()
def score_continuations(
    rm: ReplayModel, pairs: list[tuple[list[int], list[int]]], *, config, backend: str,
) -> list[tuple[float, bool]]:
    """(sum of log-probabilities, greedy) of each continuation given its context, one batch.

    pairs: (context ids, continuation ids), both non-empty. The continuations are right-padded:
    a pad token only follows a row's real tokens, so it changes no logit that is scored.
    """
    device = rm.model.device
    contexts, conts = [p[0] for p in pairs], [p[1] for p in pairs]
    session = rm.new_session(config, seq_ids=[sequence_id(c + t) for c, t in pairs], engine="chunked", backend=backend)
    ids, mask = left_pad(contexts, rm.tokenizer.pad_token_id or 0, device)
    logits = [rm.forward(ids, session, attention_mask=mask, logits_to_keep=1)[:, -1:]]  # [B, 1, V]
    width = max(len(t) for t in conts)
    targets = torch.zeros(len(pairs), width, dtype=torch.long)
    for i, t in enumerate(conts):
        targets[i, : len(t)] = torch.tensor(t, dtype=torch.long)
    targets = targets.to(device)
    if width > 1:
        logits.append(rm.forward(targets[:, :-1], session))  # [B, width - 1, V]
    logprobs = torch.log_softmax(torch.cat(logits, 1).float(), -1)  # [B, width, V]
    picked = logprobs.gather(-1, targets[..., None])[..., 0]  # [B, width]
    greedy = logprobs.argmax(-1) == targets  # [B, width]
    return [(float(picked[i, : len(t)].sum()), bool(greedy[i, : len(t)].all())) for i, t in enumerate(conts)]
