"""Philox4x32-10: Random123 known answers, and bit-identity with Triton's tl.randint (interpreter on CPU) of the torch
port and of the kernels' own `device.philox4x32`."""

import pytest
import torch
import triton
import triton.language as tl

from replayssm_eval.formats import device as dev
from replayssm_eval.formats.philox import philox4x32, randint

# Random123 kat_vectors, philox4x32_10: counter, key, output
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_random123_known_answers(counter, key, expected):
    words = [torch.tensor([c], dtype=torch.int64) for c in counter]
    out = philox4x32(key[0] | key[1] << 32, *words)
    assert [int(o) for o in out] == list(expected)


@triton.jit
def _randint_kernel(out_ptr, seed_ptr, counter_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    seed = tl.load(seed_ptr + i, mask=m, other=0)
    counter = tl.load(counter_ptr + i, mask=m, other=0)
    tl.store(out_ptr + i, tl.randint(seed, counter).to(tl.int64), mask=m)


@triton.jit
def _randint_scalar_seed_kernel(out_ptr, seed, offset, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.randint(seed, offset.to(tl.int64) + i).to(tl.int64), mask=i < n)


def test_matches_tl_randint_per_element_seeds(device):
    g = torch.Generator().manual_seed(1)
    n = 300
    seeds = torch.randint(0, 2**62, (n,), generator=g)
    seeds[:3] = torch.tensor([0, 2**32 + 7, 2**63 - 1])
    counters = torch.randint(0, 2**62, (n,), generator=g)
    counters[:4] = torch.tensor([0, 2**32 - 1, 2**32, 2**40 + 12345])
    out = torch.empty(n, dtype=torch.int64, device=device)
    _randint_kernel[(triton.cdiv(n, 128),)](out, seeds.to(device), counters.to(device), n, BLOCK=128)
    assert torch.equal(randint(seeds, counters), out.cpu())


@pytest.mark.parametrize("seed,offset", [(0, 0), (12345, 2**32 - 50), (2**40 + 3, 2**33 + 1)])
def test_matches_tl_randint_scalar_seed(seed, offset, device):
    n = 200
    out = torch.empty(n, dtype=torch.int64, device=device)
    _randint_scalar_seed_kernel[(2,)](out, seed, offset, n, BLOCK=128)
    assert torch.equal(randint(seed, offset + torch.arange(n)), out.cpu())


def test_words_are_uint32_and_seed_broadcasts():
    c = torch.arange(1000)
    r = randint(torch.tensor([[5], [6]]), c)  # [2, 1000]: one key per row
    assert r.shape == (2, 1000) and r.min() >= 0 and r.max() < 2**32
    assert torch.equal(r[0], randint(5, c)) and torch.equal(r[1], randint(6, c))
    assert r.float().mean().item() == pytest.approx(2**31, rel=0.05)


@triton.jit
def _randint_rounds_kernel(out_ptr, seed, offset, n, N_ROUNDS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.randint(seed, offset.to(tl.int64) + i, N_ROUNDS).to(tl.int64), mask=i < n)


def test_random123_seven_rounds():
    """Random123 kat_vectors, philox4x32_7 at counter 0, key 0."""
    z = torch.zeros(1, dtype=torch.int64)
    assert [int(o) for o in philox4x32(0, z, z, z, z, n_rounds=7)] == [0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48]


@pytest.mark.parametrize("n_rounds", [7, 10])
def test_rounds_match_tl_randint(n_rounds, device):
    n = 200
    out = torch.empty(n, dtype=torch.int64, device=device)
    _randint_rounds_kernel[(2,)](out, 2**33 + 7, 2**32 - 9, n, N_ROUNDS=n_rounds, BLOCK=128)
    assert torch.equal(randint(2**33 + 7, 2**32 - 9 + torch.arange(n), n_rounds), out.cpu())
    assert not torch.equal(randint(2**33 + 7, 2**32 - 9 + torch.arange(n), 17 - n_rounds), out.cpu())


@triton.jit
def _device_philox_kernel(out_ptr, seed_ptr, counter_ptr, n, N_ROUNDS: tl.constexpr, WIDE: tl.constexpr,
                          BLOCK: tl.constexpr):
    """Rows 0-3 of out: the words of `device.philox4x32`, rows 4-7 those of tl.randint4x (WIDE: int64 counters, else
    their low 32 bits as int32), row 8 `device.philox_word`."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    seed = tl.load(seed_ptr + i, mask=m, other=0)
    counter = tl.load(counter_ptr + i, mask=m, other=0)
    if not WIDE:
        counter = counter.to(tl.int32)
    ours = dev.philox4x32(seed, counter, N_ROUNDS)
    theirs = tl.randint4x(seed, counter, N_ROUNDS)
    for k in tl.static_range(4):
        tl.store(out_ptr + k * n + i, ours[k].to(tl.int64), mask=m)
        tl.store(out_ptr + (4 + k) * n + i, theirs[k].to(tl.int64), mask=m)
    tl.store(out_ptr + 8 * n + i, dev.philox_word(seed, counter, N_ROUNDS).to(tl.int64), mask=m)


@pytest.mark.parametrize("n_rounds, wide", [(10, True), (10, False), (7, True)])
def test_device_philox_equals_tl_randint4x(n_rounds, wide, device):
    """The kernels' Philox (64-bit products) gives tl.randint4x's four words and tl.randint's word 0, bit for bit, on
    keys and counters with every 32-bit half at its edges (0, 2^32 - 1, the sign bit) and random ones (n = 300: a
    short last block)."""
    g = torch.Generator().manual_seed(2)
    n = 300
    seeds = torch.randint(-2**63, 2**63 - 1, (n,), generator=g)
    counters = torch.randint(-2**63, 2**63 - 1, (n,), generator=g)
    edges = torch.tensor([0, 2**32 - 1, 2**32, 2**31, -1, -2**63, 2**63 - 1, 2**40 + 12345])
    seeds[:8], counters[8:16] = edges, edges
    out = torch.empty(9, n, dtype=torch.int64, device=device)
    _device_philox_kernel[(triton.cdiv(n, 128),)](out, seeds.to(device), counters.to(device), n, N_ROUNDS=n_rounds,
                                                  WIDE=wide, BLOCK=128)
    out = out.cpu()
    assert torch.equal(out[:4], out[4:8])
    assert torch.equal(out[8], out[0])
    expected = randint(seeds, counters if wide else (counters.to(torch.int32).to(torch.int64) & 0xFFFFFFFF), n_rounds)
    assert torch.equal(out[0], expected)
