"""One SSM layer's static decode step captured as CUDA graphs and replayed per token.

Three graphs per layer and batch size, one per step variant (`kernels.static_step.FOLDS`): no
row folds, some rows fold (the per-row fold mask is read on the device), every row folds; with round
trips inside the decode, three more, each variant with the due rows' round trip first. The
step's inputs are copied into fixed input buffers, the graph is replayed and its output copied
out. Warm-up (Triton compilation, allocator) runs on a side stream, as the CUDA graph docs of
torch ask, on a snapshot of the state that is restored afterwards, so capture changes no state.
"""

from __future__ import annotations

import torch

from replayssm_eval.kernels.static_step import FOLDS, StaticState


def _tensors(state: StaticState) -> list[torch.Tensor]:
    """Every device tensor a step writes (S_lo is S_hi when shared)."""
    packed = [t for t in state.packed.tensors() if t is not None]
    lo = [] if state.lo is state.hi else [state.lo]
    trips = [] if state.trips is None else [state.trips.position, state.trips.due]
    return [state.hi, *lo, *packed, *state.residual.values(), *state.buffer.values(), state.count, state.checkpoint,
            state.fold_out, *trips]


def variants(state: StaticState) -> list[tuple[str, bool]]:
    """The (folds, trips) variants of `state.step_device` a caller may ask for."""
    trips = (False, True) if state.trips is not None else (False,)
    return [(folds, trip) for trip in trips for folds in FOLDS]


class LayerGraph:
    """CUDA graphs of `state.step_device` for inputs shaped like `inputs` (fp32, CUDA); `__call__` = `state.step`."""

    def __init__(self, state: StaticState, inputs: tuple, pool=None):
        self.state = state
        self.inputs = tuple(t.clone() for t in inputs)
        saved = [t.clone() for t in _tensors(state)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for variant in variants(state):
                state.step_device(self.inputs, *variant)
        torch.cuda.current_stream().wait_stream(side)
        self._restore(saved)
        self.graphs, self.outputs = {}, {}
        for variant in variants(state):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[variant] = state.step_device(self.inputs, *variant)
            self.graphs[variant] = graph
        self._restore(saved)

    def _restore(self, saved: list[torch.Tensor]) -> None:
        for t, s in zip(_tensors(self.state), saved):
            t.copy_(s)

    def __call__(self, inputs: tuple, folds: str, trips: bool = False) -> torch.Tensor:
        for static, new in zip(self.inputs, inputs):
            static.copy_(new)
        self.graphs[folds, trips].replay()
        self.state.advance_host()
        return self.outputs[folds, trips].clone()
