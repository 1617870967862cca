"""The whole model's one-token greedy step on fixed buffers, captured as a CUDA graph per variant.

    decoder = StaticDecoder(rm, config, prompts_ids, mask, seq_ids, max_len=..., graphs=True)
    logits = decoder.prefill()               # [B, V], the prompt (Hugging Face's FP32 scan, eager)
    token = logits.argmax(-1)
    logits = decoder.step(token)             # [B, V], one token for every row

Every tensor a step reads or writes has a fixed address:
- attention layers: Hugging Face's `StaticCache` (keys and values [B, heads, max_len, d] written
  in place at the cache's device-side length; linear-attention layers keep their conv states
  in place), the attention mask [B, 1, 1, max_len] (bool, True = attend) built here: the
  prompt's padding mask, and column c opened when token c is written;
- SSM layers: `kernels.static_step.StaticState` through `StaticStepSession` (window phase,
  checkpoint indices and Philox keys on the device);
- the token [B, 1], positions [B, 1] and the next column [1], advanced on the device.

A step has two variants: some row folds after this token, or none does (known on the host from
the window phase, `StaticState.host_count`). With graphs=True (CUDA) a variant's first use runs
eagerly on a side stream (Triton compiles, the allocator warms up), its second use captures it
and every use replays it. With graphs=False (CPU, the Triton interpreter) every step runs
eagerly: the code that is captured.
"""

from __future__ import annotations

import torch
from transformers import StaticCache

from replayssm_eval.models.adapter import ReplayModel
from replayssm_eval.models.static_session import StaticStepSession


class StaticDecoder:
    """One batch's prompt and greedy one-token steps; see the module docstring.

    ids, mask: the left-padded prompt [B, W] and its padding mask [B, W] (1 = real) or None.
    max_len: tokens the attention caches hold (prompt width plus the steps to run).
    """

    def __init__(self, rm: ReplayModel, config, ids: torch.Tensor, mask: torch.Tensor | None, seq_ids, *,
                 max_len: int, graphs: bool = False):
        batch, width = ids.shape
        if max_len <= width:
            raise ValueError(f"max_len must exceed the prompt width {width}, got {max_len}")
        if graphs and ids.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, got device {ids.device}")
        self.rm, self.ids, self.graphs = rm, ids, graphs
        text_config = rm.model.config.get_text_config(decoder=True)
        self.session = StaticStepSession(config, seq_ids=seq_ids, graphs=False,
                                         new_cache=lambda: StaticCache(config=text_config, max_cache_len=max_len))
        device = ids.device
        self.prompt_mask = torch.ones_like(ids) if mask is None else mask
        self.attend = torch.zeros(batch, 1, 1, max_len, dtype=torch.bool, device=device)  # [B, 1, 1, max_len]
        self.attend[:, 0, 0, :width] = self.prompt_mask.bool()
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position = self.prompt_mask.sum(-1, keepdim=True)  # [B, 1] position of the next token per row
        self.column = torch.full((1,), width, dtype=torch.long, device=device)  # [1] its cache column
        self.mask_arg = {"full_attention": self.attend, "linear_attention": None}
        self.max_len, self.written = max_len, width
        self._warm: set[bool] = set()
        self._graphs: dict[bool, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None

    def prefill(self) -> torch.Tensor:
        """Feed the prompt (eager); returns the last logits [B, V]."""
        mask = None if bool(self.prompt_mask.all()) else self.prompt_mask
        return self.rm.forward(self.ids, self.session, attention_mask=mask, logits_to_keep=1)[:, -1]

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed token [B] to every row; returns the logits [B, V] (a new tensor)."""
        if self.written >= self.max_len:
            raise ValueError(f"the attention caches hold max_len={self.max_len} tokens, all written")
        self.token.copy_(token[:, None])
        flush = self._flush_next()
        if not self.graphs:
            logits = self._step_device(flush)
        elif flush not in self._warm:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                logits = self._step_device(flush)
            torch.cuda.current_stream().wait_stream(side)
            self._warm.add(flush)
        else:
            if flush not in self._graphs:
                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool):
                    out = self._step_device(flush)
                self._graphs[flush] = (graph, out)
            graph, out = self._graphs[flush]
            graph.replay()
            logits = out.clone()
        self.written += 1
        for state in self.session.static.values():
            state.advance_host()
        return logits

    def _flush_next(self) -> bool:
        """Whether some row of some SSM layer folds after the next token (host-side phases; the first
        step, before the layers are loaded, follows the window from the prompt end)."""
        if self.session.static:
            return any(s.flushes_next for s in self.session.static.values())
        return self.session.config.window == 1

    def _step_device(self, flush: bool) -> torch.Tensor:
        """One token through the model on the fixed buffers: the device work a graph captures."""
        self.session.flush = flush
        self.attend.index_fill_(-1, self.column, True)
        out = self.rm.model(input_ids=self.token, use_cache=True, attention_mask=self.mask_arg, position_ids=self.position,
                            logits_to_keep=1, **{self.rm._cache_arg: self.session.cache})
        self.position.add_(1)
        self.column.add_(1)
        return out.logits[:, -1]
