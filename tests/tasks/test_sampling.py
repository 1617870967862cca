"""The sampler against an independent formula: the filtered distribution, its ties, its random numbers, its settings.

The kept set and probabilities are recomputed here in plain Python from the definition (rank by
score then token id, top-k, top-p on the renormalised top-k, softmax); the draws are checked with
exact counts on a uniform grid and with a chi-square test on Philox draws.
"""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from replayssm_eval.generate.sampling import Sampling, choose, inverse_cdf, kept_weights, uniforms

LOGITS = [1.3, -0.4, 2.0, 2.0, 0.7, -3.0, 1.9, 0.0, 0.7]  # ties at 2.0 (ids 2, 3) and 0.7 (ids 4, 8)


def expected(logits, temperature, top_k, top_p) -> list[float]:
    """The filtered distribution from its definition (token-id order)."""
    scores = [x / temperature for x in logits]
    ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    if top_k:
        ranked = ranked[:top_k]
    top = max(scores[i] for i in ranked)
    weight = {i: math.exp(scores[i] - top) for i in ranked}
    total = sum(weight.values())
    kept, before = [], 0.0
    for i in ranked:
        if before >= top_p:
            break
        kept.append(i)
        before += weight[i] / total
    total = sum(weight[i] for i in kept)
    return [weight[i] / total if i in kept else 0.0 for i in range(len(scores))]


def weights_of(logits, settings: Sampling) -> torch.Tensor:
    rows = torch.tensor([logits], dtype=torch.float64)
    w = kept_weights(rows, torch.tensor([settings.temperature], dtype=torch.float64), torch.tensor([settings.top_k]),
                     torch.tensor([settings.top_p], dtype=torch.float64))[0]
    return w / w.sum()


@pytest.mark.parametrize("settings", [Sampling(0.7, 0.9, 5), Sampling(1.0), Sampling(1.3, 0.6), Sampling(0.5, 1.0, 3)])
def test_kept_distribution_is_the_definition(settings):
    want = expected(LOGITS, settings.temperature, settings.top_k, settings.top_p)
    torch.testing.assert_close(weights_of(LOGITS, settings), torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-15)


def test_top_k_and_top_p_ties_are_broken_by_the_lower_token_id():
    ties = [1.0, 3.0, 3.0, 3.0, 0.0]
    assert weights_of(ties, Sampling(1.0, 1.0, 2)).tolist() == [0.0, 0.5, 0.5, 0.0, 0.0]  # ids 1, 2 of the tied 1, 2, 3
    assert weights_of(ties, Sampling(1.0, 1.0, 1)).tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]  # top_k 1: argmax's token
    flat = [0.0] * 4
    assert weights_of(flat, Sampling(1.0, 0.5)).tolist() == [0.5, 0.5, 0.0, 0.0]  # mass before id 2 is 0.5: not < 0.5
    assert weights_of(flat, Sampling(1.0, 0.51)).tolist() == pytest.approx([1 / 3] * 3 + [0.0])
    assert weights_of(flat, Sampling(1.0, 1e-9)).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_top_p_reads_the_top_k_renormalised_distribution():
    logits = np.log([0.4, 0.3, 0.2, 0.1]).tolist()
    # after top-k 2: 4/7, 3/7; the mass before id 1 is 4/7 > 0.55 (of the whole softmax it would be 0.4)
    assert weights_of(logits, Sampling(1.0, 0.55, 2)).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert weights_of(logits, Sampling(1.0, 0.55)).tolist() == pytest.approx([4 / 7, 3 / 7, 0.0, 0.0])
    assert weights_of(logits, Sampling(1.0, 0.58, 2)).tolist() == pytest.approx([4 / 7, 3 / 7, 0.0, 0.0])


def test_inverse_cdf_on_a_uniform_grid_gives_exact_counts():
    want = np.array(expected(LOGITS, 0.7, 5, 0.9))
    grid = 7919
    u = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    drawn = inverse_cdf(weights_of(LOGITS, Sampling(0.7, 0.9, 5)).expand(grid, -1), u)
    counts = np.bincount(drawn.numpy(), minlength=len(LOGITS))
    assert np.all(np.abs(counts - grid * want) <= 1.0)  # each token's share of [0, 1) up to one grid step
    assert counts[want == 0].sum() == 0


