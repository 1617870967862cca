"""State round trips (`#rt=`) through `ReplaySession.scan` on every family's kernels, without a model.

A session's calls are fed here as `ReplayModel.forward` feeds them (its token count advanced by hand); the
prompt's end is the FP32 anchor `random_inputs` gives.
"""

import pytest
import torch

from tests.helpers.compare import assert_close
from tests.helpers.device import TEST_DEVICE
from replayssm_eval.kernels.family import all_families
from replayssm_eval.kernels.static_step import check_static_config
from replayssm_eval.models.session import ReplaySession
from replayssm_eval.models.static_session import StaticStepSession
from replayssm_eval.replay.config import ReplayConfig

FAMILIES = all_families()
PROMPT = 5  # tokens of the (notional) prompt before the first call
POOL = "int8:axis=headdim"  # SGLang's checkpoint pool: one scale per key channel


def _inputs(fam, tokens=14, seed=0, device=TEST_DEVICE):
    inputs, anchor = fam.random_inputs(fam.test_shapes["small"], tokens, torch.Generator().manual_seed(seed))
    return tuple(inputs[n].to(device) for n in fam.inputs), anchor.to(device)


def _feed(fam, config, tensors, anchor, cuts, engine="chunked", attention_mask=None):
    """Outputs [B, T, ...] and the session after feeding tensors in calls ending at `cuts` (offsets into T); engine
    "static": the static step's session (`StaticStepSession`)."""
    session = StaticStepSession(config) if engine == "static" else ReplaySession(config, engine=engine)
    session.tokens, session.attention_mask = PROMPT, attention_mask
    timed = [fam.shapes[n].startswith("[B, T") for n in fam.inputs]
    ys, start = [], 0
    for stop in cuts:
        part = tuple(t[:, start:stop] if time else t for t, time in zip(tensors, timed))
        ys.append(session.scan(fam, 0, part, anchor, None))
        session.tokens += stop - start
        if attention_mask is not None:
            session.attention_mask = torch.cat([attention_mask, torch.ones(len(anchor), session.tokens - PROMPT,
                                                                           dtype=torch.long)], dim=1)
        start = stop
    return torch.cat(ys, dim=1), session


def _sglang_int8(state_fmt: torch.Tensor) -> torch.Tensor:
    """SGLang's INT8 checkpoint pool (sgl-project/sglang#28185) of FP32 states [B, H, P, N] (the formats' layout,
    P = V and N = K for the delta rules): per (head, column) scale amax over P / 127, round half to even, saturate."""
    amax = state_fmt.abs().amax(dim=-2, keepdim=True)
    scale = torch.where(amax == 0, 1.0, amax / 127)
    return torch.round(state_fmt / scale).clamp(-127, 127) * scale


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("config, engine", [("fp32", "reference"), ("fp16", "chunked"), ("bf16", "chunked"),
                                            ("fp16sr", "chunked"), ("fp16sr", "reference")])
