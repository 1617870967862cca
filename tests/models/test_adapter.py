"""Every supported model type through the adapter (one case per model type of each kernel family), then the adapter's
own behaviour on a Nemotron-H model.

FP32: the routed model equals the unmodified Hugging Face model through the same calls (prompt,
teacher-forced segments, one-token steps through HF's one-token path) and its plain full forward.

Quantized configs: a run in segments (chunked kernels) equals the slow path (HF's one-token path,
`decode_reference` per layer and token). This runs in float64 weights and kernel math: in FP32,
HF's own segment and one-token code paths (matmuls of different shapes) differ by float noise,
which now and then flips a rounding decision of the quantized state (measured: up to 5e-2
relative in the logits of a split NVFP4 run), so only a float64 run can show exact equality.
kimi_linear is the exception: its RMS norms, gated output norm and MoE router cast to float32
inside a float64 model, so its segment and one-token paths differ by float32 noise (measured:
5e-9 relative in the logits), checked to 1e-7.
"""

import copy
import sys
from types import SimpleNamespace

import pytest
import torch
import transformers as tf

from replayssm_eval.kernels.delta import _common as delta_common
from replayssm_eval.models import ReplayModel, routing, token_by_token_logits
from replayssm_eval.models import session as session_module
from replayssm_eval.models.model_types import model_type_of

from tests.helpers.compare import rel_err
from tests.helpers.hf_tiny import MODEL_TYPES, VOCAB, build, cuts, forward_calls, hf_cached_logits

FP32_CALLS = cuts(23, (37, 37, 37, 1, 1, 1, 1, 1, 1))
QUANT_CALLS = cuts(11, (13, 13, 13))
QUANT_CONFIGS = ("nvfp4/fp16sr@4", "shared:nvfp4@4")
# the closed fold (delta-rule families) and the eager window, on one model type each
FOLD_CASES = [("qwen3_5", "nvfp4/fp16sr@4#closed"), ("qwen3_5", "fp8sr@1"),
              pytest.param("kimi_linear", "nvfp4/fp16sr@4#closed", marks=pytest.mark.slow)]  # a minute: the slow tier
# model types whose HF modules compute in float32 inside a float64 model: the float32 noise bound of the check
FLOAT32_INSIDE = {"kimi_linear": 1e-7}
MODELS = [name for names in MODEL_TYPES.values() for name in names]
QUANT_CASES = [(name, config) for name in MODELS for config in QUANT_CONFIGS] + FOLD_CASES


@pytest.mark.parametrize("name", MODELS)
def test_fp32_matches_hugging_face(name):
    reference = build(name)
    rm = ReplayModel(copy.deepcopy(reference), config="fp32")
    ids = torch.randint(0, VOCAB, (2, FP32_CALLS[-1][1]))
    ours = forward_calls(rm, ids, FP32_CALLS, rm.new_session())
    assert len(rm.layers) > 0
    assert set(rm.new_session().states) == set()  # fresh sessions start empty
    with torch.no_grad():
        full = reference(ids).logits
    hf = hf_cached_logits(reference, ids, FP32_CALLS)
    assert rel_err(ours, hf) <= 1e-4, (name, rel_err(ours, hf))
    assert rel_err(ours, full) <= 1e-4, (name, rel_err(ours, full))


@pytest.mark.parametrize("name", MODELS)
def test_fp32_through_the_kernels_matches_hugging_face(name):
    """The reference's segments through our chunked kernels (`reference_scan="kernels"`), its one-token calls through
    the conventional step from the state they hand back: HF's numbers up to FP32 noise, each layer checked once."""
    reference = build(name)
    rm = ReplayModel(copy.deepcopy(reference))
    ids = torch.randint(0, VOCAB, (2, FP32_CALLS[-1][1]))
    session = rm.new_session("fp32", reference_scan="kernels")
    ours = forward_calls(rm, ids, FP32_CALLS, session)
    hf = hf_cached_logits(reference, ids, FP32_CALLS)
    assert rel_err(ours, hf) <= 1e-4, (name, rel_err(ours, hf))
    assert set(session.reference_checks) == set(rm.layers)
    for layer, check in session.reference_checks.items():  # nonzero: the kernels ran, not HF's scan
        assert 0 < check["output"] <= 1e-5 and 0 < check["state"] <= 1e-5, (name, layer, check)


