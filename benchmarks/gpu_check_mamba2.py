"""GPU check of the Mamba-2 Triton kernels against the torch reference: prints a table, writes JSON.

    python benchmarks/gpu_check_mamba2.py [--out out/gpu_check_mamba2.json] [--quick]

For each config and shape it runs, on CUDA:
- chunked(backend="triton") vs chunked(backend="torch") (itself tested against decode_reference);
- decode_step_triton, token by token from sequences at different phases, vs decode_reference;
- verify_triton (T drafts, output only) vs decode_reference of the drafts without a flush;
and checks that the kernel's stored read copy is the formats library's rounding of its fold
(decode(lo_packed) == lo, bit for bit). Pass: max |err| <= 1e-5 max|ref| on all but a fraction of
`FLIPS` elements (FP32 paths that sum in different orders may round a state on the other side of
a rounding boundary now and then; see tests/kernels/test_mamba2_reference.py::assert_close).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import time
import warnings
from pathlib import Path

import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels.mamba2 import chunked, decode_reference
from replayssm_eval.kernels.mamba2.triton_step import decode_step_triton, verify_triton
from replayssm_eval.replay.schedule import ScheduleState

RTOL, FLIPS = 1e-5, 0.01
FLIP_SIZE = 0.5  # the most any element may differ, relative to max|ref|: a flipped rounding is one grid step
SHAPES = {  # name: (batch, tokens, heads, head_dim, groups, d_state)
    "awkward": (3, 37, 3, 20, 3, 24),
    "nemotron-3-nano-4b": (2, 64, 96, 80, 8, 128),
}
CONFIGS = ["fp32@16", "shared:fp16sr@1", "nvfp4:scale=row/fp16sr@16", "nvfp4:scale=head/fp8sr@16",
           "shared:nvfp4:scale=head@16#skip=0.01", "fp16/fp8sr:scale=head@8#spec=3:0.6", "nvfp4:scale=tensor/fp16sr@16",
           "shared:nvfp4:scale=tensor@16", "int8/fp16sr@16", "int16:scale=head/int8sr@16", "shared:int16sr@16",
           "flashinfer:int16", "vllm:fp16sr", "flashinfer:fp16sr-sm90", "trtllm:replay-fp16sr",
           "nvfp4:scale=row/fp16sr:words=pair@16", "int8sr:scale=block:32/fp16sr@16", "sglang:fp8",
           "mxfp8/int8:scale=block:64@16",
           # blocks along head_dim (the whole head per program) rotated along it, and a rotation along d_state
           "int8:axis=headdim,scale=block:32,rot=hadamard:4/fp8sr:rot=hadamard:8@16"]


def make_inputs(batch, tokens, heads, head_dim, groups, d_state, seed=0, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    x = rand(batch, tokens, heads, head_dim)
    dt = torch.nn.functional.softplus(rand(batch, tokens, heads) - 1.0)
    A = -torch.exp(rand(heads))
    A[: heads // 4] = -0.02  # slow heads
    B, C, D = rand(batch, tokens, groups, d_state), rand(batch, tokens, groups, d_state), rand(heads)
    state = 3.0 * rand(batch, heads, head_dim, d_state)
    return tuple(t.to(device) for t in (x, dt, A, B, C, D, state))


def compare(ref, got) -> dict:
    ref, got = ref.double(), got.double()
    err = (got - ref).abs()
    bound = RTOL * ref.abs().max().item()
    beyond = (err > bound).double().mean().item()
    rms = (err.square().mean().sqrt() / ref.square().mean().sqrt().clamp_min(1e-300)).item()
    rel_max = err.max().item() / max(ref.abs().max().item(), 1e-300)
    ok = beyond <= FLIPS and rel_max <= FLIP_SIZE and not torch.isnan(got).any().item()
    return {"max_abs": err.max().item(), "rel_max": rel_max, "rms_ratio": rms, "beyond": beyond, "ok": ok}


def with_phases(inputs, config, phases):
    """Decode phases[b] tokens of each sequence (reference), giving a batch at different window phases."""
    x, dt, A, B, C, D, s0 = inputs
    parts = []
    for b, n in enumerate(phases):
        one = lambda t: t[b:b + 1, :n]  # noqa: E731
        parts.append(decode_reference(one(x), one(dt), A, one(B), one(C), D, s0[b:b + 1], config, seq_ids=[b])[1])
    st = parts[0]
    cat = lambda get: torch.cat([get(p) for p in parts])  # noqa: E731
    sched = ScheduleState(*(cat(lambda p, f=f: getattr(p.schedule, f)) for f in ("count", "step_left", "step_read_hi", "steps")))
    packed = parts[0].lo_packed
    fields = [None if getattr(packed, f) is None else cat(lambda p, f=f: getattr(p.lo_packed, f))
              for f in ("data", "scales", "global_scale")]
    packed = dataclasses.replace(packed, shape=(len(parts), *packed.shape[1:]), data=fields[0], scales=fields[1],
                                 global_scale=fields[2])
    return dataclasses.replace(st, hi=cat(lambda p: p.hi), lo=cat(lambda p: p.lo),
                               buffer={k: cat(lambda p, k=k: p.buffer[k]) for k in st.buffer}, schedule=sched,
                               checkpoint=cat(lambda p: p.checkpoint), seq_ids=cat(lambda p: p.seq_ids), lo_packed=packed)


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def check(config_text: str, shape_name: str, device: str = "cuda") -> list[dict]:
    config = ReplayConfig.parse(config_text)
    inputs = make_inputs(*SHAPES[shape_name], device=device)
    x, dt, A, B, C, D, s0 = inputs
    rows = []

    def row(kernel, result, note="", seconds=None):
        rows.append({"config": config.name, "shape": shape_name, "kernel": kernel, **result, "note": note,
                     "seconds": seconds})

    # chunked
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _sync(device)
        t0 = time.perf_counter()
        y, st = chunked(*inputs, config, backend="triton")
        _sync(device)
        seconds = time.perf_counter() - t0
    fallback = [str(w.message) for w in caught if "runs the torch backend" in str(w.message)]
    y_ref, st_ref = chunked(*inputs, config)
    row("chunked y", compare(y_ref, y), "fallback: " + fallback[0] if fallback else "", seconds)
    row("chunked S_hi", compare(st_ref.hi, st.hi))
    exact = torch.equal(config.read_format.decode(st.lo_packed), st.lo)
    row("chunked lo == Q(fold)", {"max_abs": 0.0, "rel_max": 0.0, "rms_ratio": 0.0, "beyond": 0.0, "ok": exact},
        "bit-exact in-kernel rounding" if exact else "MISMATCH")

    if config.speculative is None:
        # decode steps from different phases
        phases = [0, min(3, config.window - 1), config.window // 2][: x.shape[0]]
        state = with_phases(inputs, config, phases)
        tri = ref = state
        worst = None
        for n in range(max(phases), max(phases) + config.window + 2):
            y_ref, ref = decode_reference(x[:, n:n + 1], dt[:, n:n + 1], A, B[:, n:n + 1], C[:, n:n + 1], D, ref, config)
            y, tri = decode_step_triton(x[:, n], dt[:, n], A, B[:, n], C[:, n], D, tri, config)
            res = compare(y_ref[:, 0], y)
            worst = res if worst is None or res["rel_max"] > worst["rel_max"] else worst
        row("decode step y (worst step)", worst)
        row("decode step S_hi", compare(ref.hi, tri.hi))

    # verification of T drafts after the committed entries, no flush
    drafts = 3
    spec_config = config.replace(window=16, speculative=None)
    pre = 5
    _, state = decode_reference(x[:, :pre], dt[:, :pre], A, B[:, :pre], C[:, :pre], D, s0, spec_config)
    d = lambda t: t[:, pre:pre + drafts]  # noqa: E731
    out = verify_triton(d(x), d(dt), A, d(B), d(C), D, state, spec_config)
    y_ref, _ = decode_reference(d(x), d(dt), A, d(B), d(C), D, state, spec_config.replace(window=32))
    row(f"verify T={drafts}", compare(y_ref, out))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/gpu_check_mamba2.json")
    parser.add_argument("--quick", action="store_true", help="awkward shape only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    shapes = ["awkward"] if args.quick else list(SHAPES)
    rows = []
    for shape in shapes:
        for text in CONFIGS:
            try:
                rows.extend(check(text, shape))
            except Exception as err:  # report and keep going: the table is the deliverable
                rows.append({"config": text, "shape": shape, "kernel": "ERROR", "ok": False, "note": repr(err)[:200]})
    print(f"{'shape':20} {'config':42} {'kernel':28} {'rel max':>9} {'RMS ratio':>9} {'>tol':>7} {'ok':>4}  note")
    for r in rows:
        if r["kernel"] == "ERROR":
            print(f"{r['shape']:20} {r['config']:42} {'ERROR':28} {'':>9} {'':>9} {'':>7} {'FAIL':>4}  {r['note']}")
            continue
        print(f"{r['shape']:20} {r['config']:42} {r['kernel']:28} {r['rel_max']:9.2e} {r['rms_ratio']:9.2e} "
              f"{r['beyond']:7.2%} {'ok' if r['ok'] else 'FAIL':>4}  {r['note']}")
    failed = sum(not r["ok"] for r in rows)
    print(f"\n{len(rows) - failed} passed, {failed} failed")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "git": commit, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(), "rtol": RTOL, "flips": FLIPS}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
