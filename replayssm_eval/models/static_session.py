"""`StaticStepSession`: a session whose one-token calls run the static, host-sync-free decode step.

The prompt (and any multi-token call) runs as in `ReplaySession`. At a layer's first one-token
call its state (the FP32 anchor the prompt left, after the config's round trip at the prompt's end
or at the rows' positions then if it has one, or a ReplayState with its packed read copy) is moved
into fixed buffers (`kernels.static_step.StaticState`, with each row's position, its real tokens
fed so far, for round trips inside the decode); every later one-token call steps them in place. With
`graphs=True` (CUDA only) each layer's step is a captured CUDA graph (`models.layer_graph`),
captured at that first call; otherwise the same step runs eagerly (CPU, Triton interpreter), so
tests run the code that is captured. A driver that captures the whole model
(`models.model_graph`) sets `folds` and `trips` (the step variant) and advances the layers'
host-side phases itself. `states[layer]` is a ReplayState view of the buffers, equal bit for bit to what
`decode_step_triton` would have carried.
"""

from __future__ import annotations

import torch

from replayssm_eval.kernels.family import KernelFamily
from replayssm_eval.kernels.round_trip import round_trip
from replayssm_eval.replay.state import ReplayState, write_read_copy_packed, zero_residual
from replayssm_eval.kernels.static_step import StaticState, check_static_config, folds_in_place
from replayssm_eval.models.session import ReplaySession, at_least_fp32


class StaticStepSession(ReplaySession):
    """A session whose one-token calls go to `StaticState.step` (or its CUDA graph); longer calls as usual."""

    def __init__(self, config, *, graphs: bool = False, **kwargs):
        super().__init__(config, backend="triton", **kwargs)
        if self.compute_dtype != torch.float32:
            raise ValueError(f"the static decode step computes in FP32, got compute_dtype={self.compute_dtype}; "
                             "use the reference engine for FP64 checks")
        self.graphs = graphs
        self._pool = None
        # the step variant, set by a driver stepping every layer (`models.model_graph`)
        self.folds: str | None = None
        self.trips = False

    def reset(self, *, config=None, seq_ids=None) -> None:
        super().reset(config=config, seq_ids=seq_ids)
        if config is not None:
            check_static_config(self.config)
        self.static: dict[int, StaticState] = {}
        self.layer_graphs: dict[int, object] = {}
        self._scratch: dict[tuple, torch.Tensor] = {}  # fold_out shared by the layers of one state shape

    def continue_from(self, carried: dict) -> None:
        super().continue_from(carried)
        self.static, self.layer_graphs = {}, {}

    def forget(self, layer_idx: int) -> None:
        super().forget(layer_idx)
        self.static.pop(layer_idx, None)
        self.layer_graphs.pop(layer_idx, None)

    def scan(self, family, layer_idx, inputs, anchor, attention_mask, plain=None):
        if inputs[0].shape[1] != 1:
            self.static.pop(layer_idx, None)  # a multi-token call continues the carried ReplayState view
            self.layer_graphs.pop(layer_idx, None)
            return super().scan(family, layer_idx, inputs, anchor, attention_mask, plain)
        inputs = tuple(at_least_fp32(t).contiguous() for t in inputs)
        if inputs[0].dtype != torch.float32:
            raise ValueError(f"the static decode step computes in FP32, got {inputs[0].dtype} inputs; use step='reference'")
        state = self.static.get(layer_idx)
        if state is None:
            state = self._load(family, layer_idx, inputs, self.states.get(layer_idx, anchor))
        if self.folds is not None:  # the driver chose the variant and advances the host-side phases
            return state.step_device(inputs, self.folds, self.trips)
        folds, trips = state.folds_next, state.trips_next
        if self.graphs:
            graph = self.layer_graphs.get(layer_idx)
            if graph is None:
                from replayssm_eval.models.layer_graph import LayerGraph

                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()
                graph = self.layer_graphs[layer_idx] = LayerGraph(state, inputs, self._pool)
            return graph(inputs, folds, trips)
        return state.step(inputs, folds, trips)

    def trip_positions(self, batch: int, device) -> torch.Tensor | None:
        """[B] int64: each row's real tokens fed so far, when one-token calls take round trips inside the decode
        (None otherwise: no round trip, one at the prompt's end, or the plain FP32 reference's, which change
        nothing)."""
        trip = self.config.round_trip
        if trip is None or trip.prompt or self.plain_fp32():
            return None
        return self._positions(batch, device)

    def _load(self, family: KernelFamily, layer_idx: int, inputs: tuple, initial) -> StaticState:
        """The layer's state in fixed buffers: checkpoint 0 written from the FP32 anchor (after the config's round trip
        at the prompt's end, or those due at the rows' positions now, as `ReplaySession` restores them), or a
        ReplayState's copies."""
        batch, device = inputs[0].shape[0], inputs[0].device
        seq_ids = self._seq_ids(batch, device)
        trip = self.config.round_trip
        anchor = not isinstance(initial, ReplayState)
        positions = self.trip_positions(batch, device)  # [B] or None
        if anchor and trip is not None and not self.plain_fp32():
            rows = torch.ones_like(seq_ids, dtype=torch.bool) if trip.prompt else trip.hits(positions)  # [B]
            if bool(rows.any()):
                initial = round_trip(family, inputs, at_least_fp32(initial), self.config, layer_idx, seq_ids, rows)
        state = family.replay_state(inputs, initial, self.config, layer_idx, seq_ids)
        packed = state.lo_packed
        if not isinstance(initial, ReplayState):  # the anchor: checkpoint 0's packed read copy, from zero residuals
            anchor_state = family.stored_layout(initial).float()
            packed = write_read_copy_packed(anchor_state, self.config, layer_idx, seq_ids, state.checkpoint,
                                            zero_residual(self.config, tuple(anchor_state.shape), device))[1]
        if packed is None:
            raise ValueError(f"layer {layer_idx}'s carried state has no packed read copy; the static step starts from "
                             "the FP32 anchor or a state written by the decode step")
        count = [0] * state.batch if not isinstance(initial, ReplayState) else state.schedule.count.tolist()
        shape = (tuple(state.hi.shape), state.hi.device)
        scratch = None  # an FP32 recurrence copy takes its folds in place
        if not folds_in_place(self.config):
            if shape not in self._scratch:
                self._scratch[shape] = torch.zeros(shape[0], dtype=torch.float32, device=shape[1])
            scratch = self._scratch[shape]
        static = self.static[layer_idx] = StaticState.from_replay_state(
            family.name, state, packed, self.config, count, scratch,
            positions=None if positions is None else positions.tolist(), taken=anchor)
        self.states[layer_idx] = static.replay_state()
        return static
