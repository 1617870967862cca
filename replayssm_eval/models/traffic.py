"""Bytes of SSM state memory traffic per decode token: conventional decoding vs ReplaySSM.

Counted per sequence, per SSM layer and per model, for one decode token (a fixed window of L;
docs/semantics.md, Decode semantics). `S(fmt)` is `get_format(fmt).storage_bytes((H, P, N))`: the packed copy with
its scales, as a kernel reads it. Conventional (eager) decoding stores one state and reads and
writes it every token: 2 S(recur). ReplaySSM, per window of L tokens:

- non-flush token j (j = 0 .. L-2): reads the read copy once, S(read); reads the j buffer entries
  of the earlier tokens of the window and writes its own entry (its own inputs are in registers);
- flush token (j = L-1): reads S_hi, folds the L-1 buffered entries and its own, writes S_hi and
  S_lo (one copy when shared), writes no entry (the buffer is cleared by a pointer move).

Amortised per token: state (L-1) S(read) / L + S(recur) / L + (S(recur) + S(read)) / L (a shared
checkpoint writes once: S(recur)), buffer reads (L-1)/2 entries, buffer writes (L-1)/L entries.
L = 1 gives conventional decoding in the recurrence format. Buffer entries are stored in bf16 (2
bytes per element): Mamba-2 x [H, P], B [G, N], dt [H]; GDN open fold k [Hk, K], u [HV, V], g [HV]
(the closed fold also writes v [HV, V] and beta [HV], reads k, u, g at non-flush tokens and k, v,
beta, g at the flush). Conv states and KV caches are not SSM state and are not counted.

Read skipping (`#skip=EPS`) is data-dependent: `state_traffic` gives its upper bound, and
`skip_savings` turns the skipped reads counted during a run (`replay.skip`, per layer) into the
bytes they save: a skipped (token, head) read saves one head's share of the copy that token reads,
S(read) / H at a non-flush token, S(recur) / H at a flush.
"""

from __future__ import annotations

from replayssm_eval.formats import get_format
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels.family import get_family
from replayssm_eval.models.presets import ModelGeometry, geometry_from_config, get_preset
from replayssm_eval.models.session import as_config

BUFFER_BYTES = 2  # bf16 ring-buffer entries
_NEEDED = ("num_ssm_layers", "num_heads", "head_dim", "state_dim", "n_groups")


def state_traffic(geometry: ModelGeometry | str | object, config: ReplayConfig | str) -> dict:
    """Bytes of SSM state read and written per decode token and sequence; see the module docstring.

    geometry: a `presets.ModelGeometry`, a preset name (`nemotron-3-nano-4b`) or a Hugging Face
    config of a supported family. The state of one layer is [H, P, N] = (num_heads, head_dim,
    state_dim) in the formats' layout (GDN: value heads, V, K).
    Returns {"config", "geometry", "bytes_per_copy", "buffer_entry_bytes", "conventional",
    "conventional_fp32", "replay", "per_model"}: conventional (state in the recurrence format) and
    replay hold per-layer {"read", "write", "total"} (replay also "state_read", "state_write",
    "buffer_read", "buffer_write"); conventional_fp32 is the per-layer total of the usual FP32
    state; per_model holds the totals over the SSM layers and the ratios conventional / replay.
    A mixed config adds "per_layer" {layer: the per-layer fields of that layer} for the layers its
    parts name; a layer with head parts sums its parts (each part stores its heads' copies and keeps
    a ring of its heads' entries, with the B / k rows of the groups they use) and lists them in
    "parts" [{"config", "heads", and that part's per-layer fields}, ...], by first head; its top-level
    per-layer fields are then the means over the SSM layers (so per_model = mean x layers) and
    bytes_per_copy and buffer_entry_bytes are the default's.
    """
    geo = _geometry(geometry)
    cfg = as_config(config)
    if cfg.speculative is not None:
        raise ValueError(f"traffic is modelled for a fixed window; {cfg.name} has a speculative schedule")
    layers = geo.num_ssm_layers
    default = _layer_traffic(geo, cfg.default, range(geo.num_heads))
    named = {p.layer for p in cfg.overrides}
    if len(named) > layers:
        raise ValueError(f"{cfg.name} names {len(named)} layers and {geo.name} has {layers} SSM layers")
    per_layer = {layer: _named_layer(geo, cfg, layer) for layer in sorted(named)}
    mean = default
    if per_layer:
        totals = [{k: v for k, v in t.items() if k != "parts"} for t in per_layer.values()]
        mean = _sum_parts([default] * (layers - len(per_layer)) + totals, scale=1 / layers)
    conventional, replay, fp32_total = mean["conventional"], mean["replay"], mean["conventional_fp32"]
    result = {
        "config": cfg.name,
        "geometry": {"name": geo.name, "family": geo.family, "num_ssm_layers": layers,
                     "state": [geo.num_heads, geo.head_dim, geo.state_dim], "groups": geo.n_groups},
        "bytes_per_copy": default["bytes_per_copy"],
        "buffer_entry_bytes": default["buffer_entry_bytes"],
        "conventional": conventional,
        "conventional_fp32": fp32_total,
        "replay": replay,
        "per_model": {
            "conventional": conventional["total"] * layers,
            "conventional_fp32": fp32_total * layers,
            "replay": replay["total"] * layers,
            "ratio": conventional["total"] / replay["total"],
            "ratio_vs_fp32": fp32_total / replay["total"],
        },
    }
    if per_layer:
        result["per_layer"] = {str(layer): t for layer, t in per_layer.items()}
    return result


