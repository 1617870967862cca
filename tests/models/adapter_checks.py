"""The adapter checks every family runs (test_adapter_mamba2.py and test_adapter_gdn.py parametrize them).

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

import pytest
import torch
from hf_tiny import VOCAB, build, cuts, hf_cached_logits, rel_err, run

from replayssm_eval.models import ReplayModel, token_by_token_logits

FP32_CALLS = cuts(23, (37, 37, 37, 1, 1, 1, 1, 1, 1))
QUANT_CALLS = cuts(11, (13, 13, 13))
QUANT_CONFIGS = ("nvfp4/fp16sr@4", "shared:nvfp4@4")


def check_fp32_matches_hf(name: str) -> None:
    reference = build(name)
    rm = ReplayModel(copy.deepcopy(reference), config="fp32")
    ids = torch.randint(0, VOCAB, (2, FP32_CALLS[-1][1]))
    ours = run(rm, ids, FP32_CALLS, rm.new_session())
    assert len(rm.layers) > 0
    assert set(rm.new_session().states) == set()  # fresh sessions start empty
    with torch.no_grad():
        full = reference(ids).logits
    hf = hf_cached_logits(reference, ids, FP32_CALLS)
    assert rel_err(ours, hf) <= 1e-4, (name, rel_err(ours, hf))
    assert rel_err(ours, full) <= 1e-4, (name, rel_err(ours, full))


# families whose HF modules compute in float32 inside a float64 model: the float32 noise bound of the check
_FLOAT32_INSIDE = {"kimi_linear": 1e-7}


def check_quantized_matches_slow_path(name: str, config: str) -> None:
    rm = ReplayModel(build(name, torch.float64))
    ids = torch.randint(0, VOCAB, (2, QUANT_CALLS[-1][1]))
    fast = run(rm, ids, QUANT_CALLS, rm.new_session(config, seq_ids=[5, 9], compute_dtype=torch.float64))
    slow = token_by_token_logits(
        rm, ids, prompt_len=QUANT_CALLS[0][1], config=config, seq_ids=[5, 9], compute_dtype=torch.float64
    )
    reference = run(rm, ids, QUANT_CALLS, rm.new_session("fp32", compute_dtype=torch.float64))
    assert rel_err(fast, slow) <= _FLOAT32_INSIDE.get(name, 1e-10), (name, config, rel_err(fast, slow))
    assert rel_err(fast, reference) > 1e-4, "the state format must move the logits, or this test shows nothing"


def check_left_padding_does_not_leak(name: str) -> None:
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
