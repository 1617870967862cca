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
beta, g at the flush). Data-dependent read skipping (`skip_read_below`) is not modelled: the
numbers are its upper bound. Conv states and KV caches are not SSM state and are not counted.
"""

from __future__ import annotations

from replayssm_eval.kernels.config import ReplayConfig
from replayssm_eval.models.presets import ModelGeometry, geometry_from_config, get_preset
from replayssm_eval.models.session import as_config
from replayssm_eval.quant import get_format

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
    """
    geo = _geometry(geometry)
    cfg = as_config(config)
    if cfg.speculative is not None:
        raise ValueError(f"traffic is modelled for a fixed window; {cfg.name} has a speculative schedule")
    shape = (geo.num_heads, geo.head_dim, geo.state_dim)
    read = get_format(cfg.read).storage_bytes(shape)
    recur = get_format(cfg.recur).storage_bytes(shape)
    window = cfg.window
    write_at_flush = recur if cfg.shared else recur + read
    nonflush_read, flush_read, entry_write = _entry_bytes(geo, cfg.gdn_fold)

    state_read = ((window - 1) * read + recur) / window
    state_write = write_at_flush / window
    buffer_read = (window - 1) * ((window - 2) / 2 * nonflush_read + flush_read) / window
    buffer_write = (window - 1) * entry_write / window
    conventional = {"read": recur, "write": recur, "total": 2 * recur}
    fp32_total = 2 * get_format("fp32").storage_bytes(shape)
    replay = {
        "state_read": state_read, "state_write": state_write, "buffer_read": buffer_read, "buffer_write": buffer_write,
        "read": state_read + buffer_read, "write": state_write + buffer_write,
        "total": state_read + state_write + buffer_read + buffer_write,
    }
    layers = geo.num_ssm_layers
    return {
        "config": cfg.name,
        "geometry": {"name": geo.name, "family": geo.family, "num_ssm_layers": layers, "state": list(shape),
                     "groups": geo.n_groups},
        "bytes_per_copy": {"read": read, "recur": recur},
        "buffer_entry_bytes": entry_write,
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


def _geometry(geometry) -> ModelGeometry:
    if isinstance(geometry, str):
        geometry = get_preset(geometry)
    elif not isinstance(geometry, ModelGeometry):
        geometry = geometry_from_config(geometry)
    missing = [name for name in _NEEDED if getattr(geometry, name) is None]
    if missing:
        raise ValueError(f"{geometry.name}: {', '.join(missing)} unknown, so its state traffic cannot be computed")
    return geometry


def _entry_bytes(geo: ModelGeometry, gdn_fold: str) -> tuple[int, int, int]:
    """(bytes read per entry at a non-flush token, at the flush, bytes written per entry)."""
    h, p, n, g = geo.num_heads, geo.head_dim, geo.state_dim, geo.n_groups
    if geo.family == "mamba2":
        entry = h * p + g * n + h  # x, B, dt
        return entry * BUFFER_BYTES, entry * BUFFER_BYTES, entry * BUFFER_BYTES
    k, u, decay = g * n, h * p, h  # GDN: k [Hk, K], u [HV, V], g [HV]
    if gdn_fold == "open":
        entry = k + u + decay
        return entry * BUFFER_BYTES, entry * BUFFER_BYTES, entry * BUFFER_BYTES
    v, beta = h * p, h
    return (k + u + decay) * BUFFER_BYTES, (k + v + beta + decay) * BUFFER_BYTES, (k + u + decay + v + beta) * BUFFER_BYTES