def _named_layer(geo: ModelGeometry, cfg: ReplayConfig, layer: int) -> dict:
    """Per-layer traffic of a layer a mixed config's parts name: the sum of its parts, with "parts" when it has
    several (one per distinct config of its heads)."""
    parts = [(c, heads, _layer_traffic(geo, c, heads)) for c, heads in cfg.layer_parts(layer, geo.num_heads)]
    total = _sum_parts([t for _, _, t in parts])
    if len(parts) > 1:
        total["parts"] = [{"config": c.name, "heads": list(heads), **t} for c, heads, t in parts]
    return total


def _layer_traffic(geo: ModelGeometry, cfg: ReplayConfig, heads) -> dict:
    """Per-layer traffic of a plain config on `heads` of one layer (its copies and its own ring)."""
    heads = list(heads)
    shape = (len(heads), geo.head_dim, geo.state_dim)
    read = get_format(cfg.read).storage_bytes(shape)
    recur = get_format(cfg.recur).storage_bytes(shape)
    window = cfg.window
    write_at_flush = recur if cfg.shared else recur + read
    groups = len({h * geo.n_groups // geo.num_heads for h in heads})  # the B / k groups these heads read
    nonflush_read, flush_read, entry_write = _entry_bytes(geo, len(heads), groups, cfg.gdn_fold)

    state_read = ((window - 1) * read + recur) / window
    state_write = write_at_flush / window
    buffer_read = (window - 1) * ((window - 2) / 2 * nonflush_read + flush_read) / window
    buffer_write = (window - 1) * entry_write / window
    return {
        "bytes_per_copy": {"read": read, "recur": recur},
        "buffer_entry_bytes": entry_write,
        "conventional": {"read": recur, "write": recur, "total": 2 * recur},
        "conventional_fp32": 2 * get_format("fp32").storage_bytes(shape),
        "replay": {
            "state_read": state_read, "state_write": state_write, "buffer_read": buffer_read,
            "buffer_write": buffer_write, "read": state_read + buffer_read, "write": state_write + buffer_write,
            "total": state_read + state_write + buffer_read + buffer_write,
        },
    }


def _sum_parts(parts: list[dict], scale: float = 1.0) -> dict:
    """The field-by-field sum of `_layer_traffic` dicts (nested dicts summed per key), times `scale`."""
    first = parts[0]
    if isinstance(first, dict):
        return {key: _sum_parts([p[key] for p in parts], scale) for key in first}
    return sum(parts) * scale


def skip_savings(traffic: dict | None, counts: dict) -> dict:
    """Skipped checkpoint reads and the bytes they save, per layer and per model.

    traffic: `state_traffic` of the config (None: bytes are not computed); counts: {layer: {"reads",
    "skipped_read_copy", "skipped_recur_copy"}} in (token, head) pairs. Returns {"per_layer": {layer: {...,
    "skipped_fraction", "bytes_saved_per_token"}}, "total": {"reads", "skipped", "skipped_fraction",
    "bytes_saved_per_token", "replay_with_skip", "saved_fraction_of_replay"}} (bytes per decode token and
    sequence; None without traffic).
    """
    per_layer, saved_total = {}, 0.0
    for layer, c in counts.items():
        if traffic:  # a layer a mixed config names has its own copies (summed over its head parts)
            copies = traffic.get("per_layer", {}).get(str(layer), traffic)["bytes_per_copy"]
            read, recur = copies["read"], copies["recur"]
        reads = c["reads"]
        skipped = c["skipped_read_copy"] + c["skipped_recur_copy"]
        saved = None
        if traffic and reads:
            saved = (c["skipped_read_copy"] * read + c["skipped_recur_copy"] * recur) / reads
            saved_total += saved
        per_layer[str(layer)] = {**c, "skipped": skipped, "skipped_fraction": skipped / reads if reads else 0.0,
                                 "bytes_saved_per_token": saved}
    reads = sum(c["reads"] for c in per_layer.values())
    skipped = sum(c["skipped"] for c in per_layer.values())
    replay = traffic["per_model"]["replay"] if traffic else None
    return {
        "per_layer": per_layer,
        "total": {
            "reads": reads, "skipped": skipped, "skipped_fraction": skipped / reads if reads else 0.0,
            "bytes_saved_per_token": saved_total if traffic else None,
            "replay_with_skip": replay - saved_total if traffic else None,
            "saved_fraction_of_replay": saved_total / replay if traffic else None,
        },
    }


def _geometry(geometry) -> ModelGeometry:
    if isinstance(geometry, str):
        geometry = get_preset(geometry)
    elif not isinstance(geometry, ModelGeometry):
        geometry = geometry_from_config(geometry)
    missing = [name for name in _NEEDED if getattr(geometry, name) is None]
    if missing:
        raise ValueError(f"{geometry.name}: {', '.join(missing)} unknown, so its state traffic cannot be computed")
    return geometry


def _entry_bytes(geo: ModelGeometry, heads: int, groups: int, gdn_fold: str) -> tuple[int, int, int]:
    """(bytes read per entry at a non-flush token, at the flush, bytes written per entry) of a ring of `heads`
    heads that read `groups` groups."""
    elements = get_family(geo.family).entry_elements(heads, geo.head_dim, geo.state_dim, groups, gdn_fold)
    return tuple(n * BUFFER_BYTES for n in elements)
