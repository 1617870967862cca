"""Rows leaving (`keep_rows`) and joining (`join`) a running batch keep every field of each row's SSM state, the
packed read copy included, in every state format with each of its options, and every buffer dtype.

Each row's state comes from the Mamba-2 reference decode alone (its packed read copy as the Triton
step reads it); joined and kept rows must equal those rows stacked, bit for bit. End to end, the Triton
step with rows leaving and joining gives each prompt its tokens alone (one config per scale layout
and option group).
"""

import pytest
import torch
from transformers import DynamicCache

from replayssm_eval.formats.registry import FORMATS, ROTATIONS
from replayssm_eval.generate.batch_rows import join, keep_rows
from replayssm_eval.generate.generation import greedy_generate
from replayssm_eval.kernels.mamba2 import decode_reference
from replayssm_eval.models.session import ReplaySession
from replayssm_eval.replay.config import BUFFER_DTYPES

from tests.helpers.compare import assert_same_state
from tests.helpers.generation import tiny_model
from tests.helpers.mamba2 import mamba2_inputs
from tests.helpers.replay import stack_states

TEXTS = ("To be", "O Romeo, Romeo", "KING HENRY:\nOnce more unto")  # three lengths: joining pads the KV caches
N_VALUES = {"rounds": "7", "bits": "8", "max": "240", "width": "4", "block:N": "block:8", "tile:RxC": "tile:3x0",
            "hadamard:N": "hadamard:4"}


def option_specs(name: str) -> list[str]:
    """`name` alone, then with each non-default value of each of its options (a number in place of a final N)."""
    accepted = {**FORMATS[name].options_for(name), "rot": ROTATIONS}
    return [name] + [f"{name}:{key}={N_VALUES.get(v, N_VALUES[key] if v == 'N' else v)}"
                     for key, values in accepted.items() for v in values[1:]]


CONFIGS = ([f"{spec}/{'fp16sr' if name == 'fp32' else 'fp32'}@4" for name in FORMATS for spec in option_specs(name)]
           + [f"nvfp4:scale=rowcol/fp16sr@4#buf={dtype}" for dtype in BUFFER_DTYPES] + ["shared:int8:scale=rowcol@4"])


def session_of_one_row(config: str, row: int) -> ReplaySession:
    """A one-row session holding a Mamba-2 layer's state after 3 + row tokens (rows at different window phases)."""
    _, state = decode_reference(*mamba2_inputs(batch=1, tokens=3 + row, seed=row), config,
                                seq_ids=torch.tensor([row]))
    assert state.lo_packed is not None
    session = ReplaySession(config, seq_ids=[row], new_cache=DynamicCache)
    session.states, session.tokens = {0: state}, 3 + row
    return session


def test_the_configs_cover_every_format_scale_layout_rotation_and_rounding_option():
    assert {c.split(":")[0].split("/")[0] for c in CONFIGS} >= set(FORMATS)
    for option in ("scale=rowcol", "scale=block:8", "scale=none", "scale=tensor", "scale=row", "axis=headdim",
                   "rot=hadamard:4", "rounds=7", "bits=8", "max=240", "#buf=bf16", "#buf=fp16"):
        assert any(option in c for c in CONFIGS), option


@pytest.mark.parametrize("config", CONFIGS)
def test_join_and_keep_rows_keep_every_field_of_each_row(config):
    sessions = [session_of_one_row(config, row) for row in range(3)]
    alone = [s.states[0] for s in sessions]
    joined = join(sessions)
    assert joined.seq_ids.tolist() == [0, 1, 2] and joined.states[0].lo_packed.shape[0] == 3
    assert_same_state(stack_states(alone), joined.states[0])
    keep_rows(joined, [2, 0])
    assert joined.seq_ids.tolist() == [2, 0] and joined.states[0].lo_packed.shape[0] == 2
    assert_same_state(stack_states([alone[2], alone[0]]), joined.states[0])


@pytest.mark.parametrize("config", [
    pytest.param("int8:scale=rowcol/fp32@4", marks=pytest.mark.slow),
    pytest.param("nvfp4:scale=rowcol,axis=headdim/fp16sr@4#buf=bf16", marks=pytest.mark.slow),
    pytest.param("int16sr:scale=block:8,rot=hadamard:4,rounds=7,bits=8/fp32@4#buf=fp16", marks=pytest.mark.slow),
    pytest.param("fp8:scale=tensor,max=240/fp32@4", marks=pytest.mark.slow),
    pytest.param("mxfp4:axis=headdim/fp32@4", marks=pytest.mark.slow),
])
def test_triton_step_with_rows_leaving_and_joining_gives_each_prompt_its_tokens_alone(config):
    rm = tiny_model("tiny-qwen3.5")
    prompts, limits = [rm.tokenizer.encode(t) for t in TEXTS], [1, 3, 2]  # the first row leaves, the third joins
    gens = greedy_generate(rm, prompts, config=config, max_gen_toks=limits, step="triton", max_batch=2)
    alone = [greedy_generate(rm, [p], config=config, max_gen_toks=m, step="triton")[0].tokens
             for p, m in zip(prompts, limits)]
    assert [g.tokens for g in gens] == alone
    assert [len(t) for t in alone] == limits