@pytest.mark.parametrize("name", [names[0] for names in MODEL_TYPES.values()])
def test_fp32_through_the_kernels_checks_a_bf16_model_before_its_casts(name):
    """bf16 activations: HF's delta rules return their output in the query's dtype, so the check hands them fp32
    inputs (the rules' first step casts to fp32 anyway) and compares FP32 outputs, not a bf16 rounding of one."""
    rm = ReplayModel(build(name).to(torch.bfloat16))
    ids = torch.randint(0, VOCAB, (2, FP32_CALLS[2][1]))
    session = rm.new_session("fp32", reference_scan="kernels")
    forward_calls(rm, ids, FP32_CALLS[:3], session)
    assert set(session.reference_checks) == set(rm.layers)
    assert max(v for check in session.reference_checks.values() for v in check.values()) <= 1e-5


def test_a_kernel_reference_off_hugging_face_stops_the_run(monkeypatch):
    monkeypatch.setattr(session_module, "KERNEL_REFERENCE_TOLERANCE", 1e-12)
    rm = ReplayModel(build("nemotron_h"))
    ids = torch.randint(0, VOCAB, (1, FP32_CALLS[1][1]))
    with pytest.raises(RuntimeError, match=r"differs from Hugging Face's FP32 scan on SSM layer \d+ by .*1e-12"):
        forward_calls(rm, ids, FP32_CALLS[:2], rm.new_session("fp32", reference_scan="kernels"))
    with pytest.raises(ValueError, match="unknown reference scan 'torch'; known: hf, kernels"):
        rm.new_session("fp32", reference_scan="torch")
    with pytest.raises(ValueError, match="reference_scan='kernels' runs under the chunked engine, not 'step'"):
        rm.new_session("fp32", engine="step", reference_scan="kernels")


@pytest.mark.parametrize("name, config", QUANT_CASES)
def test_quantized_run_equals_token_by_token_reference(name, config):
    rm = ReplayModel(build(name, torch.float64))
    ids = torch.randint(0, VOCAB, (2, QUANT_CALLS[-1][1]))
    fast = forward_calls(rm, ids, QUANT_CALLS, rm.new_session(config, seq_ids=[5, 9], compute_dtype=torch.float64))
    slow = token_by_token_logits(
        rm, ids, prompt_len=QUANT_CALLS[0][1], config=config, seq_ids=[5, 9], compute_dtype=torch.float64
    )
    reference = forward_calls(rm, ids, QUANT_CALLS, rm.new_session("fp32", compute_dtype=torch.float64))
    assert rel_err(fast, slow) <= FLOAT32_INSIDE.get(name, 1e-10), (name, config, rel_err(fast, slow))
    assert rel_err(fast, reference) > 1e-4, "the state format must move the logits, or this test shows nothing"


