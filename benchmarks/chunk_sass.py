"""Static profile of the one-token-window chunked kernels for an H100/H200 (sm_90), without a GPU: registers, stack
(spills), and the instructions of a token's loop by the source function and line they come from (nvdisasm's line
information), with the loop's barriers, shared-memory stores and shuffles.

    python benchmarks/chunk_sass.py                           # stepquant:dualaxis6's exchanging launches, every family
    python benchmarks/chunk_sass.py --families gdn --lines 30
    python benchmarks/chunk_sass.py --set BUF=1 --launch num_warps=16   # another buffer dtype, another launch
    python benchmarks/chunk_sass.py --root /path/to/other/checkout      # the kernels of another checkout

A kernel is the representative launch of tests/test_sm90_compile.py for `stepquant:dualaxis6` at window 1 over a
head's exchanging programs (Mamba-2's `_token_scan_kernel` at head_dim 80 in five programs, GDN's and KDA's
`_chunked_kernel` in four of 32 v columns), with the checkout's own launch config (`token_launch_config`,
`chunked_launch_config`), compiled as a launch specialises it: pointers 16-byte aligned and the integer sizes of
Nemotron-3-Nano-4B's and Qwen3.5-4B's geometry divisible by 16. Without that specialisation Triton picks other
layouts (a GDN tile with K across warps), so the counts would not be the launch's. A token's loop is the kernel's
longest backward branch; counts are static (each instruction once, whichever branch runs), not a profile.
"""

from __future__ import annotations

import argparse
import ast
import collections
import os
import re
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compiled code, not the interpreter

DIVISIBLE = {  # the launch's integer arguments that are multiples of 16 at full-size geometry
    "mamba2": ("S", "H", "P", "N"),  # 2048 one-token segments a call, 96 heads, head_dim 80, d_state 128
    "gdn": ("NS", "HV", "K", "V"),  # 2048 segments a call, 32 value heads, K = V = 128
    "kda": ("NS", "HV", "K", "V"),
}
COUNTED = ("BAR", "STS", "LDS", "SHFL", "DMMA", "CALL")


def stepquant_case(family: str, cases: list) -> tuple:
    """(kernel, constexprs, argument types) of `stepquant:dualaxis6`'s exchanging window-1 launch in `cases`."""
    from replayssm_eval.formats.codec import Group

    module = {"mamba2": "mamba2.triton_tokens", "gdn": "gdn.triton_chunk", "kda": "kda.triton_chunk"}[family]
    for kernel, constexprs, *types in cases:
        dual = constexprs.get("RECUR_GROUP", constexprs.get("HI_GROUP")) == int(Group.DUAL)
        if kernel.fn.__module__.endswith(module) and dual and constexprs.get("PROGRAMS", 1) > 1:
            return kernel, constexprs, (types or [{}])[0]
    raise LookupError(f"no exchanging dual-axis case of {module} in tests/test_sm90_compile.py")


def checkout_launch(family: str) -> dict:
    """The checkout's launch options for the case (num_warps, maxnreg)."""
    if family == "mamba2":
        from replayssm_eval.kernels.mamba2.triton_tokens import token_launch_config
        launch = token_launch_config(stochastic=False, rows=16, exchange=True)
    else:
        from replayssm_eval.kernels.delta.triton_chunk import chunked_launch_config
        launch = chunked_launch_config(128, 128, whole_head=False)
    return {"num_warps": launch["num_warps"], "maxnreg": launch.get("maxnreg")}


