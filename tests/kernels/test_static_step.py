"""The static decode step equals `decode_step_triton` bit for bit: outputs, both stored copies, the packed
read copy, the ring buffer, window phases and checkpoint indices, across flushes, with rows at different
phases (the "some rows fold" variant) and in phase (the "every row folds" variant); and a "some" step gives each
row the bits of a step of the rows that share its fold (a "none" or an "all" step).

Runs in the Triton interpreter on CPU (tiny sizes). Device keys are checked against `sr_keys`.
"""

import dataclasses

import pytest
import torch

from replayssm_eval.formats import PackedState
from replayssm_eval.kernels.gdn import triton_step as gdn_step
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.device_keys import sr_keys_device
from replayssm_eval.replay.keys import sr_keys
from replayssm_eval.replay.state import ReplayState, feedback_copies
from replayssm_eval.kernels.static_step import StaticState, check_static_config, check_static_family, folds_of
from replayssm_eval.kernels.step_variants import step_launches, step_variant

CONFIGS = ("fp32", "nvfp4/fp16sr@4", "shared:nvfp4@4", "nvfp4/fp8sr@3", "shared:fp8sr@4", "nvfp4/fp16sr@3#buf=bf16",
           "nvfp4/fp32@3", "nvfp4:scale=tensor/fp16sr@3", "int8/int16sr:scale=head@3",
           "shared:fp16sr:words=octet,cvt=soft@3",
           "int8:ef=fp32/fp16sr:ef=bf16@3",  # error feedback: each copy's residual, rounded with its fold
           "stepquant:dualaxis6",  # dual-axis factors: one encoder program per head, read decoded
           "fp8:scale=tile:2x0,max=240/int8sr:scale=block:16@2",  # scale tiles: the encoder's, read decoded
           "mx8sr/mx8@3",  # Pimba's MX8: the encoder's bytes, read decoded
           "int8:axis=headdim,scale=block:4,rot=hadamard:8/nvfp4:scale=rowcol@2")  # oriented, rotated; column factors
STEPS = 7
SEQ_IDS = torch.tensor([5, 2**62 + 77, 123456789, 31, 2**40 + 3], dtype=torch.int64)


@pytest.mark.parametrize("seed", [0, 9, 2**63 - 1])
def test_device_keys_equal_host_keys(seed):
    seq = torch.tensor([0, 1, 2**62 + 12345, 2**63 - 1, 987654321], dtype=torch.int64)
    for layer in (0, 3, 47):
        for copy in (0, 1):
            assert torch.equal(sr_keys_device(seed, layer, seq, copy), sr_keys(seed, layer, seq, copy))


def test_speculative_config_is_refused():
    with pytest.raises(ValueError, match="fixed windows only"):
        check_static_config(ReplayConfig.parse("nvfp4/fp16sr#spec=4:0.5"))


def test_an_unknown_family_is_refused():
    check_static_family("kda")
    with pytest.raises(ValueError, match="unknown kernel family 'rwkv7'; known: mamba2, gdn, kda"):
        check_static_family("rwkv7")


def _at_phases(state, window, phased):
    """state with rows at phases 0, 1, 2 (mod the window): rows flush at different steps; or all at phase 1."""
    count = torch.arange(state.batch, dtype=torch.int64, device=state.hi.device) if phased else torch.ones(
        state.batch, dtype=torch.int64, device=state.hi.device)
    return dataclasses.replace(state, schedule=dataclasses.replace(state.schedule, count=count % window))


def test_step_variants_follow_the_rows_that_fold():
    assert [folds_of(c, 4) for c in ([0, 1, 2], [3, 1], [3, 3], [])] == ["none", "some", "all", "none"]
    assert folds_of([0, 0], 1) == "all"
    assert [step_variant(torch.tensor(f)) for f in ([False, False], [True, False], [True, True])] == ["none", "some",
                                                                                                   "all"]
    assert step_launches("some") == ((False, True), (True, True))  # a reading and a folding launch, each split
    with pytest.raises(ValueError, match="unknown step variant 'few'; known: none, some, all"):
        step_launches("few")


def _assert_same(static: StaticState, ref, config):
    assert torch.equal(static.hi, ref.hi)
    assert torch.equal(static.lo, ref.lo)
    assert torch.equal(static.count, ref.schedule.count)
    assert torch.equal(static.checkpoint, ref.checkpoint)
    assert static.residual.keys() == ref.residual.keys() == set(feedback_copies(config))
    for copy, t in ref.residual.items():
        assert torch.equal(static.residual[copy], t), f"residual {copy}"
    for name in ref.buffer:
        assert torch.equal(static.buffer[name], ref.buffer[name]), name
    for name in PackedState.FIELDS:
        a, b = getattr(static.packed, name), getattr(ref.lo_packed, name)
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), name


