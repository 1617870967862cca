"""Static profile of the decode step kernels for an H100/H200 (sm_90), without a GPU: registers, stack (spills),
shared memory, the SASS instruction mix and Triton's compile time (a fresh cache: what a GPU's first launch of the
variant waits, on this CPU) of each family's non-flush `_replay_step_kernel`, or with --fold of the delta-rule
families' flush (KDA's `_replay_fold_kernel`, GDN's step kernel with FOLD; open fold).

    python benchmarks/step_sass.py                                   # every family, FP32 and NVFP4 reads
    python benchmarks/step_sass.py --families kda --launch BLOCK_V=64,BLOCK_K=32,num_warps=4
    python benchmarks/step_sass.py --families kda --reads nvfp4 --launch BLOCK_V=64,BLOCK_K=32,num_warps=2,maxnreg=128
    python benchmarks/step_sass.py --fold --families kda --launch BLOCK_V=32,num_warps=4 --launch BLOCK_V=64,num_warps=4
    python benchmarks/step_sass.py --root /path/to/other/checkout     # the kernels of another checkout
    python benchmarks/step_sass.py --per-row-hi --families gdn        # a speculative schedule's launch
    python benchmarks/step_sass.py --reading --root /old/checkout     # a reading row's path alone, in older kernels

Geometries as benchmarks/kernel_speed.py (Mamba-2 P = 80, N = 128; GDN and KDA K = V = 128), 16 buffer entries,
per-head NVFP4 scales. The step kernels are unrolled (no loop but the closed fold's). A fixed window's launch
(HI_AT_FOLD, the default here) reads S_hi only in its folding launch, so a reading launch holds the read copy's path
alone; --per-row-hi compiles the launch of a speculative schedule, which branches at run time on whether a row reads
S_hi or its read copy, so its static count holds both paths. Kernels from before HI_AT_FOLD always branched:
--reading compiles a copy of such a module whose kernels take every row as reading its read copy (the per-row flag
`tl.load(rhi_ptr + b) != 0` replaced by False in the source), whose count is what a reading warp issues (its
registers are not those kernels', which hold both paths). `per head` = SASS instructions x warps x programs per
head, the issue work behind 64 KiB of FP32 state (GDN, KDA) or 40 KiB (Mamba-2). A kernel whose per-head count, times
heads x batch, exceeds what the SMs issue in the time its bytes take at copy bandwidth is bound by instructions, not
memory.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compiled code, not the interpreter
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="step_sass_")  # every compile timed as a fresh machine's

SIZES = dict(K=128, V=128, KP=128, BK=128, P=80, N=128, NB=128, BLOCK_E=16, BLOCK_N=128, BLOCK_S=8, BUF=0, PDL=True,
             SKIP=False, FOLD=False, SPLIT=False, CLOSED=False, HI_AT_FOLD=True, TERMS=False)
ROWS = {"mamba2": 80, "gdn": 128, "kda": 128}  # state rows a head's programs split
PTR_TYPES = {"fold_ptr": "*i8", "read_hi_ptr": "*i8", "rhi_ptr": "*i8", "count_ptr": "*i64", "data_ptr": "*u8",
             "scale_ptr": "*u8", "scales_ptr": "*u8", "skip": "fp32", "eps": "fp32"}
OPS = ("LDG", "STG", "LDS", "STS", "BAR", "SHFL", "FFMA", "FMUL", "FADD", "HADD2", "MUFU", "LOP3", "SHF", "IMAD", "IADD3",
       "LDGSTS")  # LDGSTS: cp.async, a pipelined loop's loads


READ_HI = re.compile(r"tl\.load\((?:rhi_ptr|read_hi_ptr) \+ b\) != 0")  # a row's S_hi flag in the step kernels


def reading_module(module):
    """A copy of a family's step module (imported from a temporary file) whose kernels read every row's read copy:
    the run-time S_hi branch compiled out, so the static count is a reading row's path alone."""
    text, found = READ_HI.subn("False", Path(module.__file__).read_text())
    if not found:
        raise ValueError(f"{module.__name__} has no per-row S_hi flag matching {READ_HI.pattern!r}")
    path = Path(tempfile.mkdtemp()) / f"reading_{module.__name__.split('.')[-2]}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


def default_launch(module, family: str, kind: int, fold: bool, columns: bool) -> dict:
    """The checkout's own launch config of the profiled kernel at batch 256 (its `step_launch_config`, for GDN's fold
    of an FP32 read the folding launch's by columns, or for KDA's fold its `fold_launch_config`)."""
    values = dict(batch=256, heads=96 if family == "mamba2" else 32, head_dim=80, dk=128, dv=128, read=kind, kind=kind,
                  folds=False, fold=fold, columns=columns)
    config = module.fold_launch_config if fold and hasattr(module, "fold_launch_config") else module.step_launch_config
    return config(**{p: values[p] for p in inspect.signature(config).parameters})


