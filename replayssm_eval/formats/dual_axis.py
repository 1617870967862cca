"""STEPQuant's dual-axis integer state codec (base `dualaxis`): one FP16 factor per key row and per value column.

Yao, Xu, Lin et al., "STEPQuant: When and Where Errors Matter in Delta-Rule Recurrent State Quantization"
(arXiv 2609.38169): Section 4.3, Eq. 11-14 (Key-Row-Aware Dual-axis Fitting), Appendix C.1 (the fixed-code column
update), Appendix D (FP16 row and column vectors), Eq. 3 (the integer levels) and Eq. 4 (the updated state is
quantized for storage every step). Not here: the paper's calibrated parts, its row-impact factors w_i (Eq. 10, 21),
its lifetime-aware bit allocation across heads or key rows (Eq. 6-8) and its FP16 pivot units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from replayssm_eval.formats import layout
from replayssm_eval.formats.codec import Group, KernelCodec, Kind
from replayssm_eval.formats.formats import StateFormat
from replayssm_eval.formats.packed import PackedState

SCALE_MIN, SCALE_MAX = 2.0 ** -14, 65504.0  # the FP16 normal range the paper clamps its stored scales to (Appendix B.5)
WIDTHS = (3, 8)


def fp16_scale(s: torch.Tensor) -> torch.Tensor:
    """A positive scale as stored: clamped to [2^-14, 65504] and rounded to FP16 (NaN stays NaN), read back in FP32."""
    return s.clamp(SCALE_MIN, SCALE_MAX).half().float()


def pack_codes(u: torch.Tensor, width: int) -> torch.Tensor:
    """Unsigned `width`-bit codes `[..., n]` as bytes `[..., ceil(n * width / 8)]`, code k at bits [k*w, (k+1)*w)
    of the row's little-endian bit string."""
    bits = ((u.unsqueeze(-1) >> torch.arange(width, device=u.device)) & 1).flatten(-2)  # [..., n * w]
    bits = torch.nn.functional.pad(bits, (0, -bits.shape[-1] % 8)).unflatten(-1, (-1, 8))
    return (bits << torch.arange(8, device=u.device)).sum(-1).to(torch.uint8)


def unpack_codes(data: torch.Tensor, width: int, n: int) -> torch.Tensor:
    bits = ((data.to(torch.int64).unsqueeze(-1) >> torch.arange(8, device=data.device)) & 1).flatten(-2)
    return (bits[..., :n * width].unflatten(-1, (n, width)) << torch.arange(width, device=data.device)).sum(-1)


@dataclass(frozen=True)
class DualAxisFormat(StateFormat):
    """Integer codes z with one factor r_i per row and c_j per column of each head: dequant = z_ij * (r_i * c_j).

    Oriented view `[..., H, R, C]`: axis=headdim (default) puts the key rows in R (`[H, N, P]`: Mamba-2's d_state
    rows, GDN's and KDA's key rows), as the paper's S_t in R^{d_k x d_v}. With q = 2^(width-1) - 1 and F(s) the
    stored scale (s clamped to [2^-14, 65504], rounded to FP16):
        m_i  = mean_j |x_ij|                       (Eq. 12)
        r_i  = F(sqrt(m_i))                        (Eq. 13 with uniform row impact, w_i = 1)
        c0_j = F(max_i (|x_ij| / r_i) / q)          start: no value clips
        z0   = clip(round(x / (r_i * c0_j)), -q, q)
        c_j  = F(sum_i v_ij x_ij / sum_i v_ij^2), v_ij = r_i * z0_ij   (Appendix C.1's fixed-code update of Eq. 14;
               c0_j where the denominator is 0)
        z    = clip(round(x / (r_i * c_j)), -q, q)   round half to even; r_i * c_j is exact in FP32
    m, the sums and the update are FP64. A head holding Inf or NaN decodes to NaN throughout. The chunked kernels
    round it in whole-head programs (`kernel_codec`, `device.dual_axis_tile`).
    Packed: data uint8 `[..., H, ceil(R * C * width / 8)]`, the codes z + q of each head's row-major `[R, C]`
    as `width`-bit fields (`pack_codes`); global_scale FP16 r `[..., H, R]`; col_scale FP16 c `[..., H, C]`.
    """

    base: str
    axis: str = "headdim"
    width: str = "6"
    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {"axis": ("headdim", "dstate"), "width": ("6", "N")}

    def __post_init__(self) -> None:
        super().__post_init__()
        if not WIDTHS[0] <= int(self.width) <= WIDTHS[1]:
            raise ValueError(f"bad value '{self.width}' for option 'width' of state format '{self.base}'; "
                             f"accepted: {WIDTHS[0]}..{WIDTHS[1]}")

    @property
    def qmax(self) -> int:
        return (1 << (int(self.width) - 1)) - 1

    @property
    def bits_per_element(self) -> float:
        """Code bits (the row and column factors, scales over a whole axis, not counted)."""
        return float(self.width)

    @property
    def kernel_codec(self) -> KernelCodec:
        """Codes within +-q (INT8 holds every width) and the head's two factor vectors (`Group.DUAL`)."""
        return KernelCodec(Kind.INT8, Group.DUAL, float(self.qmax), axis=self.axis)

    def storage_bytes(self, shape) -> int:
        *lead, h, r, c = layout.oriented_shape(shape, self.axis)
        return layout.prod(lead) * h * (-(-r * c * int(self.width) // 8) + 2 * (r + c))

    def _codes(self, xo: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.clamp(torch.round(xo / scale), -self.qmax, self.qmax)

    def encode(self, x, *, seed=None, offset=0, random_bits=None) -> PackedState:
        xo = layout.orient(layout.as_bhpn(x).float(), self.axis)  # [B, H, R, C]
        finite = torch.isfinite(xo).all(-1, keepdim=True).all(-2, keepdim=True)  # [B, H, 1, 1]
        r = fp16_scale(xo.double().abs().mean(-1, keepdim=True).sqrt().float())  # [B, H, R, 1]
        r = torch.where(finite, r, torch.nan)
        c0 = fp16_scale(((xo.abs() / r).amax(-2, keepdim=True).double() / self.qmax).float())  # [B, H, 1, C]
        v = (r * self._codes(xo, r * c0)).double()  # [B, H, R, C]
        num, den = (v * xo.double()).sum(-2, keepdim=True), (v * v).sum(-2, keepdim=True)
        c = torch.where(den > 0, fp16_scale((num / torch.where(den > 0, den, 1.0)).float()), c0)  # [B, H, 1, C]
        z = self._codes(xo, r * c).to(torch.int64)
        lead = layout.shape3(x.shape)[:-3]
        *_, h, rows, cols = xo.shape
        data = pack_codes((z + self.qmax).flatten(-2), int(self.width))  # [B, H, bytes]
        return PackedState(self.name, tuple(x.shape), data.reshape(*lead, h, -1).contiguous(), None,
                           r.half().reshape(*lead, h, rows).contiguous(), c.half().reshape(*lead, h, cols).contiguous())

    def decode(self, packed) -> torch.Tensor:
        self._check(packed)
        *lead, h, r, c = layout.oriented_shape(packed.shape, self.axis)
        data = packed.data.reshape(-1, h, packed.data.shape[-1])
        z = (unpack_codes(data, int(self.width), r * c) - self.qmax).unflatten(-1, (r, c)).float()  # [B, H, R, C]
        scale = packed.global_scale.float().reshape(-1, h, r, 1) * packed.col_scale.float().reshape(-1, h, 1, c)
        return layout.unorient(z * scale, self.axis).reshape(packed.shape)
