"""`ReplaySession`: one run's SSM states, riding on the Hugging Face cache of that run.

A run is a batch of documents decoded under one ReplayConfig. Its HF cache carries the conv
states and KV caches (Hugging Face's own code); the session carries, per SSM layer, the
ReplayState the kernels return, and passes it back on the next call. The session is found from
the cache the model is called with, so several sessions (an FP32 reference and the configs under
study) share one model in lockstep, each with its own cache.

Window phase: the first call on a fresh cache is the prompt. It runs Hugging Face's FP32 torch
scan and leaves the exact FP32 state in the cache; the next call writes checkpoint 0 from it
(the anchor) and every call after that continues the ReplayState, so segment boundaries do not
change numbers. Sequence ids key the stochastic-rounding bits (`replay.keys`); layer ids are the
HF layer indices. A config's round trips (`#rt=`, `kernels.round_trip`) cut each call at their
positions, each row's real tokens fed so far (docs/semantics.md, "State round trips").

A mixed config (`ReplayConfig.overrides`) takes effect here and only here: each layer runs its own
plain config (`ReplayConfig.layer_parts`); a layer with head parts runs once per part over all its
heads, takes each head's output from its part and carries {part name: state} (docs/semantics.md,
"Mixed configs").

The FP32 reference `fp32` (window 1) under the chunked engine is a plain FP32 recurrence:
no rounding, so no checkpoints, windows or buffers change its numbers. Its multi-token calls run
Hugging Face's own FP32 torch chunk scan from the carried state (the function a plain forward runs,
handed over by the hooks as `plain`; `reference_scan="hf"`), or our chunked kernels with an FP32
checkpoint and buffer (`KERNEL_REFERENCE`; `reference_scan="kernels"`), whose first call per layer
also runs HF's scan and stops the run if the two differ by more than float noise
(`KERNEL_REFERENCE_TOLERANCE`; the differences are kept in `reference_checks`, which the sessions of one
`ReplayModel` share: each layer is checked once per model). A one-token call runs the conventional
FP32 step of our reference. Its per-layer state is the FP32 tensor in the HF layout, or after a call
through the kernels their ReplayState, whose buffered entries a later HF scan or one-token step folds
first (`live_state`, unrounded).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels.family import KernelFamily
from replayssm_eval.kernels.round_trip import round_trip
from replayssm_eval.replay.host_values import remember_host
from replayssm_eval.replay.state import ReplayState

ENGINES = ("chunked", "reference", "step")
REFERENCE_SCANS = ("hf", "kernels")
# the FP32 reference's multi-token calls under reference_scan="kernels": no rounding (FP32 read and recurrence
# copies), so the window changes only the order of FP32 sums
KERNEL_REFERENCE = ReplayConfig.parse("fp32/fp32@16")
# the largest difference accepted between KERNEL_REFERENCE and HF's FP32 scan on a layer's first call, relative to
# the largest magnitude of HF's output (and of its final state). FP32 sums in another order and other exponent
# arguments: up to 1e-6 on CPU, 4e-5 (a Mamba-2 state) on the random-weight 4B models on an H100; HF's GDN output
# rounded to bf16 measured 2.6e-3 against ours there
KERNEL_REFERENCE_TOLERANCE = 1e-3

# the HF cache points back at its session (a cycle the GC collects with both), so no registry
# outlives a run and a session adopted from a cache generate() made lives as long as that cache
_CACHE_ATTR = "_replayssm_session"


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """x in fp32, or in its own dtype if wider (fp64 runs are for checks)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b| (0 where both are 0), in float64."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(torch.finfo(torch.float64).tiny))


def as_config(config: ReplayConfig | str) -> ReplayConfig:
    return ReplayConfig.parse(config) if isinstance(config, str) else config


def set_cache_length(cache, tokens: int) -> None:
    """Set the token count that each linear-attention layer of an HF cache keeps from transformers 5.25 on (a 0-dim
    tensor, `cumulative_length_linear`: what `get_seq_length` answers for it) to `tokens` (earlier versions keep
    none). A cache whose rows were joined, kept, trimmed or copied holds `tokens` columns per row."""
    for layer in cache.layers:
        count = getattr(layer, "cumulative_length_linear", None)
        if torch.is_tensor(count):
            count.fill_(tokens)


