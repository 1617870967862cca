"""Sampled decoding with common random numbers: the same draw for a (question, sample, position) under every config.

    settings = Sampling.from_text("temperature=0.6,top_p=0.95,top_k=20")
    tokens = choose(logits, [settings] * B, seed=0, seq_ids=ids, samples=js, positions=ps)   # [B]

A token is drawn by inverse-CDF sampling from one uniform u per row and step:

1. scores s = logits / temperature in float64; tokens are ranked by (s descending, token id
   ascending), a total order (ties broken by the lower id, as argmax does);
2. top-k keeps the first k of that order (0: all); top-p then keeps the shortest prefix of it whose
   mass under the top-k renormalised softmax reaches top_p (a token is kept when the mass ranked
   strictly before it is < top_p); so top_k=1 is greedy, and the kept set is the same whatever the
   sort's internal tie order;
3. with w the softmax restricted to the kept tokens, in token-id order, the token is the first id
   whose cumulative weight exceeds u * sum(w).

u = 53 bits of Philox4x32-10 (`formats.philox.philox4x32`) under key = the sampling seed, with counter
words (position, sample index, seq_id low 32 bits, seq_id high 32 bits): position is the index of the
generated token (0 = the first), seq_id the prompt's `decode.sequence_id`. The bits depend on nothing
else: not the device, the batch, the row order, when a row joined, or the decode step. Token-id order
(rather than probability order) makes the token a continuous function of the probabilities: a config
whose distribution moves slightly changes the draw only when u lies near a moved boundary, so paired
configs share most of their samples, and a config that changes no logit gives the same samples.

Temperature 0 (or do_sample false) is greedy: `logits.argmax(-1)`, the engine's greedy path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayssm_eval.formats.philox import philox4x32

_MASK32 = 0xFFFFFFFF
GEN_KWARGS = ("do_sample", "temperature", "top_p", "top_k")  # what --gen-kwargs accepts


@dataclass(frozen=True)
class Sampling:
    """How one row picks its tokens: temperature 0 is greedy; top_k 0 keeps every token; top_p 1 keeps every token."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def from_gen_kwargs(cls, kwargs: dict) -> Sampling:
        """From generation kwargs (do_sample, temperature, top_p, top_k; other keys ignored), as Hugging Face reads
        them: do_sample false is greedy whatever the temperature; absent, a temperature > 0 samples."""
        temperature = _number(kwargs, "temperature", float, 0.0)
        top_p, top_k = _number(kwargs, "top_p", float, 1.0), _number(kwargs, "top_k", int, 0)
        do_sample = kwargs.get("do_sample")
        if isinstance(do_sample, str):
            if do_sample.lower() not in ("true", "false"):
                raise ValueError(f"do_sample must be true or false, got {do_sample!r}")
            do_sample = do_sample.lower() == "true"
        do_sample = None if do_sample is None else bool(do_sample)
        settings = cls(temperature, top_p, top_k)  # checked even when greedy wins
        if do_sample is False or (do_sample is None and temperature == 0.0):
            return cls()
        if temperature == 0.0:
            raise ValueError("do_sample true needs a temperature > 0 (0 is greedy)")
        return settings

    @classmethod
    def from_text(cls, text: str) -> Sampling:
        """From "temperature=0.6,top_p=0.95,top_k=20" (keys: do_sample, temperature, top_p, top_k)."""
        kwargs = {}
        for piece in (p.strip() for p in text.split(",") if p.strip()):
            key, eq, value = piece.partition("=")
            if not eq or key.strip() not in GEN_KWARGS:
                raise ValueError(f"bad generation kwarg {piece!r}; accepted: {', '.join(k + '=...' for k in GEN_KWARGS)}")
            kwargs[key.strip()] = value.strip()
        return cls.from_gen_kwargs(kwargs)

    def as_dict(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


def _number(kwargs: dict, key: str, kind, default):
    value = kwargs.get(key)
    if value is None:
        return default
    try:
        number = float(value)
        if isinstance(value, bool) or (kind is int and number != int(number)):
            raise ValueError
        return kind(number)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{key} must be a{'n integer' if kind is int else ' number'}, got {value!r}") from None


def uniforms(seed: int, seq_ids: torch.Tensor, samples: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B] float64 uniforms in [0, 1) of (seq_id, sample, position) [B] int64 each, under the sampling `seed`."""
    seq_ids, samples, positions = (t.to(torch.int64) for t in (seq_ids, samples, positions))
    w0, w1, _, _ = philox4x32(seed, positions & _MASK32, samples & _MASK32, seq_ids & _MASK32, (seq_ids >> 32) & _MASK32)
    bits = (w0 << 21) | (w1 >> 11)  # 53 bits
    return bits.to(torch.float64) * 2.0**-53


def kept_weights(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[B, V] float64 unnormalised probabilities of the kept tokens (0 elsewhere), token-id order.

    logits [B, V]; temperature [B] (> 0), top_k [B] (0: all), top_p [B] (in (0, 1]).
    """
    scores = logits.to(torch.float64) / temperature.to(torch.float64)[:, None]  # [B, V]
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices  # [B, V] rank -> token id
    ranked = torch.softmax(scores.gather(-1, order), dim=-1)  # [B, V] probabilities in rank order
    rank = torch.arange(scores.shape[-1], device=scores.device)
    k = torch.where(top_k > 0, top_k, scores.shape[-1]).to(scores.device)
    keep = rank[None, :] < k[:, None]  # [B, V]
    mass = ranked * keep
    mass = mass / mass.sum(-1, keepdim=True)
    before = torch.cumsum(mass, -1) - mass  # mass ranked strictly before each token
    keep &= before < top_p.to(torch.float64).to(scores.device)[:, None]
    return torch.zeros_like(ranked).scatter(-1, order, ranked * keep)


def choose(logits: torch.Tensor, settings: list[Sampling], *, seed: int, seq_ids, samples, positions) -> torch.Tensor:
    """[B] tokens: greedy rows take logits.argmax, sampling rows draw by inverse CDF (module docstring).

    logits [B, V]; settings, seq_ids, samples, positions: one per row.
    """
    chosen = logits.argmax(-1)  # [B]
    rows = [i for i, s in enumerate(settings) if not s.greedy]
    if not rows:
        return chosen
    device = logits.device
    pick = torch.tensor(rows, device=device)
    field = lambda name, dtype: torch.tensor([getattr(settings[i], name) for i in rows], dtype=dtype, device=device)  # noqa: E731
    weights = kept_weights(logits[pick], field("temperature", torch.float64), field("top_k", torch.int64),
                           field("top_p", torch.float64))  # [R, V]
    as_long = lambda values: torch.tensor([int(values[i]) for i in rows], dtype=torch.int64, device=device)  # noqa: E731
    u = uniforms(seed, as_long(seq_ids), as_long(samples), as_long(positions))  # [R]
    chosen[pick] = inverse_cdf(weights, u).to(chosen.dtype)
    return chosen


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[R] the first token id whose cumulative weight exceeds u * total: weights [R, V] >= 0 (float64), u [R] in [0, 1)."""
    cdf = torch.cumsum(weights, -1)  # [R, V]
    total = cdf[:, -1]
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))[:, None]  # < total: a kept token
    return torch.searchsorted(cdf, target, right=True)[:, 0]
