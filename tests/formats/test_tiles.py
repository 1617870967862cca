"""Tiled scales (`scale=tile:RxC`): bit-exact against a per-tile loop written here, zeros, non-finite tiles, sizes,
the scales the other layouts are special cases of, and SGLang's FP8 GDN state pool (`sglang:fp8`)."""

import pytest
import torch

from replayssm_eval.formats import get_format
from replayssm_eval.formats.codec import packed_codec, tile_codec
from replayssm_eval.kernels.family import get_family
from replayssm_eval.replay.config import ReplayConfig

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


def _tiled_ref(x: torch.Tensor, rows: int, cols: int, rounding, top: float) -> torch.Tensor:
    """Independent formula on x [B, H, R, C] (already oriented): per tile of rows x cols (0: whole axis, edge tiles
    shorter), s = amax / top (1 where 0), value = rounding(x / s) * s, by a loop over the tiles."""
    r, c = x.shape[-2:]
    rows, cols = rows or r, cols or c
    out = torch.empty_like(x)
    for i in range(0, r, rows):
        for j in range(0, c, cols):
            t = x[..., i:i + rows, j:j + cols]
            s = t.abs().flatten(-2).max(-1).values / torch.tensor(top)  # [B, H]
            s = torch.where(s == 0, torch.ones_like(s), s)[..., None, None]
            out[..., i:i + rows, j:j + cols] = rounding(t / s) * s
    return out


def _int8(v):
    return torch.clamp(torch.round(v), -127, 127)


def _e4m3(v):
    return torch.clamp(v, -448, 448).to(torch.float8_e4m3fn).float()


CASES = [  # spec, rows, cols, element rounding, scale max
    ("int8:scale=tile:8x6", 8, 6, _int8, 127.0),
    ("int8:scale=tile:32x0", 32, 0, _int8, 127.0),
    ("int8:scale=tile:0x1", 0, 1, _int8, 127.0),
    ("int16:scale=tile:5x7", 5, 7, lambda v: torch.clamp(torch.round(v), -32767, 32767), 32767.0),
    ("fp8:scale=tile:32x0,max=240", 32, 0, _e4m3, 240.0),
    ("fp8:scale=tile:3x8", 3, 8, _e4m3, 448.0),
    ("fp8:axis=headdim,scale=tile:4x0", 4, 0, _e4m3, 448.0),
]