def compile_sm90(kernel, signature: dict, constexprs: dict, divisible: tuple, options: dict):
    """The kernel compiled for sm_90 with pointers and the `divisible` integers specialised as multiples of 16."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(signature.items())
             if kind.startswith("*") or name in divisible}
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


@cache
def _functions(path: str) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of every function defined in a source file."""
    tree = ast.parse(Path(path).read_text())
    return [(n.lineno, n.end_lineno, n.name) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


def function_at(path: str, line: int) -> str:
    """The innermost function of `path` holding `line`."""
    around = [f for f in _functions(path) if f[0] <= line <= f[1]] if Path(path).exists() else []
    return min(around, key=lambda f: f[1] - f[0])[2] if around else "?"


def loop_instructions(cubin: str, tools: Path) -> tuple[list[tuple[str, tuple[str, int] | None]], int]:
    """The instructions of the longest loop of the kernel in the file `cubin`, each (opcode without predicate, (file,
    line) or None), and the kernel's instruction count, from nvdisasm -g."""
    text = subprocess.run([tools / "nvdisasm", "-g", "-c", cubin], capture_output=True, text=True, check=True).stdout
    where, pending, labels, code = None, [], {}, []  # code: (address, instruction, where)
    for line in text.splitlines():
        if m := re.search(r'//## File "([^"]+)", line (\d+)', line):
            where = (m.group(1), int(m.group(2)))
        elif m := re.match(r"\s*(\.L_x_\d+):", line):
            pending.append(m.group(1))
        elif m := re.search(r"/\*([0-9a-f]+)\*/\s+(.*?)\s*;", line):
            address = int(m.group(1), 16)
            labels.update(dict.fromkeys(pending, address))
            pending = []
            code.append((address, re.sub(r"^@!?U?P\w+\s+", "", m.group(2)), where))
    back = [(labels[m.group(1)], address) for address, ins, _ in code
            if (m := re.search(r"\bBRA\b.*`\((\.L_x_\d+)\)", ins)) and labels.get(m.group(1), address) < address]
    if not back:
        raise ValueError("the kernel has no loop")
    first, last = max(back, key=lambda b: b[1] - b[0])
    return [(ins, at) for address, ins, at in code if first <= address <= last], len(code)


def report(family: str, loop: list, total: int, usage: str, lines: int) -> None:
    """Print the loop's counts, its instructions by function and its busiest source lines."""
    ops = collections.Counter(ins.split()[0].split(".")[0] for ins, _ in loop)
    res = " ".join(re.findall(r"(?:REG|STACK|SHARED):\d+", usage))
    print(f"{family}: {res}, {total} instructions, a token's loop {len(loop)}: "
          + ", ".join(f"{op} {ops[op]}" for op in COUNTED if ops[op]))
    by_function = collections.Counter((Path(at[0]).name, function_at(*at)) if at else ("?", "?") for _, at in loop)
    for (name, function), count in by_function.most_common(12):
        print(f"  {count:5d} {100 * count / len(loop):5.1f}%  {name}:{function}")
    by_line = collections.Counter(at for _, at in loop if at)
    for (path, number), count in by_line.most_common(lines):
        source = Path(path).read_text().splitlines()[number - 1].strip() if Path(path).exists() else ""
        print(f"  {count:5d} {100 * count / len(loop):5.1f}%  {Path(path).name}:{number}  {source[:90]}")


def parse_assignments(texts: list[str]) -> dict:
    """NAME=VALUE,... options into a dict of ints (or strings where not an int)."""
    out = {}
    for text in texts:
        for item in text.split(","):
            name, _, value = item.partition("=")
            if not value:
                raise SystemExit(f"expected NAME=VALUE, got {item!r}")
            out[name] = int(value) if value.lstrip("-").isdigit() else value
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the checkout whose kernels to read")
    ap.add_argument("--families", default="mamba2,gdn,kda")
    ap.add_argument("--set", action="append", default=[], help="constexprs NAME=VALUE,... over the case's")
    ap.add_argument("--launch", action="append", default=[],
                    help="num_warps=N,maxnreg=N over the checkout's launch config")
    ap.add_argument("--lines", type=int, default=16, help="source lines to list (the busiest first)")
    args = ap.parse_args(argv)
    families = args.families.split(",")
    if unknown := sorted(set(families) - set(DIVISIBLE)):
        ap.error(f"--families: unknown {', '.join(unknown)}; accepted: {', '.join(DIVISIBLE)}")
    sys.path[:0] = [args.root, str(Path(args.root) / "tests")]
    import triton
    import test_sm90_compile

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=args.root, capture_output=True,
                            text=True).stdout.strip()
    print(f"kernels of commit {commit or '?'} at {args.root}; sm_90, triton {triton.__version__}")
    cases = test_sm90_compile.cases()
    for family in families:
        kernel, constexprs, types = stepquant_case(family, cases)
        constexprs = {**constexprs, **parse_assignments(args.set)}
        options = {**checkout_launch(family), **parse_assignments(args.launch)}
        signature = test_sm90_compile.signature(kernel, constexprs, types)
        compiled = compile_sm90(kernel, signature, constexprs, DIVISIBLE[family], options)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            usage = subprocess.run([tools / "cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
            loop, total = loop_instructions(f.name, tools)
        print(f"\n{kernel.fn.__module__}.{kernel.__name__}, {options}")
        report(family, loop, total, usage, args.lines)


if __name__ == "__main__":
    main()
