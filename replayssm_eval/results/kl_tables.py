"""The tables of kl.json (schema: docs/kl_json_schema.md) from a run's per-token metrics, and the
per-bucket CSV table rendered from kl.json."""

from __future__ import annotations

import numpy as np

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.results.buckets import Bucket, bucket_stats
from replayssm_eval.results.kl_stats import token_statistics

SCHEMA_VERSION = 1
CSV_FILE, JSON_FILE, PLOT_FILE = "kl_buckets.csv", "kl.json", "kl_vs_length.png"


def config_results(config: ReplayConfig, metrics: np.ndarray, buckets: list[Bucket], traffic: dict | None,
                   skip_reads: dict | None = None) -> dict:
    """One entry of kl.json's `configs` from its per-token metrics [D, 5, N] (`kl.metrics.METRICS` order)."""
    kl, reverse_kl, top1, nll_diff, delta_p = metrics.swapaxes(0, 1)  # each [D, N]
    return {
        "name": config.name,
        "read": config.read,
        "recur": config.recur,
        "shared": config.shared,
        "window": config.window,
        "seed": config.seed,
        "gdn_fold": config.gdn_fold,
        "buffer_dtype": config.buffer_dtype,
        "skip_read_below": config.skip_read_below,
        **({"parts": [{"layer": p.layer, "heads": None if p.heads is None else list(p.heads), "config": p.config.name}
                      for p in config.overrides]} if config.overrides else {}),
        "kl_mean": float(kl.mean(dtype=np.float64)),
        "reverse_kl_mean": float(reverse_kl.mean(dtype=np.float64)),
        "top1_agree": float(top1.mean(dtype=np.float64)),
        "nll_diff_mean": float(nll_diff.mean(dtype=np.float64)),
        **token_statistics(kl, top1, delta_p),
        "state_traffic": traffic,
        "skip_reads": skip_reads,
        "buckets": [bucket_stats(kl, reverse_kl, top1, nll_diff, delta_p, b) for b in buckets],
    }


def reference_results(ref_nll: np.ndarray, buckets: list[Bucket]) -> dict:
    """kl.json's `reference` from the reference NLL per token [D, N]."""
    return {
        "name": ReplayConfig().name,
        "nll_mean": float(ref_nll.mean(dtype=np.float64)),
        "buckets": [
            {
                "start": b.start,
                "end": b.end,
                "count": int(ref_nll[:, b.start - 1 : b.end].size),
                "nll_mean": float(ref_nll[:, b.start - 1 : b.end].mean(dtype=np.float64)),
            }
            for b in buckets
        ],
    }


def buckets_table(report: dict):
    """pandas DataFrame: one row per (config, bucket), the config's name first."""
    import pandas as pd

    rows = [{"config": c["name"], **b} for c in report["configs"] for b in c["buckets"]]
    return pd.DataFrame(rows)