@pytest.mark.parametrize("name", MODELS)
def test_left_padding_does_not_leak_into_the_state(name):
    """Two prompts of 23 and 15 tokens, left-padded into one batch, equal each prompt run alone.

    The anchor states (HF cache), the carried states and the logits after the prompt must agree to
    float noise: padded and unpadded runs cut HF's FP32 chunk scan at different places. (FP32
    config: with a quantized one that noise could flip a rounding decision, see above.)
    """
    rm = ReplayModel(build(name))
    ids = torch.randint(0, VOCAB, (2, 23 + 20))
    mask = torch.ones(2, 23, dtype=torch.long)
    mask[1, :8] = 0
    batch = rm.new_session("fp32")
    padded = torch.cat([rm.forward(ids[:, :23], batch, attention_mask=mask), rm.forward(ids[:, 23:], batch)], 1)
    for row, start in ((0, 0), (1, 8)):
        alone = rm.new_session("fp32")
        single = ids[row : row + 1, start:]
        want = torch.cat([rm.forward(single[:, : 23 - start], alone), rm.forward(single[:, 23 - start :], alone)], 1)
        assert rel_err(padded[row, start:], want[0]) <= 1e-5, (name, row, rel_err(padded[row, start:], want[0]))
        for layer, state in batch.states.items():
            anchor = batch.cache.layers[layer].recurrent_states[0][row]
            assert rel_err(anchor, alone.cache.layers[layer].recurrent_states[0][0]) <= 1e-5
            assert rel_err(state[row], alone.states[layer][0]) <= 1e-5  # the FP32 reference carries plain states
    with pytest.raises(ValueError, match="padding after the prompt"):
        rm.forward(ids[:, :5], batch, attention_mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 1, 1]]))


def test_the_hooks_vouch_for_the_gates_log_decays(monkeypatch):
    """The delta-rule hooks hand every layer call g as the mixer's gate made it (-exp(A) softplus(.) <= 0) and vouch for
    it (`remember_nonpositive`), so KDA's <= 0 check reads nothing back from the device: multi-token and one-token
    calls of a Kimi-Linear model."""
    seen = []
    known = delta_common.known_nonpositive
    monkeypatch.setattr(delta_common, "known_nonpositive", lambda g: seen.append(known(g)) or seen[-1])
    rm = ReplayModel(build("kimi_linear"))
    end = QUANT_CALLS[-1][1]
    ids = torch.randint(0, VOCAB, (2, end + 1))
    forward_calls(rm, ids, QUANT_CALLS + [(end, end + 1)], rm.new_session("nvfp4/fp16sr@4"))
    assert len(seen) >= 3 and all(seen), seen


def test_unsupported_architecture_lists_the_supported_types():
    model = tf.AutoModelForCausalLM.from_config(
        tf.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1)
    )
    supported = ("nemotron_h, mamba2, bamba, granitemoehybrid, falcon_h1, zamba2, qwen3_5, qwen3_5_moe, qwen3_next, "
                 "olmo_hybrid, kimi_linear, qwen3_5_text, qwen3_5_moe_text")
    with pytest.raises(ValueError, match=f"^unsupported model type 'llama'; supported: {supported}$"):
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
    first = forward_calls(rm, ids, calls, session)
    assert session.config.name == "fp16sr" and set(session.states) == set(rm.layers)
    assert all(state.seq_ids.tolist() == [1] and state.layer == layer for layer, state in session.states.items())
    session.reset(seq_ids=[1])
    assert session.states == {} and session.tokens == 0
    assert torch.equal(forward_calls(rm, ids, calls, session), first)  # bit-reproducible from the seed and ids
    session.reset(seq_ids=[2])
    assert not torch.equal(forward_calls(rm, ids, calls, session), first)  # other sequence, other SR bits
    session.reset(config="shared:nvfp4@4", seq_ids=[1])
    switched = forward_calls(rm, ids, calls, session)
    assert torch.equal(switched, forward_calls(rm, ids, calls, rm.new_session("shared:nvfp4@4", seq_ids=[1])))
    rm.remove()
    with torch.no_grad():
        assert rel_err(rm.model(ids).logits, forward_calls(rm, ids, calls, rm.new_session("fp32"))) < 1e-5


def test_bf16_weights_keep_an_fp32_state():
    reference = build("nemotron_h", torch.bfloat16)
    rm = ReplayModel(copy.deepcopy(reference))
    ids = torch.randint(0, VOCAB, (2, 40))
    calls = cuts(10, (15, 15))
    session = rm.new_session("nvfp4/fp16sr@4")
    logits = forward_calls(rm, ids, calls, session)
    assert torch.isfinite(logits).all()
    assert all(s.hi.dtype == torch.float32 for s in session.states.values())
    fp32 = forward_calls(rm, ids, calls, rm.new_session("fp32"))
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
