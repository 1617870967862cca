"""`encode_triton` against `fmt.encode`: every PackedState field bit-identical (interpreter on CPU)."""

import pytest
import torch

from replayssm_eval.formats import PackedState, get_format, layout, rounding
from replayssm_eval.formats import triton as formats_triton
from replayssm_eval.formats.codec import packed_codec
from replayssm_eval.formats.triton import encode_triton, head_amax
from replayssm_eval.replay import state as state_mod
from replayssm_eval.replay.state import feedback_copies
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.keys import READ_COPY, sr_keys, state_random_bits

from tests.helpers.nvfp4 import tie_rows

ELEMENTWISE = ["fp32", "bf16", "fp16", "fp16sr", "fp16sr:words=pair,bits=7"]
FP8 = [f"{base}:scale={scale}" for base in ("fp8", "fp8sr", "fp8e5m2") for scale in ("row", "head", "tensor", "none")] + [
    "fp8:scale=head,max=240", "fp8sr:max=240", "fp8sr:scale=head,bits=20"]
NVFP4 = [f"nvfp4:scale={scale}" for scale in ("tensor", "head", "row")] + ["nvfp4:scale=row,ef=bf16"]
INT = ["int8", "int16:scale=head", "int8sr:scale=tensor", "int16sr", "int8:scale=none", "int16sr:rounds=7,bits=32"]
MUL = ["int16:order=mul", "int8sr:scale=head,order=mul", "fp8:scale=tensor,order=mul", "int16:scale=none,order=mul"]
FEEDBACK = ["fp16sr:ef=fp32", "int8sr:scale=head,ef=bf16", "fp8:ef=fp32"]  # the inner format's layout, under its name
# scale tiles: edge tiles shorter, tiles taller than the head
TILE = ["fp8:scale=tile:32x0,max=240", "int8sr:scale=block:32,words=quad", "int8:scale=tile:3x5",
        "int16sr:scale=tile:2x0", "fp8sr:scale=block:8,order=mul", "int16:scale=tile:0x1,order=mul",
        "fp8e5m2:scale=tile:4x16", "int8:scale=block:16,ef=bf16"]
MX = ["mx8", "mx8sr", "mx8sr:bits=12,rounds=7", "mx8sr:ef=bf16", "mxfp8", "mxfp4", "mxfp4:ef=fp32"]  # block exponents
# one Philox call per 2 or 4 elements of a row (rows of 33 and 20: a last partial group)
WORDS = ["int16sr:words=quad", "fp8sr:scale=head,words=duo", "int8sr:scale=tensor,order=mul,words=quad",
         "mx8sr:words=quad", "int16sr:words=duo,ef=bf16"]
DUAL = ["dualaxis", "dualaxis:axis=dstate,width=3", "dualaxis:width=8", "dualaxis:width=5,ef=bf16"]  # a head a program
# codes along head_dim: the oriented rows read in place
ORIENTED = ["int16:axis=headdim", "int8sr:axis=headdim,bits=8,words=quad", "fp8:axis=headdim,scale=block:16",
            "fp8sr:axis=headdim,scale=head", "int8:axis=headdim,scale=tile:3x5,order=mul",
            "fp8e5m2:axis=headdim,scale=tensor", "int16sr:axis=headdim,scale=none", "nvfp4:axis=headdim",
            "nvfp4:axis=headdim,scale=row", "mx8sr:axis=headdim", "mxfp8:axis=headdim", "mxfp4:axis=headdim"]
ROWCOL = ["nvfp4:scale=rowcol", "int8sr:scale=rowcol", "fp8sr:scale=rowcol,bits=8", "int16:scale=rowcol,order=mul",
          "nvfp4:axis=headdim,scale=rowcol", "fp8:axis=headdim,scale=rowcol,ef=fp32"]  # torch's column factors
# rotated by torch before the launch, the decoded copy rotated back in the kernel
ROTATED = ["fp16:rot=hadamard:16", "fp16sr:words=pair,rot=hadamard:4", "int8:scale=block:32,rot=hadamard:16",
           "nvfp4:rot=hadamard:16", "mx8sr:rot=hadamard:8", "fp8:scale=tensor,rot=hadamard:2",
           "mxfp4:rot=hadamard:16,ef=fp32", "int8sr:axis=headdim,scale=head,rot=hadamard:4",
           "int8:axis=headdim,scale=block:8,rot=hadamard:8", "nvfp4:axis=headdim,scale=rowcol,rot=hadamard:8",
           "dualaxis:rot=hadamard:4", "dualaxis:axis=dstate,rot=hadamard:16,ef=bf16"]