def _cases(configs, slow=()):
    """Each config with rows out of phase, and in phase (every row folds together): slow but for a split and a
    shared config (L = 1 configs are the same either way), and the configs in `slow` either way."""
    quick = ("nvfp4/fp16sr@4", "shared:fp8sr@4")
    return [pytest.param(c, phased, id=f"{c}-{'phased' if phased else 'in-phase'}",
                         marks=() if (phased or c in quick) and c not in slow else pytest.mark.slow)
            for c in configs for phased in (True, False)]


def _run(family, config, make_inputs, decode, first_state, phased=True):
    """Eager steps from `first_state` vs the static step on a copy of it; compare after every step."""
    cfg = ReplayConfig.parse(config)
    ref = _at_phases(first_state, cfg.window, phased)
    static = StaticState.from_replay_state(family, ref, ref.lo_packed, cfg, ref.schedule.count.tolist())
    folds, variants = 0, set()
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        inputs = make_inputs(gen)
        folds += int((ref.schedule.count == cfg.window - 1).sum())
        y_ref, ref = decode(inputs, ref, cfg)
        variants.add(static.folds_next)
        y = static.step(tuple(t.contiguous() for t in inputs), static.folds_next)
        assert torch.equal(y, y_ref)
        _assert_same(static, ref, cfg)
        assert static.host_count == ref.schedule.count.tolist()
    assert folds >= (STEPS * 3 // cfg.window) - 1  # several flushes, at different steps per row
    if cfg.window == 1:
        assert variants == {"all"}
    else:  # rows at different phases never fold together; rows in phase always do
        assert ("some" in variants, "all" in variants) == (phased, not phased)


def _mamba2(config, device, b=3, h=4, p=8, g=2, n=16):
    """(make, decode, first state) of a Mamba-2 layer of these sizes: token inputs, the eager step, the state after
    one eager step from a random FP32 state."""
    from replayssm_eval.kernels.mamba2.triton_step import decode_step_triton

    gen = torch.Generator().manual_seed(0)
    A = -torch.rand(h, generator=gen) - 0.5
    D = torch.randn(h, generator=gen)

    def make(gen):
        made = (torch.randn(b, 1, h, p, generator=gen), torch.rand(b, 1, h, generator=gen) * 0.5, A,
                torch.randn(b, 1, g, n, generator=gen), torch.randn(b, 1, g, n, generator=gen), D)
        return tuple(t.to(device) for t in made)

    def decode(inputs, state, cfg):
        x, dt, A_, B, C, D_ = inputs
        y, state = decode_step_triton(x[:, 0], dt[:, 0], A_, B[:, 0], C[:, 0], D_, state, cfg, layer_idx=3,
                                      seq_ids=SEQ_IDS[:b].to(device))
        return y[:, None], state

    _, first = decode(make(gen), torch.randn(b, h, p, n, generator=gen).to(device), ReplayConfig.parse(config))
    return make, decode, first


# CI time: these five as GDN's in the quick tier (Mamba-2's in the full suite)
@pytest.mark.parametrize("config,phased", _cases(CONFIGS, slow=("nvfp4/fp16sr@3#buf=bf16", "nvfp4/fp32@3",
                                                               "nvfp4:scale=tensor/fp16sr@3", "stepquant:dualaxis6",
                                                               "mx8sr/mx8@3")))
def test_mamba2_static_step_equals_decode_step_triton(config, phased, device):
    _run("mamba2", config, *_mamba2(config, device), phased)


CLOSED = ("nvfp4/fp16sr@4#closed", "shared:fp16@3#closed#buf=fp16")


def _gdn(config, device, b=3, h=1, hv=2, k=16, v=8):
    """(make, decode, first state) of a GDN layer of these sizes, as `_mamba2`."""
    from replayssm_eval.kernels.gdn import decode_step_triton

    gen = torch.Generator().manual_seed(0)

    def make(gen):
        q = torch.nn.functional.normalize(torch.randn(b, 1, h, k, generator=gen), dim=-1)
        kk = torch.nn.functional.normalize(torch.randn(b, 1, h, k, generator=gen), dim=-1)
        made = (q, kk, torch.randn(b, 1, hv, v, generator=gen), -torch.rand(b, 1, hv, generator=gen),
                torch.rand(b, 1, hv, generator=gen))
        return tuple(t.to(device) for t in made)

    def decode(inputs, state, cfg):
        return decode_step_triton(*inputs, state, cfg, layer_idx=2, seq_ids=SEQ_IDS[:b].to(device))

    _, first = decode(make(gen), (torch.randn(b, hv, k, v, generator=gen) * 0.3).to(device), ReplayConfig.parse(config))
    return make, decode, first


@pytest.mark.parametrize("config,phased", _cases(CONFIGS + CLOSED))
def test_gdn_static_step_equals_decode_step_triton(config, phased, device):
    _run("gdn", config, *_gdn(config, device), phased)


def _kda_cases():
    """Every config at K != V and at K = V with grouped heads, out of phase and in phase; slow but for a split, a
    shared and a closed-fold config at K != V out of phase (the split one in phase too)."""
    quick = {("nvfp4/fp16sr@4", "K16V8"), ("shared:fp8sr@4", "K16V8"), ("nvfp4/fp16sr@4#closed", "K16V8")}
    shapes = {"K16V8": dict(h=1, hv=2, k=16, v=8), "K16V16": dict(h=2, hv=4, k=16, v=16)}
    return [pytest.param(c, phased, dims, id=f"{c}-{'phased' if phased else 'in-phase'}-{name}",
                         marks=() if (c, name) in quick and (phased or (c, name) == ("nvfp4/fp16sr@4", "K16V8"))
                         else pytest.mark.slow)
            for name, dims in shapes.items() for c in CONFIGS + CLOSED for phased in (True, False)]


def _kda(config, device, b=3, h=1, hv=2, k=16, v=8):
    """(make, decode, first state) of a KDA layer of these sizes, as `_mamba2`."""
    from replayssm_eval.kernels.kda import decode_step_triton

    gen = torch.Generator().manual_seed(0)
    rate = torch.logspace(-2, 0.5, hv * k)[torch.randperm(hv * k, generator=gen)].view(hv, k)  # [HV, K] shuffled rates

    def make(gen):
        q = torch.nn.functional.normalize(torch.randn(b, 1, h, k, generator=gen), dim=-1) * k ** -0.5
        kk = torch.nn.functional.normalize(torch.randn(b, 1, h, k, generator=gen), dim=-1)
        g = -rate * torch.rand(b, 1, hv, k, generator=gen)  # [B, 1, HV, K] log decays, channels 300x apart in rate
        made = (q, kk, torch.randn(b, 1, hv, v, generator=gen), g, torch.rand(b, 1, hv, generator=gen))
        return tuple(t.to(device) for t in made)

    def decode(inputs, state, cfg):
        return decode_step_triton(*inputs, state, cfg, layer_idx=4, seq_ids=SEQ_IDS[:b].to(device))

    _, first = decode(make(gen), (torch.randn(b, hv, k, v, generator=gen) * 0.3).to(device), ReplayConfig.parse(config))
    return make, decode, first


@pytest.mark.parametrize("config,phased,dims", _kda_cases())
def test_kda_static_step_equals_decode_step_triton(config, phased, dims, device):
    _run("kda", config, *_kda(config, device, **dims), phased)


@pytest.mark.parametrize("family, config", [
    (family, config) if family == "gdn" else pytest.param(family, config, marks=pytest.mark.slow)  # KDA's: the full suite
    for family in ("gdn", "kda")
    for config in ("nvfp4/fp16sr@4", "int8/int16sr:scale=head@3", "shared:nvfp4:scale=row@4")])
def test_heads_of_several_programs_equal_decode_step_triton(family, config, device):
    """Heads of 40 v rows, folded by three programs of 16 rows each: a head scale's amax spans the programs' folds."""
    setup = {"gdn": _gdn, "kda": _kda}[family]
    _run(family, config, *setup(config, device, b=3, h=1, hv=2, k=16, v=40))


AWKWARD = {"mamba2": (_mamba2, dict(b=5, h=3, p=7, g=1, n=12)), "gdn": (_gdn, dict(b=5, h=1, hv=3, k=12, v=7)),
           "kda": (_kda, dict(b=5, h=1, hv=3, k=12, v=7))}


@pytest.mark.parametrize("family", ["gdn", "mamba2", pytest.param("kda", marks=pytest.mark.slow)])
def test_some_steps_at_awkward_sizes_equal_decode_step_triton(family, device):
    """Five rows at four window phases, odd head dims: every step is a "some" step, rows folding at different steps."""
    setup, dims = AWKWARD[family]
    _run(family, "nvfp4/fp16sr@4", *setup("nvfp4/fp16sr@4", device, **dims))


def _rows(static: StaticState, rows: list[int]) -> StaticState:
    """Rows `rows` of a static state as a static state of their own (copies)."""
    st, index = static.replay_state(), torch.tensor(rows, device=static.hi.device)
    packed = PackedState(st.lo_packed.format, (len(rows), *st.lo_packed.shape[1:]),
                         *(None if t is None else t[index] for t in st.lo_packed.tensors()))
    sub = ReplayState(st.hi[index], st.lo[index], {k: v[index] for k, v in st.buffer.items()},
                      dataclasses.replace(st.schedule, count=st.schedule.count[index]),
                      st.checkpoint[index], st.seq_ids[index], st.layer,
                      residual={copy: t[index] for copy, t in st.residual.items()})
    return StaticState.from_replay_state(static.family, sub, packed, static.config,
                                         [static.host_count[i] for i in rows])


def _assert_rows(static: StaticState, sub: StaticState, rows: list[int]):
    index = torch.tensor(rows, device=static.hi.device)
    for name in ("hi", "lo", "count", "checkpoint"):
        assert torch.equal(getattr(static, name)[index], getattr(sub, name)), name
    for name, t in static.buffer.items():
        assert torch.equal(t[index], sub.buffer[name]), name
    for copy, t in static.residual.items():
        assert torch.equal(t[index], sub.residual[copy]), f"residual {copy}"
    for name in PackedState.FIELDS:
        a, b = getattr(static.packed, name), getattr(sub.packed, name)
        assert (a is None) == (b is None) and (a is None or torch.equal(a[index], b)), name


@pytest.mark.parametrize("family,config", [
    ("mamba2", "nvfp4/fp16sr@4"), ("gdn", "nvfp4/fp16sr@4"),
    pytest.param("kda", "nvfp4/fp16sr@4", marks=pytest.mark.slow),  # KDA's in the full suite
    pytest.param("mamba2", "nvfp4:scale=row/fp32@3#skip=0.2", marks=pytest.mark.slow),
    pytest.param("gdn", "nvfp4/fp8sr@3#closed", marks=pytest.mark.slow),
    pytest.param("gdn", "shared:nvfp4@4", marks=pytest.mark.slow),
    pytest.param("kda", "int8/int16sr:scale=head@3#closed", marks=pytest.mark.slow),
])
def test_some_step_gives_each_row_the_bits_of_its_own_variant(family, config, device):
    """A "some" step gives the rows that do not fold the bits of a step where no row folds, and the folding rows those
    of a step where every row folds: output, stored copies, packed read copy, ring, phase and checkpoint, each row
    stepped beside the rows that share its fold."""
    setup, dims = AWKWARD[family]
    make, _, first = setup(config, device, **dims)
    cfg = ReplayConfig.parse(config)
    ref = _at_phases(first, cfg.window, True)
    static = StaticState.from_replay_state(family, ref, ref.lo_packed, cfg, ref.schedule.count.tolist())
    gen = torch.Generator().manual_seed(1)
    for _ in range(cfg.window + 1):  # every row folds once, at its own step
        inputs = tuple(t.contiguous() for t in make(gen))
        folding = [c == cfg.window - 1 for c in static.host_count]
        parts = [(variant, [i for i, f in enumerate(folding) if f == want]) for variant, want in (("none", False),
                                                                                               ("all", True))]
        subs = [(variant, rows, _rows(static, rows)) for variant, rows in parts]
        assert static.folds_next == "some"
        y = static.step(inputs, "some")
        for variant, rows, sub in subs:
            index = torch.tensor(rows, device=device)
            assert sub.folds_next == variant
            y_sub = sub.step(tuple(t[index] if t.dim() > 1 else t for t in inputs), variant)
            assert torch.equal(y[index], y_sub), variant
            _assert_rows(static, sub, rows)


@pytest.mark.slow
def test_some_step_equals_one_folding_launch_over_every_row(device, monkeypatch):
    """With a read copy other than NVFP4 (whose codes the reading and the folding path sum in different orders), the
    split launches of a "some" step give the bits of one folding launch over every row, as the step ran before. GDN's
    whole-block fold still branches per row on whether it folds; Mamba-2's folding launch compiles for folding rows
    alone (`step_variants.read_hi_flags`), so `test_some_step_gives_each_row_the_bits_of_its_own_variant` is its
    check."""
    split = gdn_step.step_launches
    config = "int8/int16sr:scale=head@3"
    setup, dims = AWKWARD["gdn"]
    make, _, first = setup(config, device, **dims)
    cfg = ReplayConfig.parse(config)
    ref = _at_phases(first, cfg.window, True)
    new, old = (StaticState.from_replay_state("gdn", ref, ref.lo_packed, cfg, ref.schedule.count.tolist())
                for _ in range(2))
    gen = torch.Generator().manual_seed(1)
    for _ in range(cfg.window + 1):
        inputs = tuple(t.contiguous() for t in make(gen))
        y_new = new.step(inputs, "some")
        with monkeypatch.context() as m:
            m.setattr(gdn_step, "step_launches", lambda folds: ((True, False),) if folds == "some" else split(folds))
            y_old = old.step(inputs, "some")
        assert torch.equal(y_new, y_old)
        _assert_rows(new, old, list(range(dims["b"])))


def test_zero_rows_writes_the_chosen_rows_only(device):
    from replayssm_eval.kernels.delta.fixed_step import zero_rows_

    g = torch.Generator().manual_seed(2)
    for shape in ((6, 3, 5, 7), (3, 1, 2049)):  # a row of more than one block
        t = torch.randn(shape, generator=g).to(device)
        before = t.clone()
        rows = torch.tensor([1, 0, 1, 0, 0, 1][: shape[0]], dtype=torch.int8, device=device)
        zero_rows_(t, rows)
        chosen = rows.bool()
        assert torch.equal(t[chosen], torch.zeros_like(t[chosen]))
        assert torch.equal(t[~chosen], before[~chosen])


@pytest.mark.parametrize("family, config", [
    ("gdn", "nvfp4/fp16sr@4"), ("mamba2", "nvfp4/fp16sr@4"),
    pytest.param("kda", "nvfp4/fp16sr@4", marks=pytest.mark.slow),
    ("mamba2", "int8:ef=fp32/fp16sr:ef=bf16@4"),  # the copies' error-feedback residuals move with their rows
    ("gdn", "stepquant:dualaxis6"),  # dual-axis column factors (col_scale) move with their rows
])
def test_rows_put_into_a_running_state_step_as_in_a_state_of_their_own(family, config, device):
    """`put_rows` (a new row taking a stopped row's place in a running decoder): after one step of a state, rows of
    another state (other seq_ids, other phases) take two of its places; stepped on, they keep the bits of their own
    state (outputs, stored copies and residuals, packed copy, ring, phase, checkpoint), and the other rows theirs."""
    setup, dims = AWKWARD[family]
    make, _, first = setup(config, device, **dims)
    cfg = ReplayConfig.parse(config)
    ref = _at_phases(first, cfg.window, True)
    static = StaticState.from_replay_state(family, ref, ref.lo_packed, cfg, ref.schedule.count.tolist())
    stay = [0, 2, 3]
    alone = _rows(static, stay)
    other = _at_phases(dataclasses.replace(first, seq_ids=first.seq_ids + 1000), cfg.window, False)
    newcomers = _rows(StaticState.from_replay_state(family, other, other.lo_packed, cfg, other.schedule.count.tolist()),
                      [3, 0])
    gen = torch.Generator().manual_seed(1)
    inputs = tuple(t.contiguous() for t in make(gen))
    static.step(inputs, static.folds_next)
    alone.step(tuple(t[torch.tensor(stay, device=device)] if t.dim() > 1 else t for t in inputs), alone.folds_next)
    slots = [4, 1]
    static.put_rows(slots, newcomers.replay_state(), newcomers.host_count)
    assert [static.host_count[s] for s in slots] == newcomers.host_count
    for _ in range(cfg.window + 1):  # every row folds once
        inputs = tuple(t.contiguous() for t in make(gen))
        y = static.step(inputs, static.folds_next)
        for rows, own in ((slots, newcomers), (stay, alone)):
            index = torch.tensor(rows, device=device)
            y_own = own.step(tuple(t[index] if t.dim() > 1 else t for t in inputs), own.folds_next)
            assert torch.equal(y[index], y_own)
            _assert_rows(static, own, rows)
            assert torch.equal(static.seq_ids[index], own.seq_ids) and torch.equal(static.keys[:, index], own.keys)