def session_of(cache) -> ReplaySession | None:
    return getattr(cache, _CACHE_ATTR, None)


class ReplaySession:
    """SSM states of one run; create it with `ReplayModel.new_session`.

    config: the ReplayConfig (or its string form); `reset(config=...)` switches it.
    seq_ids: [B] document ids of the batch rows (default arange(B) at the first call).
    engine: "chunked" (teacher-forced chunked kernels, the fast path), "reference" (the step
        reference `decode_reference`, token by token inside each call: the slow ground truth) or
        "step" (one-token calls through the family's Triton `decode_step`, as a serving engine
        decodes; longer calls as "chunked").
    backend: "torch" | "triton", for the chunked kernels.
    reference_scan: "hf" | "kernels": what runs the FP32 reference's multi-token calls (module docstring).
    reference_checks: {layer: {"output": .., "state": ..}}, the layers already checked under "kernels": the
        differences between our kernels and HF's scan on the layer's first call, relative to HF's largest
        magnitudes; a dict shared with other sessions checks each layer once over all of them (default: a new one).
    compute_dtype: the kernels' math dtype (fp32, or fp64 for checks).
    new_cache: makes an empty HF cache (each reset gets a new one).
    cache: instead, an HF cache to adopt as is (one that generate() created).
    """

    def __init__(
        self, config: ReplayConfig | str = "fp32", *, seq_ids=None, engine: str = "chunked", backend: str = "torch",
        reference_scan: str = "hf", reference_checks: dict | None = None, compute_dtype: torch.dtype = torch.float32,
        new_cache: Callable[[], object] | None = None, cache=None,
    ):
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
        if reference_scan not in REFERENCE_SCANS:
            raise ValueError(f"unknown reference scan {reference_scan!r}; known: {', '.join(REFERENCE_SCANS)}")
        if reference_scan == "kernels" and engine != "chunked":  # the step engine's FP32 steps carry their own states
            raise ValueError(f"reference_scan='kernels' runs under the chunked engine, not {engine!r}; "
                             "accepted there: reference_scan='hf'")
        self.engine, self.backend, self.compute_dtype = engine, backend, compute_dtype
        self.reference_scan = reference_scan
        self.reference_checks: dict[int, dict[str, float]] = {} if reference_checks is None else reference_checks
        self._new_cache = new_cache
        self.cache = cache
        # per SSM layer: [checkpoint reads, skipped reads of the read copy, skipped reads of S_hi], counted
        # in (token, head) pairs over every decode call of this session when the config has #skip
        self.skip_counts: dict[int, list[int]] = {}
        self.reset(config=config, seq_ids=seq_ids)

    def reset(self, *, config: ReplayConfig | str | None = None, seq_ids=None) -> None:
        """Start new documents: a fresh HF cache, no SSM states, new seq_ids; optionally a new config."""
        if config is not None:
            self._config = as_config(config)
        self.seq_ids = None if seq_ids is None else torch.as_tensor(seq_ids, dtype=torch.int64)
        self._seq_ids_device = (None, None, None)  # (seq_ids, its version, its copy on the layers' device)
        # per SSM layer: a ReplayState, a plain FP32 tensor under `plain_fp32`, or for a layer with head parts
        # (`ReplayConfig.layer_parts`) {part config name: its state over all heads}
        self.states: dict[int, ReplayState | torch.Tensor | dict] = {}
        self.tokens = 0  # tokens per row fed so far (ReplayModel.forward)
        self.attention_mask = None  # [B, tokens], kept by ReplayModel.forward once the prompt is padded
        if self._new_cache is not None:
            self.cache = self._new_cache()
        if self.cache is not None:
            setattr(self.cache, _CACHE_ATTR, self)

    @property
    def config(self) -> ReplayConfig:
        return self._config

    def plain_fp32(self, config: ReplayConfig | None = None) -> bool:
        """True when a layer under `config` (default: the session's) runs the plain FP32 recurrence: the
        conventional FP32 config `fp32` under the chunked or step engine in FP32 math (one-token calls of the
        step engine still run the decode step) (an FP32 config with a window, e.g. `fp32@16`, runs the kernels:
        its numbers differ by float noise; FP64 checks run the kernels in FP64)."""
        cfg = self._config if config is None else config
        return (self.engine != "reference" and self.compute_dtype == torch.float32 and cfg.is_reference
                and cfg.window == 1 and cfg.speculative is None)

    def carried(self) -> dict:
        """The run's carried state (references, not copies), e.g. for torch.save: the HF cache without its
        back-pointer to this session (which holds the model), the SSM states, the tokens fed, the mask."""
        cache = copy.copy(self.cache)
        cache.__dict__ = {k: v for k, v in vars(cache).items() if k != _CACHE_ATTR}
        return {"cache": cache, "states": self.states, "tokens": self.tokens, "attention_mask": self.attention_mask}

    def continue_from(self, carried: dict) -> None:
        """Continue the run of a `carried()` state: adopt its HF cache, take its SSM states, tokens and mask."""
        self.cache = carried["cache"]
        setattr(self.cache, _CACHE_ATTR, self)
        self.states, self.tokens, self.attention_mask = carried["states"], carried["tokens"], carried["attention_mask"]
        set_cache_length(self.cache, self.tokens)

    def forget(self, layer_idx: int) -> None:
        """Drop a layer's state: its HF cache starts over (a prompt call on that layer)."""
        self.states.pop(layer_idx, None)

    def scan(self, family: KernelFamily, layer_idx: int, inputs: tuple, anchor: torch.Tensor, attention_mask,
             plain: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """Run one decode call of one layer through the kernels; returns the output in the inputs' dtype.

        family: the layer's kernel family.
        inputs: the family's kernel inputs (`family.inputs`), batch first;
            promoted to at least fp32 for the kernels (their math dtype is `compute_dtype`).
        anchor: the FP32 state the prompt left in the HF cache; used until the layer has a state.
        attention_mask: the padding mask of this call's tokens, or None.
        plain: for multi-token calls, HF's FP32 chunk scan of this call from a given FP32 state,
            returning (output, final state); the reference's fast path (see the module docstring).
        """
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError(
                "padding after the prompt: ReplaySSM window phases count every token, so only the prompt "
                "may be (left-)padded; cut documents to equal length or decode them in separate rows"
            )
        x = inputs[0]
        seq_ids = self._seq_ids(x.shape[0], x.device)
        parts = self._config.layer_parts(layer_idx, anchor.shape[1])  # anchor [B, H, ...] in `state_layout`
        if len(parts) == 1:
            y, state = self._scan_part(family, layer_idx, inputs, self.states.get(layer_idx, anchor), parts[0],
                                       plain, seq_ids)
        else:  # heads are independent recurrences: each part runs every head, keeps its own; states per part
            carried = self.states.get(layer_idx, {})
            y, state = None, {}
            for part in parts:
                cfg, heads = part
                out, state[cfg.name] = self._scan_part(family, layer_idx, inputs, carried.get(cfg.name, anchor),
                                                       part, plain, seq_ids)  # [B, T, H, ...]
                y = torch.empty_like(out) if y is None else y
                index = torch.tensor(heads, device=out.device)
                y[:, :, index] = out[:, :, index]
        self.states[layer_idx] = state
        return y.to(torch.promote_types(x.dtype, torch.float32))

    def _scan_part(self, family: KernelFamily, layer_idx: int, inputs: tuple, initial, part: tuple, plain,
                   seq_ids: torch.Tensor) -> tuple[torch.Tensor, object]:
        """One call of one layer under a plain config `part[0]` (over all heads; `part[1]`, its heads, are the
        ones counted for #skip), from the state `initial`; returns (output [B, T, H, ...], the state to carry)."""
        config = part[0]
        if config.round_trip is None or self.plain_fp32(config):  # plain FP32 round trips are through fp32: no-ops
            return self._call(family, layer_idx, inputs, initial, part, plain, seq_ids)
        return self._round_trips(family, layer_idx, inputs, initial, part, seq_ids)

    def _round_trips(self, family: KernelFamily, layer_idx: int, inputs: tuple, initial, part: tuple,
                     seq_ids: torch.Tensor) -> tuple[torch.Tensor, object]:
        """`_scan_part` with the config's round trips (docs/semantics.md, "State round trips"): the call is cut at
        every round-trip point, so its numbers do not depend on where calls are cut; the prompt's end is the
        layer's anchor (the state before its first call)."""
        config = part[0]
        x = inputs[0]
        batch, tokens = x.shape[:2]
        start = self._positions(batch, x.device)  # [B] real tokens consumed before this call
        hits = config.round_trip.hits((start[:, None] + torch.arange(tokens, device=x.device)).flatten())
        hits = hits.view(batch, tokens)
        if config.round_trip.prompt and not isinstance(initial, ReplayState):
            hits[:, 0] = True
        bounds = sorted({0, *hits.any(dim=0).nonzero().flatten().tolist(), tokens})
        timed = [family.shapes[name].startswith("[B, T") for name in family.inputs]
        ys, state = [], initial
        for a, b in zip(bounds[:-1], bounds[1:]):
            piece = tuple(at_least_fp32(t[:, a:b] if time else t) for t, time in zip(inputs, timed))
            if bool(hits[:, a].any()):
                state = round_trip(family, piece, at_least_fp32(state) if torch.is_tensor(state) else state,
                                   config, layer_idx, seq_ids, hits[:, a])
            y, state = self._call(family, layer_idx, piece, state, part, None, seq_ids)
            ys.append(y)
        return torch.cat(ys, dim=1), state

    def _positions(self, batch: int, device) -> torch.Tensor:
        """[B] int64: each row's real tokens fed before this call (the padded prompt's mask counts them)."""
        if self.attention_mask is None:
            return torch.full((batch,), self.tokens, dtype=torch.int64, device=device)
        return self.attention_mask[:, :self.tokens].sum(dim=-1).to(device=device, dtype=torch.int64)

    def _call(self, family: KernelFamily, layer_idx: int, inputs: tuple, initial, part: tuple, plain,
              seq_ids: torch.Tensor) -> tuple[torch.Tensor, object]:
        """One kernel call of one layer under the plain config `part[0]` from the state `initial`."""
        config, heads = part
        x = inputs[0]
        if self.engine == "step" and x.shape[1] == 1:
            inputs = tuple(at_least_fp32(t) for t in inputs)
            return family.decode_step(*inputs, initial, config, layer_idx=layer_idx, seq_ids=seq_ids)
        fp32 = self.plain_fp32(config)
        if fp32 and plain is not None and self.reference_scan == "kernels":
            return self._fp32_kernels(family, layer_idx, inputs, initial, plain, seq_ids)
        if fp32:  # HF's scan and the FP32 steps take the state in the HF layout
            initial = self._fp32_tensor(family, inputs, initial)
        if fp32 and plain is not None:  # HF's scan takes the inputs as they are
            return plain(initial)
        inputs = tuple(at_least_fp32(t) for t in inputs)
        opts = {"layer_idx": layer_idx, "seq_ids": seq_ids, "compute_dtype": self.compute_dtype}
        if fp32:  # one token: the conventional FP32 step, its state back in the HF layout
            y, stored = family.decode_reference(*inputs, initial, "fp32", **opts)
            return y, family.hf_state(stored)
        if self.engine == "reference":
            return family.decode_reference(*inputs, initial, config, **opts)
        self._count_skips(family, layer_idx, inputs, initial, config, heads)
        return family.chunked(*inputs, initial, config, backend=self.backend, **opts)

    def _fp32_kernels(self, family: KernelFamily, layer_idx: int, inputs: tuple, initial, plain,
                      seq_ids: torch.Tensor) -> tuple[torch.Tensor, ReplayState]:
        """A multi-token call of the FP32 reference through the chunked kernels (`KERNEL_REFERENCE`) from `initial`
        (the FP32 state in the HF layout, or the ReplayState such a call left); returns (output, ReplayState). A
        layer's first such call also runs HF's scan `plain` and raises if the two differ by more than
        `KERNEL_REFERENCE_TOLERANCE`."""
        inputs = tuple(at_least_fp32(t) for t in inputs)
        start = initial if isinstance(initial, ReplayState) else at_least_fp32(initial)
        y, state = family.chunked(*inputs, start, KERNEL_REFERENCE, backend=self.backend, layer_idx=layer_idx,
                                  seq_ids=seq_ids, compute_dtype=self.compute_dtype)
        if layer_idx not in self.reference_checks:
            y_hf, final_hf = plain(self._fp32_tensor(family, inputs, initial))
            final = self._fp32_tensor(family, inputs, state)
            check = {"output": relative_difference(y, y_hf), "state": relative_difference(final, final_hf)}
            if max(check.values()) > KERNEL_REFERENCE_TOLERANCE:
                raise RuntimeError(
                    f"the FP32 reference through our kernels ({KERNEL_REFERENCE.name}, backend {self.backend}) differs "
                    f"from Hugging Face's FP32 scan on SSM layer {layer_idx} by {check['output']:.2e} (output) and "
                    f"{check['state']:.2e} (state) relative to HF's largest magnitude; accepted: at most "
                    f"{KERNEL_REFERENCE_TOLERANCE:.0e}. Run the reference through HF's scan (--reference-scan hf)"
                )
            self.reference_checks[layer_idx] = check
        return y, state

    @staticmethod
    def _fp32_tensor(family: KernelFamily, inputs: tuple, state) -> torch.Tensor:
        """The FP32 reference's state in the HF layout: as carried (at least FP32), or a kernel call's ReplayState
        with its buffered entries folded (`reference_scan="kernels"`)."""
        if not isinstance(state, ReplayState):
            return at_least_fp32(state)
        return family.hf_layout(family.live_state(inputs, state, KERNEL_REFERENCE))

    def _count_skips(self, family: KernelFamily, layer_idx: int, inputs: tuple, initial, config: ReplayConfig,
                     heads: tuple[int, ...]) -> None:
        """Add this call's skipped checkpoint reads (`replay.skip`) of `heads` to `skip_counts[layer_idx]`."""
        if config.skip_read_below is None:
            return
        from replayssm_eval.replay.schedule import ScheduleState
        from replayssm_eval.replay.skip import skipped_reads

        carried = initial if isinstance(initial, ReplayState) else None
        log_decay, buffered = family.log_decays(tuple(t.to(self.compute_dtype) for t in inputs), carried)
        batch = log_decay.shape[0]
        if buffered is None:  # the anchor: checkpoint 0, nothing buffered
            buffered = log_decay.new_zeros(batch, 1, *log_decay.shape[2:])
            schedule = ScheduleState.start(batch, log_decay.device)
        else:
            schedule = initial.schedule
        skipped, read_hi = skipped_reads(log_decay, buffered, schedule, config, self._seq_ids(batch, log_decay.device))
        skipped = skipped[:, :, list(heads)]  # [B, T, H'] of this part's heads
        hi = read_hi[..., None].expand_as(skipped)
        counts = self.skip_counts.setdefault(layer_idx, [0, 0, 0])
        counts[0] += skipped.numel()
        counts[1] += int((skipped & ~hi).sum())
        counts[2] += int((skipped & hi).sum())

    def _seq_ids(self, batch: int, device) -> torch.Tensor:
        if self.seq_ids is None:
            self.seq_ids = torch.arange(batch, dtype=torch.int64)
        if self.seq_ids.shape != (batch,):
            raise ValueError(f"seq_ids has {self.seq_ids.numel()} entries, expected one per batch row ({batch})")
        source, version, on_device = self._seq_ids_device
        if source is not self.seq_ids or version != self.seq_ids._version or on_device.device != torch.device(device):
            # one device tensor while seq_ids stand: `replay.keys.sr_keys` remembers its keys, the host its values
            on_device = self.seq_ids.to(device, non_blocking=True)
            remember_host(on_device, self.seq_ids.tolist())
            self._seq_ids_device = (self.seq_ids, self.seq_ids._version, on_device)
        return on_device