SHAPES = {"nvfp4": [(3, 5, 48), (2, 3, 40)], "other": [(3, 5, 33), (1, 7, 20)],
          "tile": [(3, 5, 33), (2, 40, 24), (1, 6, 64)],
          "rotated": [(3, 8, 48), (1, 32, 32)]}  # (H, P, N) per sequence; rotated: runs of 16 along N, of 8 along P


def _ties_fp(h, p, n, g):
    """Values on the midpoints of the FP16, BF16, E4M3 and E5M2 grids; amax 448 in every row (FP8 scale 1)."""
    ties = torch.tensor([1 + 2**-11, 1 + 2**-8, 1.0625, 17.0, 1.125, 144.0, 2**-10 + 2**-11, 2**-17, 2**-25, 0.0])
    x = ties[torch.randint(0, len(ties), (h, p, n), generator=g)]
    x = x * torch.where(torch.rand(h, p, n, generator=g) < 0.5, -1.0, 1.0)
    x[..., 0] = 448.0
    return x


def _ties_nvfp4(h, p, n, g):
    """NVFP4 blocks k * {6, E2M1 midpoints}, k on the E4M3 grid (subnormal ones too); amax 2688 in every row."""
    mids = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0, 0.0])
    ks = torch.tensor([448.0, 3 * 2.0**-9, 2.0**-9, 5 * 2.0**-8, 0.5, 1.0, 1.5, 2.0**-7, 26.0])
    x = torch.zeros(h, p, n)
    for b0 in range(0, n, 16):
        k = ks[torch.randint(0, len(ks), (h, p, 1), generator=g)]
        width = min(16, n - b0)
        x[..., b0:b0 + width] = k * mids[torch.randint(0, len(mids), (h, p, width), generator=g)]
        x[..., b0] = k[..., 0] * 6.0
    x[..., 0] = 2688.0
    return x


def _states(hpn, seed=0):
    """[6, H, P, N]: two random states over wide exponent ranges, one with zeros, subnormals and huge
    values, the FP tie state, the NVFP4 tie state, and an all-zero state."""
    g = torch.Generator().manual_seed(seed)
    h, p, n = hpn
    rand = [torch.randn(hpn, generator=g) * torch.exp2(torch.randint(-30, 30, hpn, generator=g).float())
            for _ in range(3)]
    odd = rand[2].view(-1)
    odd[:7] = 0.0
    odd[7], odd[8], odd[9], odd[10] = 2.0**-140, -70000.0, 3e38, -1e-30
    rand[2][0, 0, :] = 0.0  # an all-zero row
    if p > 1:
        rand[2][0, 1, :] = 1e-39  # a row of FP32 subnormals
    return torch.stack([rand[0], rand[1], rand[2], _ties_fp(h, p, n, g), _ties_nvfp4(h, p, n, g), torch.zeros(hpn)])


def _field_equal(name, a, b):
    if a is None or b is None:
        assert a is None and b is None, f"{name}: {a is None} vs {b is None}"
        return
    assert a.dtype == b.dtype and a.shape == b.shape, f"{name}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    assert a.is_contiguous()  # torch's elementwise encode keeps a transposed input's strides; values must match
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    bad = a.view(view) != b.view(view)
    assert not bad.any(), f"{name}: {int(bad.sum())} of {a.numel()} differ, e.g. {a[bad][:4]} vs {b[bad][:4]}"


def packed_equal(got, want):
    assert got.format == want.format and got.shape == want.shape
    for name in PackedState.FIELDS:
        _field_equal(name, getattr(got, name).cpu() if getattr(got, name) is not None else None, getattr(want, name))


def _keys(fmt, n_seq, layer=3):
    seq_ids = torch.tensor([5, 0, 2**40 + 3, 17, 2, 9, 11][:n_seq])
    keys = sr_keys(1234, layer, seq_ids, READ_COPY)
    checkpoints = [torch.tensor([0, 1, 2**20 + 7, 3, 2**31 + 5, 64][:n_seq]),
                   torch.tensor([9, 0, 4, 2**33, 1, 2][:n_seq])]
    return keys, (checkpoints if fmt.is_stochastic else checkpoints[:1])


