"""Model geometry presets, state sizes, and geometry read from Hugging Face configs."""

import dataclasses

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    BambaConfig,
    LlamaConfig,
    Mamba2Config,
    NemotronHConfig,
    Qwen3_5Config,
    Qwen3_5TextConfig,
    KimiLinearConfig,
    Qwen3NextConfig,
)

from replayssm_eval.models.presets import (
    PRESETS, full_size_config, full_size_preset, geometry_from_config, get_preset, state_shape,
)


def test_nemotron_nano_state_bytes():
    nano = PRESETS["nemotron-3-nano-4b"]
    assert nano.head_state_shape == (80, 128)
    assert nano.state_bytes_per_layer() == 96 * 80 * 128 * 4 == 3.75 * 2**20  # docs/semantics.md, The method
    assert nano.state_bytes_per_layer(bits=4.5) == 96 * 80 * 128 * 4.5 / 8
    assert nano.state_bytes_per_sequence() == 21 * 96 * 80 * 128 * 4


def test_qwen_state_is_key_by_value():
    qwen = PRESETS["qwen3.5-4b"]
    assert qwen.family == "gdn"
    assert qwen.head_state_shape == (128, 128)
    assert qwen.state_bytes_per_layer(bits=16) == 32 * 128 * 128 * 2


def test_unknown_values_are_named():
    with pytest.raises(ValueError, match="num_heads, head_dim, state_dim unknown"):
        PRESETS["qwen3.5-122b-a10b"].state_bytes_per_layer()


def test_get_preset_by_short_name_or_hub_id():
    assert get_preset("Qwen/Qwen3.5-4B") is get_preset("qwen3.5-4b")
    with pytest.raises(KeyError, match="known: nemotron-3-nano-4b"):
        get_preset("qwen9-1b")


def test_family_is_checked():
    with pytest.raises(ValueError, match="known: mamba2, gdn, kda"):
        dataclasses.replace(PRESETS["qwen3.5-4b"], family="mamba1")


def test_kimi_linear_state_is_key_by_value_per_head():
    kimi = get_preset("moonshotai/Kimi-Linear-48B-A3B-Instruct")
    assert (kimi.family, kimi.num_layers, kimi.num_ssm_layers, kimi.num_heads, kimi.n_groups) == ("kda", 27, 20, 32, 32)
    assert kimi.head_state_shape == (128, 128)
    assert kimi.state_bytes_per_sequence() == 20 * 32 * 128 * 128 * 4 == 40 * 2**20


MAMBA2_PATTERN = "M-M*M-"  # 3 Mamba-2, 2 MLP, 1 attention


