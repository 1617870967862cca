"""The whole model's one-token greedy step on fixed buffers, captured as a CUDA graph per variant.

    decoder = StaticDecoder(rm, config, prompts_ids, mask, seq_ids, max_len=..., graphs=True)
    logits = decoder.prefill()               # [B, V], the prompt (Hugging Face's FP32 scan, eager)
    token = logits.argmax(-1)
    logits = decoder.step(token)             # [B, V], one token for every row

    kept = decoder.rows([0, 2])              # rows of a running batch, as a dynamic-cache session (copies)
    decoder = StaticDecoder.from_session(rm, batch_rows.join([kept, new]), steps=..., graphs=True)
    decoder.admit([1], new)                  # or: new rows into stopped places of the running decoder

The last two forms are how the engine's continuous batching (`generate.engine`, step "graph") regroups
rows or puts new ones into free places: `rows` copies the chosen rows out (KV columns written so far,
without the leading columns none of them uses; conv and recurrent states; every SSM layer's ReplayState:
both stored copies, the packed read copy, the ring buffer, the window phase, the checkpoint index that
counts the Philox draws, the seq_ids that key them); `from_session` copies a session's rows in, each
row's tokens ending at the shared next column (the mask closes the columns left of a row's tokens), its
positions continuing from its own token count. The ReplayStates move into the static step's buffers at
the first step, bit for bit (`StaticStepSession`), so a row's numbers do not change when it moves to
another decoder; only the batch it shares matmuls with does. `admit` makes the same copies into some
places of a decoder that has stepped (its buffers keep their addresses: the captured graphs stay valid),
where the rows' tokens fit left of the next column.

Every tensor a step reads or writes has a fixed address:
- attention layers: Hugging Face's `StaticCache` (keys and values [B, heads, max_len, d] written
  in place at the cache's device-side length; linear-attention layers keep their conv states
  in place), the attention mask [B, 1, 1, max_len] (bool, True = attend) built here: the
  prompt's padding mask, and column c opened when token c is written; on CUDA each step's attention
  reads only the columns the mask opens (`decode_attention`), whatever max_len is;
- SSM layers: `kernels.static_step.StaticState` through `StaticStepSession` (window phase,
  checkpoint indices and Philox keys on the device);
- the token [B, 1], positions [B, 1] and the next column [1], advanced on the device.

A step has three variants: no row, some rows or every row folds after this token
(`kernels.static_step.FOLDS`, known on the host from the window phases, `StaticState.host_count`),
and with round trips inside the decode each comes with or without the due rows' round trip first
(known on the host from the rows' positions, `StaticState.trips_next`).
With graphs=True (CUDA) a variant's first use runs eagerly on a side stream (Triton compiles, the
allocator warms up), its second use captures it and every use replays it. With graphs=False (CPU, the Triton interpreter) every step runs
eagerly: the code that is captured.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import DummyLayer, LinearAttentionCacheLayerMixin, StaticLayer

from replayssm_eval.formats import PackedState
from replayssm_eval.replay.state import ReplayState
from replayssm_eval.kernels.static_step import folds_of
from replayssm_eval.models.adapter import ReplayModel
from replayssm_eval.models.session import ReplaySession, set_cache_length
from replayssm_eval.models.static_session import StaticStepSession


class StaticDecoder:
    """One batch's prompt and greedy one-token steps; see the module docstring.

    ids, mask: the left-padded prompt [B, W] and its padding mask [B, W] (1 = real) or None.
    max_len: tokens the attention caches hold (prompt width plus the steps to run).
    """

    def __init__(self, rm: ReplayModel, config, ids: torch.Tensor, mask: torch.Tensor | None, seq_ids, *,
                 max_len: int, graphs: bool = False):
        self.ids = ids
        self.prompt_mask = torch.ones_like(ids) if mask is None else mask  # [B, W]
        self._buffers(rm, config, seq_ids, self.prompt_mask, max_len, graphs)

    @classmethod
    def from_session(cls, rm: ReplayModel, session: ReplaySession, *, steps: int,
                     graphs: bool = False) -> "StaticDecoder":
        """A decoder continuing the rows of `session` for at most `steps` more tokens (max_len = its width + steps).

        session: a session on Hugging Face's dynamic cache whose SSM layers hold ReplayStates (at least one
        decode step after the prompt: the eager Triton step's session, or `rows` of another decoder), each
        row's tokens right-aligned in its KV columns (`attention_mask` [B, T], left side masked). Its KV,
        conv and recurrent states are copied into a StaticCache of width + steps columns; its ReplayStates
        move into the static step's fixed buffers at the first step, bit for bit (`StaticStepSession`).
        """
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if not session.states or not all(isinstance(s, ReplayState) for s in session.states.values()):
            raise ValueError("a decoder continues rows whose SSM layers hold ReplayStates: run one decode step "
                             "after the prompt first")
        width = session.tokens
        mask = _token_mask(session, rm.model.device)
        decoder = cls.__new__(cls)
        decoder.ids, decoder.prompt_mask = None, None
        decoder._buffers(rm, session.config, session.seq_ids, mask, width + steps, graphs)
        _into_static(session.cache, decoder.session.cache, width)
        set_cache_length(decoder.session.cache, width)
        decoder.session.states = dict(session.states)
        decoder.session.tokens, decoder.session.attention_mask = width, mask  # the rows' positions (round trips)
        return decoder

    def _buffers(self, rm: ReplayModel, config, seq_ids, mask: torch.Tensor, max_len: int, graphs: bool) -> None:
        """The fixed buffers of a batch whose first W columns hold `mask` [B, W] (1 = a real token there)."""
        batch, width = mask.shape
        if max_len <= width:
            raise ValueError(f"max_len must exceed the prompt width {width}, got {max_len}")
        if graphs and mask.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, got device {mask.device}")
        self.rm, self.graphs = rm, graphs
        text_config = rm.model.config.get_text_config(decoder=True)
        self.session = StaticStepSession(config, seq_ids=seq_ids, graphs=False,
                                         new_cache=lambda: StaticCache(config=text_config, max_cache_len=max_len))
        device = mask.device
        self.attend = torch.zeros(batch, 1, 1, max_len, dtype=torch.bool, device=device)  # [B, 1, 1, max_len]
        self.attend[:, 0, 0, :width] = mask.bool()
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position = mask.sum(-1, keepdim=True)  # [B, 1] position of the next token per row
        self.column = torch.full((1,), width, dtype=torch.long, device=device)  # [1] its cache column
        self.mask_arg = {"full_attention": self.attend, "linear_attention": None}
        self.max_len, self.written = max_len, width
        self._warm: set[tuple[str, bool]] = set()
        self._graphs: dict[tuple[str, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None

    @property
    def batch(self) -> int:
        return self.attend.shape[0]

    def rows(self, keep: list[int]) -> ReplaySession:
        """Rows `keep` of the batch, in that order, as a session on a dynamic cache (copies; `from_session` takes
        it back): their KV columns written so far, conv and recurrent states, ReplayStates, seq_ids and mask,
        without the leading columns none of them uses."""
        index = torch.tensor(keep, dtype=torch.long)
        on_device = index.to(self.attend.device)
        mask = self.attend[on_device, 0, 0, :self.written].long()  # [b, written]
        used = mask.any(0).nonzero()
        start = int(used[0]) if len(used) else self.written
        session = ReplaySession(self.session.config, seq_ids=self.session.seq_ids[index], engine="step",
                                backend="triton", cache=_dynamic_rows(self.session.cache, self.rm, on_device, start,
                                                                      self.written))
        states = {layer: _state_rows(state, on_device) for layer, state in self.session.states.items()}
        session.continue_from({"cache": session.cache, "states": states, "tokens": self.written - start,
                               "attention_mask": mask[:, start:]})
        return session

    def admit(self, slots: list[int], session: ReplaySession) -> bool:
        """Put the rows of `session` into this decoder's places `slots` (one each, in order), dropping the rows held
        there: what `from_session` does for a whole batch, for some places of a running decoder. Each row's tokens end
        at the shared next column (the mask closes the columns left of them), its positions continue from its own
        token count, and its states take over the places' fixed buffers (`StaticState.put_rows`), so the captured
        graphs stay valid and no other row moves. session: as `from_session` takes it. Returns False, changing
        nothing, where the rows do not fit: more columns than written so far, or the SSM layers not in their fixed
        buffers yet (no step since this decoder was built). A row whose budget outlasts max_len is the caller's to
        move on when the columns run out."""
        width = session.tokens
        if len(slots) != session.seq_ids.shape[0]:
            raise ValueError(f"{len(slots)} places for the {session.seq_ids.shape[0]} rows of the session")
        if width > self.written or not self.session.static or set(self.session.static) != set(session.states):
            return False
        index = torch.tensor(slots, dtype=torch.long, device=self.attend.device)
        mask = _token_mask(session, self.attend.device)
        start = self.written - width
        _rows_into_static(session.cache, self.session.cache, index, start, self.written)
        self.attend[index] = False
        self.attend[index, 0, 0, start:self.written] = mask.bool()
        real = mask.sum(-1)  # [n] real tokens fed, prompt included
        self.position[index] = real[:, None]
        seq_ids = self.session.seq_ids.clone()
        seq_ids[slots] = session.seq_ids.to(seq_ids.device)
        self.session.seq_ids = seq_ids
        positions = real.tolist()  # round trips inside the decode
        for layer, static in self.session.static.items():
            state = session.states[layer]
            static.put_rows(slots, state, state.schedule.count.tolist(), positions)
        return True

    def prefill(self) -> torch.Tensor:
        """Feed the prompt (eager); returns the last logits [B, V]."""
        if self.ids is None:
            raise ValueError("this decoder continues carried rows (from_session): it has no prompt to prefill")
        mask = None if bool(self.prompt_mask.all()) else self.prompt_mask
        return self.rm.forward(self.ids, self.session, attention_mask=mask, logits_to_keep=1)[:, -1]

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed token [B] to every row; returns the logits [B, V] (a new tensor)."""
        if self.written >= self.max_len:
            raise ValueError(f"the attention caches hold max_len={self.max_len} tokens, all written")
        self.token.copy_(token[:, None])
        variant = self._variant_next()
        if not self.graphs:
            logits = self._step_device(variant)
        elif variant not in self._warm:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                logits = self._step_device(variant)
            torch.cuda.current_stream().wait_stream(side)
            self._warm.add(variant)
        else:
            if variant not in self._graphs:
                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool):
                    out = self._step_device(variant)
                self._graphs[variant] = (graph, out)
            graph, out = self._graphs[variant]
            graph.replay()
            logits = out.clone()
        self.written += 1
        for state in self.session.static.values():
            state.advance_host()
        return logits

    def _variant_next(self) -> tuple[str, bool]:
        """The next step's variant, (`kernels.static_step.FOLDS`, whether round trips are due), from the host-side
        phases and positions, which every SSM layer shares; the first step, before the layers are loaded, reads a
        carried state's phases and the rows' positions once, or starts a window at the prompt's end (whose round
        trips the layers take from the anchor as they load)."""
        window = self.session.config.window
        for state in self.session.static.values():
            return state.folds_next, state.trips_next
        for state in self.session.states.values():
            if isinstance(state, ReplayState):  # rows continued from a session; a due round trip restarts a phase
                count = state.schedule.count.tolist()
                positions = self.session.trip_positions(self.batch, self.attend.device)  # [B] or None
                trip = self.session.config.round_trip
                due = [False] * len(count) if positions is None else trip.hits(positions).tolist()
                return folds_of([0 if d else c for c, d in zip(count, due)], window), any(due)
        return folds_of([0] * self.batch, window), False

    def _step_device(self, variant: tuple[str, bool]) -> torch.Tensor:
        """One token through the model on the fixed buffers: the device work a graph captures."""
        self.session.folds, self.session.trips = variant
        self.attend.index_fill_(-1, self.column, True)
        out = self.rm.model(input_ids=self.token, use_cache=True, attention_mask=self.mask_arg, position_ids=self.position,
                            logits_to_keep=1, **{self.rm._cache_arg: self.session.cache})
        self.position.add_(1)
        self.column.add_(1)
        return out.logits[:, -1]


