"""MX8: Pimba's shared-microexponent state format (bases `mx8` and the stochastic `mx8sr`).

Kim et al., "Pimba: A Processing-in-Memory Acceleration for Post-Transformer Large Language Model Serving",
MICRO '25 (doi 10.1145/3725843.3756121). Section 3.2 defines the format the paper stores the state S_t of its
Eq. 2 (S_t = d_t * S_{t-1} + k_t v_t^T) in: groups of 16 values share an 8-bit exponent, pairs of values within a
group share a 1-bit microexponent, and each value keeps a sign and a 6-bit mantissa (8 bits per value on
average); Sections 3.2 and 4.2 pick it with stochastic rounding ("MX8 with stochastic rounding emerges as a
Pareto-optimal choice"). The two-level scaling is Rouhani et al.'s shared microexponents (ISCA '23), the
paper's reference [16].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from replayssm_eval.formats import layout, philox, rounding
from replayssm_eval.formats.codec import KernelCodec, Kind
from replayssm_eval.formats.formats import StateFormat
from replayssm_eval.formats.packed import PackedState

BLOCK = 16  # values sharing one 8-bit exponent
MANTISSA_BITS = 6
EXP_MIN = -126  # the smallest shared exponent (field 1); a block of zeros or subnormals gets it
NAN_FIELD = 255


@dataclass(frozen=True)
class MicroexponentFormat(StateFormat):
    """MX8 blocks of 16 values along `axis` (zero-padded to a multiple of 16), pairs (2j, 2j+1) within a block:

        e(x)   = floor(log2 |x|) for x != 0 (zeros take no part in the maxima)
        E      = max(max over the block of e(x), -126)        the shared exponent; an all-zero block has E = -126
        mu     = 1 if max over the pair of e(x) < E, else 0   the pair's microexponent (an all-zero pair has mu = 1)
        step   = 2^(E - mu - 5)                               6 magnitude bits below 2^(E - mu + 1)
        mx8    m = min(floor(|x| / step + 1/2), 63)            round to nearest, ties away from zero
        mx8sr  m = min(floor(|x| / step + r / 2^K), 63)        r = bits [K-1:0] of the element's word, K = `bits` (8)
                                                               (`words=` element, duo or quad)
        dequant = sign(x) * m * step   (m = 0 decodes to +0)
    |x| / step < 64 always (every e(x) <= E - mu), so the clamp acts only where |x| rounds up to 64 * step.
    A block holding Inf or NaN decodes to NaN throughout (exponent field 255).

    Packed, oriented view `[..., H, R, Cp]` (Cp = C padded to a multiple of 16): data uint8 `[..., H, R, Cp]`,
    16 bytes per block, byte b = sign << 6 | m in bits [6:0]; bit 7 of byte 2j is pair j's microexponent and bit
    7 of byte 2j+1 is bit j of the exponent field E + 127 (8 bits per value, the paper's budget).
    """

    base: str
    axis: str = "dstate"
    rounds: str = str(philox.N_ROUNDS)
    bits: str = str(rounding.MX8_SR_BITS)
    words: str = "element"
    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {"axis": layout.AXES}
    STOCHASTIC: ClassVar[tuple[str, ...]] = ("mx8sr",)
    SR_BITS: ClassVar[dict[str, tuple[int, int]]] = {"mx8sr": (rounding.MX8_SR_BITS, 32)}
    QMAX: ClassVar[int] = (1 << MANTISSA_BITS) - 1

    @property
    def bits_per_element(self) -> float:
        return 8.0

    @property
    def kernel_codec(self) -> KernelCodec | None:
        """Covered: either axis, any rounds=, bits= and words= (the chunked kernels round it in their tiles; it has no
        packed kernel encoding)."""
        return KernelCodec(Kind[self.base.upper()], block=BLOCK, axis=self.axis, **self.random_codec)

    def storage_bytes(self, shape) -> int:
        *lead, h, r, c = layout.oriented_shape(shape, self.axis)
        return layout.prod(lead) * h * r * -(-c // BLOCK) * BLOCK

    def encode(self, x, *, seed=None, offset=0, random_bits=None) -> PackedState:
        words = self._words(x, seed, offset, random_bits)
        x4 = layout.as_bhpn(x)  # [B, H, P, N]
        xo = layout.pad_to(layout.orient(x4.float(), self.axis), BLOCK)  # [B, H, R, Cp]
        blocks = xo.unflatten(-1, (-1, BLOCK))  # [B, H, R, Cb, 16]
        finite = torch.isfinite(blocks).all(-1, keepdim=True)  # [B, H, R, Cb, 1]
        mag = torch.where(finite, blocks.abs(), 0.0)
        e = torch.where(mag > 0, torch.frexp(mag).exponent - 1, EXP_MIN - 1)  # floor(log2 |x|), zeros below any E
        big = e.amax(-1, keepdim=True).clamp(min=EXP_MIN)  # [B, H, R, Cb, 1]
        mu = (e.unflatten(-1, (-1, 2)).amax(-1) < big).to(torch.int64)  # [B, H, R, Cb, 8]
        shift = MANTISSA_BITS - 1 - (big - mu.repeat_interleave(2, -1))  # |x| / step = |x| * 2^shift, exact in FP64
        v = mag.double() * torch.pow(2.0, shift.double())
        if words is None:
            m = torch.floor(v + 0.5)
        else:
            wo = layout.pad_to(layout.orient(words.reshape(x4.shape), self.axis), BLOCK).reshape(v.shape)
            r = (wo & ((1 << self.random_bits_used) - 1)).double()
            m = torch.floor(v + r * 2.0 ** -self.random_bits_used)
        m = m.clamp(max=self.QMAX).to(torch.int64)
        sign = ((blocks < 0) & (m > 0)).to(torch.int64)
        field = torch.where(finite, big + 127, NAN_FIELD)  # [B, H, R, Cb, 1]
        spare = torch.stack((mu, (field >> torch.arange(8, device=x.device)) & 1), dim=-1).flatten(-2)  # [.., 16]
        data = (sign << 6 | m | spare << 7).to(torch.uint8).flatten(-2)  # [B, H, R, Cp]
        lead = layout.shape3(x.shape)[:-3]
        return PackedState(self.name, tuple(x.shape), data.reshape(*lead, *data.shape[1:]).contiguous())

    def decode(self, packed) -> torch.Tensor:
        self._check(packed)
        *lead, h, r, c = layout.oriented_shape(packed.shape, self.axis)
        data = packed.data.reshape(-1, h, r, packed.data.shape[-1]).to(torch.int64).unflatten(-1, (-1, BLOCK))
        spare = (data >> 7).unflatten(-1, (-1, 2))  # [B, H, R, Cb, 8, 2]: microexponent, exponent bit
        field = (spare[..., 1] << torch.arange(8, device=data.device)).sum(-1, keepdim=True)  # [B, H, R, Cb, 1]
        scale = torch.pow(2.0, (field - 127 - spare[..., 0].repeat_interleave(2, -1) - (MANTISSA_BITS - 1)).double())
        v = torch.where((data >> 6) & 1 == 1, -1.0, 1.0).double() * (data & self.QMAX).double() * scale
        v = torch.where(field == NAN_FIELD, torch.nan, v).float().flatten(-2)[..., :c]  # [B, H, R, C]
        return layout.unorient(v, self.axis).reshape(packed.shape)