def profile(kernel, constexprs: dict, warps: int, tools: Path,
            maxnreg: int | None = None) -> tuple[dict, collections.Counter, float]:
    """(cuobjdump's REG / STACK / SHARED, SASS opcode counts, Triton's compile seconds) of one launch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {}
    for i, (name, _) in enumerate(inspect.signature(kernel.fn).parameters.items()):
        constexpr = kernel.params[i].is_constexpr
        sig[name] = "constexpr" if constexpr else PTR_TYPES.get(name, "*fp32" if name.endswith("_ptr") else "i32")
        if constexpr and name not in constexprs:
            raise ValueError(f"no value for the constexpr {name} of {kernel.__name__}; give it with --launch")
    values = {k: v for k, v in constexprs.items() if sig.get(k) == "constexpr"}
    # pointers 16-byte aligned, as a launch with torch tensors specialises them (vector loads need it)
    aligned = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*")}
    start = time.perf_counter()
    compiled = triton.compile(ASTSource(kernel, sig, constexprs=values, attrs=aligned),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "maxnreg": maxnreg})
    seconds = time.perf_counter() - start
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([tools / "cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tools / "nvdisasm", "-c", f.name], capture_output=True, text=True).stdout
    res = {key: int(m.group(1)) for key in ("REG", "STACK", "SHARED") if (m := re.search(rf"{key}:(\d+)", usage))}
    ops = collections.Counter(m.group(1).split(".")[0] for line in sass.splitlines()
                              if (m := re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)))
    return res, ops, seconds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the checkout whose kernels to read")
    ap.add_argument("--families", default="mamba2,gdn,kda")
    ap.add_argument("--reads", default="fp32,nvfp4", help="read copies: fp32 (as shared:fp32), nvfp4 (per-head scales)")
    ap.add_argument("--launch", action="append", default=[],
                    help="a launch config NAME=VALUE,... overriding any constexpr, COLUMNS and HI_AT_FOLD included "
                         "(repeatable; default: the checkout's step_launch_config)")
    ap.add_argument("--fold", action="store_true", help="the flush's kernel (GDN and KDA; the FP32 read as shared)")
    ap.add_argument("--per-row-hi", action="store_true",
                    help="a speculative schedule's launch: rows flag at run time whether they read S_hi")
    ap.add_argument("--reading", action="store_true",
                    help="kernels from before HI_AT_FOLD: the per-row S_hi branch compiled out of the source")
    args = ap.parse_args(argv)
    if args.fold and "mamba2" in args.families.split(","):
        ap.error("--fold profiles the delta-rule families' flush: --families gdn,kda")
    if args.fold and args.reading:
        ap.error("--reading profiles the non-flush step; a fold reads S_hi")
    if args.per_row_hi and args.reading:
        ap.error("--reading compiles the per-row S_hi flag out; --per-row-hi keeps it")
    sys.path.insert(0, args.root)
    import triton
    from replayssm_eval.formats.codec import Group, Kind

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    reads = {"fp32": (int(Kind.FP32), int(Group.NONE)), "nvfp4": (int(Kind.NVFP4), int(Group.HEAD))}
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=args.root, capture_output=True,
                            text=True).stdout.strip()
    print(f"kernels of commit {commit or '?'}; sm_90, triton {triton.__version__}")
    for family in args.families.split(","):
        module = importlib.import_module(f"replayssm_eval.kernels.{family}.triton_step")
        if args.reading:
            module = reading_module(module)
        launches = [dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in text.split(",")) for text in args.launch]
        for read in args.reads.split(","):
            kind, group = reads[read]
            kernel = module._replay_fold_kernel if args.fold and hasattr(module, "_replay_fold_kernel") \
                else module._replay_step_kernel
            # GDN's fold by columns (its rule at the profiled window of 16 entries, open fold)
            columns = args.fold and hasattr(module, "fold_columns") and module.fold_columns(kind, False, 16)
            for launch in launches or [default_launch(module, family, kind, args.fold, columns)]:
                launch = dict(launch)
                warps, maxnreg = launch.pop("num_warps", 4), launch.pop("maxnreg", None)
                constexprs = {**SIZES, "BLOCK_K": 32, "WORDS": True, "KIND": kind, "READ": kind,
                              "GROUP": group, "FOLD": args.fold, "SHARED": args.fold and read == "fp32",
                              "COLUMNS": columns, "HI_AT_FOLD": not args.per_row_hi, **launch}
                res, ops, seconds = profile(kernel, constexprs, warps, tools, maxnreg)
                block = launch.get("BLOCK_V", launch.get("BV", launch.get("BLOCK_P", 16))) * launch.get("TILES", 1)
                per_head = sum(ops.values()) * warps * -(-ROWS[family] // block)
                name = " ".join(f"{k}={v}" for k, v in launch.items()) + (f" maxnreg={maxnreg}" if maxnreg else "")
                print(f"{family:6} {read:5} {name:34} w{warps} REG={res.get('REG')} STACK={res.get('STACK')} "
                      f"SHARED={res.get('SHARED')} SASS={sum(ops.values())} per head={per_head} compile={seconds:.1f}s "
                      + " ".join(f"{op}={ops[op]}" for op in OPS if ops[op]), flush=True)


if __name__ == "__main__":
    main()