def test_round_trip_through_fp32_changes_nothing(fam, config, engine):
    tensors, anchor = _inputs(fam)
    plain, s0 = _feed(fam, config, tensors, anchor, [4, 14], engine)
    tripped, s1 = _feed(fam, f"{config}#rt=fp32@every:3", tensors, anchor, [4, 14], engine)
    assert torch.equal(plain, tripped)
    assert torch.equal(s0.states[0].hi, s1.states[0].hi) and torch.equal(s0.states[0].lo, s1.states[0].lo)


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_lossy_round_trip_equals_the_hand_computation(fam):
    """fp32 with the pool at position PROMPT + 4: four FP32 steps, the state rounded by SGLang's formula, then FP32
    steps from it as from a new anchor, bit for bit. A test of the torch reference's semantics: it runs on the CPU
    even under REPLAYSSM_TEST_DEVICE=cuda, where the two computations' FP32 sums are not the same bits."""
    tensors, anchor = _inputs(fam, tokens=9, device="cpu")
    timed = [fam.shapes[n].startswith("[B, T") for n in fam.inputs]
    head = tuple(t[:, :4] if time else t for t, time in zip(tensors, timed))
    tail = tuple(t[:, 4:] if time else t for t, time in zip(tensors, timed))
    y_head, state = fam.decode_reference(*head, anchor, "fp32")
    stored = fam.stored_layout(fam.hf_state(state))  # [B, H, P, N]
    restored = fam.stored_layout(_sglang_int8(stored))  # back to the HF layout (a transpose or nothing)
    assert not torch.equal(restored, fam.hf_state(state))
    y_tail, _ = fam.decode_reference(*tail, restored, "fp32")
    got, _ = _feed(fam, f"fp32#rt={POOL}@at:{PROMPT + 4}", tensors, anchor, [9], "reference")
    assert torch.equal(got, torch.cat([y_head, y_tail], dim=1))


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_prompt_round_trip_stores_the_anchor(fam):
    tensors, anchor = _inputs(fam, tokens=6)
    restored = fam.stored_layout(_sglang_int8(fam.stored_layout(anchor)))
    want, _ = fam.chunked(*tensors, restored, "nvfp4/fp16sr@4")
    got, _ = _feed(fam, f"nvfp4/fp16sr@4#rt={POOL}@prompt", tensors, anchor, [6])
    assert torch.equal(got, want)


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_live_state_of_an_fp32_recurrence_copy_is_the_fp32_state(fam):
    """Mid-window the live state (S_hi with the ring folded in) of `fp32@4` is the FP32 recurrence's state."""
    tensors, anchor = _inputs(fam, tokens=6)
    _, carried = fam.chunked(*tensors, anchor, "fp32@4")
    _, exact = fam.decode_reference(*tensors, anchor, "fp32")
    assert int(carried.schedule.count[0]) == 2
    live = fam.live_state(tensors, carried, ReplayConfig.parse("fp32@4"))
    assert_close("live", fam.stored_layout(fam.hf_state(exact)), live, rtol=1e-5)


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_numbers_do_not_depend_on_where_calls_are_cut(fam):
    config = f"nvfp4/fp16sr@4#rt={POOL}@every:6"
    tensors, anchor = _inputs(fam)
    whole, _ = _feed(fam, config, tensors, anchor, [14], "reference")
    cut, _ = _feed(fam, config, tensors, anchor, [3, 4, 11, 14], "reference")
    assert torch.equal(whole, cut)
    # the chunked form is cut-invariant where its window phases start (every call here is cut at the round trips)
    chunked_whole, _ = _feed(fam, config, tensors, anchor, [14])
    chunked_cut, _ = _feed(fam, config, tensors, anchor, [1, 7, 14])
    assert torch.equal(chunked_whole, chunked_cut)
    assert_close("chunked vs reference", whole, chunked_whole, rtol=1e-5, flips=0.01)
    plain, _ = _feed(fam, "nvfp4/fp16sr@4", tensors, anchor, [14], "reference")
    assert torch.equal(plain[:, :1], whole[:, :1]) and not torch.equal(plain[:, 1:], whole[:, 1:])


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_rows_at_different_positions_round_trip_alone(fam):
    """Row 0 has one padded prompt column, so its positions trail row 1's by one: each row's numbers are its own."""
    config = f"fp16/fp32@4#rt={POOL}@at:8"
    tensors, anchor = _inputs(fam, tokens=6)
    mask = torch.ones(len(anchor), PROMPT, dtype=torch.long)
    mask[0, 0] = 0
    batch, _ = _feed(fam, config, tensors, anchor, [2, 6], "reference", attention_mask=mask)
    for row in (0, 1):
        alone = tuple(t[row:row + 1] if t.dim() > 1 else t for t in tensors)
        got, _ = _feed(fam, config, alone, anchor[row:row + 1], [6], "reference", attention_mask=mask[row:row + 1])
        assert_close(f"row {row}", got, batch[row:row + 1], rtol=1e-6)
        plain, _ = _feed(fam, "fp16/fp32@4", alone, anchor[row:row + 1], [6], "reference")
        hit = 4 - row  # the round trip comes after token PROMPT + hit - 1 (row 0 has one real prompt token less)
        assert_close(f"row {row} before", plain[:, :hit], got[:, :hit], rtol=1e-6)
        assert not torch.allclose(plain[:, hit:], got[:, hit:], rtol=1e-4)


def _assert_same_state(a, b):
    """Two carried ReplayStates equal bit for bit: both copies, phases, checkpoints, the ring, the packed read copy."""
    assert torch.equal(a.checkpoint, b.checkpoint) and torch.equal(a.schedule.count, b.schedule.count)
    assert torch.equal(a.hi, b.hi) and torch.equal(a.lo, b.lo)
    assert all(torch.equal(a.buffer[k], b.buffer[k]) for k in b.buffer)
    assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a.lo_packed.tensors(), b.lo_packed.tensors()))


@pytest.mark.parametrize("fam", [f if f.name != "kda" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES],
                         ids=lambda f: f.name)  # CI time: KDA in the full suite
