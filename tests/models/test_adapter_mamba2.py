"""Mamba-2 families through the adapter: FP32 equivalence with HF, quantized runs vs the slow path, padding."""

import copy
import sys
from types import SimpleNamespace

import pytest
import torch
import transformers as tf
from adapter_checks import (
    QUANT_CONFIGS,
    check_fp32_matches_hf,
    check_left_padding_does_not_leak,
    check_quantized_matches_slow_path,
)
from hf_tiny import MAMBA2_FAMILIES, VOCAB, build, cuts, hf_cached_logits, rel_err, run

from replayssm_eval.models import ReplayModel, routing
from replayssm_eval.models.model_types import model_type_of


@pytest.mark.parametrize("name", MAMBA2_FAMILIES)
def test_fp32_matches_hugging_face(name):
    check_fp32_matches_hf(name)


@pytest.mark.parametrize("config", QUANT_CONFIGS)
@pytest.mark.parametrize("name", MAMBA2_FAMILIES)
def test_quantized_run_equals_token_by_token_reference(name, config):
    check_quantized_matches_slow_path(name, config)


@pytest.mark.parametrize("name", MAMBA2_FAMILIES)
def test_left_padding_does_not_leak_into_the_state(name):
    check_left_padding_does_not_leak(name)


def test_unsupported_architecture_lists_the_supported_types():
    model = tf.AutoModelForCausalLM.from_config(
        tf.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1)
    )
    with pytest.raises(ValueError, match="unsupported model type 'llama'.*supported: nemotron_h, mamba2, .*qwen3_next"):
        ReplayModel(model)
    with pytest.raises(ValueError, match="Mamba-1 has a per-channel diagonal state"):
        model_type_of(SimpleNamespace(model_type="mamba"))


def test_a_model_without_ssm_layers_is_an_error():
    config = tf.NemotronHConfig(
        vocab_size=VOCAB, hidden_size=16, layers_block_type=["attention", "mlp"], num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, intermediate_size=32,
    )
    with pytest.raises(ValueError, match="no mamba2 SSM layers found"):
        ReplayModel(tf.AutoModelForCausalLM.from_config(config))


def test_a_mixer_that_bypasses_the_hooks_is_an_error(monkeypatch):
    rm = ReplayModel(build("nemotron_h"))
    original = routing._ORIGINALS[(rm.model_type.module, "mamba2_chunk_scan")]
    monkeypatch.setattr(sys.modules[rm.model_type.module], "mamba2_chunk_scan", original)
    with pytest.raises(RuntimeError, match="ran without reaching a ReplaySSM scan hook"):
        rm.forward(torch.zeros(1, 5, dtype=torch.long), rm.new_session())


def test_sessions_reset_switch_config_and_key_rounding_by_sequence():
    rm = ReplayModel(build("nemotron_h"), config="fp16sr@1")
    ids = torch.randint(0, VOCAB, (1, 40))
    calls = cuts(10, (15, 15))
    session = rm.new_session(seq_ids=[1])
    first = run(rm, ids, calls, session)
    assert session.config.name == "fp16sr" and set(session.states) == set(rm.layers)
    assert all(state.seq_ids.tolist() == [1] and state.layer == layer for layer, state in session.states.items())
    session.reset(seq_ids=[1])
    assert session.states == {} and session.tokens == 0
    assert torch.equal(run(rm, ids, calls, session), first)  # bit-reproducible from the seed and ids
    session.reset(seq_ids=[2])
    assert not torch.equal(run(rm, ids, calls, session), first)  # other sequence, other SR bits
    session.reset(config="shared:nvfp4@4", seq_ids=[1])
    switched = run(rm, ids, calls, session)
    assert torch.equal(switched, run(rm, ids, calls, rm.new_session("shared:nvfp4@4", seq_ids=[1])))
    rm.remove()
    with torch.no_grad():
        assert rel_err(rm.model(ids).logits, run(rm, ids, calls, rm.new_session("fp32"))) < 1e-5


def test_bf16_weights_keep_an_fp32_state():
    reference = build("nemotron_h", torch.bfloat16)
    rm = ReplayModel(copy.deepcopy(reference))
    ids = torch.randint(0, VOCAB, (2, 40))
    calls = cuts(10, (15, 15))
    session = rm.new_session("nvfp4/fp16sr@4")
    logits = run(rm, ids, calls, session)
    assert torch.isfinite(logits).all()
    assert all(s.hi.dtype == torch.float32 for s in session.states.values())
    fp32 = run(rm, ids, calls, rm.new_session("fp32"))
    assert rel_err(fp32.float(), hf_cached_logits(reference, ids, calls).float()) < 3e-2  # bf16 activations


def test_generate_adopts_the_cache_it_creates():
    rm = ReplayModel(build("nemotron_h"), config="shared:nvfp4@4")
    ids = torch.randint(0, VOCAB, (1, 12))
    out = rm.model.generate(ids, max_new_tokens=6, do_sample=False)
    session = rm.new_session()
    tokens, step = ids, rm.forward(ids, session)[:, -1:]
    for _ in range(6):
        tokens = torch.cat([tokens, step.argmax(-1)], 1)
        step = rm.forward(tokens[:, -1:], session)
    assert torch.equal(out, tokens)
