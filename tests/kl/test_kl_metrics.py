"""Per-token metrics against independent formulas (scipy.special.rel_entr, numpy)."""

import numpy as np
import pytest
import torch
from scipy.special import log_softmax, rel_entr, softmax

from replayssm_eval.kl.metrics import METRICS, token_metrics, token_nll


def _random_logits(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen) * 3


@pytest.mark.parametrize("max_elements", [1 << 24, 50])  # whole segment at once, and slices of one token
def test_metrics_match_scipy(max_elements):
    batch, length, vocab = 3, 37, 61
    a, b = _random_logits((batch, length, vocab), 1), _random_logits((batch, length, vocab), 2)
    b[0, :5] = a[0, :5] + 1e-3 * b[0, :5]  # near-identical rows: small KLs too
    targets = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(3))
    out = token_metrics(a, b, targets, max_elements=max_elements)
    assert out.shape == (batch, len(METRICS), length) and out.dtype == torch.float32

    p, q = softmax(a.double().numpy(), -1), softmax(b.double().numpy(), -1)
    kl, reverse = rel_entr(p, q).sum(-1), rel_entr(q, p).sum(-1)
    y = targets.numpy()[..., None]
    nll_p = -np.take_along_axis(log_softmax(a.double().numpy(), -1), y, -1)[..., 0]
    nll_q = -np.take_along_axis(log_softmax(b.double().numpy(), -1), y, -1)[..., 0]
    np.testing.assert_allclose(out[:, 0].numpy(), kl, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out[:, 1].numpy(), reverse, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(out[:, 2].numpy(), (p.argmax(-1) == q.argmax(-1)).astype(np.float32))
    np.testing.assert_allclose(out[:, 3].numpy(), nll_q - nll_p, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[:, 4].numpy(), np.exp(-nll_q) - np.exp(-nll_p), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(token_nll(a, targets, max_elements=max_elements).numpy(), nll_p, rtol=1e-5, atol=1e-5)


def test_identical_logits_give_exact_zeros_in_low_precision():
    a = _random_logits((2, 9, 40), 4).to(torch.bfloat16)
    out = token_metrics(a, a.clone(), torch.zeros(2, 9, dtype=torch.int64))
    assert torch.equal(out[:, [0, 1, 3, 4]], torch.zeros(2, 4, 9))
    assert torch.equal(out[:, 2], torch.ones(2, 9))


def test_masked_vocabulary_gives_no_nan():
    a, b = _random_logits((1, 4, 10), 5), _random_logits((1, 4, 10), 6)
    a[..., 7:] = b[..., 7:] = float("-inf")  # padded vocabulary entries, zero probability in both
    out = token_metrics(a, b, torch.zeros(1, 4, dtype=torch.int64))
    assert torch.isfinite(out).all()
    expected = token_metrics(a[..., :7], b[..., :7], torch.zeros(1, 4, dtype=torch.int64))
    torch.testing.assert_close(out, expected)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match=r"expected \[B, T, V\]"):
        token_metrics(torch.zeros(1, 3, 5), torch.zeros(1, 3, 6), torch.zeros(1, 3, dtype=torch.int64))
