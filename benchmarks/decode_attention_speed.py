"""Decode attention of the whole-model step over a static KV cache: `models.decode_attention` against Hugging Face's SDPA.

    python benchmarks/decode_attention_speed.py --out OUT.json                 # H200: about a minute
    python benchmarks/decode_attention_speed.py --tiny --device cpu            # smoke run (Triton interpreter)

One attention layer of Qwen3.5-4B (16 query heads, 4 KV heads, head_dim 256) and Nemotron-3-Nano-4B (40, 8, 128),
bf16, at each batch, with a static cache of --columns columns of which --written are open (the prompt and the tokens
so far; the rest unwritten), per row:
- "sdpa, static cache": HF's SDPA over every column with the boolean mask (the step before decode attention);
- "sdpa, written columns": SDPA over the written columns alone, no mask (what a cache holding only those would cost);
- "decode attention": ours over the static cache (its default launch, then each launch of the sweep).
Kernel ms (do_bench median), the written columns' K and V bytes per second and as a share of the device's copy
bandwidth (measured in the same run), and the largest difference from SDPA's output relative to its largest value.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from kernel_speed import Timer, environment, relerr  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

from replayssm_eval.models.decode_attention import decode_attention, decode_launch_config  # noqa: E402

GEOMETRIES = {"qwen3.5-4b": (16, 4, 256), "nemotron-3-nano-4b": (40, 8, 128)}  # query heads, KV heads, head_dim
SWEEP = [dict(SPLITS=s, BLOCK_N=n, num_warps=w, num_stages=2) for s, n, w in itertools.product((1, 2, 4), (32, 64), (4, 8))]


class _Attention:
    """What SDPA's HF wrapper reads of an attention module."""

    def __init__(self, groups: int):
        self.num_key_value_groups, self.is_causal = groups, True


def copy_gbps(timer: Timer, device: str) -> float | None:
    if not timer.cuda:
        return None
    src = torch.rand(1 << 28, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / timer.kernel_ms(lambda: dst.copy_(src)) / 1e6


def bench(model: str, batch: int, columns: int, written: int, timer: Timer, device: str, sweep: bool, copy):
    heads, kv_heads, dim = GEOMETRIES[model]
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, heads, 1, dim, device=device, generator=gen).bfloat16()
    k, v = (torch.randn(batch, kv_heads, columns, dim, device=device, generator=gen).bfloat16() for _ in range(2))
    mask = torch.zeros(batch, 1, 1, columns, dtype=torch.bool, device=device)
    mask[..., :written] = True
    module, scaling = _Attention(heads // kv_heads), dim ** -0.5
    kv_bytes = 2 * batch * kv_heads * written * dim * 2
    ref = sdpa_attention_forward(module, q, k, v, mask, scaling=scaling)[0]
    runs = [("sdpa, static cache", None, lambda: sdpa_attention_forward(module, q, k, v, mask, scaling=scaling)[0]),
            ("sdpa, written columns", None,
             lambda: sdpa_attention_forward(module, q, k[:, :, :written], v[:, :, :written], None, scaling=scaling)[0])]
    default = decode_launch_config(batch, kv_heads, columns, dim)
    for launch in [default] + (SWEEP if sweep else []):
        runs.append(("decode attention" + ("" if launch is default else " (sweep)"), launch,
                     lambda launch=launch: decode_attention(q, k, v, mask[:, 0, 0], scaling, launch)))
    rows = []
    for path, launch, fn in runs:
        ms = timer.kernel_ms(fn)
        gbps = kv_bytes / ms / 1e6
        rows.append(dict(model=model, batch=batch, columns=columns, written=written, path=path, launch=launch, ms=ms,
                         gbps=gbps, pct_copy=100 * gbps / copy if copy else None, rel_diff=relerr(ref, fn())))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(GEOMETRIES))
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--columns", type=int, default=2049, help="the static cache's columns")
    parser.add_argument("--written", default="1090,2049", help="open columns per row, comma-separated")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    timer = Timer(args.device, quick=True)
    copy = copy_gbps(timer, args.device)
    print(json.dumps({"copy_gbps": copy}))
    batches = [2] if args.tiny else [int(b) for b in args.batches.split(",")]
    columns = 70 if args.tiny else args.columns
    written = [40] if args.tiny else [int(w) for w in args.written.split(",")]
    rows = []
    for model in args.models.split(","):
        for batch, n in itertools.product(batches, written):
            rows += bench(model, batch, columns, n, timer, args.device, not (args.no_sweep or args.tiny), copy)
    print(f"\n{'model':20} {'batch':>5} {'open':>10} {'path':32} {'ms':>8} {'GB/s':>7} {'% copy':>6} {'rel diff':>9}")
    best = {}
    for r in rows:
        key = (r["model"], r["batch"], r["written"], r["path"].replace(" (sweep)", ""))
        if r["path"].endswith("(sweep)") and r["ms"] >= best.get(key, float("inf")):
            continue
        best[key] = r["ms"]
        pct = f"{r['pct_copy']:6.0f}" if r["pct_copy"] else "     -"
        print(f"{r['model']:20} {r['batch']:>5} {r['written']:>4}/{r['columns']:<5} {r['path']:32} {r['ms']:8.3f} "
              f"{r['gbps']:7.0f} {pct} {r['rel_diff']:9.1e}" + (f"  {r['launch']}" if r["launch"] else ""))
    if args.out:
        args.out.write_text(json.dumps({"environment": environment(args.device), "copy_gbps": copy, "rows": rows},
                                       indent=1))


if __name__ == "__main__":
    main()
