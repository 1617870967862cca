"""A head scale over several programs (`kernels.head_exchange`): where a launch exchanges, the programs' start order,
and the exchanged amax and row sums themselves (compiled code on a GPU: the interpreter runs programs one after
another)."""

from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import Order, tile_codec
from replayssm_eval.kernels.head_exchange import (
    can_exchange, exchange_programs, shared_head_amax, shared_head_sums, sums_exchanged, ticket_ids,
)
from replayssm_eval.replay.config import ReplayConfig

from tests.helpers.device import TEST_DEVICE


def _codecs(text):
    cfg = ReplayConfig.parse(text)
    return [tile_codec(f, True, (128, 128)) for f in (cfg.recur_format, cfg.read_format)]


def test_exchange_programs_only_in_compiled_code_for_natural_head_scales(monkeypatch):
    """A head's tiles exchange in compiled code on a GPU with a multiprocessor for each of them (they must run at
    once), any number of tiles; never in the interpreter, on the CPU, for one tile, for a head scale along head_dim,
    or with nothing head-scaled."""
    gpu = torch.device("cuda")
    assert exchange_programs(_codecs("nvfp4/fp16sr@16"), 4, torch.device("cpu")) == 1
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert exchange_programs(_codecs("nvfp4/fp16sr@16"), 4, gpu) == 1
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    assert exchange_programs(_codecs("nvfp4/fp16sr@16"), 4, gpu) == 4
    assert exchange_programs(_codecs("int8:scale=head/int8sr:scale=head@16"), 5, gpu) == 5
    assert exchange_programs(_codecs("shared:nvfp4@16"), 132, gpu) == 132
    assert exchange_programs(_codecs("nvfp4/fp16sr@16"), 136, gpu) == 1  # 136 tiles on 132 multiprocessors
    assert exchange_programs(_codecs("nvfp4/fp16sr@16"), 1, gpu) == 1
    assert exchange_programs(_codecs("int8:axis=headdim,scale=head/fp16sr@16"), 4, gpu) == 1
    assert exchange_programs(_codecs("nvfp4:scale=row/fp16sr@16"), 4, gpu) == 1  # nothing to exchange
    assert exchange_programs(_codecs("dualaxis:axis=headdim/fp16sr@1"), 8, gpu) == 8


