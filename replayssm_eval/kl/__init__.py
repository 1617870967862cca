"""The teacher-forced KL driver behind `replayssm-eval kl`.

    data.sources -> data.tokens -> kl.driver (lockstep segments through kl.runner)
        -> kl.metrics (per-token KL, reverse KL, top-1, NLL difference)
        -> kl.store (per-document files, the batch in flight)
        -> kl.buckets (per-length statistics) -> kl.output (kl.json, kl_buckets.csv, kl_vs_length.png)

kl.interrupt defers Ctrl-C to the end of a segment, where the driver saves the batch in flight.
`run_kl(KLConfig(...))` is the public entry point; docs/kl_json_schema.md documents kl.json.
"""

from replayssm_eval.kl.cli import KLConfig
from replayssm_eval.kl.driver import run_kl

__all__ = ["KLConfig", "run_kl"]
