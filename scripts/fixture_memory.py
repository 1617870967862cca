"""Rank retrained fixture variants by how well they show the paper's effect: a shared NVFP4 checkpoint's KL
against the split (NVFP4 read, FP32 recurrence) KL in the last length bucket, and its growth with length.

    python scripts/fixture_memory.py VARIANT_DIR:KL_DIR ...   # prints a table; the last line is the chosen VARIANT_DIR

VARIANT_DIR holds a trained model (training.json from scripts/train_tiny.py); KL_DIR the `replayssm-eval kl` run on it
with the configs SHARED and SPLIT below. The choice: the largest last-bucket ratio among variants whose held-out
bits/byte is within MAX_BPB_LOSS of the best variant's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SHARED, SPLIT = "shared:nvfp4", "nvfp4/fp32"  # as the KL driver names them (NVFP4 with its default per-head scales)
MAX_BPB_LOSS = 0.3


def summary(variant: Path, kl_dir: Path) -> dict:
    """Held-out bits/byte, the shared KL of the first and last bucket with 64+ tokens, the last-bucket ratio."""
    training = json.loads((variant / "training.json").read_text())
    configs = {c["name"]: c for c in json.loads((kl_dir / "kl.json").read_text())["configs"]}
    shared = [b for b in configs[SHARED]["buckets"] if b["start"] >= 64]
    split_last = [b for b in configs[SPLIT]["buckets"] if b["start"] >= 64][-1]
    return {"variant": str(variant), "bpb": training["held_out_bits_per_byte"],
            "shared_first": shared[0]["kl_mean"], "shared_last": shared[-1]["kl_mean"], "split_last": split_last["kl_mean"],
            "ratio_last": shared[-1]["kl_mean"] / split_last["kl_mean"], "growth": shared[-1]["kl_mean"] / shared[0]["kl_mean"],
            "bucket_last": f"{shared[-1]['start']}-{shared[-1]['end']}", "command": training["command"]}


def main(pairs: list[str]) -> None:
    rows = [summary(*(Path(p) for p in pair.split(":", 1))) for pair in pairs]
    for r in rows:
        print(f"{r['variant']}: bpb {r['bpb']:.3f}  shared {r['shared_first']:.2e} -> {r['shared_last']:.2e} "
              f"(x{r['growth']:.1f}, last bucket {r['bucket_last']})  split {r['split_last']:.2e}  "
              f"ratio {r['ratio_last']:.1f}  [{r['command']}]")
    best_bpb = min(r["bpb"] for r in rows)
    print(max((r for r in rows if r["bpb"] <= best_bpb + MAX_BPB_LOSS), key=lambda r: r["ratio_last"])["variant"])


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