def _into_static(dynamic, static, width: int) -> None:
    """Copy a dynamic cache's layers (KV [B, H, width, D], conv and recurrent states) into an empty StaticCache."""
    for src, dst in zip(dynamic.layers, static.layers):
        if getattr(dst, "is_sliding", False):
            raise ValueError(f"cache layer {type(dst).__name__}: sliding-window attention has no fixed-buffer "
                             "continuation here; use step 'triton'")
        if isinstance(dst, LinearAttentionCacheLayerMixin):
            for i in range(dst.number_of_states):
                conv, recurrent = src.conv_states[i], src.recurrent_states[i]
                dst.lazy_initialization(conv_states=conv, recurrent_states=recurrent, state_idx=i,
                                        conv_kernel_size=src.conv_kernel_size[i])
                for ours, theirs in ((dst.conv_states[i], conv), (dst.recurrent_states[i], recurrent)):
                    if theirs is not None:
                        ours.copy_(theirs)
                dst.has_previous_state[i] = src.has_previous_state[i]
        if isinstance(dst, StaticLayer):
            dst.lazy_initialization(src.keys[:, :, :1], src.values[:, :, :1])
            dst.keys[:, :, :width].copy_(src.keys)
            dst.values[:, :, :width].copy_(src.values)
            dst.cumulative_length.fill_(width)
        elif not isinstance(dst, (LinearAttentionCacheLayerMixin, DummyLayer)):
            raise ValueError(f"cache layer {type(dst).__name__} has no fixed-buffer continuation here; "
                             "use step 'triton'")


