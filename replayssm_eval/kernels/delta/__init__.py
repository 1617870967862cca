"""Code shared by the delta-rule families: Gated DeltaNet (`kernels.gdn`, one log-decay per value head) and Kimi
Delta Attention (`kernels.kda`, one per key channel). Per value head, with S [K, V] in HF's layout:

    S = A_t S;   S = S + k_t (beta_t (v_t - S^T k_t))^T;   o_t = S^T q_t      A_t = exp(g_t) or diag(exp(g_t))

Everything but the decay is the same, so one module of each layer serves both, parametrised by
`per_channel` (the shape of g); the scalar-decay branches keep GDN's own operation order. Layering,
one way, as in flash-linear-attention: `_common` <- `reference` <- `chunked` (torch) <- `triton_chunk` and
`triton_step` (shared jit helpers and launch code of the chunked and the decode kernels; each family keeps its own
kernels in `<family>/triton_chunk.py` and `<family>/triton_step.py`) <- `fixed_step`; `DeltaRule` here binds one
family's kernels into the `KernelFamily` call convention.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from types import ModuleType

import torch

from replayssm_eval.kernels.delta import triton_step as shared_step
from replayssm_eval.kernels.delta._common import (  # noqa: F401 (checkpoint_kv: API)
    checkpoint_kv, from_format_layout, prepare_inputs, to_format_layout,
)
from replayssm_eval.kernels.delta.chunked import chunked_torch
from replayssm_eval.kernels.delta.fixed_step import fixed_step
from replayssm_eval.kernels.delta.reference import decode, fold_closed, fold_open, speculative_decode
from replayssm_eval.kernels.delta.triton_chunk import feedback_in_kernel
from replayssm_eval.kernels.family import KernelFamily
from replayssm_eval.replay.state import ReplayState, chunked_backend

BACKENDS = ("torch", "triton")


@dataclass(frozen=True)
class DeltaRule:
    """One delta-rule family's entry points. per_channel: g is [B, T, HV, K] rather than [B, T, HV]; chunk, step: the
    family's Triton modules (`chunked_triton(p)`; `launch_replay_step`, `verify_triton`, `conventional_step`)."""

    per_channel: bool
    chunk: ModuleType
    step: ModuleType

    def prepare(self, q, k, v, g, beta, initial_state, config, *, layer_idx=0, seq_ids=None, compute_dtype=torch.float32):
        return prepare_inputs(q, k, v, g, beta, initial_state, config, layer_idx=layer_idx, seq_ids=seq_ids,
                        compute_dtype=compute_dtype, per_channel=self.per_channel)

    def decode_reference(
        self, q, k, v, g, beta, initial_state, config, *, layer_idx=0, seq_ids=None, compute_dtype=torch.float32
    ) -> tuple[torch.Tensor, ReplayState]:
        """Decode T tokens one at a time for B sequences, each at its own window phase (`reference.decode`).

        q, k: [B, T, H, K]; v: [B, T, HV, V]; g (log-decay <= 0): [B, T, HV] (GDN) or [B, T, HV, K] (KDA);
        beta: [B, T, HV]; initial_state: the FP32 state [B, HV, K, V] at the anchor as prefill leaves it
        (checkpoint 0 is written from it), or the ReplayState of a previous call to continue from.
        config: ReplayConfig or its string form. seq_ids: [B] ids keying the SR bits (default arange(B), or the
        continued state's). Returns o [B, T, HV, V] in compute_dtype and the ReplayState after the call (its hi / lo
        are [B, HV, V, K], see `checkpoint_kv`).
        """
        return decode(self.prepare(q, k, v, g, beta, initial_state, config, layer_idx=layer_idx, seq_ids=seq_ids,
                                   compute_dtype=compute_dtype))

    def speculative_decode_reference(
        self, q, k, v, g, beta, initial_state, config, *, layer_idx=0, seq_ids=None, compute_dtype=torch.float32
    ) -> tuple[torch.Tensor, ReplayState]:
        """Speculative decoding as a serving engine runs it (`reference.speculative_decode`); arguments and returns
        as `decode_reference`, the config must carry a speculative schedule (`#spec=T:alpha`)."""
        return speculative_decode(self.prepare(q, k, v, g, beta, initial_state, config, layer_idx=layer_idx,
                                               seq_ids=seq_ids, compute_dtype=compute_dtype))

    def chunked(
        self, q, k, v, g, beta, initial_state, config, *, layer_idx=0, seq_ids=None, compute_dtype=torch.float32,
        backend="torch",
    ) -> tuple[torch.Tensor, ReplayState]:
        """The teacher-forced form of `decode_reference`: same arguments, same outputs and states.

        Any plan (per-sequence phases, speculative schedules), both fold modes. Returns o [B, T, HV, V] in
        compute_dtype and the ReplayState after the call, interchangeable with `decode_reference`'s.
        backend="triton" runs the family's `triton_chunk.chunked_triton` (FP32 only).
        """
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
        p = self.prepare(q, k, v, g, beta, initial_state, config, layer_idx=layer_idx, seq_ids=seq_ids,
                         compute_dtype=compute_dtype)
        carried = backend == "triton" and feedback_in_kernel(p)
        return self.chunk.chunked_triton(p) if chunked_backend(p.config, backend, "delta-rule", carried) == "triton" \
            else chunked_torch(p)

    def decode_step_triton(self, q, k, v, g, beta, initial_state, config, *, layer_idx=0, seq_ids=None):
        """One decode token (T = 1) for B sequences at their own phases, one launch of the family's single-token
        kernel (`delta.triton_step.decode_step`). Arguments as `decode_reference` with T = 1; returns (o [B, 1, HV, V]
        FP32, ReplayState with lo_packed)."""
        p = self.prepare(q, k, v, g, beta, initial_state, config, layer_idx=layer_idx, seq_ids=seq_ids)
        return shared_step.decode_step(p, q, initial_state, self.step.launch_replay_step)

    def verify(self, q, k, v, g, beta, state, config, *, layer_idx=0) -> torch.Tensor:
        """Output-only verification of T drafts (shapes as `decode_reference`) appended after the committed entries of
        `state` (a ReplayState), each sequence reading S_hi if `state.schedule.step_read_hi` else the read copy (as
        `speculative_decode_reference`). Returns o [B, T, HV, V] FP32; the state is not changed."""
        if not isinstance(state, ReplayState):
            raise ValueError(f"state must be a ReplayState (the committed entries and checkpoint), got {type(state).__name__}")
        p = self.prepare(q, k, v, g, beta, state, config, layer_idx=layer_idx)
        return shared_step.verify(p, q, self.step.verify_triton)

    def random_inputs(self, dims, tokens, gen):
        """Test inputs: dims {B, H, HV, K, V}; q, k L2-normalised (q scaled by K^-0.5), beta in (0, 1); g <= 0, per
        channel with slow and fast channels."""
        batch, heads, value_heads, dk, dv = (dims[d] for d in ("B", "H", "HV", "K", "V"))
        rand = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
        norm = lambda t: torch.nn.functional.normalize(t, dim=-1)  # noqa: E731
        if self.per_channel:
            rate = 0.5 * torch.rand(value_heads, dk, generator=gen)  # per (head, channel)
        inputs = {"q": norm(rand(batch, tokens, heads, dk)) * dk ** -0.5, "k": norm(rand(batch, tokens, heads, dk)),
                  "v": rand(batch, tokens, value_heads, dv)}
        if self.per_channel:
            inputs["g"] = -rate * torch.rand(batch, tokens, value_heads, dk, generator=gen)
        else:
            inputs["g"] = -0.25 * torch.rand(batch, tokens, value_heads, generator=gen)
        inputs["beta"] = torch.sigmoid(rand(batch, tokens, value_heads))
        return inputs, rand(batch, value_heads, dk, dv)

    def entry_elements(self, heads, head_dim, state_dim, groups, fold):
        """k [Hk, K], u [HV, V], g [HV] or [HV, K]; the closed fold also keeps v [HV, V] and beta [HV] and reads them
        at the flush."""
        k, u, decay = groups * state_dim, heads * head_dim, heads * (state_dim if self.per_channel else 1)
        if fold == "open":
            return k + u + decay, k + u + decay, k + u + decay
        v, beta = heads * head_dim, heads
        return k + u + decay, k + v + beta + decay, k + u + decay + v + beta

    def entry_points(self) -> tuple:
        """(decode_reference, speculative_decode_reference, chunked, decode_step_triton, verify), the family's API."""
        return (self.decode_reference, self.speculative_decode_reference, self.chunked, self.decode_step_triton,
                self.verify)

    def family(self, name: str, qk_normalised: str) -> KernelFamily:
        """The `KernelFamily` of these entry points. qk_normalised: when q and k arrive L2-normalised (the shapes'
        note)."""
        g = "[B, T, HV, K] (per-channel log decay <= 0)" if self.per_channel else "[B, T, HV] (log decay <= 0)"
        return KernelFamily(
            name=name,
            inputs=("q", "k", "v", "g", "beta"),
            shapes={"q": f"[B, T, H, K] (L2-normalised {qk_normalised}, scaled by K^-0.5)",
                    "k": f"[B, T, H, K] (L2-normalised {qk_normalised})", "v": "[B, T, HV, V]", "g": g,
                    "beta": "[B, T, HV]"},
            state_layout="[B, HV, K, V]",
            test_shapes={"small": dict(B=3, H=1, HV=2, K=16, V=20), "grouped": dict(B=2, H=2, HV=4, K=32, V=16)},
            closed_fold=True,
            decode_reference=self.decode_reference,
            speculative_decode_reference=self.speculative_decode_reference,
            chunked=self.chunked,
            decode_step=self.decode_step_triton,
            verify=self.verify,
            conventional_step=self.step.conventional_step,
            hf_state=lambda state: checkpoint_kv(state)[0],
            stored_layout=to_format_layout,
            hf_layout=from_format_layout,
            random_inputs=self.random_inputs,
            head_state=lambda head_dim, state_dim: (state_dim, head_dim),
            entry_elements=self.entry_elements,
            replay_state=lambda tensors, state, config, layer_idx, seq_ids: self.prepare(
                *tensors, state, config, layer_idx=layer_idx, seq_ids=seq_ids).state,
            log_decays=_log_decays,
            live_state=_live_state,
            fixed_step=partial(fixed_step, self.step.launch_replay_step),
        )


def _live_state(tensors, state: ReplayState, config) -> torch.Tensor:
    """The state a flush now would fold from a carried ReplayState, unrounded (the config's open or closed fold of its
    buffered entries into S_hi), [B, HV, V, K] (the formats' layout) in the buffer's dtype."""
    buf = state.buffer
    hi = checkpoint_kv(state)[0].to(buf["k"].dtype)  # [B, HV, K, V]
    keep = hi.new_ones(hi.shape[:2])  # [B, HV]
    fold = fold_closed if config.gdn_fold == "closed" else fold_open
    return to_format_layout(fold(hi, buf, state.schedule.count, keep, hi.shape[1] // buf["k"].shape[2]))


def _log_decays(tensors, carried):
    """g of the tokens [B, T, HV(, K)] and of the carried buffer entries [B, cap, HV(, K)] (None at the anchor)."""
    g = tensors[3]
    return g, (None if carried is None else carried.buffer["g"].to(g.dtype))