def _reference(fmt, x, keys, checkpoint):
    """The torch encode a flush does today (`replay.state._encode`), for states x [..., H, P, N]."""
    if not fmt.is_stochastic:
        return fmt.encode(x)
    return fmt.encode(x, random_bits=state_random_bits(keys, checkpoint, x.shape[-3:], fmt.lane_words).reshape(x.shape))


def _check(spec, hpn, device, fmt=None):
    """Every field of `encode_triton` and the decoded copy its launch writes against `fmt.encode` and `fmt.decode`."""
    fmt = fmt or get_format(spec)
    x = _states(hpn)
    keys, checkpoints = _keys(fmt, x.shape[0])
    for checkpoint in checkpoints:
        want = _reference(fmt, x, keys, checkpoint)
        decoded = torch.empty(x.shape, device=device)
        got = encode_triton(x.to(device), fmt, keys.to(device), checkpoint.to(device), decoded=decoded)
        packed_equal(got, want)
        assert torch.equal(decoded.cpu().view(torch.int32), fmt.decode(want).view(torch.int32))


@pytest.mark.parametrize("hpn", SHAPES["other"], ids=str)
@pytest.mark.parametrize("spec", ELEMENTWISE + FP8 + INT + MUL + FEEDBACK + MX + DUAL + WORDS)
def test_encode_triton_bit_exact(spec, hpn, device):
    _check(spec, hpn, device)


@pytest.mark.parametrize("hpn", SHAPES["tile"], ids=str)
@pytest.mark.parametrize("spec", TILE)
def test_encode_triton_scale_tiles_bit_exact(spec, hpn, device):
    """Scale tiles (the tile maxima reduced by torch, each tile's scale stored by its first element): heads of 40
    rows under 32-row tiles, 33 columns under blocks of 32 and 8, tiles of 3 x 5; blocks that divide the row (their
    maxima from a max and a min of a view) and that do not."""
    _check(spec, hpn, device)


@pytest.mark.parametrize("hpn", SHAPES["nvfp4"], ids=str)
@pytest.mark.parametrize("spec", NVFP4)
def test_encode_triton_nvfp4_bit_exact(spec, hpn, device):
    _check(spec, hpn, device)


@pytest.mark.parametrize("hpn", SHAPES["other"], ids=str)
@pytest.mark.parametrize("spec", ORIENTED + ROWCOL)
def test_encode_triton_head_dim_codes_and_column_factors_bit_exact(spec, hpn, device):
    """Codes along head_dim (element codes and decoded values in the state's layout, packed rows and scales in the
    oriented one), and scale=rowcol's column factors, on heads whose 33 and 20 columns and 5 and 7 rows pad every
    block."""
    _check(spec, hpn, device)


@pytest.mark.parametrize("hpn", SHAPES["rotated"], ids=str)
@pytest.mark.parametrize("spec", ROTATED)
def test_encode_triton_rotated_bit_exact(spec, hpn, device):
    """`rot=hadamard:N` along either axis: the packed fields of the rotated state, and the decoded copy rotated back
    in the kernel, bit for bit torch's FP64 rotation."""
    _check(spec, hpn, device)


def test_encode_triton_modelopt_preset_bit_exact(device):
    """ModelOpt's INT8 state: blocks of 32 along head_dim rotated by H_32 (a 32-row head)."""
    fmt = ReplayConfig.parse("modelopt:int8-hadamard").read_format
    _check(fmt.name, (2, 32, 24), device, fmt)


@pytest.mark.parametrize("spec", ["fp16sr", "fp8sr:scale=head", "nvfp4:scale=row", "fp8e5m2:scale=tensor",
                                  "int8sr:axis=headdim,scale=head", "nvfp4:scale=rowcol", "fp8:rot=hadamard:8"])
def test_encode_triton_lead_shapes(spec, device):
    """States without a batch dim ([H, P, N]) and with two leading dims."""
    fmt = get_format(spec)
    x = _states((2, 3, 32), seed=4)
    for xs in (x[0], x[:4].reshape(2, 2, 2, 3, 32)):
        n_seq = xs[..., 0, 0, 0].numel()
        keys, (checkpoint, *_) = _keys(fmt, n_seq)
        want = _reference(fmt, xs, keys, checkpoint)
        packed_equal(encode_triton(xs.to(device), fmt, keys.to(device), checkpoint.to(device)), want)