def _token_mask(session: ReplaySession, device) -> torch.Tensor:
    """[B, T] int64 mask of a session's real tokens (1 everywhere where it has no attention mask), on device."""
    mask = session.attention_mask
    if mask is None:
        return torch.ones(session.seq_ids.shape[0], session.tokens, dtype=torch.long, device=device)
    return mask.to(device)


def _rows_into_static(dynamic, static, index: torch.Tensor, start: int, end: int) -> None:
    """A dynamic cache's rows (KV [n, H, end - start, D], conv and recurrent states) into rows `index` of a StaticCache
    in use, KV at columns [start, end) (the columns left of start keep other tokens' values: the mask closes them)."""
    for src, dst in zip(dynamic.layers, static.layers):
        if isinstance(dst, LinearAttentionCacheLayerMixin):
            for i in range(dst.number_of_states):
                for ours, theirs in ((dst.conv_states[i], src.conv_states[i]),
                                     (dst.recurrent_states[i], src.recurrent_states[i])):
                    if theirs is not None:
                        ours.index_copy_(0, index, theirs.to(ours.dtype))
        if isinstance(dst, StaticLayer):
            dst.keys[index, :, start:end] = src.keys
            dst.values[index, :, start:end] = src.values


def _dynamic_rows(static, rm: ReplayModel, index: torch.Tensor, start: int, end: int) -> DynamicCache:
    """Rows `index` of a StaticCache as a DynamicCache: KV columns [start, end), conv and recurrent states."""
    dynamic = DynamicCache(config=rm.model.config.get_text_config(decoder=True))
    for src, dst in zip(static.layers, dynamic.layers):
        if isinstance(src, LinearAttentionCacheLayerMixin):
            for i in range(src.number_of_states):
                conv, recurrent = src.conv_states[i], src.recurrent_states[i]
                dst.lazy_initialization(conv_states=None if conv is None else conv[index],
                                        recurrent_states=None if recurrent is None else recurrent[index], state_idx=i,
                                        conv_kernel_size=src.conv_kernel_size[i])
                for ours, theirs in ((dst.conv_states[i], conv), (dst.recurrent_states[i], recurrent)):
                    if theirs is not None:
                        ours.copy_(theirs[index])
                dst.has_previous_state[i] = src.has_previous_state[i]
        if isinstance(src, StaticLayer) and src.is_initialized:
            dst.lazy_initialization(src.keys, src.values)
            dst.keys, dst.values = src.keys[index, :, start:end], src.values[index, :, start:end]  # [b, H, T, D]
    return dynamic


def _state_rows(state: ReplayState, index: torch.Tensor) -> ReplayState:
    """Rows `index` of a ReplayState (copies; every tensor leads with the batch dim, the packed read copy too)."""
    pick = lambda t: None if t is None else t[index]  # noqa: E731
    packed = state.lo_packed
    if packed is not None:
        packed = PackedState(packed.format, (len(index), *packed.shape[1:]), *(pick(t) for t in packed.tensors()))
    schedule = dataclasses.replace(state.schedule, **{f.name: pick(getattr(state.schedule, f.name))
                                                      for f in dataclasses.fields(state.schedule)})
    return ReplayState(pick(state.hi), pick(state.lo), {k: pick(v) for k, v in state.buffer.items()}, schedule,
                       pick(state.checkpoint), pick(state.seq_ids), state.layer, packed,
                       {copy: pick(t) for copy, t in state.residual.items()})
