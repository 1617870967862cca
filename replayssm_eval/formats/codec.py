"""The kernel codec of a state format: what a Triton kernel needs to round, encode or read it.

Every Triton kernel (the chunked and step kernels of each family, the static step, `encode_triton`,
`quantize_triton`) reads a format through its `fmt.kernel_codec`, never through the format's class.
A format without one is rounded by torch.
A new format that rounds like one of the kinds below is its class plus its codec.

    kind    one element's rounding and stored code (`Kind`, the numbering of `formats.device`)
    group   the group of the FP32 global scale (`Group`): none, per row of the blocked axis, per head,
            per leading index (tensor), per tile of rows x cols of the oriented head (block:N, tile:RxC), or per row
            of the head divided by its column factors (rowcol: c_j = max_i |x_ij| over the head's rows, 1 where 0),
            or none but STEPQuant's FP16 factors r_i per row and c_j per column of the head (dual: `dual_axis`; kind
            INT8, codes within +-max)
    max     scaled elementwise kinds: the scale is s = amax / max over the group (1.0 otherwise); dual: q
    rows    group tile: the tile's rows of the oriented head [R, C] (0: all R; 1 for block:N)
    cols    group tile: the tile's columns along the blocked axis (0: all C; N for block:N); dual: the head's C, the
            divisor of its row means (`tile_codec` sets it from the state's dims; 0 in `fmt.kernel_codec`)
    block   elements per E4M3 / E8M0 block scale or shared exponent along the blocked axis (16 NVFP4 and MX8, 32 MX;
            1 without)
    axis    the blocked axis (`layout.AXES`): "dstate" (codes along the state's last dim) or "headdim"
    rot     Hadamard size of `rot=hadamard:N` (1: none): runs of rot elements along the blocked axis are rotated by
            H_rot in FP64 and rounded to FP32 before the rounding above, and rotated back after it (`rotation`)
    order   scaled elementwise kinds: the operand order of the scale (`Order`, the formats' `order=`)
    words   stochastic kinds: which random word and bit field each element reads (`Words`, fp16sr's `words=`)
    rounds  stochastic kinds: the Philox rounds of words drawn from a seed (`quantize(x, seed=...)`, the formats'
            `rounds=`; a stored copy's keyed words are Philox4x32-10 whatever it is, `replay.keys`)
    bits    stochastic kinds: K, the random bits of each word the rounding adds below the kept LSB (the formats'
            `bits=`; 0 given: the kind's default, `SR_BITS`); 0 for the other kinds
    ef      error feedback (`Residual`, the formats' `ef=`): the copy rounds the state plus the residual it keeps and
            keeps the new one, in FP32 or BF16; the chunked kernels carry it in their loops, the encoder rounds the
            state plus residual it is given (the inner format's packed layout)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

import torch

from replayssm_eval.formats import philox, rounding


class Kind(enum.IntEnum):
    """Element kinds (values are the Triton constexprs of `formats.device`).

    FP32, BF16, FP16 (RNE); FP16SR (stochastic, PTX cvt.rs.f16x2.f32); FP8 (E4M3fn, RNE), FP8SR, FP8E5M2;
    NVFP4 (E2M1 in blocks of 16, E4M3 block scales); MXFP8, MXFP4 (E4M3 / E2M1 in blocks of 32, E8M0 scales);
    INT8, INT16 (RNE, saturating, two's-complement codes), INT8SR, INT16SR (stochastic, 16 random bits);
    FP16SR_SOFT (FP16 codes, stochastic by FlashInfer's integer port of cvt.rs, fp16sr's `cvt=soft`);
    MX8, MX8SR (Pimba's shared-microexponent blocks of 16, RNA / stochastic with 8 random bits: `MicroexponentFormat`).
    """

    FP32 = 0
    BF16 = 1
    FP16 = 2
    FP16SR = 3
    FP8 = 4
    FP8SR = 5
    FP8E5M2 = 6
    NVFP4 = 7
    MXFP8 = 8
    MXFP4 = 9
    INT8 = 10
    INT16 = 11
    INT8SR = 12
    INT16SR = 13
    FP16SR_SOFT = 14
    MX8 = 15
    MX8SR = 16


class Group(enum.IntEnum):
    """Scale group of the FP32 global scale (values are the Triton constexprs of `formats.device`)."""

    NONE = 0
    ROW = 1
    HEAD = 2
    TENSOR = 3
    TILE = 4
    ROWCOL = 5
    DUAL = 6

    @property
    def scale(self) -> str:
        """The group's name in the format options and `layout` (`row`, `head`, `tensor`, `none`; `tile`, `rowcol`)."""
        return self.name.lower()


class Words(enum.IntEnum):
    """Which Philox word and bit field each element of a stochastic kind reads (values are the Triton constexprs of
    `formats.device`; fp16sr's `words=`, `formats.ElementwiseFormat`). n is the element's index along the state's
    last dim (its column), `counter` its Philox counter (`replay.keys`: (checkpoint << 32) + flat index; `quantize`:
    offset + flat index).

    ELEMENT  its own word, `tl.randint(key, counter)`.
    PAIR     elements 2j and 2j+1 of a row share 2j's word: 2j reads its bits [12:0], 2j+1 its bits [28:16]
             (a last unpaired element its own word).
    DUO, QUAD, OCTET  one Philox4x32 call per G = 2, 4, 8 elements of a row at the first one's counter (from a seed,
             `quantize(x, seed=...)`, or a stored copy's key, `replay.keys`), element n reading output word n % G
             (OCTET: word (0, 0, 2, 2, 1, 1, 3, 3)[n % 8], each pair split as PAIR). Given one word per element
             (`random_bits`) DUO and QUAD read it as ELEMENT does, OCTET as PAIR does.
    """

    ELEMENT = 0
    PAIR = 1
    DUO = 2
    QUAD = 3
    OCTET = 4


class Residual(enum.IntEnum):
    """The error-feedback residual a stored copy keeps (`feedback.Feedback`; values are the Triton constexprs of
    `formats.device`): none, FP32, or BF16 (round to nearest even)."""

    NONE = 0
    FP32 = 1
    BF16 = 2


class Order(enum.IntEnum):
    """Operand order of a scaled elementwise kind's scale (values are the Triton constexprs of `formats.device`).

    DIV: s = amax / max, v = x / s, the amax propagating NaN. MUL (FlashInfer's CUDA order): the amax skips NaN
    (fmaxf from -FLT_MAX), enc = max / amax (1 where amax = 0), v = x * enc, s = 1 / enc, and an integer kind codes
    NaN as -max. Both: code = round(v), value = code * s (`formats.ScaledFormat`).
    """

    DIV = 0
    MUL = 1


# dtype of the packed `data` field of each kind (4-bit kinds pack two codes per byte)
_DATA_DTYPES = {Kind.FP32: torch.float32, Kind.BF16: torch.bfloat16, Kind.FP16: torch.float16,
                Kind.FP16SR: torch.float16, Kind.FP16SR_SOFT: torch.float16, Kind.INT8: torch.int8,
                Kind.INT8SR: torch.int8, Kind.INT16: torch.int16, Kind.INT16SR: torch.int16}


# each stochastic kind's default random bits K (its format's default `bits=`)
SR_BITS = {Kind.FP16SR: rounding.FP16_SR_BITS, Kind.FP16SR_SOFT: rounding.FP16_SR_BITS,
           Kind.FP8SR: rounding.E4M3_SR_BITS, Kind.INT8SR: rounding.INT_SR_BITS, Kind.INT16SR: rounding.INT_SR_BITS,
           Kind.MX8SR: rounding.MX8_SR_BITS}


# kinds whose blocks share an exponent, which the step kernels do not decode packed
_BLOCK_EXPONENT_KINDS = (Kind.MXFP8, Kind.MXFP4, Kind.MX8, Kind.MX8SR)


@dataclass(frozen=True)
class KernelCodec:
    """One format as the Triton kernels see it (module docstring)."""

    kind: Kind
    group: Group = Group.NONE
    max: float = 1.0
    block: int = 1
    axis: str = "dstate"
    order: Order = Order.DIV
    words: Words = Words.ELEMENT
    rows: int = 1
    cols: int = 0
    rot: int = 1
    rounds: int = philox.N_ROUNDS
    bits: int = 0
    ef: Residual = Residual.NONE

    def __post_init__(self) -> None:
        if not self.stochastic and (self.rounds != philox.N_ROUNDS or self.bits):
            raise ValueError(f"rounds={self.rounds} and bits={self.bits} given to the deterministic kind "
                             f"{self.kind.name}; accepted: rounds={philox.N_ROUNDS} and bits=0")
        if self.stochastic and not self.bits:
            object.__setattr__(self, "bits", SR_BITS[self.kind])

    @property
    def stochastic(self) -> bool:
        return self.kind in SR_BITS

    @property
    def natural(self) -> bool:
        """Codes along d_state in the state's own basis (axis=dstate, no rotation): a [head_dim, d_state] tile of the
        state rounds as it lies."""
        return self.axis == "dstate" and self.rot == 1

    @property
    def packed(self) -> bool:
        """Whether the step kernels decode the packed encoding (`encode_triton` writes every codec's): a natural codec
        in a kind the kernel decoders read (not MX or MX8) with one scale per row, head or tensor (no tiles, column
        factors or dual-axis factors); the others they read as the decoded FP32 copy. Error feedback keeps its inner
        format's layout: the encoder rounds the target it is given (state + residual), the residual being the
        caller's."""
        return (self.natural and self.kind not in _BLOCK_EXPONENT_KINDS
                and self.group not in (Group.TILE, Group.ROWCOL, Group.DUAL))

    @property
    def head_span(self) -> int:
        """Consecutive head_dim indices one scale group, block or rotation run spans (0: all of them). The chunked
        kernels' programs hold all of d_state and a slab of head_dim: along d_state (axis=dstate) a format row is one
        head_dim index, a head all of them, a scale tile `rows` of them; along head_dim (axis=headdim) a row or head
        scale spans them all, a scale tile or block `cols`, an MX / NVFP4 block and a rotation run their size. Column
        factors (rowcol) and dual-axis factors span the whole head along either axis."""
        if self.axis == "dstate":
            return {Group.HEAD: 0, Group.ROWCOL: 0, Group.DUAL: 0, Group.TILE: self.rows}.get(self.group, 1)
        group = {Group.NONE: 1, Group.TILE: self.cols}.get(self.group, 0)
        return 0 if group == 0 else max(group, self.block, self.rot)

    def spans(self, rows: int) -> bool:
        """Whether a scale group, block or rotation run spans more than `rows` head_dim indices (`head_span`): a
        program holding slabs of `rows` head_dim indices would cut it."""
        return self.head_span == 0 or self.head_span > rows

    def in_tile(self, whole_head: bool) -> bool:
        """Whether a chunked kernel program holding all of d_state and a slab of head_dim rounds this format in its
        loop: its scale groups, blocks and rotation runs lie inside the program's tile. No tensor-wide scale; scale
        tiles, blocks and rotation runs of power-of-two sizes (or the whole axis), so that they align with the
        power-of-two slabs; a group or run spanning more than one head_dim index needs whole_head (a program that can
        hold the whole head; it then holds the whole head, or slabs of whole spans). Dual-axis factors need the head's
        C (`cols`, set by `tile_codec` from the state's dims)."""
        if self.group == Group.TENSOR or (self.group == Group.DUAL and not self.cols):
            return False
        sizes = (self.rot,) if self.group == Group.DUAL else (self.rows, self.cols, self.rot)
        if any(n & (n - 1) for n in sizes):
            return False
        return whole_head or not self.spans(1)

    def fits(self, head_dim: int, d_state: int) -> bool:
        """Whether rotation runs tile the rotated axis of a [head_dim, d_state] head (else the format's torch encode
        raises: `rotation.Rotated`)."""
        return (head_dim if self.axis == "headdim" else d_state) % self.rot == 0

    @property
    def data_dtype(self) -> torch.dtype:
        """dtype of the packed `data` field (uint8 for the FP8 and FP4 codes, int8 / int16 for the integers)."""
        return _DATA_DTYPES.get(self.kind, torch.uint8)

    def padded(self, n: int) -> int:
        """Length of the blocked axis n padded to whole blocks (the packed row's elements)."""
        return -(-n // self.block) * self.block

    @property
    def args(self) -> tuple[int, int, float, int]:
        """(KIND, GROUP, MAX, ORDER): the constexprs of a kernel's in-tile rounding (`device.round_tile`)."""
        return int(self.kind), int(self.group), float(self.max), int(self.order)

    @property
    def random(self) -> tuple[int, int, int]:
        """(WORDS, ROUNDS, BITS): the one tuple constexpr RANDOM of a kernel's random words (`device.state_bits`,
        `device.seeded_bits`, `device.sr_field`)."""
        return int(self.words), self.rounds, self.bits

    @property
    def tile(self) -> tuple[int, int]:
        """(ROWS, COLS): the constexprs of `device.round_tile`'s scale tile (group tile; 0 for the whole axis)."""
        return self.rows, self.cols

    @property
    def basis(self) -> tuple[int, int]:
        """(AXIS, ROT): the constexprs of the blocked axis (0 d_state, 1 head_dim: the kernels transpose their tile to
        the oriented view) and the Hadamard size (1: none) of a kernel's in-tile rounding."""
        return int(self.axis == "headdim"), self.rot

    def constexprs(self, prefix: str) -> dict:
        """The constexprs of one stored copy's in-tile rounding in a Mamba-2 chunked kernel, named as its parameters:
        PREFIX (kind), PREFIX_GROUP, _MAX, _ORDER, _RANDOM, _ROWS, _COLS, _AXIS and _ROT."""
        axis, rot = self.basis
        return {prefix: int(self.kind), f"{prefix}_GROUP": int(self.group), f"{prefix}_MAX": self.max,
                f"{prefix}_ORDER": int(self.order), f"{prefix}_RANDOM": self.random, f"{prefix}_ROWS": self.rows,
                f"{prefix}_COLS": self.cols, f"{prefix}_AXIS": axis, f"{prefix}_ROT": rot}


FP32_CODEC = KernelCodec(Kind.FP32)  # what a kernel stores where torch rounds the copy: the FP32 value itself


def tile_codec(fmt, whole_head: bool = True, dims: tuple[int, int] | None = None) -> KernelCodec | None:
    """fmt's codec when a kernel program rounds it in-loop (`KernelCodec.in_tile`), else None: torch rounds it. dims:
    the state's (head_dim, d_state), where rotation runs that do not tile their axis leave it to torch, whose encode
    names the mismatch (`KernelCodec.fits`), and which give dual-axis factors their head's C; None for a codec alone
    (dual-axis factors: torch rounds them)."""
    codec = fmt.kernel_codec
    if codec is not None and codec.group == Group.DUAL:
        codec = None if dims is None else replace(codec, cols=dims[0] if codec.axis == "headdim" else dims[1])
    if codec is None or not codec.in_tile(whole_head) or (dims is not None and not codec.fits(*dims)):
        return None
    return codec


def packed_codec(fmt) -> KernelCodec | None:
    """fmt's codec when the step kernels decode its packed layout (`KernelCodec.packed`), else None."""
    codec = fmt.kernel_codec
    return codec if codec is not None and codec.packed else None