def test_static_step_restores_the_prompt_round_trip_as_the_triton_step(fam):
    """One-token calls from the anchor, a window of 3 so a flush follows: the static step takes the round trip before
    the state enters its buffers and equals the eager Triton step bit for bit, outputs and every stored tensor."""
    config = f"nvfp4/fp8sr@3#rt={POOL}@prompt"
    tensors, anchor = _inputs(fam, tokens=5)
    cuts = [1, 2, 3, 4, 5]
    eager_y, eager = _feed(fam, config, tensors, anchor, cuts, "step")
    static_y, static = _feed(fam, config, tensors, anchor, cuts, "static")
    assert torch.equal(static_y, eager_y)
    assert int(eager.states[0].checkpoint.max()) == 1
    _assert_same_state(static.states[0], eager.states[0])
    plain_y, _ = _feed(fam, "nvfp4/fp8sr@3", tensors, anchor, cuts, "static")
    assert not torch.equal(plain_y[:, :1], static_y[:, :1])  # the first token reads the round-tripped checkpoint


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_a_row_that_does_not_round_trip_keeps_its_numbers_on_the_triton_step(fam):
    """Rows 1 and 2 go through the pool (whose decode along head_dim is a transposed view) in the step where row 0
    folds: row 0's outputs and stored copies are the plain config's, bit for bit."""
    tensors, anchor = _inputs(fam, tokens=2)
    mask = torch.ones(len(anchor), PROMPT, dtype=torch.long)
    mask[0, 0] = 0  # row 0 reaches position 6 a step after rows 1 and 2
    tripped_y, tripped = _feed(fam, f"fp16/fp32@2#rt={POOL}@at:6", tensors, anchor, [1, 2], "step", attention_mask=mask)
    plain_y, plain = _feed(fam, "fp16/fp32@2", tensors, anchor, [1, 2], "step", attention_mask=mask)
    a, b = tripped.states[0], plain.states[0]
    assert torch.equal(tripped_y[0], plain_y[0]) and torch.equal(a.hi[0], b.hi[0]) and torch.equal(a.lo[0], b.lo[0])
    assert a.checkpoint.tolist() == [1, 0, 0] and not torch.equal(tripped_y[1:, 1], plain_y[1:, 1])


# row 0's prompt has a padded column, so it reaches each position one step after rows 1 and 2 (positions 4 and 5 at
# the first step): every:4 takes row 0's first round trip at the anchor, the others' from the buffers; at:5,7,8 the
# reverse, then two in a row; fp16/fp32 writes its FP32 recurrence copy in place; at window 2 with every:2 some rows
# round-trip at every step while the others fold. Each family and the first three configs once in the quick tier (about
# 8 s each in the interpreter; the last config in the slow tier only), the rest of the grid in the slow tier.
INSIDE = (f"nvfp4/fp8sr@3#rt={POOL}@every:4", "shared:fp16@2#rt=fp8sr@at:5,7,8", "fp16/fp32@3#rt=fp16sr@every:3",
          f"nvfp4/fp16sr@2#rt={POOL}@every:2")


@pytest.mark.parametrize("fam, config", [
    pytest.param(fam, config, marks=() if i == j else pytest.mark.slow, id=f"{fam.name}-{config}")
    for i, fam in enumerate(FAMILIES) for j, config in enumerate(INSIDE)])
def test_static_step_takes_round_trips_inside_the_decode_as_the_triton_step(fam, config):
    """One-token calls of rows at different positions: the static step's per-row positions take each row's round
    trips at its own tokens, bit for bit as the eager Triton step: outputs and every stored tensor after each call."""
    tensors, anchor = _inputs(fam, tokens=7)
    mask = torch.ones(len(anchor), PROMPT, dtype=torch.long)
    mask[0, 0] = 0
    cuts = list(range(1, 8))
    eager_y, eager = _feed(fam, config, tensors, anchor, cuts, "step", attention_mask=mask)
    static_y, static = _feed(fam, config, tensors, anchor, cuts, "static", attention_mask=mask)
    assert torch.equal(static_y, eager_y)
    _assert_same_state(static.states[0], eager.states[0])
    trips = static.static[0].trips
    assert static.static[0].host_count == eager.states[0].schedule.count.tolist()
    assert trips.host_position == trips.position.tolist() == [PROMPT - 1 + 7] + [PROMPT + 7] * (len(anchor) - 1)
    plain_y, _ = _feed(fam, config.partition("#")[0], tensors, anchor, cuts, "static", attention_mask=mask)
    assert not torch.equal(plain_y, static_y)


def test_static_state_without_round_trips_refuses_the_trips_variant():
    fam = FAMILIES[0]
    tensors, anchor = _inputs(fam, tokens=1)
    session = StaticStepSession("nvfp4/fp8sr@3")
    session.tokens = PROMPT
    session.scan(fam, 0, tensors, anchor, None)
    with pytest.raises(ValueError, match=r"this state takes no round trips inside the decode \(config 'nvfp4/fp8sr@3'\); "
                                         "accepted: trips=False"):
        session.static[0].step(tuple(t.contiguous() for t in tensors), "none", trips=True)


@pytest.mark.parametrize("config, message", [
    ("nvfp4#rt=int8@every:4+1=fp32", r"the static decode step takes one config for every layer, got mixed config "
                                     r"'nvfp4#rt=int8@every:4\+1=fp32'; use step='triton'"),
    ("nvfp4#spec=2:0.5", r"the static decode step covers fixed windows only, got speculative config 'nvfp4#spec=2:0.5'; "
                         r"use step='triton'"),
])
def test_static_step_refuses_mixed_and_speculative_configs(config, message):
    for points in ("prompt", "every:4", "at:6,9"):
        check_static_config(ReplayConfig.parse(f"nvfp4#rt=int8@{points}"))
    with pytest.raises(ValueError, match=message):
        check_static_config(ReplayConfig.parse(config))
