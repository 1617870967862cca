"""A new kernel family is its package plus one registry line.

This module is the package of a toy family, "toy": linear attention with a fixed per-head decay,

    S_t = a S_{t-1} + v_t k_t^T,   o_t = S_t q_t          S [H, V, K], a = exp(log_a) per head,

which is Mamba-2 with dt = 1, A = log_a, B = k, C = q (one group), x = v and D = 0: its kernels are Mamba-2's,
reached through the registry. The tests add the one registry line (`FAMILY_PACKAGES`) and run the toy through the
reference (against the formula above), the chunked form and the conformance checks, which know it only by name.
"""

import pytest
import torch

from replayssm_eval.kernels.family import FAMILY_PACKAGES, KernelFamily, family_names, get_family
from replayssm_eval.kernels.static_step import check_static_family
from replayssm_eval.regress import conformance

_MAMBA2 = get_family("mamba2")


def _as_mamba2(q, k, v, log_a):
    """Mamba-2's (x, dt, A, B, C, D) of toy inputs q, k [B, T, K], v [B, T, H, V], log_a [H]."""
    return v, torch.ones(v.shape[:3], dtype=v.dtype, device=v.device), log_a, k[:, :, None], q[:, :, None], \
        torch.zeros_like(log_a)


def _through_mamba2(kernel):
    def run(q, k, v, log_a, state, config, **kwargs):
        return kernel(*_as_mamba2(q, k, v, log_a), state, config, **kwargs)
    return run


def _random_inputs(dims, tokens, gen):
    batch, heads, dv, dk = (dims[d] for d in "BHVK")
    rand = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    inputs = {"q": rand(batch, tokens, dk), "k": rand(batch, tokens, dk) / dk ** 0.5, "v": rand(batch, tokens, heads, dv),
              "log_a": -0.5 * torch.rand(heads, generator=gen)}
    return inputs, rand(batch, heads, dv, dk)


FAMILY = KernelFamily(
    name="toy",
    inputs=("q", "k", "v", "log_a"),
    shapes={"q": "[B, T, K]", "k": "[B, T, K]", "v": "[B, T, H, V]", "log_a": "[H] (negative)"},
    state_layout="[B, H, V, K]",
    test_shapes={"small": dict(B=3, H=2, V=12, K=20), "grouped": dict(B=2, H=4, V=8, K=16)},
    closed_fold=False,
    decode_reference=_through_mamba2(_MAMBA2.decode_reference),
    speculative_decode_reference=_through_mamba2(_MAMBA2.speculative_decode_reference),
    chunked=_through_mamba2(_MAMBA2.chunked),
    decode_step=_through_mamba2(_MAMBA2.decode_step),
    verify=_through_mamba2(_MAMBA2.verify),
    conventional_step=_MAMBA2.conventional_step,
    hf_state=_MAMBA2.hf_state,
    stored_layout=_MAMBA2.stored_layout,
    hf_layout=_MAMBA2.hf_layout,
    random_inputs=_random_inputs,
    head_state=_MAMBA2.head_state,
    entry_elements=lambda heads, head_dim, state_dim, groups, fold: _MAMBA2.entry_elements(heads, head_dim, state_dim,
                                                                                            1, fold),
    replay_state=lambda tensors, state, config, layer_idx, seq_ids: _MAMBA2.replay_state(
        _as_mamba2(*tensors), state, config, layer_idx, seq_ids),
    log_decays=lambda tensors, carried: _MAMBA2.log_decays(_as_mamba2(*tensors), carried),
    live_state=lambda tensors, state, config: _MAMBA2.live_state(_as_mamba2(*tensors), state, config),
    fixed_step=None,
)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(FAMILY_PACKAGES, "toy", __name__)  # the registry line
    return get_family("toy")


def _formula(q, k, v, log_a, state):
    """o [B, T, H, V] and the final state of the recurrence in the module docstring, in float64."""
    s, outs = state.double(), []
    for t in range(q.shape[1]):
        s = log_a.double().exp()[:, None, None] * s + v[:, t, :, :, None].double() * k[:, t, None, None, :].double()
        outs.append(torch.einsum("bhvk,bk->bhv", s, q[:, t].double()))
    return torch.stack(outs, 1), s


def test_registered_by_one_line(toy):
    assert "toy" in family_names() and toy is FAMILY


def test_reference_follows_the_formula(toy):
    inputs, anchor = conformance.make_inputs("toy", "small", seed=0, tokens=9)
    o, state = conformance.reference_decode("toy", inputs, anchor, "fp32", layer_idx=0)
    o_ref, s_ref = _formula(*(inputs[k] for k in toy.inputs), anchor)
    assert torch.allclose(o.double(), o_ref, rtol=1e-5, atol=1e-5)
    assert torch.allclose(toy.hf_state(state).double(), s_ref, rtol=1e-5, atol=1e-5)


def test_chunked_equals_the_reference(toy):
    """In FP64, so the two summation orders make the same rounding decisions (in FP32 one may flip an FP16 SR or
    NVFP4 rounding, on one CPU and not another): outputs to 1e-10, the stored copies bit for bit."""
    inputs, anchor = conformance.make_inputs("toy", "grouped", seed=1, tokens=11)
    args = (*(inputs[k] for k in toy.inputs), anchor, "nvfp4/fp16sr@4")
    o_ref, st_ref = toy.decode_reference(*args, compute_dtype=torch.float64)
    o, st = toy.chunked(*args, compute_dtype=torch.float64)
    assert torch.allclose(o, o_ref, rtol=0, atol=1e-10 * o_ref.abs().max().item())
    assert torch.equal(st.hi, st_ref.hi) and torch.equal(st.lo, st_ref.lo)
    assert torch.equal(st.checkpoint, st_ref.checkpoint) and torch.equal(st.schedule.count, st_ref.schedule.count)


def _chunked_adapter(family, inputs, state, config):
    """The family's torch `chunked` form one token at a time, as a conformance adapter."""
    fam = get_family(family)
    one = {k: (v[:, None] if v.dim() > 1 else v) for k, v in inputs.items()}
    y, new_state = fam.chunked(*(one[k] for k in fam.inputs), state, config, layer_idx=state.layer)
    return y[:, 0], new_state


def test_conformance_checks_run_the_toy(toy):
    cases = conformance.grid_cases("quick", ("toy",))
    assert cases and {case.family for case in cases} == {"toy"}
    assert not any("#closed" in case.config for case in cases)  # the closed fold is not the toy's
    results = conformance.check_kernel(_chunked_adapter, cases)
    assert [r.status for r in results] == ["pass"] * len(cases), conformance.format_results(results)


def test_no_fixed_step_is_refused(toy):
    with pytest.raises(ValueError, match="the toy family has no fixed-buffer decode step"):
        check_static_family("toy")