@pytest.mark.parametrize("spec", ["int8", "int16:scale=head"])
def test_encode_triton_int_ties_and_saturation(spec, device):
    """Scale 1 (every row's amax is qmax) and half-integer elements: the codes break ties to even; with scale=none,
    elements beyond +-qmax saturate."""
    fmt = get_format(spec)
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-fmt.qmax, fmt.qmax, (3, 2, 5, 33), generator=g).float() + 0.5  # [B, H, P, N]
    x[..., 0] = fmt.qmax * torch.where(torch.rand(3, 2, 5, generator=g) < 0.5, -1.0, 1.0)
    want = fmt.encode(x)
    assert torch.equal(want.global_scale, torch.ones_like(want.global_scale))
    assert torch.equal(want.data[..., 1:].float() % 2, torch.zeros(3, 2, 5, 32))  # ties to even
    packed_equal(encode_triton(x.to(device), fmt), want)
    plain = get_format(fmt.base + ":scale=none")
    want = plain.encode(x * 3)
    assert (want.data.float().abs() == fmt.qmax).any()
    packed_equal(encode_triton((x * 3).to(device), plain), want)


@pytest.mark.parametrize("spec", ["fp32", "bf16", "fp16sr", "fp8:scale=head", "nvfp4:scale=row",
                                  "int8:axis=headdim,scale=block:4", "mx8sr:rot=hadamard:8"])
def test_encode_triton_transposed_input(spec, device):
    """GDN hands its [B, HV, K, V] state over transposed: a non-contiguous [B, H, P, N] view."""
    fmt = get_format(spec)
    x = _states((2, 32, 5), seed=6).transpose(-1, -2)  # [6, 2, 5, 32], strided
    keys, (checkpoint, *_) = _keys(fmt, x.shape[0])
    want = _reference(fmt, x, keys, checkpoint)
    packed_equal(encode_triton(x.to(device), fmt, keys.to(device), checkpoint.to(device)), want)


IN_PLACE = ["fp32", "bf16", "fp16sr", "fp8sr:scale=head", "fp8:scale=row", "fp8e5m2:scale=none", "nvfp4:scale=head",
            "nvfp4:scale=row", "int16sr:scale=head", "int16:order=mul", "dualaxis", "dualaxis:axis=dstate,width=3",
            "fp8:scale=tile:2x0,max=240", "int8sr:scale=block:16", "mx8sr", "mxfp4", "int8sr:axis=headdim,scale=head",
            "nvfp4:axis=headdim,scale=rowcol", "int8:scale=block:16,rot=hadamard:8",
            "dualaxis:axis=dstate,rot=hadamard:4", "nvfp4:scale=tensor",
            "int8sr:scale=tensor,order=mul"]  # a tensor scale spans one state


@pytest.mark.parametrize("spec", IN_PLACE)
def test_encode_triton_in_place_rounds_the_taken_states_only(spec, device):
    """take/out/decoded (a flush of some rows): taken states get `fmt.encode` and `fmt.decode` of it bit for bit,
    the others keep every field and decoded value they had."""
    _check_in_place(spec, device)


@pytest.mark.parametrize("spec", ["nvfp4:scale=head", "fp16sr", "int16sr:scale=head"])
def test_encode_triton_take_with_fewer_programs_than_taken_states(spec, device, monkeypatch):
    """Two programs per row block for four taken states (`TAKE_SLOTS`): each encodes two of them in turn."""
    monkeypatch.setattr(formats_triton, "TAKE_SLOTS", 2)
    _check_in_place(spec, device)


def _check_in_place(spec, device):
    fmt = get_format(spec)
    x, old_x = _states((2, 3, 32), seed=8), _states((2, 3, 32), seed=9)
    keys, (checkpoint, *_) = _keys(fmt, x.shape[0])
    want, old = _reference(fmt, x, keys, checkpoint), _reference(fmt, old_x, keys, checkpoint)
    take = torch.tensor([True, False, True, True, False, True])
    for rows in (take, None):
        out = PackedState(old.format, old.shape, *(None if t is None else t.clone().to(device) for t in old.tensors()))
        decoded = fmt.decode(old).to(device).contiguous()
        got = encode_triton(x.to(device), fmt, keys.to(device), checkpoint.to(device),
                               take=None if rows is None else rows.to(device), out=out, decoded=decoded)
        assert got.data is out.data
        sel = torch.ones(6, dtype=torch.bool) if rows is None else rows
        for name in PackedState.FIELDS:
            field = getattr(got, name)
            if field is not None:
                expected = torch.where(sel.view(-1, *[1] * (field.dim() - 1)), getattr(want, name), getattr(old, name))
                _field_equal(name, field.cpu(), expected)
        expected = torch.where(sel.view(-1, 1, 1, 1), fmt.decode(want), fmt.decode(old))
        assert torch.equal(decoded.cpu().view(torch.int32), expected.view(torch.int32))


