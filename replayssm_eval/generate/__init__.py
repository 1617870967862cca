"""The generation engine: ReplaySSM decoding of many prompts at once, greedy or sampled.

    engine       segmented FP32 prefill, continuous batching, the one place that runs a decode step
    steps        the decode step of a session, the left padding of prompt groups
    generation   greedy generation and continuation scoring over the engine (what the lm-eval model runs)
    batch_rows   keep some rows of a running session, or join sessions into one batch
    memory       how many rows fit on the device (`--max-batch-size auto`)
    sampling     sampled decoding with common random numbers across configs
    degeneration whether a generation's tail loops
    offline      `python -m replayssm_eval.generate.offline`: generate from a requests file, without lm-eval

The whole model's fixed-buffer step (the "graph" step) is `models.model_graph.StaticDecoder`.
This module imports neither torch nor lm-eval.
"""

from __future__ import annotations

import re

# decode steps of the generation engine (`engine.Engine`); the fixed-buffer ones cover fixed windows only
DECODE_STEPS = ("reference", "triton", "static", "graph")
FIXED_BUFFER_STEPS = ("static", "graph")


def split_configs(text: str) -> list[str]:
    """Comma-separated config strings; a piece `key=value` continues the format options of the one before
    (`fp32,nvfp4:axis=headdim,scale=head/fp16sr` is two configs), a piece of digits its round-trip positions
    (`fp32,fp16#rt=int8@at:64,512` is two configs)."""
    pieces: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if pieces and re.match(r"^(\w+=|\d+$)", piece):
            pieces[-1] += "," + piece
        elif piece:
            pieces.append(piece)
    return pieces