@pytest.mark.parametrize(
    "config, expected",
    [
        (
            NemotronHConfig(hidden_size=64, hybrid_override_pattern=MAMBA2_PATTERN, mamba_num_heads=6,
                            mamba_head_dim=10, ssm_state_size=12, n_groups=3, conv_kernel=3, vocab_size=99),
            ("mamba2", 6, 3, 6, 10, 12, 3, 3),
        ),
        (
            Mamba2Config(hidden_size=64, num_hidden_layers=5, num_heads=8, head_dim=16, state_size=12, n_groups=2,
                         conv_kernel=4, expand=2, vocab_size=99),
            ("mamba2", 5, 5, 8, 16, 12, 2, 4),
        ),
        (
            BambaConfig(hidden_size=64, num_hidden_layers=4, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16,
                        mamba_d_state=8, mamba_n_groups=2, mamba_d_conv=4, vocab_size=99),
            ("mamba2", 4, 3, 8, 16, 8, 2, 4),
        ),
        (
            Qwen3_5TextConfig(hidden_size=64, num_hidden_layers=8, linear_num_value_heads=6, linear_num_key_heads=3,
                              linear_key_head_dim=12, linear_value_head_dim=10, linear_conv_kernel_dim=4, vocab_size=99),
            ("gdn", 8, 6, 6, 10, 12, 3, 4),
        ),
        (
            Qwen3_5Config(text_config={"hidden_size": 64, "num_hidden_layers": 4, "linear_num_value_heads": 4,
                                       "linear_num_key_heads": 2, "linear_key_head_dim": 8,
                                       "linear_value_head_dim": 8, "vocab_size": 99}),
            ("gdn", 4, 3, 4, 8, 8, 2, 4),
        ),
        (
            Qwen3NextConfig(hidden_size=64, num_hidden_layers=4, linear_num_value_heads=4, linear_num_key_heads=2,
                            linear_key_head_dim=8, linear_value_head_dim=16, vocab_size=99),
            ("gdn", 4, 3, 4, 16, 8, 2, 4),
        ),
        (
            KimiLinearConfig(hidden_size=64, num_hidden_layers=5, linear_num_heads=6, linear_head_dim=12,
                             linear_conv_kernel_dim=3, vocab_size=99,
                             linear_attn_config={"full_attn_layers": [2, 5], "kda_layers": [1, 3, 4]}),
            ("kda", 5, 3, 6, 12, 12, 6, 3),
        ),
    ],
    ids=["nemotron_h", "mamba2", "bamba", "qwen3_5_text", "qwen3_5", "qwen3_next", "kimi_linear"],
)
def test_geometry_from_tiny_configs(config, expected):
    g = geometry_from_config(config)
    got = (g.family, g.num_layers, g.num_ssm_layers, g.num_heads, g.head_dim, g.state_dim, g.n_groups, g.conv_kernel)
    assert got == expected
    assert g.vocab_size == 99


def test_geometry_of_a_real_tiny_model():
    config = NemotronHConfig(hidden_size=32, hybrid_override_pattern=MAMBA2_PATTERN, mamba_num_heads=4,
                             mamba_head_dim=8, ssm_state_size=16, n_groups=2, vocab_size=99, intermediate_size=64,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = AutoModelForCausalLM.from_config(config)
    g = geometry_from_config(model.config)
    mixers = [m for m in model.modules() if hasattr(m, "A_log")]
    assert len(mixers) == g.num_ssm_layers == 3
    assert all(m.A_log.numel() == g.num_heads for m in mixers)


def test_unsupported_model_type():
    with pytest.raises(ValueError, match="unsupported model type 'llama'; supported: nemotron_h"):
        geometry_from_config(LlamaConfig())


# the model cards give 3.97 x 10^9 parameters (Nemotron) and 48B total (Kimi Linear; built: 49.1e9, of which
# 0.75e9 are the untied embeddings, so the card's figure is rounded)
@pytest.mark.parametrize("name, params, rel", [("nemotron-3-nano-4b", 3.97e9, 2e-3), ("qwen3.5-4b", None, None),
                                               ("kimi-linear-48b-a3b", 48e9, 3e-2)])
def test_full_size_configs(name, params, rel):
    config = full_size_config(name)
    assert dataclasses.replace(geometry_from_config(config), name=PRESETS[name].name) == PRESETS[name]
    if params is not None:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(params, rel=rel)


def test_full_size_config_names():
    with pytest.raises(ValueError, match="available: nemotron-3-nano-4b, qwen3.5-4b, kimi-linear-48b-a3b"):
        full_size_config("qwen3.5-122b-a10b")


def test_state_shapes_in_the_formats_layout():
    assert state_shape("nemotron-3-nano-4b") == (96, 80, 128)
    assert state_shape("qwen3.5-4b") == (32, 128, 128)
    assert state_shape("8,64,16") == (8, 64, 16)
    with pytest.raises(ValueError, match="known: nemotron-3-nano-4b, nemotron-3-super-120b-a12b"):
        state_shape("8,64")
    with pytest.raises(ValueError, match="num_heads, head_dim, state_dim unknown"):
        state_shape("qwen3.5-122b-a10b")


def test_full_size_preset_of_each_family():
    assert [full_size_preset(f) for f in ("mamba2", "gdn", "kda")] == [
        "nemotron-3-nano-4b", "qwen3.5-4b", "kimi-linear-48b-a3b"]