def test_encode_triton_in_place_refuses_a_wrong_target(device):
    fmt = get_format("fp16")
    x = torch.randn(2, 2, 3, 32, device=device)
    with pytest.raises(ValueError, match=r"decoded must be a contiguous torch.float32 \[2, 2, 3, 32\].*float16"):
        encode_triton(x, fmt, decoded=torch.zeros(2, 2, 3, 32, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="data must be a contiguous torch.float16"):
        encode_triton(x, fmt, out=PackedState("fp16", (2, 2, 3, 32), torch.zeros(2, 2, 3, 31, device=device)))


def _nan_canonical(packed):
    """Fields with NaN payloads and signs erased (those differ between backends and torch's casts)."""
    out = []
    for t in packed.tensors():
        if t is None:
            out.append(None)
        elif t.dtype == torch.uint8:
            t = t.cpu()
            out.append(torch.where((t & 0x7F) == 0x7F, 0x7F, t) if packed.format[:3] in ("fp8", "nvf", "mxf") else t)
        else:
            t = t.cpu().float()
            out.append(torch.where(t.isnan(), float("nan"), t).nan_to_num(nan=1234.5))
    return out


@pytest.mark.parametrize("spec", ELEMENTWISE + FP8 + NVFP4 + INT + MUL + DUAL + TILE + MX + ORIENTED + ROWCOL + ROTATED)
def test_encode_triton_non_finite(spec, device):
    fmt = get_format(spec)
    x = torch.randn(3, 2, 8, 32, generator=torch.Generator().manual_seed(7))
    x[0, 0, 1, 4], x[0, 1, 2, 9] = float("nan"), float("inf")
    x[1, 1, 0, 20], x[2, 0, 0, 3] = -float("inf"), -float("nan")
    keys, (checkpoint, *_) = _keys(fmt, 3)
    want = _reference(fmt, x, keys, checkpoint)
    got = encode_triton(x.to(device), fmt, keys.to(device), checkpoint.to(device))
    for a, b in zip(_nan_canonical(got), _nan_canonical(want)):
        assert (a is None and b is None) or torch.equal(a, b)


def test_encode_triton_rejects(device):
    x = torch.randn(2, 2, 3, 32, device=device)
    with pytest.raises(NotImplementedError, match="does not cover format 'fp16': it has no `kernel_codec`"):
        encode_triton(x, _NoCodec())
    with pytest.raises(ValueError, match=r"rot=hadamard:4 needs the headdim dim \(3\) to be a multiple of 4"):
        encode_triton(x, get_format("int8:axis=headdim,rot=hadamard:4"))
    with pytest.raises(ValueError, match="keys"):
        encode_triton(x, get_format("fp8sr"))
    with pytest.raises(ValueError, match="2 entries"):
        encode_triton(x, get_format("fp16sr"), torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
    # what the step kernels decode packed; they read the others as the decoded FP32 copy the encoder writes
    for spec in ("fp8:max=240", "nvfp4:scale=row", "int16sr:scale=head", "fp16sr:words=pair"):
        assert packed_codec(get_format(spec)) is not None
    for spec in ("dualaxis", "fp8:scale=tile:32x0,max=240", "mx8sr", "mxfp4", "int8:axis=headdim", "nvfp4:scale=rowcol",
                 "fp16:rot=hadamard:4"):
        assert packed_codec(get_format(spec)) is None


class _NoCodec(type(get_format("fp16"))):
    """A format the kernels leave to torch (a user's format without a kernel codec)."""

    @property
    def kernel_codec(self):
        return None

    def __init__(self):
        super().__init__("fp16")


@pytest.mark.parametrize("recur, read, shared", [
    ("fp16sr", "nvfp4:scale=head", False), ("fp32", "fp8sr", False), ("bf16", "mxfp4", False),
    ("fp8sr:scale=tensor", "nvfp4:axis=headdim", False), ("int16sr:scale=head", "int16sr:scale=head", True)])
def test_write_checkpoint_packed_triton_path(recur, read, shared, device, monkeypatch):
    """The CUDA dispatch of `write_checkpoint_packed` on the device (forced on CPU): same (S_hi, S_lo, lo_packed) as
    torch on CPU; `write_read_copy_packed` (the encoder's launch decoding S_lo too) the same (S_lo, lo_packed)."""
    cfg = ReplayConfig(read=read, recur=recur, shared=shared, seed=99)
    x = _states((2, 3, 32), seed=5)
    seq_ids, checkpoint = torch.arange(6) * 7 + 1, torch.tensor([0, 3, 1, 2**21, 5, 8])
    want = state_mod.write_checkpoint_packed(x, cfg, 2, seq_ids, checkpoint)
    monkeypatch.setattr(state_mod, "_use_triton", lambda state, fmt: packed_codec(fmt) is not None)
    on_device = (x.to(device), cfg, 2, seq_ids.to(device), checkpoint.to(device))
    got = state_mod.write_checkpoint_packed(*on_device)
    lo, lo_packed = state_mod.write_read_copy_packed(*on_device)
    for a, b in zip((*got[:2], lo), (*want[:2], want[1])):
        assert torch.equal(a.cpu().view(torch.int32), b.view(torch.int32))
    packed_equal(got[2], want[2])
    packed_equal(lo_packed, want[2])


def test_write_checkpoint_packed_triton_path_with_feedback(device, monkeypatch):
    """With error feedback the encoder rounds state + residual in the inner format's layout: the same (S_hi, S_lo,
    lo_packed) and new residuals as torch on CPU, from non-zero residuals."""
    cfg = ReplayConfig(read="nvfp4:scale=head,ef=bf16", recur="int8sr:ef=fp32", shared=False, seed=99)
    x = _states((2, 3, 32), seed=5)
    seq_ids, checkpoint = torch.arange(6) * 7 + 1, torch.tensor([0, 3, 1, 2**21, 5, 8])
    gen = torch.Generator().manual_seed(2)
    start = {copy: 1e-2 * torch.randn(x.shape, generator=gen) for copy in feedback_copies(cfg)}
    want_residual = {copy: t.clone() for copy, t in start.items()}
    want = state_mod.write_checkpoint_packed(x, cfg, 2, seq_ids, checkpoint, want_residual)
    monkeypatch.setattr(state_mod, "_use_triton", lambda state, fmt: packed_codec(fmt) is not None)
    residual = {copy: t.to(device) for copy, t in start.items()}
    got = state_mod.write_checkpoint_packed(x.to(device), cfg, 2, seq_ids.to(device), checkpoint.to(device), residual)
    for a, b in zip((*got[:2], *residual.values()), (*want[:2], *want_residual.values())):
        assert torch.equal(a.cpu().view(torch.int32), b.view(torch.int32))
    packed_equal(got[2], want[2])
    assert not torch.equal(want_residual[READ_COPY], start[READ_COPY])


def test_encode_triton_nvfp4_order_of_operations(device):
    """The kernel's block scales on the golden E4M3 tie rows (test_nvfp4's order-of-operations rows)."""
    x, scales = tie_rows()
    assert torch.equal(encode_triton(x.to(device), get_format("nvfp4")).scales.cpu().view(64, 2), scales)


def test_head_amax_equals_torch_on_the_taken_heads_nan_and_inf_included(device):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 3, 7, 37, generator=g) * torch.logspace(-30, 30, 37)
    x[1, 2, 3, 4] = float("nan")
    x[2] = 0.0
    x[3, 1, 0, 0] = -float("inf")
    x[4, 0, 6, 36] = -1e38
    x = x.to(device)
    expected = x.abs().amax(dim=(2, 3)).reshape(-1).cpu()  # [B * H]
    assert expected.isnan().sum() == 1 and expected.isinf().sum() == 1
    assert torch.equal(head_amax(x).cpu().nan_to_num(nan=-1.0), expected.nan_to_num(nan=-1.0))
    take = torch.tensor([True, False, False, True, True], device=device)
    taken = take.cpu().repeat_interleave(3)
    got = head_amax(x, take).cpu()
    assert torch.equal(got[taken].nan_to_num(nan=-1.0), expected[taken].nan_to_num(nan=-1.0))
    x[0, 1] = float("nan")  # an all-NaN head: -FLT_MAX where the maximum skips NaN (order=mul)
    skipping = layout.group_amax(x, "head", skip_nan=True).reshape(-1).cpu()
    assert skipping[1] == -rounding.FLT_MAX and not skipping.isnan().any()
    assert torch.equal(head_amax(x, skip_nan=True).cpu(), skipping)
