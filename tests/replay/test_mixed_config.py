"""Mixed configs: the `+SELECTOR=CONFIG` grammar, its canonical name and what each layer and head runs."""

import pytest

from replayssm_eval.generate import split_configs
from replayssm_eval.replay.config import Override, ReplayConfig


@pytest.mark.parametrize("text, name", [
    ("nvfp4/fp16sr+7,3=fp32+5.h0-3=nvfp4/fp32", "nvfp4/fp16sr+3,7=fp32+5.h0-3=nvfp4/fp32"),
    ("nvfp4/fp16sr#seed=2+3=fp32+1.h2-2=fp8@4", "nvfp4/fp16sr#seed=2+3=fp32+1.h2=shared:fp8@4"),
    ("fp32+2=nvfp4/fp16sr+2.h4=fp16sr@8#closed", "fp32+2=nvfp4/fp16sr+2.h4=shared:fp16sr@8#closed"),
])
def test_name_is_canonical_and_round_trips(text, name):
    config = ReplayConfig.parse(text)
    assert config.name == name
    assert ReplayConfig.parse(name) == config


def test_engine_presets_expand_in_each_part():
    config = ReplayConfig.parse("vllm:fp16sr+0=vllm:fp8")
    assert config.default == ReplayConfig.parse("vllm:fp16sr")
    assert config.for_layer(0) == ReplayConfig.parse("vllm:fp8") != config.default
    assert ReplayConfig.parse(config.name) == config


def test_parts_of_a_layer():
    config = ReplayConfig.parse("nvfp4/fp16sr+3=fp32+3.h1-2=fp8@4+5.h0=fp16")
    plain = ReplayConfig.parse
    assert config.default == plain("nvfp4/fp16sr") and config.windows == (1, 4, 16)
    assert config.for_layer(3) == plain("fp32") and config.for_layer(4) == plain("nvfp4/fp16sr")
    assert config.layer_parts(3, 4) == ((plain("fp32"), (0, 3)), (plain("shared:fp8@4"), (1, 2)))
    assert config.layer_parts(5, 2) == ((plain("fp16"), (0,)), (plain("nvfp4/fp16sr"), (1,)))
    assert config.layer_parts(0, 2) == ((plain("nvfp4/fp16sr"), (0, 1)),)
    assert not config.is_reference and ReplayConfig.parse("fp32+1=fp32@16").is_reference
    with pytest.raises(ValueError, match=r"^heads 3\.h1-2 in mixed config: layer 3 has 2 heads; accepted: heads 0-1$"):
        config.layer_parts(3, 2)
    with pytest.raises(ValueError, match="a kernel runs one plain config, got mixed config"):
        config.plain()


def test_overrides_are_sorted_and_may_be_built_directly():
    built = ReplayConfig(read="nvfp4", recur="fp16sr", window=16, shared=False,
                         overrides=(Override(7, "fp32"), Override(2, "fp8", (0, 1))))
    assert built == ReplayConfig.parse("nvfp4/fp16sr+2.h0-1=fp8+7=fp32")
    assert [p.selector for p in built.overrides] == ["2.h0-1", "7"]


def test_split_configs_keeps_a_layer_list_in_its_config():
    assert split_configs("fp32,nvfp4/fp16sr+3,7=fp32,fp8") == ["fp32", "nvfp4/fp16sr+3,7=fp32", "fp8"]


@pytest.mark.parametrize("text, message", [
    ("nvfp4+3", r"^bad part '3' in mixed config 'nvfp4\+3'; accepted: \+LAYERS=CONFIG"),
    ("nvfp4+x=fp32", r"^bad selector 'x' in mixed config 'nvfp4\+x=fp32'; accepted: layer indices"),
    ("nvfp4+3.g1=fp32", r"^bad selector '3\.g1'"),
    ("nvfp4+3.h2-1=fp32", r"^heads 2-1 of layer 3 in a mixed config; accepted: first-last with 0 <= first <= last$"),
    ("nvfp4+3=fp32+3=fp8", r"^part 3 of mixed config 'nvfp4\+3=fp32\+3=fp8' repeats or overlaps another of layer 3"),
    ("nvfp4+3.h0-2=fp32+3.h2=fp8", r"^part 3\.h2 of mixed config .* repeats or overlaps another of layer 3"),
    ("nvfp4+3=fp32#spec=2:0.5", r"has a speculative schedule \(#spec\), which is one for the whole model"),
    ("nvfp4+3=nvfp5", r"^unknown state format 'nvfp5'"),
])
def test_bad_parts(text, message):
    with pytest.raises(ValueError, match=message):
        ReplayConfig.parse(text)
