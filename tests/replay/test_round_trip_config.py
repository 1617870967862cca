"""The `#rt=` option: its grammar, the positions it names, and SGLang's INT8 checkpoint pool as a format."""

import pytest
import torch

from replayssm_eval.formats import get_format
from replayssm_eval.generate import split_configs
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.engine_presets import PRESETS
from replayssm_eval.replay.round_trip import RoundTrip


@pytest.mark.parametrize("text, prompt, every, at", [
    ("nvfp4/fp16sr#rt=int8:axis=headdim@prompt", True, 0, ()),
    ("fp16#rt=fp8:scale=head@every:256", False, 256, ()),
    ("shared:nvfp4@8#seed=3#rt=bf16@at:17,40,1000", False, 0, (17, 40, 1000)),
])
def test_parse_and_name(text, prompt, every, at):
    config = ReplayConfig.parse(text)
    rt = config.round_trip
    assert (rt.prompt, rt.every, rt.at) == (prompt, every, at)
    assert ReplayConfig.parse(config.name) == config
    assert config.name.endswith(f"#rt={rt.name}")


def test_format_spec_is_canonical():
    rt = ReplayConfig.parse("fp32#rt=int8:scale=row,axis=headdim@prompt").round_trip
    assert rt.fmt == "int8:axis=headdim" and rt.format == get_format("int8:axis=headdim,scale=row")


def test_hits():
    positions = torch.tensor([0, 3, 6, 7, 12, 40])
    assert RoundTrip("int8", every=6).hits(positions).tolist() == [False, False, True, False, True, False]
    assert RoundTrip("int8", at=(7, 40)).hits(positions).tolist() == [False, False, False, True, False, True]
    assert not RoundTrip("int8", prompt=True).hits(positions).any()  # applied at the anchor, not by position


def test_only_an_fp32_round_trip_keeps_the_reference():
    assert ReplayConfig.parse("fp32#rt=fp32@every:4").is_reference
    assert not ReplayConfig.parse("fp32#rt=int8@every:4").is_reference
    assert not ReplayConfig.parse("sglang:int8-pool").is_reference


@pytest.mark.parametrize("text, message", [
    ("fp32#rt=int8", "round trip 'int8' has no points"),
    ("fp32#rt=int8@never", "bad round-trip points 'never'; accepted: prompt, every:N, at:P1,P2,..."),
    ("fp32#rt=int8@every:0", "bad round-trip points 'every:0': '0' is not an integer >= 1"),
    ("fp32#rt=int8@at:3,x", "bad round-trip points 'at:3,x': 'x' is not an integer >= 1"),
    ("fp32#rt=int8@at:9,4", r"round-trip positions \[9, 4\]; accepted: increasing integers >= 1"),
    ("fp32#rt=int9@prompt", "unknown state format 'int9'"),
    ("nvfp4#rt=int8@prompt#spec=2:0.5", "does not combine with #spec or #skip"),
])
def test_bad_round_trips(text, message):
    with pytest.raises(ValueError, match=message):
        ReplayConfig.parse(text)


def test_sglang_pool_is_its_formula():
    """sgl-project/sglang#28185 (Int8CheckpointStore.quantize): a GDN state [H, V, K], amax over V per (head, key
    channel), scale amax / 127 (FP32 here: the live state's dtype), round half to even, saturate at +-127."""
    rt = ReplayConfig.parse("sglang:int8-pool").round_trip
    assert rt.prompt and PRESETS["sglang:int8-pool"].source.startswith("sgl-project/sglang#28185")
    state = torch.randn(2, 3, 20, 16, generator=torch.Generator().manual_seed(0))  # [B, HV, V, K]
    state[0, 1, :, 5] = 0.0  # an all-zero key channel decodes to zero
    state[1, 2, 0, 3] = 2.5 * state[1, 2, :, 3].abs().max()  # an outlier moves one channel's scale alone
    amax = state.abs().amax(dim=-2, keepdim=True)
    scale = amax / 127
    want = torch.round(state / torch.where(scale == 0, 1.0, scale)).clamp(-127, 127) * scale
    packed = rt.format.encode(state)
    assert packed.global_scale.shape == (2, 3, 16)  # one scale per (head, key channel)
    assert torch.equal(rt.format.decode(packed), want)


def test_config_lists_keep_round_trip_positions():
    assert split_configs("fp32,fp16#rt=int8@at:64,512,nvfp4:axis=headdim,scale=head/fp16sr") == [
        "fp32", "fp16#rt=int8@at:64,512", "nvfp4:axis=headdim,scale=head/fp16sr"]
