"""A head scale over several programs (`kernels.head_exchange`): where a launch exchanges, the programs' start order,
and the exchanged amax itself (compiled code on a GPU: the interpreter runs programs one after another)."""

from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import Order, tile_codec
from replayssm_eval.kernels.head_exchange import exchange_programs, shared_head_amax, ticket_ids
from replayssm_eval.replay.config import ReplayConfig

from tests.helpers.device import TEST_DEVICE


def _codecs(text):
    cfg = ReplayConfig.parse(text)
    return [tile_codec(f, True, (128, 128)) for f in (cfg.recur_format, cfg.read_format)]


def test_exchange_programs_only_in_compiled_code_for_natural_head_scales(monkeypatch):
    """A head's tiles exchange in compiled code on a GPU with a multiprocessor for each program that must run at once
    (a head's, numbered in start order; the launch's, numbered by the grid), any number of tiles; never in the
    interpreter, on the CPU, for one tile, for a head scale along head_dim, or with nothing head-scaled."""
    gpu = torch.device("cuda")
    assert exchange_programs(_codecs("nvfp4/fp16sr@16"), 4, 4, torch.device("cpu")) == 1
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert exchange_programs(_codecs("nvfp4/fp16sr@16"), 4, 4, gpu) == 1
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    assert exchange_programs(_codecs("nvfp4/fp16sr@16"), 4, 128, gpu) == 4
    assert exchange_programs(_codecs("int8:scale=head/int8sr:scale=head@16"), 5, 5, gpu) == 5
    assert exchange_programs(_codecs("shared:nvfp4@16"), 3, 132, gpu) == 3
    assert exchange_programs(_codecs("nvfp4/fp16sr@16"), 4, 136, gpu) == 1  # 136 programs on 132 multiprocessors
    assert exchange_programs(_codecs("nvfp4/fp16sr@16"), 1, 1, gpu) == 1
    assert exchange_programs(_codecs("int8:axis=headdim,scale=head/fp16sr@16"), 4, 4, gpu) == 1
    assert exchange_programs(_codecs("nvfp4:scale=row/fp16sr@16"), 4, 4, gpu) == 1  # nothing to exchange


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
