"""The generation engine: segmented FP32 prefill and continuous batching of greedy or sampled ReplaySSM generations.

    engine = Engine(rm, "nvfp4/fp16sr", step="triton", max_batch=64, prefill_segment=2048, sampling_seed=0)
    gens = engine.generate(prompts, max_gen_toks=[4096, ...], until=[["</s>"], ...], seq_ids=[...],
                           order=longest_first, sampling=Sampling(0.6, 0.95, 20), samples=[0, 1, ...])

Prefill (`prefill`). Prompts are fed in segments of at most `prefill_segment` tokens per row and
`prefill_tokens` tokens per call (rows x segment), through an FP32 session (`fp32` under the
chunked engine: Hugging Face's FP32 torch chunk scan from the carried FP32 state), so no call
asks for more workspace than `prefill_tokens` tokens need, whatever the prompt length and batch.
The final FP32 state of each SSM layer is put back into the HF cache as the anchor every config
starts from (docs/semantics.md, decode semantics); segment boundaries change it only by the float
noise of the chunk scan's summation order. Rows are prefilled in groups of equal segment count
(ceil(length / segment)), left-padded inside the group, so every row's padding lies in its group's
first segment (only the first call of a session may be padded) and holds at least one real token.

Decoding (`generate`). At most `max_batch` rows run at once. Each step picks every row's token
(`sampling.choose`: greedy argmax, or a draw keyed by (sampling_seed, seq_id, sample, position) alone,
so the same under any batching, step and config) and feeds the batch one token per row through `step_tokens`, the engine's one
place that runs a one-token step. A row stops at the eos token, at a stop string, or at its
max_gen_toks; it leaves the batch and, with `continuous`, waiting prompts take the free places
once `refill` are free: they are prefilled alone (a batch of the new rows), take their first
token and one decode step there (their SSM states become ReplayStates like the running rows'),
and are joined into the running batch. Each row keeps its own seq_id (its SR bits), its own
positions and its own window phase, so its tokens do not depend on the batching. Without
`continuous` (static batching) new prompts start only once the whole batch stopped.

The steps "reference", "triton" and "static" run a session (`decode.decode_session`); rows
leave it and join it through `batch_rows.keep_rows` and `batch_rows.join`. Step "graph" runs the
whole model's one-token step on fixed buffers (`models.model_graph.StaticDecoder`, a CUDA graph
per variant on CUDA): the new rows' first step is the eager Triton step (bit for bit the static
step). A stopped row keeps its place in the decoder, masked and ignored; new rows take such places
(`StaticDecoder.admit`: their KV right-aligned at the shared next column, their states copied into the
places' fixed buffers, so no running row moves and no graph is captured) where their tokens fit left of
that column. Otherwise a join builds a new decoder (`StaticDecoder.rows` of the running rows, joined
with the new rows, `StaticDecoder.from_session`) sized for the longest remaining budget, and so does a
decoder whose columns run out under an admitted row with budget left. When no refill is coming and at
most half the decoder's rows run, the running rows move to a smaller decoder. A row's KV, conv and SSM
states are its own, so it reaches no other row's tokens or states except as any batch neighbour does
(the batch shape of the matmuls, which a fixed decoder keeps fixed). Each regroup copies the states and
captures new graphs, so it waits for many free places rather than one. A decoder's step is launched before
the host reads the tokens it takes (`Engine._advance_decoder`): the device runs it while the host appends
them and checks the stops, so no step waits on the host. "static" and "graph" take one fixed-window config for
every layer (not speculative or mixed: `kernels.static_step.check_static_config`), with round trips of every kind,
each row's at its own positions (`kernels.static_step.Trips`).

Out of memory in a step, a prefill or a regroup: the running batch is discarded, its rows go back to the front of the
queue and `max_batch` halves (decoding is deterministic, sampled or not: they regenerate the same tokens);
at one row, the error says so.
"""

from __future__ import annotations

import gc
import math
from collections import deque
from dataclasses import dataclass, field

import torch

from replayssm_eval.generate import DECODE_STEPS, FIXED_BUFFER_STEPS
from replayssm_eval.generate.batch_rows import join, keep_rows
from replayssm_eval.generate.decode import Generation, cut_text, decode_session, left_pad, sequence_id
from replayssm_eval.generate.sampling import Sampling, choose
from replayssm_eval.kernels.static_step import check_static_config, check_static_family
from replayssm_eval.models.adapter import ReplayModel
from replayssm_eval.models.model_graph import StaticDecoder
from replayssm_eval.models.session import ReplaySession, as_config

