"""A mixed config through `ReplaySession`: each part rounds only its own layers and heads, bit for bit as the
uniform run of that part's config does there, and parts that all agree are the uniform config.

Kernel level: `ReplaySession.scan` of one layer on the family's test inputs, in two calls (the second
continues each part's state). Model level: one tiny model per kernel family (tests/helpers/hf_tiny);
the first SSM layer sees the same inputs in every run, so its state is compared exactly.
"""

import pytest
import torch

from replayssm_eval.kernels.family import all_families
from replayssm_eval.models import ReplayModel
from replayssm_eval.models.session import ReplaySession
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.state import ReplayState

from tests.helpers.hf_tiny import VOCAB, build, cuts, forward_calls

X = "nvfp4/fp16sr@4"
CALLS = cuts(11, (9, 8, 1))
MODELS = ("nemotron_h", "qwen3_5", "kimi_linear")


def scan_calls(family, config: str, calls=(7, 5)) -> tuple[torch.Tensor, object]:
    """Outputs [B, T, H, ...] of one layer (id 2) over calls of `calls` tokens (4 heads), and its final state."""
    inputs, anchor = family.random_inputs(family.test_shapes["grouped"], sum(calls), torch.Generator().manual_seed(0))
    session = ReplaySession(config, seq_ids=[4, 9])
    outs, start = [], 0
    for length in calls:
        part = tuple(inputs[n][:, start:start + length] if "T" in family.shapes[n] else inputs[n] for n in family.inputs)
        outs.append(session.scan(family, 2, part, anchor, None))
        start += length
    return torch.cat(outs, dim=1), session.states[2]


@pytest.mark.parametrize("family", all_families(), ids=lambda f: f.name)
def test_head_parts_take_each_head_from_their_own_config(family):
    y_x, state_x = scan_calls(family, X)
    y_y, state_y = scan_calls(family, "fp8/fp32@8")
    y_ref, state_ref = scan_calls(family, "fp32")
    y, state = scan_calls(family, f"fp32+2.h0=fp8/fp32@8+2.h2={X}")
    assert torch.equal(y[:, :, 0], y_y[:, :, 0]) and torch.equal(y[:, :, 1], y_ref[:, :, 1])
    assert torch.equal(y[:, :, 2], y_x[:, :, 2])
    assert set(state) == {"fp32", "fp8/fp32@8", X}
    assert torch.equal(state[X].hi, state_x.hi) and torch.equal(state["fp8/fp32@8"].hi, state_y.hi)
    assert torch.equal(state["fp32"], state_ref)
    assert not torch.equal(y_x[:, :, 2], y_ref[:, :, 2]), "the format must move the outputs, or this shows nothing"


@pytest.mark.parametrize("family", all_families(), ids=lambda f: f.name)
def test_a_part_of_another_layer_changes_nothing(family):
    y_x, state_x = scan_calls(family, X)
    y, state = scan_calls(family, f"{X}+0=fp32+3.h1=fp8")
    assert torch.equal(y, y_x) and torch.equal(state.hi, state_x.hi)


@pytest.mark.parametrize("family", all_families(), ids=lambda f: f.name)
def test_a_head_part_keeps_its_own_round_trip(family):
    trip = ReplayConfig.parse(f"{X}#rt=int8:axis=headdim@prompt").name
    y_trip, state_trip = scan_calls(family, trip)
    y_x, state_x = scan_calls(family, X)
    y, state = scan_calls(family, f"{X}+2.h1={trip}")
    assert torch.equal(y[:, :, 1], y_trip[:, :, 1]) and torch.equal(y[:, :, 0], y_x[:, :, 0])
    assert torch.equal(state[trip].hi, state_trip.hi) and torch.equal(state[X].hi, state_x.hi)
    assert not torch.equal(y_trip[:, :, 1], y_x[:, :, 1]), "the round trip must move the outputs"


def run(rm, ids, config):
    session = rm.new_session(config, seq_ids=[3, 8])
    return forward_calls(rm, ids, CALLS, session), session.states


@pytest.mark.parametrize("name", MODELS)
def test_parts_that_agree_equal_the_uniform_config(name):
    rm = ReplayModel(build(name))
    first, last = min(rm.layers), max(rm.layers)
    ids = torch.randint(0, VOCAB, (2, CALLS[-1][1]), generator=torch.Generator().manual_seed(1))
    uniform, states = run(rm, ids, X)
    mixed, mixed_states = run(rm, ids, f"{X}+{first}={X}+{last}.h0-1={X}")
    assert torch.equal(mixed, uniform)
    assert all(torch.equal(mixed_states[k].hi, states[k].hi) for k in rm.layers)


@pytest.mark.parametrize("name", MODELS)
def test_each_part_rounds_only_its_own_layer_and_heads(name):
    rm = ReplayModel(build(name))
    first = min(rm.layers)
    ids = torch.randint(0, VOCAB, (2, CALLS[-1][1]), generator=torch.Generator().manual_seed(1))
    ref, ref_states = run(rm, ids, "fp32")
    quant, quant_states = run(rm, ids, X)

    only_first, states = run(rm, ids, f"fp32+{first}={X}")
    assert torch.equal(states[first].hi, quant_states[first].hi)
    assert all(isinstance(states[k], torch.Tensor) for k in rm.layers if k != first)  # plain FP32 elsewhere
    all_but_first, states = run(rm, ids, f"{X}+{first}=fp32")
    assert torch.equal(states[first], ref_states[first])
    assert all(isinstance(states[k], ReplayState) for k in rm.layers if k != first)

    heads, states = run(rm, ids, f"fp32+{first}.h1={X}")
    assert torch.equal(states[first][X].hi[:, 1], quant_states[first].hi[:, 1])
    assert torch.equal(states[first]["fp32"], ref_states[first])
    for logits in (only_first, all_but_first, heads):
        assert not torch.equal(logits, ref) and not torch.equal(logits, quant)


def test_check_config_names_the_bad_part():
    rm = ReplayModel(build("nemotron_h"))  # SSM layers 0 and 2 of 4 heads
    with pytest.raises(ValueError, match=r"layer 1 is not an SSM layer of this nemotron_h model; accepted: 0, 2$"):
        rm.check_config("nvfp4/fp16sr+1=fp32")
    with pytest.raises(ValueError, match=r"^heads 2\.h3-4 in mixed config: layer 2 has 4 heads; accepted: heads 0-3$"):
        rm.new_session("nvfp4/fp16sr+2.h3-4=fp32")


def test_skip_counts_only_the_heads_of_its_part():
    rm = ReplayModel(build("nemotron_h"))
    ids = torch.randint(0, VOCAB, (2, CALLS[-1][1]), generator=torch.Generator().manual_seed(1))
    session = rm.new_session(f"fp32+2.h0-1={X}#skip=0.5", seq_ids=[3, 8])
    forward_calls(rm, ids, CALLS, session)
    decoded = CALLS[-1][1] - CALLS[0][1]  # tokens after the prompt
    assert list(session.skip_counts) == [2] and session.skip_counts[2][0] == 2 * decoded * 2  # rows x tokens x heads