def test_philox_draws_follow_the_filtered_softmax():
    draws = 60000
    settings = Sampling(0.7, 0.9, 5)
    want = np.array(expected(LOGITS, 0.7, 5, 0.9))
    logits = torch.tensor([LOGITS], dtype=torch.float32).expand(draws, -1)
    tokens = choose(logits, [settings] * draws, seed=11, seq_ids=[987654321987] * draws,
                    samples=(np.arange(draws) % 8).tolist(), positions=(np.arange(draws) // 8).tolist())
    counts = np.bincount(tokens.numpy(), minlength=len(LOGITS))
    kept = want > 0
    assert counts[~kept].sum() == 0 and kept.sum() == 4  # top-k 5 keeps 2, 3, 6, 0, 4 (4 before its tie 8); top-p drops 4
    chi2 = float(((counts[kept] - draws * want[kept]) ** 2 / (draws * want[kept])).sum())
    assert chi2 < stats.chi2.ppf(0.999, kept.sum() - 1)
    # and a distribution off by 2% of its mass is rejected at that sample size
    skewed = want.copy()
    skewed[kept] += np.array([0.02, -0.02, 0.0, 0.0])
    assert float(((counts[kept] - draws * skewed[kept]) ** 2 / (draws * skewed[kept])).sum()) > stats.chi2.ppf(0.999, 3)


def test_greedy_rows_take_argmax_beside_sampled_rows():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    greedy = [Sampling()] * 6
    assert torch.equal(choose(logits, greedy, seed=0, seq_ids=[1] * 6, samples=[0] * 6, positions=range(6)), logits.argmax(-1))
    mixed = [Sampling(), Sampling(1.5), Sampling(), Sampling(1.5), Sampling(1.5, 1.0, 1), Sampling(2.0, 1e-6)]
    tokens = choose(logits, mixed, seed=0, seq_ids=[1] * 6, samples=[0] * 6, positions=range(6))
    assert tokens[[0, 2, 4, 5]].tolist() == logits.argmax(-1)[[0, 2, 4, 5]].tolist()  # top_k 1 and a tiny top_p: greedy
    assert tokens[[1, 3]].tolist() != logits.argmax(-1)[[1, 3]].tolist()


def test_uniforms_depend_on_the_row_key_only():
    seq = torch.tensor([5, 5, 5, 5, 5 + (1 << 40), 6])
    sample = torch.tensor([0, 1, 0, 0, 0, 0])
    position = torch.tensor([0, 0, 1, 0, 0, 0])
    u = uniforms(0, seq, sample, position)
    assert len(set(u[:3].tolist() + u[4:].tolist())) == 5  # sample, position, seq_id (high bits too) each matter
    assert u[0] == u[3]
    assert not torch.equal(uniforms(1, seq, sample, position), u)  # the seed matters
    alone = torch.cat([uniforms(0, seq[i:i + 1], sample[i:i + 1], position[i:i + 1]) for i in range(6)])
    flipped = uniforms(0, seq.flip(0), sample.flip(0), position.flip(0)).flip(0)
    assert torch.equal(alone, u) and torch.equal(flipped, u)  # batch composition and row order change no bit
    many = uniforms(3, torch.full((100000,), 42), torch.zeros(100000, dtype=torch.long), torch.arange(100000))
    assert 0 <= float(many.min()) and float(many.max()) < 1
    assert stats.kstest(many.numpy(), "uniform").pvalue > 1e-4


def test_settings_from_generation_kwargs():
    assert Sampling.from_text("temperature=0.6,top_p=0.95,top_k=20") == Sampling(0.6, 0.95, 20)
    assert Sampling.from_text("") == Sampling() and Sampling().greedy
    assert Sampling.from_gen_kwargs({"do_sample": False, "temperature": 0.7, "top_k": 5}) == Sampling()  # HF: greedy
    assert Sampling.from_gen_kwargs({"do_sample": "true", "temperature": "0.7"}) == Sampling(0.7)
    assert Sampling.from_gen_kwargs({"temperature": 0.5}) == Sampling(0.5)  # do_sample absent: the temperature decides
    assert Sampling.from_gen_kwargs({"until": ["x"], "max_gen_toks": 4}) == Sampling()


@pytest.mark.parametrize("text, message", [
    ("temperature=-1", "temperature must be >= 0 (0: greedy), got -1.0"),
    ("temperature=0.6,top_p=0", "top_p must be in (0, 1], got 0.0"),
    ("temperature=0.6,top_p=1.5", "top_p must be in (0, 1], got 1.5"),
    ("temperature=0.6,top_k=-1", "top_k must be >= 0 (0: off), got -1"),
    ("temperature=0.6,top_k=2.5", "top_k must be an integer, got '2.5'"),
    ("temperature=hot", "temperature must be a number, got 'hot'"),
    ("min_p=0.1", "bad generation kwarg 'min_p=0.1'; accepted: do_sample=..., temperature=..., top_p=..., top_k=..."),
    ("do_sample=true", "do_sample true needs a temperature > 0"),
    ("do_sample=maybe,temperature=1", "do_sample must be true or false, got 'maybe'"),
    ("do_sample=false,top_p=2", "top_p must be in (0, 1], got 2.0"),  # checked even where greedy wins
])
def test_bad_settings_are_one_clear_error(text, message):
    with pytest.raises(ValueError) as err:
        Sampling.from_text(text)
    assert message in str(err.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_gpu_draws_the_cpu_bits_and_tokens():
    keys = (torch.tensor([3, 1 << 50, 77]), torch.tensor([0, 5, 1]), torch.tensor([0, 9, 1 << 20]))
    assert torch.equal(uniforms(9, *(k.cuda() for k in keys)).cpu(), uniforms(9, *keys))
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(1))
    rows = dict(seed=4, seq_ids=list(range(64)), samples=[1] * 64, positions=list(range(64)))
    settings = [Sampling(0.6, 0.95, 20)] * 32 + [Sampling(1.0)] * 32
    assert torch.equal(choose(logits.cuda(), settings, **rows).cpu(), choose(logits, settings, **rows))
