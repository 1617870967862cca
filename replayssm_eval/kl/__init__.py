"""The teacher-forced KL driver behind `replayssm-eval kl`.

    data.sources -> data.tokens -> kl.driver (lockstep segments through kl.runner)
        -> kl.metrics (per-token KL, reverse KL, top-1, NLL difference)
        -> results.kl_store (per-document files, the batch in flight)
        -> results.buckets, results.kl_tables (per-length statistics)
        -> kl.output (kl.json, kl_buckets.csv, kl_vs_length.png)

kl.interrupt defers Ctrl-C to the end of a segment, where the driver saves the batch in flight.
`run_kl(KLConfig(...))` is the public entry point (`kl.options` holds KLConfig); docs/kl_json_schema.md documents kl.json.
"""

from replayssm_eval.kl.options import KLConfig

__all__ = ["KLConfig", "run_kl"]


def __getattr__(name: str):
    """`run_kl` is imported on first use, so `kl.options` (for --help) loads without torch."""
    if name == "run_kl":
        from replayssm_eval.kl.driver import run_kl

        return run_kl
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
