"""The state formats: one frozen dataclass per family, each with its formula and packed layout.

Every format maps an FP32 state `[..., H, P, N]` to a `PackedState` and back; `quantize` is
`decode(encode(x))` cast back to x's dtype. Options are dataclass fields; `OPTIONS` lists their
accepted values in canonical order, the first value being the default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from replayssm_eval.formats import layout, philox, rounding
from replayssm_eval.formats.codec import Group, KernelCodec, Kind, Order, Words
from replayssm_eval.formats.packed import PackedState


def div_rn(a: float | torch.Tensor, b: float | torch.Tensor) -> torch.Tensor:
    """a / b correctly rounded in FP32; torch turns `c / t` into reciprocal(t) * c, so scalars become tensors
    (filled on the device, not copied there: a CUDA graph capture allows no host-to-device copy)."""
    ref = a if isinstance(a, torch.Tensor) else b
    a, b = (x.to(ref.dtype) if isinstance(x, torch.Tensor) else torch.full((), x, dtype=ref.dtype, device=ref.device)
            for x in (a, b))
    return a / b


class StateFormat:
    """Base of all formats. Subclasses are frozen dataclasses whose first field is `base` (the name).

    Option values are strings; in `OPTIONS` a value ending in `N` (`N`, `block:N`) stands for any
    positive integer in its place (the registry's grammar).
    """

    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {}
    STOCHASTIC: ClassVar[tuple[str, ...]] = ()
    # default random bits of each stochastic base, and the most it can use
    SR_BITS: ClassVar[dict[str, tuple[int, int]]] = {}
    # a stochastic base's word layouts (`words=`): its own Philox call per element, or one call per 2 or 4 elements of
    # a row (fp16sr adds its engines' pairs, `ElementwiseFormat`)
    WORDS: ClassVar[tuple[str, ...]] = ("element", "duo", "quad")
    # output word of a Philox4x32 call read by each element of a group (words=duo, quad, octet)
    _LANE_WORDS: ClassVar[dict[str, tuple[int, ...]]] = {"duo": (0, 1), "quad": (0, 1, 2, 3),
                                                         "octet": (0, 0, 2, 2, 1, 1, 3, 3)}

    base: str

    @classmethod
    def options_for(cls, base: str) -> dict[str, tuple[str, ...]]:
        """Accepted options of format `base`, defaults first; stochastic bases add `rounds`, `bits` and `words`."""
        if base not in cls.STOCHASTIC:
            return cls.OPTIONS
        return {**cls.OPTIONS, "rounds": (str(philox.N_ROUNDS), "N"), "bits": (str(cls.SR_BITS[base][0]), "N"),
                "words": cls.WORDS}

    def __post_init__(self) -> None:
        if self.is_stochastic:
            top = self.SR_BITS[self.base][1]
            if not 1 <= int(self.bits) <= top:
                raise ValueError(f"bad value '{self.bits}' for option 'bits' of state format '{self.base}'; accepted: 1..{top}")

    @property
    def name(self) -> str:
        """Canonical spec: `base[:key=value,...]`, options in `OPTIONS` order, defaults omitted."""
        opts = [f"{k}={getattr(self, k)}" for k, values in self.options_for(self.base).items()
                if getattr(self, k) != values[0]]
        return self.base + (":" + ",".join(opts) if opts else "")

    @property
    def is_stochastic(self) -> bool:
        return self.base in self.STOCHASTIC

    @property
    def random_bits_used(self) -> int:
        """K: the low bits of each random word a stochastic format adds below the rounding point."""
        return int(self.bits)

    @property
    def lane_words(self) -> tuple[int, ...] | None:
        """A stochastic format's Philox lanes: one Philox4x32 call per G = len(lane_words) elements of a row, element n
        reading output word lane_words[n % G] (`words=duo|quad`, fp16sr's `octet`), or None: each element's own
        call's word 0. Seeded words (`seed=`) and a run's keyed words (`replay.keys.state_random_bits`) follow it."""
        return self._LANE_WORDS.get(self.words) if self.is_stochastic else None

    @property
    def random_codec(self) -> dict:
        """The `KernelCodec` fields of a stochastic format's `rounds=`, `bits=` and `words=` (none for a deterministic
        one)."""
        if not self.is_stochastic:
            return {}
        return {"rounds": int(self.rounds), "bits": int(self.bits), "words": Words[self.words.upper()]}

    @property
    def kernel_codec(self) -> KernelCodec | None:
        """What a Triton kernel reads of this format (`codec.KernelCodec`), or None: the kernels leave it to torch."""
        return None

    @property
    def feedback(self) -> str | None:
        """The precision of the error-feedback residual a stored copy keeps (`feedback.Feedback`), None without."""
        return None

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
        if not self.is_stochastic:
            return None
        return layout.random_words(x, seed, offset, random_bits, int(self.rounds), self.lane_words)

    def _check(self, packed: PackedState) -> None:
        if packed.format != self.name:
            raise ValueError(f"packed state was written by '{packed.format}', not '{self.name}'")

    def __str__(self) -> str:
        return self.name


class WrappedFormat(StateFormat):
    """A format option that applies to every format (`rot=`, `ef=`): `inner` (a frozen dataclass field of the
    subclass) does the rounding; the subclass names its option (`option`) and may change what `encode` sees."""

    inner: StateFormat

    @property
    def option(self) -> str:
        raise NotImplementedError

    @property
    def base(self) -> str:
        return self.inner.base

    @property
    def axis(self) -> str:
        return getattr(self.inner, "axis", "dstate")

    @property
    def name(self) -> str:
        return self.inner.name + ("," if ":" in self.inner.name else ":") + self.option

    @property
    def is_stochastic(self) -> bool:
        return self.inner.is_stochastic

    @property
    def lane_words(self) -> tuple[int, ...] | None:
        return self.inner.lane_words

    @property
    def bits_per_element(self) -> float:
        return self.inner.bits_per_element

    def storage_bytes(self, shape) -> int:
        return self.inner.storage_bytes(shape)

    def encode(self, x, *, seed=None, offset=0, random_bits=None) -> PackedState:
        packed = self.inner.encode(x, seed=seed, offset=offset, random_bits=random_bits)
        return dataclasses.replace(packed, format=self.name)

    def decode(self, packed) -> torch.Tensor:
        self._check(packed)
        return self.inner.decode(dataclasses.replace(packed, format=self.inner.name))


@dataclass(frozen=True)
class ElementwiseFormat(StateFormat):
    """Unscaled per-element formats; `data` has x's shape and the dtype below.

    fp32     the FP32 state itself (the reference).                       data: float32
    bf16     RNE to bfloat16; overflow -> Inf.                              data: bfloat16
    fp16     RNE to IEEE half; |x| >= 65520 -> Inf.                         data: float16
    fp16sr   stochastic: q * floor(|x|/q + r/2^K), r = bits [K-1:0] of the word, K = `bits` (13, as PTX
             cvt.rs.f16x2.f32); results beyond 65504 -> Inf; see `rounding` for subnormals.  data: float16
    Signs of zero are kept (IEEE formats have -0).

    fp16sr's word layout (`words=`), which random word and field each element reads:
        element  each element its own word, Philox at its own counter (`offset` + flat index), bits [K-1:0]
        pair     vLLM's and SGLang's Triton store (`cvt.rs.f16x2.f32` with `pack=2`): elements 2j and 2j+1
                 of a row share the word at 2j's counter, 2j reading bits [12:0] and 2j+1 bits [28:16]
                 (`layout.paired_words`); with `random_bits`, 2j+1 reads the high field of 2j's word
        duo      FlashInfer's SM90 vertical decode kernel, and its simple one for d_state 64: one Philox4x32 call
                 per 2 elements of a row at the first one's counter, element n reading output word n % 2
        quad     FlashInfer's simple decode kernel for d_state >= 128: one Philox4x32 call per 4 elements of a
                 row at the first one's counter, element n reading output word n % 4, bits [K-1:0]
                 (`layout.philox_lane_words`)
        octet    TensorRT-LLM's ReplaySSM flush: one Philox4x32 call per 8 elements of a row at the first one's
                 counter, its words in `tl.join` order r0, r2, r1, r3 to the row's 4 pairs, each pair split as
                 `pair`
    (`duo`, `quad` and `octet` take `random_bits` as each element's own word, as `element` and `pair` do; a run's
    keyed words come in the layout, `lane_words`)
    and its conversion (`cvt=`): `ptx`, the cvt.rs model of `rounding._stochastic`; `soft`, FlashInfer's
    software port on GPUs without cvt.rs (`rounding.sr_fp16_soft`: flushes fp16 subnormal results).
    """

    base: str
    rounds: str = str(philox.N_ROUNDS)
    bits: str = str(rounding.FP16_SR_BITS)
    words: str = "element"
    cvt: str = "ptx"
    STOCHASTIC: ClassVar[tuple[str, ...]] = ("fp16sr",)
    WORDS: ClassVar[tuple[str, ...]] = ("element", "pair", "duo", "quad", "octet")
    SR_OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {"cvt": ("ptx", "soft")}
    SR_BITS: ClassVar[dict[str, tuple[int, int]]] = {"fp16sr": (rounding.FP16_SR_BITS, rounding.FP16_SR_BITS)}
    _DTYPES: ClassVar[dict[str, torch.dtype]] = {
        "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp16sr": torch.float16,
    }

    @classmethod
    def options_for(cls, base):
        opts = super().options_for(base)
        return {**opts, **cls.SR_OPTIONS} if base in cls.STOCHASTIC else opts

    @property
    def bits_per_element(self) -> float:
        return float(self._DTYPES[self.base].itemsize * 8)

    @property
    def kernel_codec(self) -> KernelCodec | None:
        """Covered: every word layout, conversion, rounds= and bits= (fp16sr's `words=` as the codec's `Words`,
        `cvt=soft` as the kind FP16SR_SOFT)."""
        if not self.is_stochastic:
            return KernelCodec(Kind[self.base.upper()])
        return KernelCodec(Kind.FP16SR_SOFT if self.cvt == "soft" else Kind.FP16SR, **self.random_codec)

    def storage_bytes(self, shape) -> int:
        return layout.prod(shape) * self._DTYPES[self.base].itemsize

    def _words(self, x, seed, offset, random_bits):
        words = super()._words(x, seed, offset, random_bits)
        return layout.paired_words(words) if self.words in ("pair", "octet") and words is not None else words

    def encode(self, x, *, seed=None, offset=0, random_bits=None) -> PackedState:
        words = self._words(x, seed, offset, random_bits)
        x32 = x.float()
        if self.base == "fp16sr":
            sr = rounding.sr_fp16_soft if self.cvt == "soft" else rounding.sr_fp16
            x32 = sr(x32, words, self.random_bits_used)
        data = x32.to(self._DTYPES[self.base])
        return PackedState(self.name, tuple(x.shape), data.clone() if data is x else data)

    def decode(self, packed) -> torch.Tensor:
        self._check(packed)
        return packed.data.float()


SCALES = ("row", "head", "tensor", "block:N", "tile:RxC", "rowcol", "none")


def column_factors(xo: torch.Tensor) -> torch.Tensor:
    """Column factors of scale=rowcol: max |x| over the rows of each head's column, 1 where 0 `[B, H, 1, C]`."""
    col = xo.abs().amax(dim=2, keepdim=True)
    return torch.where(col == 0, 1.0, col)


@dataclass(frozen=True)
class ScaledFormat(StateFormat):
    """Element codes times FP32 scales s = amax / MAX over a scale group (FP8 and integer formats).

    Work on the oriented view `[B, H, R, C]` (`axis=dstate`: `[B, H, P, N]`; `axis=headdim`: `[B, H, N, P]`):
        scale=row      one s per (head, row), amax over C          stored: global_scale `lead + (H, R)`
        scale=head     one s per head, amax over [R, C]            stored: global_scale `lead + (H,)`
        scale=tensor   one s per leading index, over [H, R, C]     stored: global_scale `lead`
        scale=block:N  one s per N consecutive elements along C (the last block may be shorter)
                                                                   stored: scales FP32 `lead + (H, R, ceil(C/N))`
        scale=tile:RxC one s per tile of R rows x C columns of [R, C] (0: the whole axis; edge tiles shorter);
                       block:N is tile:1xN, row tile:1x0, head tile:0x0, one per column tile:0x1
                                                                   stored: scales FP32 `lead + (H, ceil(R/r), ceil(C/c))`
        scale=rowcol   two axes: c_j = max_i |x_ij| per column of the head (1 where 0), y = x / c,
                       r_i = max_j |y_ij| / MAX per row (1 where 0), v = y / r, dequant = (code * r) * c.
                       stored: global_scale r `lead + (H, R)`, col_scale c `lead + (H, C)`
        scale=none     s = 1 (a plain saturating cast)
    order=div (default): s = amax / MAX (FP32 division) and s = 1 where it is 0 (an all-zero group);
    v = x / s (FP32 division); code = round(v); dequant = code * s. A group holding Inf or NaN decodes to
    NaN throughout.
    order=mul (FlashInfer's scaled state, CUDA order): amax over the group ignoring NaN (fmaxf from -FLT_MAX,
    so an all-NaN group has amax = -FLT_MAX), enc = MAX / amax (1 where amax = 0), v = x * enc, s = 1 / enc
    (FP32 divisions), code = round(v) (integers: NaN -> -qmax, fminf/fmaxf clamp before __float2int_rn),
    dequant = code * s. An Inf in the group gives enc = 0 and s = Inf.
    Packed data: codes with x's shape (uint8 FP8 bytes, int8 or int16 integers).
    """

    base: str
    axis: str = "dstate"
    scale: str = "row"
    order: str = "div"
    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {"axis": layout.AXES, "scale": SCALES, "order": ("div", "mul")}

    @property
    def max_value(self) -> float:
        raise NotImplementedError

    @property
    def tile(self) -> tuple[int, int] | None:
        """(rows, columns) of one scale tile of the oriented view, 0 for the whole axis (block:N is (1, N)); None for
        the other scales."""
        kind, _, size = self.scale.partition(":")
        if kind == "block":
            return 1, int(size)
        if kind == "tile":
            rows, _, cols = size.partition("x")
            return int(rows), int(cols)
        return None

    def _tile_dims(self, r: int, c: int) -> tuple[int, int]:
        """The scale tile's rows and columns in an oriented [R=r, C=c] head."""
        rows, cols = self.tile
        return rows or r, cols or c

    @property
    def code_bytes(self) -> int:
        return 1

    @property
    def bits_per_element(self) -> float:
        """Code bits, plus the FP32 scale's share for block:N and tile:RxC of fixed size (R, C > 0; scales over a whole
        axis, row, head and tensor not counted)."""
        fixed = self.tile is not None and 0 not in self.tile
        return 8.0 * self.code_bytes + (32.0 / (self.tile[0] * self.tile[1]) if fixed else 0.0)

    def _n_scales(self, shape) -> int:
        *lead, h, r, c = layout.oriented_shape(shape, self.axis)
        per_head = {"row": r, "head": 1, "rowcol": r + c, "none": 0}.get(self.scale)
        if self.scale == "tensor":
            return layout.prod(lead)
        if self.tile:
            rows, cols = self._tile_dims(r, c)
            per_head = -(-r // rows) * -(-c // cols)
        return layout.prod(lead) * h * per_head

    def storage_bytes(self, shape) -> int:
        return layout.prod(shape) * self.code_bytes + 4 * self._n_scales(shape)

    @property
    def kernel_codec(self) -> KernelCodec | None:
        """Covered: either axis with every scale (tile:RxC and block:N as a group tile, rowcol as `Group.ROWCOL`),
        either order, any SR rounds=, bits= and words=; the element kind is the one named as the base (`Kind`: fp8,
        fp8sr, fp8e5m2, int8, int8sr, int16, int16sr)."""
        kind, order = Kind[self.base.upper()], Order[self.order.upper()]
        if self.tile:
            rows, cols = self.tile
            return KernelCodec(kind, Group.TILE, self.max_value, axis=self.axis, order=order, rows=rows, cols=cols,
                               **self.random_codec)
        return KernelCodec(kind, Group[self.scale.upper()], self.max_value, axis=self.axis, order=order,
                           **self.random_codec)

    def _round(self, v: torch.Tensor, words: torch.Tensor | None) -> torch.Tensor:
        """On-grid values (FP32) of the scaled elements v."""
        raise NotImplementedError

    def _to_codes(self, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _from_codes(self, data: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _scale(self, amax: torch.Tensor) -> torch.Tensor:
        s = div_rn(amax, self.max_value)
        return torch.where(s == 0, 1.0, s)

    def _magnitudes(self, x: torch.Tensor) -> torch.Tensor:
        """|x| as the group maximum reads it: NaN propagates (div) or is skipped, reading -FLT_MAX (mul)."""
        return layout.magnitudes(x, self.order == "mul")

    def _scaled(self, x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(v, s): the elements x scaled for rounding and their decode scales, from the group maxima amax."""
        if self.order == "div":
            s = self._scale(amax)
            return x / s, s
        enc = torch.where(amax == 0, 1.0, div_rn(self.max_value, amax))
        return x * enc, div_rn(1.0, enc)

    def encode(self, x, *, seed=None, offset=0, random_bits=None) -> PackedState:
        words = self._words(x, seed, offset, random_bits)
        x4 = layout.as_bhpn(x)  # [B, H, P, N]
        xo = layout.orient(x4, self.axis)  # [B, H, R, C]
        lead = layout.shape3(x.shape)[:-3]
        *_, h, r, c = xo.shape
        v, scales, gs, cs = xo, None, None, None
        if self.scale == "rowcol":
            col = column_factors(xo)  # [B, H, 1, C]
            y = xo / col
            v, s = self._scaled(y, self._magnitudes(y).amax(dim=3, keepdim=True))  # s: [B, H, R, 1]
            cs, gs = col.reshape(*lead, h, c), s.reshape(*lead, h, r)
        elif self.tile:
            rows, cols = self._tile_dims(r, c)
            tmax = layout.tile_max(self._magnitudes(xo), rows, cols)  # [B, H, Rt, Ct]
            v, s = self._scaled(xo, layout.untile(tmax, rows, cols, r, c))  # s: [B, H, R, C]
            scales = s[..., ::rows, ::cols].reshape(*lead, h, *tmax.shape[2:])
        elif self.scale != "none":
            v, s = self._scaled(xo, layout.group_max(self._magnitudes(xo), self.scale))  # s: [B, H|1, R|1, 1]
            gs = s.reshape(layout.group_shape(x.shape, self.scale, self.axis))
        wo = None if words is None else layout.orient(words.reshape(x4.shape), self.axis)
        codes = self._to_codes(self._round(v, wo))
        data = layout.unorient(codes, self.axis).reshape(x.shape).contiguous()
        return PackedState(self.name, tuple(x.shape), data, None if scales is None else scales.contiguous(),
                           None if gs is None else gs.contiguous(), None if cs is None else cs.contiguous())

    def decode(self, packed) -> torch.Tensor:
        self._check(packed)
        *lead, h, r, c = layout.oriented_shape(packed.shape, self.axis)
        v = layout.orient(self._from_codes(packed.data).reshape(-1, *layout.shape3(packed.shape)[-3:]), self.axis)
        if self.scale == "rowcol":
            v = (v * packed.global_scale.reshape(-1, h, r, 1)) * packed.col_scale.reshape(-1, h, 1, c)
        elif self.tile:
            rows, cols = self._tile_dims(r, c)
            v = v * layout.untile(packed.scales.reshape(-1, h, *packed.scales.shape[-2:]), rows, cols, r, c)
        elif self.scale != "none":
            v = v * packed.global_scale.reshape(-1, *{"row": (h, r), "head": (h, 1), "tensor": (1, 1)}[self.scale], 1)
        return layout.unorient(v, self.axis).reshape(packed.shape)


@dataclass(frozen=True)
class FP8Format(ScaledFormat):
    """FP8 state with FP32 scales (`ScaledFormat`'s groups; default one scale per (head, head_dim row)).

    fp8      OCP E4M3fn, RNE, saturating (+-448).
    fp8sr    E4M3fn, stochastic: q * floor(|v|/q + r/2^K), r = bits [K-1:0] of the word, K = `bits`
             (16: PTX cvt.rs.satfinite.e4m3x4.f32, FlashInfer's port), saturating; `words=` element, duo or quad.
    fp8e5m2  OCP E5M2, RNE, saturating (+-57344).
    max=M: s = amax / M instead of amax / 448 (57344 for e5m2), e.g. max=240 (codes stay within +-240).
    Codes keep the sign of zero (-0.0 -> 0x80, as the hardware cast).
    """

    max: str = ""
    rounds: str = str(philox.N_ROUNDS)
    bits: str = str(rounding.E4M3_SR_BITS)
    words: str = "element"
    STOCHASTIC: ClassVar[tuple[str, ...]] = ("fp8sr",)
    SR_BITS: ClassVar[dict[str, tuple[int, int]]] = {"fp8sr": (rounding.E4M3_SR_BITS, 20)}

    @classmethod
    def options_for(cls, base):
        top = str(int(rounding.E5M2_MAX if base == "fp8e5m2" else rounding.E4M3_MAX))
        opts = super().options_for(base)
        random = ("rounds", "bits", "words")
        return {k: v for k, v in opts.items() if k not in ("max", *random)} | {"max": (top, "N")} | {
            k: v for k, v in opts.items() if k in random}

    def __post_init__(self) -> None:
        super().__post_init__()
        top = rounding.E5M2_MAX if self.base == "fp8e5m2" else rounding.E4M3_MAX
        if not self.max:
            object.__setattr__(self, "max", str(int(top)))
        if not 0 < int(self.max) <= top:
            raise ValueError(f"bad value '{self.max}' for option 'max' of state format '{self.base}'; accepted: 1..{int(top)}")

    @property
    def max_value(self) -> float:
        return float(self.max)

    def _round(self, v, words):
        if self.base == "fp8sr":
            return rounding.sr_e4m3(v, words, self.random_bits_used)
        return rounding.round_e5m2(v) if self.base == "fp8e5m2" else rounding.round_e4m3(v)

    def _to_codes(self, q):
        return rounding.e5m2_to_bits(q) if self.base == "fp8e5m2" else rounding.e4m3_to_bits(q)

    def _from_codes(self, data):
        return rounding.e5m2_from_bits(data) if self.base == "fp8e5m2" else rounding.e4m3_from_bits(data)


@dataclass(frozen=True)
class IntFormat(ScaledFormat):
    """Symmetric integer state with FP32 scales (`ScaledFormat`'s groups, default one per (head, row)).

    int8, int16      code = RNE(x / s), saturating to +-qmax (127, 32767); s = amax / qmax.
    int8sr, int16sr  code = sign(v) * floor(|v| + r / 2^K), v = x / s, r = bits [K-1:0] of the word,
                     K = `bits` (default 16, up to 32), computed exactly; unbiased when v has at most K
                     bits below the integer point, else biased toward zero by less than 2^-K. The words:
                     `words=` element, duo or quad (`StateFormat.WORDS`, `lane_words`).
    Codes: int8 / int16 two's complement (-0.0 -> 0, NaN -> 0; a group holding Inf or NaN decodes
    to NaN throughout, its scale being Inf or NaN). Under order=mul NaN -> -qmax (`ScaledFormat`).
    """

    rounds: str = str(philox.N_ROUNDS)
    bits: str = str(rounding.INT_SR_BITS)
    words: str = "element"
    STOCHASTIC: ClassVar[tuple[str, ...]] = ("int8sr", "int16sr")
    SR_BITS: ClassVar[dict[str, tuple[int, int]]] = {"int8sr": (rounding.INT_SR_BITS, 32),
                                                     "int16sr": (rounding.INT_SR_BITS, 32)}

    @property
    def code_bytes(self) -> int:
        return 2 if self.base.startswith("int16") else 1

    @property
    def max_value(self) -> float:
        return float(self.qmax)

    @property
    def qmax(self) -> int:
        return rounding.INT16_MAX if self.code_bytes == 2 else rounding.INT8_MAX

    def _round(self, v, words):
        if self.order == "mul":
            v = torch.where(torch.isnan(v), -float(self.qmax), v)
        if self.is_stochastic:
            return rounding.sr_int(v, words, self.qmax, self.random_bits_used)
        return rounding.round_int(v, self.qmax)

    def _to_codes(self, q):
        return q.to(torch.int16 if self.code_bytes == 2 else torch.int8)

    def _from_codes(self, data):
        return data.float()


def nvfp4_block_scale(bmax: torch.Tensor, s_enc: torch.Tensor) -> torch.Tensor:
    """E4M3 block scale in TE's order, `bmax * (S_enc * fp32(1/6))`: `(bmax / 6) * S_enc` rounds differently."""
    return rounding.round_e4m3(bmax * (s_enc * rounding.F32_SIXTH))


@dataclass(frozen=True)
class NVFP4Format(StateFormat):
    """NVFP4: E2M1 elements in blocks of 16 with an E4M3 block scale and an FP32 global scale.

    TransformerEngine's reference, FP32 with RNE in this order (amax over the global group):
        S_enc = min(2688 / amax, FLT_MAX); S_enc = 1 where amax == 0 or S_enc == 0; S_dec = 1 / S_enc
        s_b   = e4m3(clamp(blockmax * (S_enc * fp32(1/6)), +-448))      (subnormal s_b allowed)
        enc_b = min(1 / (s_b * S_dec), FLT_MAX)                         (s_b = 0 -> FLT_MAX)
        q     = e2m1(clamp(x * enc_b, +-6));  dequant = (q * s_b) * S_dec
    A scaled element x * enc_b equal to zero (an input of -0.0 included) encodes as code 0, never as
    the negative zero code 8, as TransformerEngine's reference; a nonzero negative value that rounds
    to zero keeps code 8.
    Non-finite input: NaN anywhere in a global group makes the whole group NaN (S_dec = NaN);
    +-Inf makes S_enc = 1, its block scale 448 and its element +-6 * 448, and the rest of the
    group is quantized with S_enc = 1.

    axis=dstate|headdim: blocks run along N (last dim) or P (dim -2); the blocked dim is
    zero-padded to a multiple of 16. scale=head (default)|tensor|row: one S_dec per head (per
    sequence and head: a single-pass kernel sees one head), per leading index, or per row of the
    oriented `[..., H, R, C]` view (C = blocked dim). scale=rowcol: two axes, x is first divided by
    column factors c_j = max_i |x_ij| over the rows of its head (1 where 0; FP32, `ScaledFormat`),
    then quantized with per-row S_dec; dequant = ((q * s_b) * S_dec) * c_j.
    Packed (oriented view: `[..., H, P, N]` for dstate, `[..., H, N, P]` for headdim, C padded to Cp):
        data          uint8 `[..., H, R, Cp/2]`: element 2j in the low nibble, 2j+1 in the high
                      nibble; nibble = sign << 3 | magnitude index into (0, .5, 1, 1.5, 2, 3, 4, 6)
        scales        uint8 E4M3fn `[..., H, R, Cp/16]`
        global_scale  FP32 S_dec, shape `lead`, `lead + (H,)` or `lead + (H, R)` (row, rowcol)
        col_scale     FP32 c `lead + (H, C)` for scale=rowcol, else None
    """

    base: str = "nvfp4"
    axis: str = "dstate"
    scale: str = "head"
    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {"axis": layout.AXES, "scale": ("head", "tensor", "row", "rowcol")}
    BLOCK: ClassVar[int] = rounding.NVFP4_BLOCK

    @property
    def bits_per_element(self) -> float:
        return 4.0 + 8.0 / self.BLOCK

    def storage_bytes(self, shape) -> int:
        *lead, h, r, c = layout.oriented_shape(shape, self.axis)
        cp = -(-c // self.BLOCK) * self.BLOCK
        rows = layout.prod(lead) * h * r
        n_col = layout.prod(lead) * h * c if self.scale == "rowcol" else 0
        return rows * (cp // 2 + cp // self.BLOCK) + 4 * (layout.prod(layout.group_shape(shape, self.group, self.axis)) + n_col)

    @property
    def group(self) -> str:
        """The scale group of S_dec."""
        return "row" if self.scale == "rowcol" else self.scale

    @property
    def kernel_codec(self) -> KernelCodec:
        """Covered: every scale (rowcol as `Group.ROWCOL`: S_dec per row of x / c)."""
        return KernelCodec(Kind.NVFP4, Group[self.scale.upper()], block=self.BLOCK, axis=self.axis)

    def encode(self, x, *, seed=None, offset=0, random_bits=None) -> PackedState:
        xo = layout.orient(layout.as_bhpn(x), self.axis)  # [B, H, R, C]
        col = column_factors(xo) if self.scale == "rowcol" else None  # [B, H, 1, C]
        xo = layout.pad_to(xo if col is None else xo / col, self.BLOCK)  # [B, H, R, Cp]
        amax = layout.group_amax(xo, self.group)  # [B, H|1, R|1, 1]
        s_enc = torch.clamp(div_rn(rounding.NVFP4_AMAX, amax), max=rounding.FLT_MAX)
        s_enc = torch.where((amax == 0) | (s_enc == 0), 1.0, s_enc)
        s_dec = div_rn(1.0, s_enc)
        blocks = xo.unflatten(-1, (-1, self.BLOCK))  # [B, H, R, Cp/16, 16]
        s_b = nvfp4_block_scale(blocks.abs().amax(-1), s_enc)  # [B, H, R, Cp/16]
        enc_b = torch.clamp(div_rn(1.0, s_b * s_dec), max=rounding.FLT_MAX)
        v = blocks * enc_b.unsqueeze(-1)
        q = torch.where(v == 0, 0.0, rounding.round_e2m1(v)).flatten(-2)  # [B, H, R, Cp]; -0.0 -> code 0
        codes = rounding.e2m1_to_bits(q)
        lead = layout.shape3(x.shape)[:-3]
        data = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(*lead, *xo.shape[1:3], -1)
        scales = rounding.e4m3_to_bits(s_b).reshape(*lead, *s_b.shape[1:])
        gs = s_dec.reshape(layout.group_shape(x.shape, self.group, self.axis)).contiguous()
        cs = None if col is None else col.reshape(*lead, xo.shape[1], -1).contiguous()
        return PackedState(self.name, tuple(x.shape), data, scales, gs, cs)

    def decode(self, packed) -> torch.Tensor:
        self._check(packed)
        *lead, h, r, c = layout.oriented_shape(packed.shape, self.axis)
        data = packed.data.reshape(-1, h, r, packed.data.shape[-1])
        codes = torch.stack((data & 0xF, data >> 4), dim=-1).flatten(-2)  # [B, H, R, Cp]
        q = rounding.e2m1_from_bits(codes).unflatten(-1, (-1, self.BLOCK))
        s_b = rounding.e4m3_from_bits(packed.scales.reshape(q.shape[:-1])).unsqueeze(-1)
        s_dec = packed.global_scale.reshape(q.shape[0], *{"row": (h, r), "head": (h, 1), "tensor": (1, 1)}[self.group], 1, 1)
        xo = ((q * s_b) * s_dec).flatten(-2)[..., :c]
        if self.scale == "rowcol":
            xo = xo * packed.col_scale.reshape(-1, h, 1, c)
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
    BLOCK: ClassVar[int] = rounding.MX_BLOCK

    @property
    def fp4(self) -> bool:
        return self.base == "mxfp4"

    @property
    def emax(self) -> int:
        return 2 if self.fp4 else 8

    @property
    def kernel_codec(self) -> KernelCodec:
        return KernelCodec(Kind[self.base.upper()], block=self.BLOCK, axis=self.axis)

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