def test_can_exchange_and_sums_exchanged(monkeypatch):
    """Programs wait on each other only in compiled code on a GPU with a multiprocessor for each; STEPQuant's dual-axis
    factors exchange row sums along head_dim only, unrotated."""
    assert not can_exchange(2, torch.device("cpu"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    assert can_exchange(132, torch.device("cuda")) and not can_exchange(133, torch.device("cuda"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not can_exchange(2, torch.device("cuda"))
    assert [sums_exchanged(c) for c in _codecs("dualaxis/dualaxis:axis=dstate@1")] == [False, True]
    assert [sums_exchanged(c) for c in _codecs("dualaxis:rot=hadamard:8/nvfp4@1")] == [False, False]


@triton.jit
def _ticket_kernel(ticket_ptr, ids_ptr, TILES, HEADS):
    tile, head, seq = ticket_ids(ticket_ptr, TILES, HEADS)
    where = ((seq * HEADS + head) * TILES + tile) * 2
    tl.store(ids_ptr + where, tl.program_id(0))
    tl.store(ids_ptr + where + 1, 1)  # a visit


def test_ticket_ids_give_every_place_once(device):
    """Each (tile, head, sequence) of a launch goes to exactly one program, at 5 tiles, 3 heads and 2 sequences; in
    the interpreter (programs in grid order) program i takes place i, tiles fastest."""
    tiles, heads, seqs = 5, 3, 2
    ticket = torch.zeros(1, dtype=torch.int32, device=device)
    ids = torch.zeros(seqs * heads * tiles, 2, dtype=torch.int32, device=device)
    _ticket_kernel[(tiles * heads * seqs,)](ticket, ids, tiles, heads)
    assert int(ticket) == tiles * heads * seqs
    assert torch.equal(ids[:, 1].cpu(), torch.ones(tiles * heads * seqs, dtype=torch.int32))
    assert sorted(ids[:, 0].tolist()) == list(range(tiles * heads * seqs))
    if device == "cpu":
        assert ids[:, 0].tolist() == list(range(tiles * heads * seqs))


@triton.jit
def _exchange_kernel(x_ptr, out_ptr, exch_ptr, count_ptr, ticket_ptr, HEADS, ROUNDS: tl.constexpr,
                     ORDER: tl.constexpr, PROGRAMS: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    tile, head, _ = ticket_ids(ticket_ptr, PROGRAMS, HEADS)
    at = ((head * PROGRAMS + tile) * R + tl.arange(0, R)[:, None]) * C + tl.arange(0, C)[None, :]
    for rnd in tl.static_range(1, ROUNDS + 1):
        x = tl.load(x_ptr + (rnd - 1) * HEADS * PROGRAMS * R * C + at)  # [R, C] this round's tile
        amax = shared_head_amax(x, exch_ptr, count_ptr, head, rnd, tile, ORDER, PROGRAMS)
        tl.store(out_ptr + ((rnd - 1) * HEADS + head) * PROGRAMS + tile, amax)


@pytest.mark.skipif(TEST_DEVICE != "cuda", reason="an exchange needs a head's programs running at once (a GPU)")
@pytest.mark.parametrize("programs", [5, 4, 3])
@pytest.mark.parametrize("order", [Order.DIV, Order.MUL])
def test_shared_head_amax_is_the_head_amax(programs, order, device):
    """Over three exchanges in one launch (the two slots reused), every program of a head gets the amax of the whole
    head: NaN where a tile holds one with ORDER_DIV, the amax of the rest with ORDER_MUL; a head of zeros gives 0."""
    rounds, heads, r, c = 3, 4, 16, 32
    x = torch.randn(rounds, heads, programs, r, c, device=device) * torch.rand(rounds, heads, 1, 1, 1, device=device)
    x[1, 2, programs - 1, 3, 7] = float("nan")
    x[2, 1] = 0.0
    x[0, 3, 1, 0, 0] = -1e6
    out = torch.empty(rounds, heads, programs, device=device)
    exch = torch.empty(heads * 2 * programs, dtype=torch.int32, device=device)
    count = torch.zeros(heads + 1, dtype=torch.int32, device=device)
    _exchange_kernel[(heads * programs,)](x, out, exch, count, count[-1:], heads, ROUNDS=rounds, ORDER=int(order),
                                          PROGRAMS=programs, R=r, C=c)
    mags = x.abs().flatten(2)
    want = mags.amax(-1) if order == Order.DIV else mags.nan_to_num(nan=0.0).amax(-1)  # [rounds, heads]
    assert torch.isnan(want[1, 2]) == (order == Order.DIV) and want[2, 1] == 0 and want[0, 3] == 1e6
    torch.testing.assert_close(out, want[..., None].expand_as(out), rtol=0, atol=0, equal_nan=True)


@triton.jit
def _sums_kernel(x_ptr, out_ptr, exch_ptr, count_ptr, ticket_ptr, HEADS, ROUNDS: tl.constexpr, PROGRAMS: tl.constexpr,
                 R: tl.constexpr, C: tl.constexpr):
    tile, head, _ = ticket_ids(ticket_ptr, PROGRAMS, HEADS)
    at = ((head * PROGRAMS + tile) * R + tl.arange(0, R)[:, None]) * C + tl.arange(0, C)[None, :]
    for rnd in tl.static_range(1, ROUNDS + 1):
        x = tl.load(x_ptr + (rnd - 1) * HEADS * PROGRAMS * R * C + at)  # [R, C] this round's tile
        sums = shared_head_sums(tl.sum(tl.abs(x).to(tl.float64), axis=0), exch_ptr, count_ptr, head, rnd, tile,
                                PROGRAMS)
        tl.store(out_ptr + (((rnd - 1) * HEADS + head) * PROGRAMS + tile) * C + tl.arange(0, C), sums)


@pytest.mark.skipif(TEST_DEVICE != "cuda", reason="an exchange needs a head's programs running at once (a GPU)")
@pytest.mark.parametrize("programs", [5, 3, 2])
def test_shared_head_sums_are_the_head_sums(programs, device):
    """Over three exchanges in one launch (the two slots reused), every program of a head gets the FP64 sums of |x|
    over the whole head's rows, the same bits in each: exact for these values (integers times powers of two within
    FP64's 53 bits), NaN where a tile holds one, Inf where one holds an Inf and no NaN, 0 for a head of zeros."""
    rounds, heads, r, c = 3, 4, 16, 32
    x = torch.randint(-2**20, 2**20, (rounds, heads, programs, r, c), device=device).float()
    x = x * torch.exp2(torch.randint(-8, 8, (rounds, heads, 1, 1, c), device=device).float())
    x[1, 2, programs - 1, 3, 7] = float("nan")
    x[1, 2, 0, 5, 9] = float("-inf")
    x[2, 1] = 0.0
    out = torch.empty(rounds, heads, programs, c, dtype=torch.float64, device=device)
    exch = torch.empty(heads * 2 * programs * c, dtype=torch.int64, device=device)
    count = torch.zeros(heads + 1, dtype=torch.int32, device=device)
    _sums_kernel[(heads * programs,)](x, out, exch, count, count[-1:], heads, ROUNDS=rounds, PROGRAMS=programs, R=r,
                                      C=c)
    want = x.abs().double().sum((2, 3))  # [rounds, heads, c], exact
    assert torch.isnan(want[1, 2, 7]) and torch.isinf(want[1, 2, 9]) and not want[2, 1].any()
    torch.testing.assert_close(out, want[:, :, None].expand_as(out), rtol=0, atol=0, equal_nan=True)
