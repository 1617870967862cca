"""Decode attention over a static KV cache (`models.decode_attention`) against an independent FP64 softmax.

- the kernel on random inputs of awkward sizes (head_dim 40 and 24, 77 and 300 columns, 1 to 5 query heads a KV
  head), masks with left padding, holes, one open column, none, and every split layout: FP32 inputs to FP32 rounding,
  16-bit inputs to their precision;
- `attention_forward`: SDPA's own output off DEVICES (prefill, CPU, no mask), the kernel on them;
- the whole-model step on a static cache (`StaticDecoder`, run eagerly) with the kernel in the Triton interpreter:
  the eager Triton step session on a StaticCache through the same attention gives the same tokens, logits and SSM
  states bit for bit (HF's mask of a static cache opens the columns the decoder's mask opens), and the tokens of
  SDPA's run.
"""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from replayssm_eval.models import decode_attention as da
from replayssm_eval.models.decode_attention import attention_forward, decode_attention, open_spans

from tests.helpers.device import TEST_DEVICE


def reference(q, k, v, mask, scaling):
    """softmax(q k^T * scaling over the open columns) v in FP64, [B, 1, H, D]; zeros for a row with none open."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, 1) for t in (k, v))  # [B, H, T, D]
    s = (q.double() @ k.transpose(-1, -2)) * scaling  # [B, H, 1, T]
    s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    p = torch.where(mask[:, None, None, :], s.softmax(-1).nan_to_num(0.0), 0.0)
    return (p @ v).transpose(1, 2)


def random_mask(batch, length, gen):
    """[B, T] bool: row b open on a random span (left padding, unwritten columns), row 0 with a hole, the last row's
    span one column."""
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for b in range(batch):
        first = int(torch.randint(0, length // 2, (), generator=gen))
        last = int(torch.randint(first + 1, length + 1, (), generator=gen))
        mask[b, first:last] = True
    mask[0, mask[0].nonzero()[1:4, 0]] = False
    mask[-1] = False
    mask[-1, length - 1] = True
    return mask


CASES = [  # batch, heads, kv_heads, columns, head_dim, dtype, launch (None: decode_launch_config)
    (3, 6, 2, 77, 40, torch.float32, None),
    (2, 5, 1, 300, 24, torch.float32, dict(SPLITS=4, BLOCK_N=16, num_warps=4, num_stages=2)),
    (4, 8, 8, 130, 64, torch.float32, dict(SPLITS=2, BLOCK_N=32, num_warps=4, num_stages=2)),
    (3, 12, 4, 100, 40, torch.bfloat16, None),
    (2, 4, 4, 90, 32, torch.float16, dict(SPLITS=8, BLOCK_N=16, num_warps=4, num_stages=2)),
]


@pytest.mark.parametrize("batch,heads,kv_heads,length,dim,dtype,launch", CASES)
def test_decode_attention_matches_the_softmax(batch, heads, kv_heads, length, dim, dtype, launch):
    gen = torch.Generator().manual_seed(batch * length + dim)
    q = torch.randn(batch, heads, 1, dim, generator=gen).to(dtype)
    k, v = (torch.randn(batch, kv_heads, length, dim, generator=gen).to(dtype) for _ in range(2))
    mask = random_mask(batch, length, gen)
    scaling = dim ** -0.5
    args = [t.to(TEST_DEVICE) for t in (q, k, v, mask)]
    out = decode_attention(*args, scaling, launch).cpu()
    ref = reference(q, k, v, mask, scaling)
    assert out.shape == (batch, 1, heads, dim) and out.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 2e-2  # 16-bit: P is cast to V's dtype for the product
    assert (out.double() - ref).abs().max() <= tol * ref.abs().max()


def test_a_row_with_no_open_column_gets_zeros():
    q, k, v = torch.randn(2, 2, 1, 16), torch.randn(2, 1, 40, 16), torch.randn(2, 1, 40, 16)
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[1, 5:9] = True
    out = decode_attention(*(t.to(TEST_DEVICE) for t in (q, k, v, mask)), 0.25).cpu()
    assert torch.equal(out[0], torch.zeros(1, 2, 16))
    assert torch.allclose(out[1].double(), reference(q, k, v, mask, 0.25)[1], rtol=1e-6, atol=1e-7)


def test_open_spans():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    assert open_spans(mask).tolist() == [[1, 5], [0, 0], [0, 6]]


@pytest.mark.parametrize("change,match", [
    (dict(q=torch.zeros(2, 4, 2, 8)), "one query token"),
    (dict(q=torch.zeros(2, 3, 1, 8)), "H a multiple of H_kv"),
    (dict(mask=torch.ones(2, 10, dtype=torch.int64)), "mask must be bool"),
    (dict(mask=torch.ones(2, 9, dtype=torch.bool)), r"\[B, T\] = \[2, 10\]"),
])
def test_bad_input_is_named(change, match):
    args = dict(q=torch.zeros(2, 4, 1, 8), k=torch.zeros(2, 2, 10, 8), v=torch.zeros(2, 2, 10, 8),
                mask=torch.ones(2, 10, dtype=torch.bool))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        decode_attention(args["q"], args["k"], args["v"], args["mask"], 1.0)


class _Module:
    num_key_value_groups = 3
    is_causal = True


def test_attention_forward_takes_the_kernel_for_masked_decode_only(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 6, 1, 24, generator=gen), *(torch.randn(2, 2, 50, 24, generator=gen) for _ in range(2))
    mask = random_mask(2, 50, gen)[:, None, None, :]  # [B, 1, 1, T] as Hugging Face passes it
    q, k, v, mask = (t.to(TEST_DEVICE) for t in (q, k, v, mask))
    monkeypatch.setattr(da, "DEVICES", ())  # nowhere: SDPA's own bits
    sdpa = sdpa_attention_forward(_Module(), q, k, v, mask, scaling=0.2)[0]
    assert torch.equal(attention_forward(_Module(), q, k, v, mask, scaling=0.2)[0], sdpa)
    monkeypatch.setattr(da, "DEVICES", (TEST_DEVICE,))
    ours = attention_forward(_Module(), q, k, v, mask, scaling=0.2)[0]
    assert torch.allclose(ours, sdpa, rtol=1e-5, atol=1e-6)
    assert torch.equal(ours, decode_attention(q, k, v, mask[:, 0, 0], 0.2))
    prefill = torch.randn(2, 6, 3, 24, generator=gen).to(TEST_DEVICE)  # more than one query token: SDPA
    assert torch.equal(attention_forward(_Module(), prefill, k, v, None, scaling=0.2)[0],
                       sdpa_attention_forward(_Module(), prefill, k, v, None, scaling=0.2)[0])


@pytest.mark.slow
@pytest.mark.parametrize("name,config", [("tiny-qwen3.5", "nvfp4/fp16sr@2"), ("tiny-nemotron-h", "fp32")])
def test_whole_model_step_with_decode_attention(name, config, monkeypatch):
    from tests.helpers.generation import tiny_model
    from tests.models.test_static_session import (
        NEW_TOKENS, assert_same_states, decode_static, feed, prompt_batch, static_cache_session,
    )

    rm = tiny_model(name, "triton")
    ids, mask, seq_ids = prompt_batch(rm)
    max_len = ids.shape[1] + NEW_TOKENS + 2  # unwritten columns past the last step
    sdpa_tokens, sdpa_logits, _ = (decode_static(rm, config, ids, mask, seq_ids, max_len) if TEST_DEVICE == "cpu"
                                   else (None, None, None))
    monkeypatch.setattr(da, "DEVICES", ("cpu", "cuda"))
    calls = []
    kernel = da.decode_attention
    monkeypatch.setattr(da, "decode_attention", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    tokens, logits, states = decode_static(rm, config, ids, mask, seq_ids, max_len)
    assert calls  # the decoder's steps ran the kernel
    eager = static_cache_session(rm, config, seq_ids, max_len)
    eager_tokens, eager_logits = feed(rm, eager, ids, mask)
    assert torch.equal(tokens, eager_tokens) and torch.equal(logits, eager_logits)
    assert_same_states(states, eager.states)
    if sdpa_tokens is not None:
        assert torch.equal(tokens, sdpa_tokens) and torch.allclose(logits, sdpa_logits, rtol=1e-4, atol=1e-4)

def test_use_decode_attention_sets_and_restores_sdpa():
    from replayssm_eval.models import load_model
    from replayssm_eval.models.decode_attention import ATTENTION, use_decode_attention

    rm = load_model("tiny-qwen3.5", dtype="fp32", device="cpu")
    text = rm.model.config.get_text_config(decoder=True)
    assert rm.model.config._attn_implementation == text._attn_implementation == ATTENTION
    rm.remove()
    assert rm.model.config._attn_implementation == text._attn_implementation == "sdpa"

    class Fixed:  # a model whose attention cannot be set after loading
        config = type("Config", (), {"_attn_implementation": "sdpa"})()

        def _can_set_attn_implementation(self):
            return False

        def set_attn_implementation(self, name):
            raise AssertionError("must not be called")

    use_decode_attention(Fixed())
