"""`ReplayConfig`: how one SSM state is stored and read, and its string form.

String form (used on the command line, in result files and in test ids):

    fp32                      the reference: FP32 state, conventional decoding (window 1)
    X                         conventional eager decoding with the state stored in format X (window 1)
    shared:X                  ReplaySSM with one checkpoint in X for reads and recurrence (window 16)
    R/Q                       split precision: read copy in R, recurrence copy in Q (window 16)
    ...@L                     window L, e.g. nvfp4/fp8sr@16, fp16@1
    engine:name               an engine preset (`replay.engine_presets`), e.g. vllm:fp16sr, trtllm:replay-fp16sr
    ...#tag#tag               options: #seed=N, #closed (GDN closed-loop fold), #open,
                              #spec=T:alpha (speculative flush schedule), #skip=EPS,
                              #buf=DTYPE (buffer dtype: fp32, bf16 or fp16),
                              #rt=FORMAT@prompt|every:N|at:P1,P2 (state round trips, `replay.round_trip`)

Format specs may carry their own options (`nvfp4:axis=headdim,scale=head/fp16sr@16`); they are
validated and canonicalised through `replayssm_eval.formats.get_format`.

Mixed configs (docs/semantics.md, "Mixed configs"): a default, then `+SELECTOR=CONFIG` parts that
give chosen SSM layers (HF layer indices), or heads of one layer, their own config:

    nvfp4/fp16sr+3,7=fp32                 layers 3 and 7 FP32, every other SSM layer nvfp4/fp16sr
    nvfp4/fp16sr+5.h0-3=fp8/fp32@8        heads 0..3 (inclusive) of layer 5 in fp8/fp32 with window 8
    fp32+2=nvfp4/fp16sr+2.h4=fp16sr       layer 2 nvfp4/fp16sr except its head 4

A part's config is a whole config (its own window, seed and tags); the default's tags stay with the
default (write them before the first `+`). Head parts override their layer's config (the default
or the layer's part). No character of the grammar is special to a POSIX shell, so a mixed config
needs no quotes. `+` occurs in no format, preset or option name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from replayssm_eval.replay import engine_presets
from replayssm_eval.replay.round_trip import RoundTrip

DEFAULT_REPLAY_WINDOW = 16
GDN_FOLDS = ("open", "closed")
_TAGS = "seed=N, open, closed, spec=T:alpha, skip=EPS, buf=fp32|bf16|fp16, rt=FORMAT@prompt|every:N|at:P1,P2"
BUFFER_DTYPES = ("fp32", "bf16", "fp16")
_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class SpeculativeFlush:
    """Speculative decoding: each step appends `drafts` entries (T) to the ring and commits a prefix.

    The committed count per step is 1 + the number of leading successes among T-1 Bernoulli(alpha)
    draws, so 1 <= committed <= T. A step starts with a flush when h + T > L (h committed entries):
    the decision needs only h and T, and the ring never holds more than L + T entries.
    """

    drafts: int
    accept: float

    def __post_init__(self):
        if self.drafts < 1:
            raise ValueError(f"speculative drafts per step must be >= 1, got {self.drafts}")
        if not 0.0 <= self.accept <= 1.0:
            raise ValueError(f"speculative acceptance rate must be in [0, 1], got {self.accept}")


@dataclass(frozen=True)
class Override:
    """One part of a mixed config: `config` for SSM layer `layer`, or only for its heads first..last (inclusive)."""

    layer: int
    config: "ReplayConfig"
    heads: tuple[int, int] | None = None

    def __post_init__(self):
        if isinstance(self.config, str):
            object.__setattr__(self, "config", ReplayConfig.parse(self.config))
        if self.heads is not None:
            object.__setattr__(self, "heads", tuple(self.heads))
        if not isinstance(self.layer, int) or self.layer < 0:
            raise ValueError(f"layer {self.layer!r} in a mixed config; accepted: an SSM layer index >= 0")
        if self.heads is not None and not 0 <= self.heads[0] <= self.heads[1]:
            raise ValueError(f"heads {self.heads[0]}-{self.heads[1]} of layer {self.layer} in a mixed config; "
                             "accepted: first-last with 0 <= first <= last")
        if self.config.overrides:
            raise ValueError(f"part {self.selector}={self.config.name} of a mixed config has parts of its own; "
                             "accepted: a plain config after each '='")

    @property
    def selector(self) -> str:
        """`L`, `L.hA` or `L.hA-B`."""
        if self.heads is None:
            return str(self.layer)
        first, last = self.heads
        return f"{self.layer}.h{first}" + ("" if first == last else f"-{last}")

    def sort_key(self) -> tuple:
        return (self.layer, (-1, -1) if self.heads is None else self.heads)


@dataclass(frozen=True)
class ReplayConfig:
    """How one SSM layer's state is stored, read and rounded (docs/semantics.md, "Decode semantics").

    read / recur: format specs of the read copy (S_lo) and the recurrence copy (S_hi).
    shared: one stored copy serves both (Q_read = Q_recur, and SR draws one set of bits).
    window: L; 1 is conventional eager decoding with a quantized state.
    seed: Philox key material for stochastic rounding (see `replay.keys`).
    speculative: None for one token per step, else the speculative flush schedule.
    gdn_fold: 'open' buffers u computed from the read copy (vLLM); 'closed' re-folds from S_hi
        with the buffered raw k, v, beta, g at flush. Ignored by Mamba-2.
    skip_read_below: if set, heads whose cumulative decay since the checkpoint is below this
        value skip the checkpoint read on non-flush steps (its contribution is taken as zero).
    buffer_dtype: the dtype the ring keeps (docs/semantics.md, buffered-input precision): Mamba-2
        rounds x and B, and a fold's scaled keys dt G B; GDN and KDA round k, beta (and v, closed
        fold) and each u when appended. 'fp32' rounds nothing.
    overrides: the parts of a mixed config (`Override`s, sorted); the fields above are the default
        of every other SSM layer and head. `layer_parts` gives what one layer runs.
    """

    read: str = "fp32"
    recur: str = "fp32"
    window: int = 1
    shared: bool = True
    seed: int = 0
    speculative: SpeculativeFlush | None = None
    gdn_fold: str = "open"
    skip_read_below: float | None = None
    buffer_dtype: str = "fp32"
    overrides: tuple[Override, ...] = ()
    round_trip: RoundTrip | None = None

    def __post_init__(self):
        from replayssm_eval.formats import get_format

        object.__setattr__(self, "read", get_format(self.read).name)
        object.__setattr__(self, "recur", get_format(self.recur).name)
        if self.shared and self.read != self.recur:
            raise ValueError(f"a shared checkpoint has one format, got read={self.read!r} recur={self.recur!r}")
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be an integer >= 1, got {self.window!r}")
        if self.gdn_fold not in GDN_FOLDS:
            raise ValueError(f"unknown gdn_fold {self.gdn_fold!r}; known: {', '.join(GDN_FOLDS)}")
        if self.skip_read_below is not None and not 0.0 < self.skip_read_below < 1.0:
            raise ValueError(f"skip_read_below must be in (0, 1), got {self.skip_read_below}")
        if self.buffer_dtype not in BUFFER_DTYPES:
            raise ValueError(f"unknown buffer dtype {self.buffer_dtype!r}; known: {', '.join(BUFFER_DTYPES)}")
        if self.round_trip is not None and (self.speculative is not None or self.skip_read_below is not None):
            raise ValueError(f"config {self.name!r}: a round trip does not combine with #spec or #skip; "
                             "accepted: #rt with the other options")
        if self.round_trip is not None and (self.read_format.feedback or self.recur_format.feedback):
            raise ValueError(f"config {self.name!r}: a round trip does not combine with error feedback (ef=); "
                             "accepted: #rt on formats without ef=")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if self.overrides:
            self._check_overrides()

    def _check_overrides(self) -> None:
        parts = tuple(sorted(self.overrides, key=Override.sort_key))
        object.__setattr__(self, "overrides", parts)
        if any(c.speculative is not None for c in self.part_configs):
            raise ValueError(f"mixed config {self.name!r} has a speculative schedule (#spec), which is one for the "
                             "whole model; accepted: mixed configs without #spec")
        seen: dict[int, list[tuple[int, int]]] = {}
        for part in parts:
            ranges = seen.setdefault(part.layer, [])
            whole = part.heads is None
            clash = (whole and (-1, -1) in ranges) or (not whole and any(
                a <= part.heads[1] and part.heads[0] <= b for a, b in ranges if a >= 0))
            if clash:
                raise ValueError(f"part {part.selector} of mixed config {self.name!r} repeats or overlaps another of "
                                 f"layer {part.layer}; accepted: each layer once, head ranges of a layer that do not "
                                 "overlap")
            ranges.append((-1, -1) if whole else part.heads)
    @property
    def read_format(self):
        from replayssm_eval.formats import get_format

        return get_format(self.read)

    @property
    def recur_format(self):
        from replayssm_eval.formats import get_format

        return get_format(self.recur)

    @property
    def is_reference(self) -> bool:
        """True for the exact FP32 reference (window, speculation and FP32 round trips do not change FP32 numbers),
        in every part."""
        return (self.read == "fp32" and self.recur == "fp32" and self.skip_read_below is None
                and self.buffer_dtype == "fp32" and (self.round_trip is None or self.round_trip.fmt == "fp32")
                and all(p.config.is_reference for p in self.overrides))

    @property
    def default(self) -> "ReplayConfig":
        """The config of the layers and heads no part names (this config without its parts)."""
        return self.replace(overrides=()) if self.overrides else self

    @property
    def part_configs(self) -> tuple["ReplayConfig", ...]:
        """The default, then each part's config: every plain config this one runs."""
        return (self.default, *(p.config for p in self.overrides))

    @property
    def windows(self) -> tuple[int, ...]:
        """The distinct windows of all parts, ascending."""
        return tuple(sorted({c.window for c in self.part_configs}))

    def plain(self) -> "ReplayConfig":
        """This config, checked to have no parts: what a kernel (one layer, every head) runs."""
        if self.overrides:
            raise ValueError(f"a kernel runs one plain config, got mixed config {self.name!r}; accepted: a config "
                             "without +parts (a ReplaySession applies a mixed config per layer: `for_layer`)")
        return self

    def for_layer(self, layer: int) -> "ReplayConfig":
        """The plain config of SSM layer `layer` as a whole (its head parts, if any, aside)."""
        return next((p.config for p in self.overrides if p.layer == layer and p.heads is None), self.default)

    def layer_parts(self, layer: int, num_heads: int) -> tuple[tuple["ReplayConfig", tuple[int, ...]], ...]:
        """What layer `layer` of `num_heads` heads runs: (plain config, its heads) per distinct config,
        ordered by first head; one entry covering every head when no head part names the layer."""
        heads = [self.for_layer(layer)] * num_heads
        for part in self.overrides:
            if part.layer == layer and part.heads is not None:
                first, last = part.heads
                if last >= num_heads:
                    raise ValueError(f"heads {part.selector} in mixed config: layer {layer} has {num_heads} heads; "
                                     f"accepted: heads 0-{num_heads - 1}")
                heads[first:last + 1] = [part.config] * (last - first + 1)
        groups: dict[ReplayConfig, list[int]] = {}
        for h, cfg in enumerate(heads):
            groups.setdefault(cfg, []).append(h)
        return tuple((cfg, tuple(hs)) for cfg, hs in groups.items())

    def round_buffered(self, t: torch.Tensor) -> torch.Tensor:
        """t rounded to the buffer dtype (round to nearest even) and back to t's dtype; t itself for fp32."""
        if self.buffer_dtype == "fp32":
            return t
        return t.to(_TORCH_DTYPES[self.buffer_dtype]).to(t.dtype)

    @property
    def name(self) -> str:
        """Canonical string form; `ReplayConfig.parse(c.name) == c`."""
        if self.shared:
            default_window = 1 if self.window == 1 else DEFAULT_REPLAY_WINDOW
            base = self.read if self.window == 1 else f"shared:{self.read}"
        else:
            default_window = DEFAULT_REPLAY_WINDOW
            base = f"{self.read}/{self.recur}"
        text = base if self.window == default_window else f"{base}@{self.window}"
        if self.seed:
            text += f"#seed={self.seed}"
        if self.gdn_fold != "open":
            text += f"#{self.gdn_fold}"
        if self.speculative is not None:
            text += f"#spec={self.speculative.drafts}:{self.speculative.accept:g}"
        if self.skip_read_below is not None:
            text += f"#skip={self.skip_read_below:g}"
        if self.buffer_dtype != "fp32":
            text += f"#buf={self.buffer_dtype}"
        if self.round_trip is not None:
            text += f"#rt={self.round_trip.name}"
        return text + self._parts_name()

    def _parts_name(self) -> str:
        """`+SELECTORS=CONFIG` per part: whole-layer parts with one config share a list (`+3,7=fp32`)."""
        layers: dict[str, list[str]] = {}
        for part in self.overrides:
            if part.heads is None:
                layers.setdefault(part.config.name, []).append(part.selector)
        whole = [f"+{','.join(selectors)}={name}" for name, selectors in layers.items()]
        return "".join(whole + [f"+{p.selector}={p.config.name}" for p in self.overrides if p.heads is not None])

    def __str__(self) -> str:
        return self.name

    def replace(self, **changes) -> "ReplayConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def parse(cls, text: str) -> "ReplayConfig":
        """Parse the string form described in the module docstring."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"empty replay config {text!r}; examples: fp32, shared:nvfp4, nvfp4/fp16sr@16")
        default, *parts = text.strip().split("+")
        if parts:
            overrides = tuple(o for part in parts for o in _parse_part(part, text))
            return cls.parse(default).replace(overrides=overrides)
        if engine_presets.is_preset(text.strip()):
            text = engine_presets.expand(text.strip())
        body, *tags = text.strip().split("#")
        fields: dict = {}
        for tag in tags:
            key, _, value = tag.partition("=")
            try:
                if key == "seed":
                    fields["seed"] = int(value)
                elif key in GDN_FOLDS and not value:
                    fields["gdn_fold"] = key
                elif key == "spec":
                    drafts, accept = value.split(":")
                    fields["speculative"] = SpeculativeFlush(int(drafts), float(accept))
                elif key == "skip":
                    fields["skip_read_below"] = float(value)
                elif key == "buf" and value in BUFFER_DTYPES:
                    fields["buffer_dtype"] = value
                elif key == "rt" and "round_trip" not in fields:
                    fields["round_trip"] = RoundTrip.parse(value)
                else:
                    raise ValueError
            except ValueError as err:
                detail = f": {err}" if str(err) else ""
                raise ValueError(f"bad option #{tag} in replay config {text!r}{detail}; known options: {_TAGS}") from None

        body, at, window = body.partition("@")
        if body.startswith("shared:"):
            read = recur = body[len("shared:"):]
            shared, default_window = True, DEFAULT_REPLAY_WINDOW
        elif "/" in body:
            read, _, recur = body.partition("/")
            shared, default_window = False, DEFAULT_REPLAY_WINDOW
        else:
            read = recur = body
            shared, default_window = True, 1
        if at:
            try:
                fields["window"] = int(window)
            except ValueError:
                raise ValueError(f"bad window {window!r} in replay config {text!r}; expected an integer, e.g. @16") from None
        else:
            fields["window"] = default_window
        return cls(read=read, recur=recur, shared=shared, **fields)


def _parse_part(part: str, text: str) -> list[Override]:
    """The `Override`s of one `+SELECTOR=CONFIG` part of the mixed config `text`."""
    selector, eq, config = part.partition("=")
    if not eq or not config:
        raise ValueError(f"bad part {part!r} in mixed config {text!r}; accepted: +LAYERS=CONFIG or "
                         "+LAYER.hFIRST-LAST=CONFIG, e.g. nvfp4/fp16sr+3,7=fp32+5.h0-3=fp8/fp32")
    cfg = ReplayConfig.parse(config)
    layers, dot, heads = selector.partition(".")
    first, dash, last = heads[1:].partition("-")
    try:
        if not dot:
            return [Override(_index(layer), cfg) for layer in layers.split(",")]
        if not heads.startswith("h"):
            raise ValueError
        layer, span = _index(layers), (_index(first), _index(last if dash else first))
    except ValueError:
        raise ValueError(f"bad selector {selector!r} in mixed config {text!r}; accepted: layer indices L or "
                         "L1,L2,... or heads of one layer L.hA or L.hA-B (inclusive)") from None
    return [Override(layer, cfg, span)]


def _index(text: str) -> int:
    if not text.isdigit():
        raise ValueError
    return int(text)