@pytest.mark.parametrize("spec, rows, cols, rounding, top", CASES)
def test_matches_per_tile_loop(spec, rows, cols, rounding, top):
    """Rows (37) and columns (20) that the tiles do not divide, leading dims, heads of very different size."""
    fmt = get_format(spec)
    x = torch.randn(2, 3, 37, 20, generator=torch.Generator().manual_seed(1)) * torch.tensor([1e-3, 1.0, 300.0])[:, None, None]
    xo = x.transpose(-1, -2) if fmt.axis == "headdim" else x
    want = _tiled_ref(xo, rows, cols, rounding, top)
    want = want.transpose(-1, -2) if fmt.axis == "headdim" else want
    got = fmt.quantize(x)
    assert torch.equal(got, want)
    r, c = xo.shape[-2:]
    n_tiles = -(-r // (rows or r)) * -(-c // (cols or c))
    packed = fmt.encode(x)
    assert packed.scales.shape == (2, 3, -(-r // (rows or r)), -(-c // (cols or c)))
    assert packed.global_scale is None and packed.data.shape == x.shape
    assert fmt.storage_bytes((3, 37, 20)) == 3 * 37 * 20 * fmt.code_bytes + 4 * 3 * n_tiles == packed.nbytes // 2


def test_special_cases_of_tiles():
    """row = tile:1x0, head = tile:0x0, block:N = tile:1xN, per-column (per key channel) = tile:0x1: same values."""
    x = torch.randn(2, 4, 12, 10, generator=torch.Generator().manual_seed(2))
    for tiled, other in (("tile:1x0", "row"), ("tile:0x0", "head"), ("tile:1x4", "block:4")):
        for base in ("int8", "fp8", "fp8sr"):
            kw = {"seed": 5} if base == "fp8sr" else {}
            a = get_format(f"{base}:scale={tiled}").quantize(x, **kw)
            assert torch.equal(a, get_format(f"{base}:scale={other}").quantize(x, **kw)), (base, tiled)
    # one scale per column of the head = per row of the transposed view
    assert torch.equal(get_format("int8:scale=tile:0x1").quantize(x), get_format("int8:axis=headdim").quantize(x))


def test_zero_tiles_and_non_finite_tiles():
    """An all-zero tile stores scale 1 and codes 0; a tile holding NaN or Inf decodes to NaN throughout, the others
    are untouched."""
    fmt = get_format("int8:scale=tile:2x3")
    x = torch.randn(1, 1, 5, 7, generator=torch.Generator().manual_seed(3))
    x[..., 0:2, 0:3] = 0.0
    x[..., 0, 4] = -0.0
    x[..., 2, 6] = torch.nan
    x[..., 4, 0] = torch.inf
    packed = fmt.encode(x)
    assert packed.scales[0, 0, 0, 0].item() == 1.0 and not packed.data[..., 0:2, 0:3].any()
    y = fmt.decode(packed)
    assert y[..., 0:2, 0:3].eq(0).all()
    assert y[..., 2:4, 6:7].isnan().all() and y[..., 4:5, 0:3].isnan().all()
    finite = torch.ones_like(x, dtype=torch.bool)
    finite[..., 2:4, 6:7] = finite[..., 4:5, 0:3] = False
    assert y[finite].isfinite().all()
    want = _tiled_ref(torch.where(finite, x, 0.0), 2, 3, _int8, 127.0)
    assert torch.equal(y[finite], want[finite])
    fp8 = get_format("fp8:scale=tile:2x3").quantize(x)
    assert fp8[..., 2:4, 6:7].isnan().all() and fp8[finite].isfinite().all()


def test_bits_and_kernel_coverage():
    """Fixed-size tiles count their FP32 scale per element; the chunked kernels round tiles of power-of-two sizes in
    their loop (`tile_codec`), torch the others and every tiled packed layout (no `packed_codec`)."""
    assert get_format("int8:scale=tile:4x8").bits_per_element == 8 + 1
    assert get_format("int8:scale=tile:32x0").bits_per_element == 8
    for spec in ("int8:scale=tile:4x8", "fp8:scale=tile:32x0,max=240", "fp8sr:scale=tile:1x0",
                 "fp8:axis=headdim,scale=tile:4x0"):
        fmt = get_format(spec)
        assert packed_codec(fmt) is None and tile_codec(fmt) == fmt.kernel_codec
    for spec in ("int8:scale=tile:3x8", "int8:scale=tile:4x6", "fp8:axis=headdim,scale=tile:4x6"):
        assert tile_codec(get_format(spec)) is None
    assert get_format("fp8:scale=tile:32x0,max=240").name == "fp8:scale=tile:32x0,max=240"


def test_sglang_fp8_scales_each_32_row_value_tile():
    """sglang:fp8 on a GDN state in the Hugging Face layout [B, HV, K, V]: one scale per (head, 32 V rows x all K),
    amax / 240, E4M3 codes of x / s."""
    fmt = ReplayConfig.parse("sglang:fp8").read_format
    hf = torch.randn(2, 3, 16, 70, generator=torch.Generator().manual_seed(4))  # [B, HV, K, V]; V = 70: a short tile
    stored = get_family("gdn").stored_layout(hf)  # [B, HV, V, K]
    packed = fmt.encode(stored)
    tiles = [(0, 32), (32, 64), (64, 70)]
    want = torch.stack([hf[..., v0:v1].abs().amax(dim=(-2, -1)) / torch.tensor(240.0) for v0, v1 in tiles], -1)
    assert torch.equal(packed.scales.squeeze(-1), want)  # [B, HV, 3]
    back = fmt.decode(packed).transpose(-1, -2)  # [B, HV, K, V]
    for (v0, v1), s in zip(tiles, want.unbind(-1)):
        s = s[..., None, None]
        assert torch.equal(back[..., v0:v1], _e4m3(hf[..., v0:v1] / s) * s)
