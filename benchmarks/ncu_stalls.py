"""Where a kernel's warps stall, from Nsight Compute's source page exported as CSV (`ncu -i REPORT --page source
--print-source sass --csv > FILE`; scripts/gpu_decode_step.sh and scripts/gpu_chunk_scan.sh write it as
`ncu_*_source.log`): the sampled stall reasons' shares, the shares by SASS opcode and the instructions with the most
samples.

    python benchmarks/ncu_stalls.py reports/logs/ncu/fold_kda_source.csv.gz --top 12
"""

from __future__ import annotations

import argparse

import pandas as pd

SAMPLES = "Warp Stall Sampling (All Samples)"


def load(path: str) -> pd.DataFrame:
    """The source page's rows (one per SASS instruction) with `samples` and `op` (the opcode, predicate dropped)."""
    df = pd.read_csv(path, skiprows=1)  # the first line names the kernel
    if SAMPLES not in df.columns:
        raise ValueError(f"{path}: no {SAMPLES!r} column; export it with --page source --print-source sass --csv")
    df["samples"] = pd.to_numeric(df[SAMPLES], errors="coerce").fillna(0)
    df["op"] = df["Source"].str.strip().str.replace(r"^@!?U?P\w+\s+", "", regex=True).str.split().str[0]
    return df


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source_csv")
    ap.add_argument("--top", type=int, default=12, help="instructions, opcodes and stall reasons to list")
    args = ap.parse_args(argv)
    df = load(args.source_csv)
    total = df["samples"].sum()
    print(f"{len(df)} SASS instructions, {int(total)} warp stall samples")
    reasons = [c for c in df.columns if c.startswith("stall_") and "Not Issued" not in c]
    shares = df[reasons].apply(pd.to_numeric, errors="coerce").fillna(0).sum() / total * 100
    print("\nstall reason, % of samples\n" + shares.sort_values(ascending=False).head(args.top).round(1).to_string())
    by_op = df.groupby("op")["samples"].sum() / total * 100
    print("\nopcode, % of samples\n" + by_op.sort_values(ascending=False).head(args.top).round(1).to_string())
    print("\ninstructions with the most samples")
    for _, row in df.nlargest(args.top, "samples").iterrows():
        print(f"{row.samples / total * 100:5.1f}%  {row.Address}  {row.Source.strip()}")


if __name__ == "__main__":
    main()
