"""The state formats: one frozen dataclass per family, each with its formula and packed layout.

Every format maps an FP32 state `[..., H, P, N]` to a `PackedState` and back; `quantize` is
`decode(encode(x))` cast back to x's dtype. Options are dataclass fields; `OPTIONS` lists their
accepted values in canonical order, the first value being the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from replayssm_eval.quant import layout, rounding
from replayssm_eval.quant.packed import PackedState

FLT_MAX = 3.4028234663852886e38


def _div(a: float | torch.Tensor, b: float | torch.Tensor) -> torch.Tensor:
    """a / b correctly rounded in FP32; torch turns `c / t` into reciprocal(t) * c, so scalars become tensors."""
    ref = a if isinstance(a, torch.Tensor) else b
    return torch.as_tensor(a, dtype=ref.dtype, device=ref.device) / torch.as_tensor(b, dtype=ref.dtype, device=ref.device)


class StateFormat:
    """Base of all formats. Subclasses are frozen dataclasses whose first field is `base` (the name)."""

    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {}
    STOCHASTIC: ClassVar[tuple[str, ...]] = ()

    base: str

    @property
    def name(self) -> str:
        """Canonical spec: `base[:key=value,...]`, options in `OPTIONS` order, defaults omitted."""
        opts = [f"{k}={getattr(self, k)}" for k, values in self.OPTIONS.items() if getattr(self, k) != values[0]]
        return self.base + (":" + ",".join(opts) if opts else "")

    @property
    def is_stochastic(self) -> bool:
        return self.base in self.STOCHASTIC

    @property
    def bits_per_element(self) -> float:
        raise NotImplementedError

    def storage_bytes(self, shape: tuple[int, ...]) -> int:
        raise NotImplementedError

    def encode(self, x: torch.Tensor, *, seed: int | None = None, offset: int = 0,
               random_bits: torch.Tensor | None = None) -> PackedState:
        raise NotImplementedError

    def decode(self, packed: PackedState) -> torch.Tensor:
        raise NotImplementedError

    def quantize(self, x: torch.Tensor, *, seed: int | None = None, offset: int = 0,
                 random_bits: torch.Tensor | None = None) -> torch.Tensor:
        """Fake quantization: same shape and dtype as x, computed in FP32."""
        return self.decode(self.encode(x, seed=seed, offset=offset, random_bits=random_bits)).to(x.dtype)

    def _words(self, x, seed, offset, random_bits) -> torch.Tensor | None:
        return layout.random_words(x, seed, offset, random_bits) if self.is_stochastic else None

    def _check(self, packed: PackedState) -> None:
        if packed.format != self.name:
            raise ValueError(f"packed state was written by '{packed.format}', not '{self.name}'")

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class ElementwiseFormat(StateFormat):
    """Unscaled per-element formats; `data` has x's shape and the dtype below.

    fp32     the FP32 state itself (the reference).                       data: float32
    bf16     RNE to bfloat16; overflow -> Inf.                              data: bfloat16
    fp16     RNE to IEEE half; |x| >= 65520 -> Inf.                         data: float16
    fp16sr   stochastic: q * floor(|x|/q + r/2^13), r = bits [12:0] of the word (PTX cvt.rs.f16x2.f32);
             results beyond 65504 -> Inf; see `rounding` for subnormals.    data: float16
    """

    base: str
    STOCHASTIC: ClassVar[tuple[str, ...]] = ("fp16sr",)
    _DTYPES: ClassVar[dict[str, torch.dtype]] = {
        "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp16sr": torch.float16,
    }

    @property
    def bits_per_element(self) -> float:
        return float(self._DTYPES[self.base].itemsize * 8)

    def storage_bytes(self, shape) -> int:
        return layout.prod(shape) * self._DTYPES[self.base].itemsize

    def encode(self, x, *, seed=None, offset=0, random_bits=None) -> PackedState:
        words = self._words(x, seed, offset, random_bits)
        x32 = x.float()
        if self.base == "fp16sr":
            x32 = rounding.sr_fp16(x32, words)
        data = x32.to(self._DTYPES[self.base])
        return PackedState(self.name, tuple(x.shape), data.clone() if data is x else data)

    def decode(self, packed) -> torch.Tensor:
        self._check(packed)
        return packed.data.float()


@dataclass(frozen=True)
class FP8Format(StateFormat):
    """FP8 state with FP32 scales.

    fp8      OCP E4M3fn, RNE, saturating (+-448).
    fp8sr    E4M3fn, stochastic: q * floor(|v|/q + r/2^16), r = bits [15:0] of the word
             (PTX cvt.rs.satfinite.e4m3x4.f32, FlashInfer's port), saturating.
    fp8e5m2  OCP E5M2, RNE, saturating (+-57344).

    scale=row (default): s = amax / MAX per (head, head_dim row), amax over d_state;
    scale=head: per head over [P, N]; scale=tensor: per leading index over [H, P, N];
    s is replaced by 1 where it is 0 (all-zero group). v = x / s (FP32 division),
    code = round(v), dequant = code * s. scale=none: s = 1, a plain saturating cast.
    A group holding Inf or NaN decodes to NaN throughout (s = Inf or NaN).

    Packed: data uint8 codes with x's shape; global_scale FP32 s with shape
    `lead + (H, P)` / `lead + (H,)` / `lead` (row / head / tensor), None for scale=none.
    """

    base: str
    scale: str = "row"
    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {"scale": ("row", "head", "tensor", "none")}
    STOCHASTIC: ClassVar[tuple[str, ...]] = ("fp8sr",)

    @property
    def max_value(self) -> float:
        return rounding.E5M2_MAX if self.base == "fp8e5m2" else rounding.E4M3_MAX

    @property
    def bits_per_element(self) -> float:
        return 8.0

    def storage_bytes(self, shape) -> int:
        n_scales = 0 if self.scale == "none" else layout.prod(layout.group_shape(shape, self.scale))
        return layout.prod(shape) + 4 * n_scales

    def _round(self, v: torch.Tensor, words: torch.Tensor | None) -> torch.Tensor:
        if self.base == "fp8sr":
            return rounding.sr_e4m3(v, words)
        return rounding.round_e5m2(v) if self.base == "fp8e5m2" else rounding.round_e4m3(v)

    def encode(self, x, *, seed=None, offset=0, random_bits=None) -> PackedState:
        words = self._words(x, seed, offset, random_bits)
        x4 = layout.as_bhpn(x)  # [B, H, P, N]
        s = None
        if self.scale != "none":
            s = _div(layout.group_amax(x4, self.scale), self.max_value)  # [B, H|1, P|1, 1]
            s = torch.where(s == 0, 1.0, s)
            x4 = x4 / s
        q = self._round(x4, None if words is None else words.reshape(x4.shape))
        to_bits = rounding.e5m2_to_bits if self.base == "fp8e5m2" else rounding.e4m3_to_bits
        gs = None if s is None else s.reshape(layout.group_shape(x.shape, self.scale)).contiguous()
        return PackedState(self.name, tuple(x.shape), to_bits(q).reshape(x.shape), None, gs)

    def decode(self, packed) -> torch.Tensor:
        self._check(packed)
        from_bits = rounding.e5m2_from_bits if self.base == "fp8e5m2" else rounding.e4m3_from_bits
        v = from_bits(packed.data)
        if packed.global_scale is None:
            return v
        x4 = v.reshape(layout.as_bhpn(v).shape)
        s = packed.global_scale.reshape(x4.shape[0], *{"row": x4.shape[1:3], "head": (x4.shape[1], 1),
                                                       "tensor": (1, 1)}[self.scale], 1)
        return (x4 * s).reshape(packed.shape)


@dataclass(frozen=True)
class NVFP4Format(StateFormat):
    """NVFP4: E2M1 elements in blocks of 16 with an E4M3 block scale and an FP32 global scale.

    TransformerEngine's reference, FP32 with RNE in this order (amax over the global group):
        S_enc = min(2688 / amax, FLT_MAX); S_enc = 1 where amax == 0 or S_enc == 0; S_dec = 1 / S_enc
        s_b   = e4m3(clamp(blockmax * (S_enc * fp32(1/6)), +-448))      (subnormal s_b allowed)
        enc_b = min(1 / (s_b * S_dec), FLT_MAX)                         (s_b = 0 -> FLT_MAX)
        q     = e2m1(clamp(x * enc_b, +-6));  dequant = (q * s_b) * S_dec
    Non-finite input: NaN anywhere in a global group makes the whole group NaN (S_dec = NaN);
    +-Inf makes S_enc = 1, its block scale 448 and its element +-6 * 448, and the rest of the
    group is quantized with S_enc = 1.

    axis=dstate|headdim: blocks run along N (last dim) or P (dim -2); the blocked dim is
    zero-padded to a multiple of 16. scale=tensor|head|row: one S_dec per leading index, per
    head, or per row of the oriented `[..., H, R, C]` view (C = blocked dim).
    Packed (oriented view: `[..., H, P, N]` for dstate, `[..., H, N, P]` for headdim, C padded to Cp):
        data          uint8 `[..., H, R, Cp/2]`: element 2j in the low nibble, 2j+1 in the high
                      nibble; nibble = sign << 3 | magnitude index into (0, .5, 1, 1.5, 2, 3, 4, 6)
        scales        uint8 E4M3fn `[..., H, R, Cp/16]`
        global_scale  FP32 S_dec, shape `lead`, `lead + (H,)` or `lead + (H, R)`
    """

    base: str = "nvfp4"
    axis: str = "dstate"
    scale: str = "tensor"
    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {"axis": layout.AXES, "scale": layout.SCALE_GROUPS}
    BLOCK: ClassVar[int] = 16

    @property
    def bits_per_element(self) -> float:
        return 4.0 + 8.0 / self.BLOCK

    def storage_bytes(self, shape) -> int:
        *lead, h, r, c = layout.oriented_shape(shape, self.axis)
        cp = -(-c // self.BLOCK) * self.BLOCK
        rows = layout.prod(lead) * h * r
        return rows * (cp // 2 + cp // self.BLOCK) + 4 * layout.prod(layout.group_shape(shape, self.scale, self.axis))

    def encode(self, x, *, seed=None, offset=0, random_bits=None) -> PackedState:
        xo = layout.pad_to(layout.orient(layout.as_bhpn(x), self.axis), self.BLOCK)  # [B, H, R, Cp]
        amax = layout.group_amax(xo, self.scale)  # [B, H|1, R|1, 1]
        s_enc = torch.clamp(_div(2688.0, amax), max=FLT_MAX)
        s_enc = torch.where((amax == 0) | (s_enc == 0), 1.0, s_enc)
        s_dec = _div(1.0, s_enc)
        blocks = xo.unflatten(-1, (-1, self.BLOCK))  # [B, H, R, Cp/16, 16]
        s_b = rounding.round_e4m3(blocks.abs().amax(-1) * (s_enc * rounding.F32_SIXTH))  # [B, H, R, Cp/16]
        enc_b = torch.clamp(_div(1.0, s_b * s_dec), max=FLT_MAX)
        q = rounding.round_e2m1(blocks * enc_b.unsqueeze(-1)).flatten(-2)  # [B, H, R, Cp]
        codes = rounding.e2m1_to_bits(q)
        lead = layout.shape3(x.shape)[:-3]
        data = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(*lead, *xo.shape[1:3], -1)
        scales = rounding.e4m3_to_bits(s_b).reshape(*lead, *s_b.shape[1:])
        gs = s_dec.reshape(layout.group_shape(x.shape, self.scale, self.axis)).contiguous()
        return PackedState(self.name, tuple(x.shape), data, scales, gs)

    def decode(self, packed) -> torch.Tensor:
        self._check(packed)
        *lead, h, r, c = layout.oriented_shape(packed.shape, self.axis)
        data = packed.data.reshape(-1, h, r, packed.data.shape[-1])
        codes = torch.stack((data & 0xF, data >> 4), dim=-1).flatten(-2)  # [B, H, R, Cp]
        q = rounding.e2m1_from_bits(codes).unflatten(-1, (-1, self.BLOCK))
        s_b = rounding.e4m3_from_bits(packed.scales.reshape(q.shape[:-1])).unsqueeze(-1)
        s_dec = packed.global_scale.reshape(q.shape[0], *{"row": (h, r), "head": (h, 1), "tensor": (1, 1)}[self.scale], 1, 1)
        xo = ((q * s_b) * s_dec).flatten(-2)[..., :c]
        return layout.unorient(xo, self.axis).reshape(packed.shape)


@dataclass(frozen=True)
class MXFormat(StateFormat):
    """OCP Microscaling (MX v1.0): blocks of 32 elements share one E8M0 power-of-two scale X.

    mxfp8: E4M3fn elements (emax 8); mxfp4: E2M1 elements (emax 2). Per block:
        code = clamp(floor(log2 blockmax) - emax + 127, 0, 254); X = 2^(code - 127)
        code = 127 (X = 1) for an all-zero block; code = 255 (X = NaN) if the block holds Inf/NaN
        element = round_RNE(clamp(x / X, +-max)); dequant = element * X
    axis=dstate|headdim as for nvfp4, blocked dim zero-padded to a multiple of 32.
    Packed (oriented `[..., H, R, Cp]`): data uint8 `[..., H, R, Cp]` E4M3 bytes (mxfp8) or
    `[..., H, R, Cp/2]` nibbles, low nibble first (mxfp4); scales uint8 E8M0 `[..., H, R, Cp/32]`.
    """

    base: str
    axis: str = "dstate"
    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {"axis": layout.AXES}
    BLOCK: ClassVar[int] = 32

    @property
    def fp4(self) -> bool:
        return self.base == "mxfp4"

    @property
    def emax(self) -> int:
        return 2 if self.fp4 else 8

    @property
    def bits_per_element(self) -> float:
        return (4.0 if self.fp4 else 8.0) + 8.0 / self.BLOCK

    def storage_bytes(self, shape) -> int:
        *lead, h, r, c = layout.oriented_shape(shape, self.axis)
        cp = -(-c // self.BLOCK) * self.BLOCK
        return layout.prod(lead) * h * r * (cp // (2 if self.fp4 else 1) + cp // self.BLOCK)

    def encode(self, x, *, seed=None, offset=0, random_bits=None) -> PackedState:
        xo = layout.pad_to(layout.orient(layout.as_bhpn(x), self.axis), self.BLOCK)  # [B, H, R, Cp]
        blocks = xo.unflatten(-1, (-1, self.BLOCK))  # [B, H, R, Cp/32, 32]
        bmax = blocks.abs().amax(-1)
        code = torch.clamp(torch.frexp(bmax).exponent - 1 - self.emax + 127, 0, 254)
        code = torch.where(bmax == 0, 127, code)
        code = torch.where(torch.isfinite(blocks).all(-1), code, 255)
        v = blocks * rounding.e8m0_from_bits(254 - code).unsqueeze(-1)  # x / X, exact
        v = torch.where(code.unsqueeze(-1) == 255, torch.nan, v).flatten(-2)
        lead = layout.shape3(x.shape)[:-3]
        if self.fp4:
            codes = rounding.e2m1_to_bits(rounding.round_e2m1(v))
            data = codes[..., 0::2] | (codes[..., 1::2] << 4)
        else:
            data = rounding.e4m3_to_bits(rounding.round_e4m3(v))
        data = data.reshape(*lead, *xo.shape[1:3], -1)
        scales = code.to(torch.uint8).reshape(*lead, *code.shape[1:])
        return PackedState(self.name, tuple(x.shape), data, scales)

    def decode(self, packed) -> torch.Tensor:
        self._check(packed)
        *lead, h, r, c = layout.oriented_shape(packed.shape, self.axis)
        data = packed.data.reshape(-1, h, r, packed.data.shape[-1])
        if self.fp4:
            v = rounding.e2m1_from_bits(torch.stack((data & 0xF, data >> 4), dim=-1).flatten(-2))
        else:
            v = rounding.e4m3_from_bits(data)
        scale = rounding.e8m0_from_bits(packed.scales.reshape(*v.shape[:-1], -1))
        xo = (v.unflatten(-1, (-1, self.BLOCK)) * scale.unsqueeze(-1)).flatten(-2)[..., :c]
        return layout.unorient(xo, self.axis).reshape(packed.shape)