PREFILL_SEGMENT = 2048
PREFILL_TOKENS = 4096


@dataclass
class _Row:
    """One request: its prompt, limits, how it picks tokens (its sample index keys the draws) and what it generated so far."""

    prompt: list[int]
    max_gen_toks: int
    until: list[str]
    seq_id: int
    sampling: Sampling
    sample: int
    tokens: list[int] = field(default_factory=list)
    stopped: bool = False


@dataclass
class _Batch:
    """The running batch: its session (step "graph": its decoder), the request index of each row (None: a
    stopped row still holding its place in a decoder), and the next logits [B, V]."""

    session: ReplaySession | StaticDecoder | None
    rows: list[int | None]
    logits: torch.Tensor

    @property
    def live(self) -> list[int]:
        return [k for k, row in enumerate(self.rows) if row is not None]


class Engine:
    """Greedy or sampled generation of many prompts under one config; see the module docstring.

    step: "reference" | "triton" | "static" (the decode steps of `decode.decode_session`) | "graph"
        (the whole model's step on fixed buffers, `models.model_graph.StaticDecoder`).
    max_batch: rows decoded at once; prefill_segment: prompt tokens per row and call;
    prefill_tokens: tokens per prefill call (rows x segment; at least one row);
    continuous: refill free places while others run (False: static batches);
    refill: free places that trigger a refill (default max(1, max_batch // 8); fewer when fewer wait);
    stop_at_eos: False runs every row to its max_gen_toks (benchmarks; also the case without a tokenizer);
    sampling_seed: the Philox key of the sampled rows' draws (`sampling`).
    """

    def __init__(self, rm: ReplayModel, config, *, step: str, max_batch: int, prefill_segment: int = PREFILL_SEGMENT,
                 prefill_tokens: int = PREFILL_TOKENS, continuous: bool = True, refill: int | None = None,
                 stop_at_eos: bool = True, sampling_seed: int = 0):
        for name, value in (("max_batch", max_batch), ("prefill_segment", prefill_segment),
                            ("prefill_tokens", prefill_tokens)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if sampling_seed < 0:
            raise ValueError(f"sampling_seed must be >= 0, got {sampling_seed}")
        if step not in DECODE_STEPS:
            raise ValueError(f"unknown decode step {step!r}; known: {', '.join(DECODE_STEPS)}")
        config = as_config(config)
        if step in FIXED_BUFFER_STEPS:
            check_static_config(config, f"step {step!r}", "step 'triton'")
            check_static_family(rm.model_type.family)
        self.rm, self.config, self.step = rm, config, step
        self.graphs = step == "graph" and rm.model.device.type == "cuda"  # CUDA graphs of each decoder's step
        self.max_batch, self.prefill_segment, self.prefill_tokens = max_batch, prefill_segment, prefill_tokens
        self.continuous, self.sampling_seed = continuous, sampling_seed
        tokenizer = rm.tokenizer
        self.eos = tokenizer.eos_token_id if stop_at_eos and tokenizer is not None else None
        self.pad = (tokenizer.pad_token_id or 0) if tokenizer is not None else 0
        self.refill = refill or max(1, max_batch // 8)
        self.decode_steps = 0  # one-token steps of the running batch (counted for benchmarks)
        self.regroups = 0  # decoders built by step "graph" (each copies the rows' states and captures graphs)
        self.admitted = 0  # rows step "graph" put into a running decoder's stopped places (no regroup)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, max_gen_toks, until=(), seq_ids=None, order=None, sampling=None,
                 samples=None):
        """Generations of `prompts` (token id lists), in input order.

        max_gen_toks: one limit, or one per prompt; until: stop strings of every row, or one list
        per row; seq_ids: SR and sampling keys per row (default `decode.sequence_id` of the prompt);
        order: the order rows enter the batch (default: input order); sampling: one `Sampling` or one
        per row (default greedy); samples: each row's sample index (default 0; the n samples of a
        question are n rows of one prompt with samples 0..n-1).
        """
        n = len(prompts)
        limits = [max_gen_toks] * n if isinstance(max_gen_toks, int) else list(max_gen_toks)
        stops = [list(u) for u in until] if until and not isinstance(until[0], str) else [list(until)] * n
        ids = [sequence_id(p) for p in prompts] if seq_ids is None else list(seq_ids)
        how = list(sampling) if isinstance(sampling, (list, tuple)) else [sampling or Sampling()] * n
        indices = [0] * n if samples is None else [int(j) for j in samples]
        if not (len(limits) == len(stops) == len(ids) == len(how) == len(indices) == n):
            raise ValueError(f"{n} prompts but {len(limits)} max_gen_toks, {len(stops)} stop lists, {len(ids)} seq_ids, "
                             f"{len(how)} sampling settings, {len(indices)} sample indices")
        if any(j < 0 for j in indices):
            raise ValueError(f"sample indices must be >= 0, got {min(indices)}")
        if any(m < 1 for m in limits):
            raise ValueError(f"max_gen_toks must be >= 1, got {min(limits)}")
        if self.rm.tokenizer is None and any(stops):
            raise ValueError("stop strings need a tokenizer; this model has none")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: every prompt needs at least one token")
        self._rows = [_Row(list(p), m, s, i, h, j) for p, m, s, i, h, j in zip(prompts, limits, stops, ids, how, indices)]
        order = list(range(n)) if order is None else list(order)
        if sorted(order) != list(range(n)):
            raise ValueError(f"order must be a permutation of range({n})")
        self._run(deque(order))
        tok = self.rm.tokenizer
        return [Generation(tuple(r.tokens), "" if tok is None else cut_text(tok, r.tokens, r.until), r.stopped,
                           r.max_gen_toks) for r in self._rows]

    def _run(self, waiting: deque) -> None:
        run: _Batch | None = None
        while waiting or run is not None:
            free = self.max_batch - (0 if run is None else len(run.live))
            if waiting and (run is None or (self.continuous and free >= min(self.refill, len(waiting)))):
                new = [waiting.popleft() for _ in range(min(free, len(waiting)))]
                joined, failure = _unless_out_of_memory(lambda: self._join(run, self._start(new)))
                if failure is not None:
                    run = self._shrink(run, new, waiting, failure)
                    continue
                run = joined
            if run is None:
                continue
            compact = not (waiting and self.continuous)  # no refill coming
            advanced, failure = _unless_out_of_memory(lambda: self._advance(run, compact=compact))
            run = advanced if failure is None else self._shrink(run, [], waiting, failure)

    def _advance(self, run: _Batch, compact: bool = True) -> _Batch | None:
        """Append each row's token (`_choose`); the stopped rows leave; one step for the others.

        Step "graph" (`_advance_decoder`): a stopped row keeps its place in the decoder, masked (its tokens are
        ignored; rows share no values), until a new row takes it or a refill regroups the batch, or, with `compact`
        (no refill coming), until at most half the decoder's rows run: then the running rows move to a smaller
        decoder. Regrouping copies every state and captures new graphs: worth it only for many rows.
        """
        if isinstance(run.session, StaticDecoder):
            return self._advance_decoder(run, compact)
        chosen = self._choose(run)  # [B]
        live = self._append_tokens(run, chosen.tolist())
        if not live:
            return None
        if len(live) < len(run.rows):
            keep_rows(run.session, live)
            run.rows = [run.rows[k] for k in live]
            chosen = chosen[torch.tensor(live, device=chosen.device)]
        run.logits = self.step_tokens(run.session, chosen)
        self.decode_steps += 1
        return run

    def _advance_decoder(self, run: _Batch, compact: bool) -> _Batch | None:
        """`_advance` of a decoder, one step ahead of the host: the step that takes this token is launched before the
        host reads the tokens back, so the device runs it while the host appends them and checks the stops (a fixed
        decoder holds a stopped row's place anyway: it takes its last token in vain). The step is skipped where every
        row takes its last token (max_gen_toks); a compaction regroups after the step, from the stepped logits, and a
        decoder whose columns ran out regroups before it."""
        going_on = self._going_on(run)
        if any(going_on) and run.session.written == run.session.max_len:
            run = self._regroup(run, None)  # an admitted row outlives the decoder's columns: one sized for it
            going_on = self._going_on(run)
        chosen = self._choose(run)  # [B]
        taken = _HostCopy(chosen)
        if any(going_on):
            run.logits = self.step_tokens(run.session, chosen)
            self.decode_steps += 1
        live = self._append_tokens(run, taken.values())
        if not live:
            return None
        if compact and len(live) <= len(run.rows) // 2:
            return self._regroup(run, None)
        return run

    def _going_on(self, run: _Batch) -> list[bool]:
        """Per place, whether its row runs past the token it takes now (not its last by max_gen_toks)."""
        return [i is not None and len(self._rows[i].tokens) + 1 < self._rows[i].max_gen_toks for i in run.rows]

    def _append_tokens(self, run: _Batch, tokens: list[int]) -> list[int]:
        """Append the batch's chosen tokens to its rows (a finished row's place becomes None); returns the running
        rows' places, and where none runs, lets the batch's session go."""
        for k, token in enumerate(tokens):
            if run.rows[k] is not None and self._append(run.rows[k], token):
                run.rows[k] = None
        live = run.live
        if not live:
            run.session = None
            _collect()
        return live

    def _choose(self, run: _Batch) -> torch.Tensor:
        """[B] next tokens of the batch's rows (a row holding a stopped place: greedy, ignored)."""
        rows = [None if i is None else self._rows[i] for i in run.rows]
        return choose(run.logits, [Sampling() if r is None else r.sampling for r in rows], seed=self.sampling_seed,
                      seq_ids=[0 if r is None else r.seq_id for r in rows], samples=[0 if r is None else r.sample for r in rows],
                      positions=[0 if r is None else len(r.tokens) for r in rows])

    def step_tokens(self, session: ReplaySession | StaticDecoder, tokens: torch.Tensor) -> torch.Tensor:
        """One token per row [B] through the model; returns the next logits [B, V]."""
        if isinstance(session, StaticDecoder):
            return session.step(tokens)
        return self.rm.forward(tokens[:, None], session, logits_to_keep=1)[:, -1]

    def _append(self, index: int, token: int) -> bool:
        """Add a token to request `index`; True when the request is finished."""
        row = self._rows[index]
        row.tokens.append(token)
        lookback = max((len(s.encode()) for s in row.until), default=0) + 1  # a stop string of n bytes spans <= n tokens
        tail = self.rm.tokenizer.decode(row.tokens[-lookback:]) if row.until else ""
        row.stopped = token == self.eos or any(s in tail for s in row.until)
        return row.stopped or len(row.tokens) >= row.max_gen_toks

    def _start(self, new: list[int]) -> _Batch | None:
        """Prefill requests `new`, take their first token and, for the unfinished, one decode step of their own
        (step "graph": the eager Triton step, bit for bit the static step; the decoder takes its ReplayStates)."""
        prefill, logits = self.prefill([self._rows[i].prompt for i in new], [self._rows[i].seq_id for i in new])
        step = "triton" if self.step == "graph" else self.step
        session = decode_session(self.rm, self.config, [self._rows[i].seq_id for i in new], step)
        session.continue_from(prefill.carried())
        return self._advance(_Batch(session, list(new), logits))

    def _join(self, run: _Batch | None, started: _Batch | None) -> _Batch | None:
        """The running rows followed by the started ones (step "graph": in the running decoder's stopped places where
        they fit, else in a new decoder)."""
        if started is None or (run is None and self.step != "graph"):
            return run if started is None else started
        if self.step == "graph":
            return run if run is not None and self._admit(run, started) else self._regroup(run, started)
        session = join([run.session, started.session])
        run.session = started.session = None
        _collect()
        return _Batch(session, run.rows + started.rows, torch.cat([run.logits, started.logits]))

    def _admit(self, run: _Batch, started: _Batch) -> bool:
        """The started rows into the first stopped places of run's decoder (`StaticDecoder.admit`: no running row
        moves, no graph is captured); False, changing nothing, where there are too few places or the rows do not
        fit."""
        slots = [k for k, row in enumerate(run.rows) if row is None][:len(started.rows)]
        if len(slots) < len(started.rows) or not run.session.admit(slots, started.session):
            return False
        for slot, row in zip(slots, started.rows):
            run.rows[slot] = row
        run.logits[torch.tensor(slots, device=run.logits.device)] = started.logits
        started.session = None
        _collect()
        self.admitted += len(slots)
        return True

    def _regroup(self, run: _Batch | None, started: _Batch | None) -> _Batch:
        """A new decoder of run's running rows then started's rows (`StaticDecoder.rows` / `from_session`), sized for
        the longest remaining budget; run's decoder is released before the new one is allocated."""
        parts, rows, logits = [], [], []
        if run is not None:
            live = run.live
            parts.append(run.session.rows(live))
            rows += [run.rows[k] for k in live]
            logits.append(run.logits[torch.tensor(live, device=run.logits.device)])
            run.session = None
            _collect()
        if started is not None:
            parts.append(started.session)
            rows += started.rows
            logits.append(started.logits)
        session = join(parts) if len(parts) > 1 else parts[0]
        steps = max(self._rows[i].max_gen_toks - len(self._rows[i].tokens) for i in rows)
        decoder = StaticDecoder.from_session(self.rm, session, steps=max(1, steps), graphs=self.graphs)
        self.regroups += 1
        return _Batch(decoder, rows, torch.cat(logits))

    def prefill(self, prompts: list[list[int]], seq_ids: list[int]) -> tuple[ReplaySession, torch.Tensor]:
        """FP32 sessions of `prompts` (their states at the anchor) joined into one, and the last logits [B, V].

        See the module docstring: groups of equal segment count, calls of at most `prefill_tokens` tokens.
        """
        segment = self.prefill_segment
        groups: dict[int, list[int]] = {}
        for k, p in enumerate(prompts):
            groups.setdefault(math.ceil(len(p) / segment), []).append(k)
        parts, logits, placed = [], [], []
        for count, members in sorted(groups.items()):
            rows_per_call = max(1, self.prefill_tokens // min(segment, max(len(prompts[k]) for k in members)))
            for start in range(0, len(members), rows_per_call):
                chunk = members[start:start + rows_per_call]
                session = self.rm.new_session("fp32", seq_ids=[seq_ids[k] for k in chunk], engine="chunked")
                ids, mask = left_pad([prompts[k] for k in chunk], self.pad, self.rm.model.device)
                first = ids.shape[1] - segment * (count - 1)  # holds every row's padding and >= 1 real token
                bounds = [0, *range(first, ids.shape[1] + 1, segment)]
                for a, b in zip(bounds, bounds[1:]):
                    out = self.rm.forward(ids[:, a:b], session, attention_mask=None if (mask is None or a) else mask[:, :b],
                                          logits_to_keep=1)
                _anchor_into_cache(session)
                parts.append(session)
                logits.append(out[:, -1])
                placed += chunk
        session = join(parts) if len(parts) > 1 else parts[0]
        back = torch.tensor([placed.index(k) for k in range(len(prompts))], dtype=torch.long)
        if placed != sorted(placed):
            keep_rows(session, back.tolist())
        return session, torch.cat(logits)[back.to(logits[0].device)]

    def _shrink(self, run: _Batch | None, new: list[int], waiting: deque, failure: str) -> None:
        """Out of memory: every started row goes back to the queue, max_batch halves (or the error says why not)."""
        rows = ([] if run is None else [i for i in run.rows if i is not None]) + new
        if self.max_batch == 1:
            raise MemoryError(f"out of memory generating one row (prompt of {max(len(self._rows[i].prompt) for i in rows)} "
                              f"tokens) at prefill_tokens {self.prefill_tokens}: {failure}")
        for i in reversed(rows):
            self._rows[i].tokens.clear()
            self._rows[i].stopped = False
            waiting.appendleft(i)
        self.max_batch = max(1, self.max_batch // 2)
        self.refill = max(1, min(self.refill, self.max_batch // 8))
        if run is not None:
            run.session = None
        _collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None


def _unless_out_of_memory(work):
    """(work(), None), or (None, the message) when it ran out of GPU memory: the error's traceback, whose frames
    hold the failed batch's tensors, is dropped here so that `Engine._shrink` can free them."""
    try:
        return work(), None
    except torch.OutOfMemoryError as err:
        return None, str(err)


class _HostCopy:
    """A copy of a small device tensor on its way to the host (pinned memory, ordered after the work queued so far),
    so that work launched after it runs while the host waits for these values alone."""

    def __init__(self, values: torch.Tensor):
        self.host = values.to("cpu", non_blocking=True)
        self.ready = None
        if values.device.type == "cuda":
            self.ready = torch.cuda.Event()
            self.ready.record()

    def values(self) -> list:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


def _collect() -> None:
    """Free the sessions a join or regroup let go of now: a session and its HF cache point at each other
    (`models.session`), so only the cyclic GC frees their states and caches, and it may not run before the
    next batch asks the GPU for the same memory."""
    gc.collect()


def _anchor_into_cache(session: ReplaySession) -> None:
    """Put the FP32 states a multi-segment prefill carried in the session into the HF cache (the anchor slot)."""
    for layer_idx, state in session.states.items():
        session.cache.layers[layer_idx].update_recurrent_state(state)
    session.states = {}
