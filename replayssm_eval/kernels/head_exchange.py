"""A head scale over several programs: the chunked kernels' programs each hold a tile of a head and exchange the
tiles' amax at every fold, so that a head-scaled copy (the default `nvfp4`'s per-head scale) does not need one
program holding the whole head (which spills its registers, or takes a second pass over the segments); Mamba-2's
token scan and the GDN and KDA chunked kernels exchange the row sums of STEPQuant's dual-axis factors the same way.

- `ticket_ids` (jit): a program's (tile, head, sequence) in the order programs start, from an atomic counter, so that
  a head's programs start one after another whatever order the GPU dispatches the grid in;
- `shared_head_amax`, `shared_head_sums` (jit): the exchanges themselves, through global atomics;
- `round_state_copy` (jit): a stored copy of a Mamba-2 state tile, exchanging where its head's programs share it;
- `exchange_programs`, `can_exchange`, `sums_exchanged`: where a launch may exchange (compiled code on a GPU holding
  at once the programs a program may wait on: its head's, numbered in start order or, where the launch's programs
  all fit at once, in grid order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import Group, KernelCodec
from replayssm_eval.formats.device import (
    GROUP_DUAL, GROUP_HEAD, abs_sums, dual_axis_value, quantize_tile, round_state_tile, tile_amax,
)
from replayssm_eval.kernels.compiled import compiled_on_gpu


@triton.jit
def ticket_ids(ticket_ptr, TILES, HEADS):
    """(tile, head, sequence) of this program, numbered in the order the programs start: the ticket counter
    (int32, zero at the launch) gives consecutive tickets, tiles fastest, then heads (HEADS per sequence)."""
    ticket = tl.atomic_add(ticket_ptr, 1)
    return ticket % TILES, (ticket // TILES) % HEADS, ticket // (TILES * HEADS)


@triton.jit
def shared_head_amax(x, exch_ptr, count_ptr, head, rnd, tile, ORDER: tl.constexpr, PROGRAMS: tl.constexpr):
    """The amax of a head that PROGRAMS programs hold in tiles, as `device.tile_amax` of the whole head: this
    program's tile x [R, C] (padding zero) gives its amax, which it publishes at its tile's place in slot rnd % 2 of
    the head's exch [heads, 2, PROGRAMS] (int32 bits); it counts itself in count[head] and waits until every
    program of the head has counted rnd times (rnd: the exchange's number in the launch, from 1; the counts are zero
    at the launch). Two slots suffice: a program cannot publish round rnd + 2 before every program has counted
    rnd + 1, after reading rnd. The head's programs must run at once (`exchange_programs`).
    Returns the head's amax (a scalar): NaN if any tile's is NaN (ORDER_DIV), else the largest."""
    first = tl.arange(0, x.shape[0])[:, None] == 0
    part = tl.sum(tl.where(first, tile_amax(x, True, ORDER), 0.0))  # the tile's amax (every row holds it)
    slots = exch_ptr + (head * 2 + rnd % 2) * PROGRAMS
    tl.atomic_xchg(slots + tile, part.to(tl.int32, bitcast=True), sem="release")
    tl.atomic_add(count_ptr + head, 1, sem="release")
    while tl.atomic_add(count_ptr + head, 0, sem="acquire") < rnd * PROGRAMS:
        pass
    places = tl.arange(0, triton.next_power_of_2(PROGRAMS))  # padding places read 0, which no amax exceeds
    parts = tl.atomic_or(slots + places, 0, mask=places < PROGRAMS, sem="acquire").to(tl.float32, bitcast=True)
    parts = tl.where(places < PROGRAMS, parts, 0.0)
    nan = tl.max((parts != parts).to(tl.int32), axis=0)
    return tl.where(nan != 0, float("nan"), tl.max(tl.where(parts != parts, 0.0, parts), axis=0))


@triton.jit
def shared_head_sums(part, exch_ptr, count_ptr, head, rnd, tile, PROGRAMS: tl.constexpr):
    """Sums over a head that PROGRAMS programs hold in tiles, as one program holding the whole head would take them
    (up to the order of the additions): this program's partial sums part [C] (FP64) go to its tile's place in slot
    rnd % 2 of the head's exch [heads, 2, PROGRAMS, C] (int64 bits); it counts itself in count[head] and waits until
    every program of the head has counted rnd times, as `shared_head_amax`. The parts go out as plain stores and one
    release of the count after a barrier (the grid barrier's pattern: one fence for the whole program), and come back
    in one volatile load of every place (coherent, past L1). Returns [C] FP64: the programs' parts summed by one
    reduction over the places, the same bits in every program."""
    C: tl.constexpr = part.shape[0]
    offs = tl.arange(0, C)
    slots = exch_ptr + (head * 2 + rnd % 2).to(tl.int64) * PROGRAMS * C
    tl.store(slots + tile * C + offs, part.to(tl.int64, bitcast=True))
    tl.debug_barrier()  # every thread's part is out before the count says so
    tl.atomic_add(count_ptr + head, 1, sem="release")
    while tl.atomic_add(count_ptr + head, 0, sem="acquire") < rnd * PROGRAMS:
        pass
    places = tl.arange(0, triton.next_power_of_2(PROGRAMS))[:, None]  # padding places read 0
    parts = tl.load(slots + places * C + offs[None, :], mask=places < PROGRAMS, other=0, volatile=True)
    return tl.sum(parts.to(tl.float64, bitcast=True), axis=0)


@triton.jit
def round_state_copy(x, bits, exch_ptr, count_ptr, bh, rnd, tile, KIND: tl.constexpr, GROUP: tl.constexpr,
                     MAX: tl.constexpr, ORDER: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
                     AXIS: tl.constexpr, ROT: tl.constexpr, PROGRAMS: tl.constexpr, BLOCK_P: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """One stored copy of a state tile x [BLOCK_P, BLOCK_N] (head_dim rows, d_state columns; padding zero) with its
    random bits, as `round_state_tile`, where the head's PROGRAMS > 1 programs hold the head in tiles: a head scale
    from the head's amax (`shared_head_amax` of head bh, this program's tile), dual-axis factors along head_dim
    (`sums_exchanged` codecs) from the head's row sums over head_dim (`shared_head_sums`). rnd: the head's exchanges
    so far in the launch. Returns the copy and rnd after it."""
    if (GROUP == GROUP_HEAD) and (PROGRAMS > 1):
        rnd += 1
        amax = shared_head_amax(x, exch_ptr, count_ptr, bh, rnd, tile, ORDER, PROGRAMS)
        y = quantize_tile(x, bits, amax + tl.zeros([BLOCK_P, 1], dtype=tl.float32), KIND, GROUP, MAX, ORDER,
                          BLOCK_P, BLOCK_N)
    elif (GROUP == GROUP_DUAL) and (PROGRAMS > 1):
        rnd += 1
        part = abs_sums(x, 0)  # [BLOCK_N] over this tile's head_dim rows
        sums = shared_head_sums(part, exch_ptr, count_ptr, bh, rnd, tile, PROGRAMS)
        y = tl.trans(dual_axis_value(tl.trans(x), sums[:, None], MAX, COLS))  # key rows along d_state
    else:
        y = round_state_tile(x, bits, KIND, GROUP, MAX, ORDER, ROWS, COLS, AXIS, ROT, BLOCK_P, BLOCK_N)
    return y, rnd


def can_exchange(at_once: int, device: torch.device) -> bool:
    """Whether `at_once` programs may wait on each other (`shared_head_amax`, `shared_head_sums`): compiled code on a
    GPU with at least `at_once` multiprocessors (each holds at least one program; the interpreter runs programs one
    after another, where an exchange would wait forever)."""
    return compiled_on_gpu(device) and at_once <= torch.cuda.get_device_properties(device).multi_processor_count


def sums_exchanged(codec: KernelCodec) -> bool:
    """Whether programs holding slabs of head_dim may round codec by exchanging its head's row sums
    (`shared_head_sums`): STEPQuant's dual-axis factors with their key rows along d_state (axis=headdim, unrotated),
    whose column fits lie along a head_dim index each."""
    return codec.group == Group.DUAL and codec.axis == "headdim" and codec.rot == 1


def exchange_programs(codecs: list[KernelCodec | None], tiles: int, device: torch.device) -> int:
    """The `tiles` programs of a head that exchange the amax of its head-scaled copies (`shared_head_amax`) or the
    row sums of its dual-axis copies (`sums_exchanged`, `shared_head_sums`; not both kinds in one launch), or 1:
    one program then holds the head. A program waits on the other programs of its head, numbered in start order
    (`ticket_ids`; or in grid order where all of the launch's programs fit at once): it waits only on programs of its
    head that run or start as soon as any program ends, so the head's `tiles` programs must be resident together,
    as on a GPU with at least `tiles` multiprocessors (each holds at least one program). Compiled code on a GPU only
    (the interpreter runs programs one after another: an exchange would wait forever), head-scaled formats in their
    natural basis (`KernelCodec.natural`) and dual-axis factors along head_dim."""
    head_scaled = [c for c in codecs if c is not None and c.group == Group.HEAD]
    dual = [c for c in codecs if c is not None and c.group == Group.DUAL]
    exchanges = (bool(head_scaled) != bool(dual) and all(c.natural for c in head_scaled)
                 and all(map(sums_exchanged, dual)) and tiles > 1)
    return tiles if exchanges and can_exchange(tiles, device) else 1
