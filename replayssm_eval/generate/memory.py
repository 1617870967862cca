"""How many rows fit on the device: `--max-batch-size auto`, and the check of a given batch size before any work.

Per-row bytes are measured, not modelled (`measure`): one probe prompt of PROBE_TOKENS tokens is
prefilled and decoded one step under the config, and the tensors its session holds are summed:
attention KV (`keys` / `values` of the cache layers) per token, everything else (conv states, the
FP32 anchor, the stored SSM copies and ring buffers) per row. A row at the longest length L
(prompt + max_gen_toks) needs

    row = fixed + per_token * L + logits        (logits: vocab x 4 bytes x 2, the step's output and argmax)

and a batch of b rows needs b * row + prefill, where `prefill` is the probe's peak prefill
workspace on CUDA scaled linearly to `prefill_tokens` (the chunk scans' workspace grows with the
tokens of a call). The batch must fit in MARGIN-less free memory (torch.cuda.mem_get_info, taken
with the weights loaded): b * row + prefill <= (1 - MARGIN) * free. On CPU nothing is queried: a
given batch size is used as is and `auto` takes the default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from replayssm_eval.generate.batch_rows import KV_ATTRS

MARGIN = 0.15  # of the free memory, for activations of a step, allocator fragmentation and the CUDA context
PROBE_TOKENS = 256
GIB = 2**30


class DoesNotFit(MemoryError, ValueError):
    """A batch (or one row) that does not fit the free device memory: bad input, reported in one line by the CLI."""


@dataclass(frozen=True)
class RowCost:
    """Bytes of one row: `fixed` + `per_token` x tokens + `logits`; `prefill`: workspace of one prefill call."""

    fixed: int
    per_token: int
    logits: int
    prefill: int

    def row(self, length: int) -> int:
        return self.fixed + self.per_token * length + self.logits


def free_memory(device: torch.device) -> int | None:
    """Free bytes on a CUDA device; None elsewhere."""
    if device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(device)[0]


@torch.no_grad()
def measure(rm, config, *, step: str, prefill_segment: int, prefill_tokens: int) -> RowCost:
    """The `RowCost` of `rm` under `config`, from a one-row probe (see the module docstring)."""
    from replayssm_eval.generate.decode import decode_session
    from replayssm_eval.generate.engine import Engine

    device = rm.model.device
    probe = [1] * PROBE_TOKENS
    engine = Engine(rm, config, step=step, max_batch=1, prefill_segment=prefill_segment, prefill_tokens=prefill_tokens)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    prefill, logits = engine.prefill([probe], [0])
    workspace = torch.cuda.max_memory_allocated(device) - before if cuda else 0
    session = decode_session(rm, config, [0], "static" if step == "graph" else step)  # graph: the static step's buffers
    session.continue_from(prefill.carried())
    engine.step_tokens(session, logits.argmax(-1))
    kv = sum(_bytes(getattr(layer, name, None)) for layer in session.cache.layers for name in KV_ATTRS)
    total = sum(_bytes(vars(layer)) for layer in session.cache.layers) + _bytes(session.states)
    tokens = session.tokens
    scale = prefill_tokens / min(PROBE_TOKENS, prefill_segment, prefill_tokens)
    return RowCost(fixed=total - kv, per_token=-(-kv // tokens) + 8, logits=2 * 4 * logits.shape[-1],
                   prefill=int(workspace * max(1.0, scale)))


def plan_rows(rm, config, requested: int | str, length: int, *, step: str, prefill_segment: int, prefill_tokens: int,
              default: int) -> int:
    """`fit_batch` on the model's device, measuring the row cost only where the memory is checked (CUDA)."""
    free = free_memory(rm.model.device)
    if free is None:
        return fit_batch(requested, RowCost(0, 0, 0, 0), length, None, default=default)
    cost = measure(rm, config, step=step, prefill_segment=prefill_segment, prefill_tokens=prefill_tokens)
    return fit_batch(requested, cost, length, free, default=default)


def fit_batch(requested: int | str, cost: RowCost, length: int, free: int | None, *, default: int) -> int:
    """The batch size to run: `requested`, checked, or for "auto" the largest that fits; `DoesNotFit` otherwise.

    length: the longest row (prompt + max_gen_toks); free: free device bytes (None: not checked).
    """
    if free is None:
        return default if requested == "auto" else int(requested)
    budget = (1 - MARGIN) * free - cost.prefill
    row = cost.row(length)
    largest = int(budget // row) if budget > 0 else 0
    what = (f"{row / GIB:.2f} GiB per row at {length} tokens + {cost.prefill / GIB:.2f} GiB prefill workspace, "
            f"{free / GIB:.2f} GiB free ({MARGIN:.0%} kept back)")
    if requested == "auto":
        if largest < 1:
            raise DoesNotFit(f"not even one row fits: {what}; lower --max-gen-toks or the prefill segment/tokens")
        return largest
    requested = int(requested)
    if requested > largest:
        needed = requested * row + cost.prefill
        raise DoesNotFit(f"batch size {requested} needs {needed / GIB:.2f} GiB ({what}); at most {largest} rows fit: "
                          "use that batch size or --max-batch-size auto")
    return requested


def _bytes(obj) -> int:
    """Bytes of the tensors in `obj` (dicts, lists, tuples, dataclasses), each storage counted once."""
    seen: set[int] = set()

    def walk(o) -> int:
        if torch.is_tensor(o):
            key = o.untyped_storage().data_ptr()
            if key in seen:
                return 0
            seen.add(key)
            return o.untyped_storage().nbytes()
        if isinstance(o, dict):
            return sum(walk(v) for v in o.values())
        if isinstance(o, (list, tuple)):
            return sum(walk(v) for v in o)
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return sum(walk(getattr(o, f.name)) for f in dataclasses.fields(o))
        return 0

    return walk(obj)
