"""Philox keys and counters for stochastic rounding of stored states.

Every stored state copy draws its random bits from Philox4x32-10 (`formats.philox.randint`) with
- key = `sr_key(seed, layer, sequence, copy)`: splitmix64 of the run seed, the layer index, the
  sequence id and the copy (0 = recurrence copy S_hi, 1 = read copy S_lo, 2 = a round trip's stored state);
- counter = (checkpoint index << 32) + element index, the element index being row-major in the
  state's `[H, P, N]` format layout (GDN states are laid out `[HV, V, K]` for the formats);
- word 0 at each element's counter, or, for a format with Philox lanes (`fmt.lane_words`: fp16sr's
  `words=duo|quad|octet`), one call per G elements of a row at the first one's counter, element n reading
  word lane_words[n % G]: the draws of `fmt.encode(x, seed=key, offset=checkpoint << 32)`.
Checkpoint 0 is the one written at prefill; checkpoint k the k-th flush after it. So a run is
bit-reproducible from its seed, and neither batch composition nor call boundaries change a bit.

`sr_keys` computes a GPU batch's keys on the GPU and remembers the keys of a seq_ids tensor while it lives
(and is not written in place): the layers of a session share one seq_ids tensor, and a host read of the ids
would wait for every queued kernel, once per layer and call.
"""

from __future__ import annotations

import torch

from replayssm_eval.formats.layout import lane_draws
from replayssm_eval.formats.philox import randint
from replayssm_eval.replay.device_keys import sr_keys_device
from replayssm_eval.replay.host_values import remembered

_MASK64 = (1 << 64) - 1
RECUR_COPY, READ_COPY, ROUND_TRIP_COPY = 0, 1, 2


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def sr_key(seed: int, layer: int, sequence: int, copy: int) -> int:
    """64-bit Philox key of one stored copy, as a signed int64 value (two's complement)."""
    z = _splitmix64(seed & _MASK64)
    for part in (layer, sequence, copy):
        z = _splitmix64(z ^ (part & _MASK64))
    return z - (1 << 64) if z >= 1 << 63 else z


def sr_keys(seed: int, layer: int, seq_ids: torch.Tensor, copy: int) -> torch.Tensor:
    """[B] int64 keys for a batch of sequences, on seq_ids' device (read-only: shared between calls).

    Remembered per seq_ids tensor (by identity) while it lives and is not written in place; off the CPU they are
    computed on the device (`device_keys.sr_keys_device`, the same bits), so no call reads the device."""
    keys = remembered(seq_ids)  # {(seed, layer, copy): [B] int64 keys on seq_ids' device}
    part = (seed, layer, copy)
    if part in keys:
        return keys[part]
    if seq_ids.device.type == "cpu":
        return keys.setdefault(part, torch.tensor([sr_key(seed, layer, int(s), copy) for s in seq_ids.tolist()],
                                                  dtype=torch.int64))
    new = sr_keys_device(seed, layer, seq_ids.long(), copy)
    if not torch.cuda.is_current_stream_capturing():  # a graph's tensors hold their values only when it replays
        keys[part] = new
    return new


def state_random_bits(keys: torch.Tensor, checkpoint: torch.Tensor, state_shape: tuple[int, ...],
                      lane_words: tuple[int, ...] | None = None) -> torch.Tensor:
    """Random bits for storing one checkpoint of every sequence.

    keys: [B] int64, checkpoint: [B] int64 checkpoint indices, state_shape: (H, P, N) in format layout; lane_words:
    the format's Philox lanes (`fmt.lane_words`): element n of a row reads output word lane_words[n % G] of the call
    at the counter of element n - n % G, as `fmt.encode(x, seed=key, offset=checkpoint << 32)` draws them; None: word
    0 at each element's own counter. Returns [B, H, P, N] int64 holding uint32 values.
    """
    numel = 1
    for size in state_shape:
        numel *= size
    element = torch.arange(numel, dtype=torch.int64, device=keys.device)  # [HPN]
    if lane_words is None:
        counter = (checkpoint[:, None] << 32) + element[None, :]  # [B, HPN]
        return randint(keys[:, None], counter).view(keys.shape[0], *state_shape)
    lane = element % state_shape[-1] % len(lane_words)  # [HPN] position in its row's group of G
    first = (checkpoint[:, None] << 32) + (element - lane)[None, :]  # [B, HPN] the group's first counter
    return lane_draws(keys[:, None], first, lane, lane_words).view(keys.shape[0], *state_shape)
