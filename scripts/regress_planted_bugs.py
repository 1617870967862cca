"""Plant numerics bugs one at a time and check that `replayssm-eval regress` catches each: the audit of the gate.

Each bug is one text replacement in one module of the package. For each, a temporary copy of the package gets the
bug, and `python -m replayssm_eval regress` runs the parts that should catch it (from the copy, with `--json-output`);
the bug is caught when that run exits 1 with a REGRESSED metric (or, with `--kernel`, a failed case). The same parts of an unpatched copy must pass first
(a control), so a catch is the bug's doing. Prints a table bug -> caught, the first failing metrics and the seconds
the run took, and the largest relative move of a failing numeric metric; exits 1 if any bug is missed (or a control
fails).

    python scripts/regress_planted_bugs.py                 # every bug
    python scripts/regress_planted_bugs.py --only kl_direction --only ci_dof
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "replayssm_eval"
ADAPTER = REPO / "tests" / "helpers" / "regress_adapters.py"
CHEAP = ("--part", "format", "--part", "bits")


@dataclass(frozen=True)
class Bug:
    name: str
    what: str
    module: str  # path inside the package
    old: str  # must occur exactly once
    new: str
    args: tuple[str, ...]  # regress options that select the parts to run


BUGS = (
    Bug("nvfp4_ties", "E2M1 ties round away from zero, not to the even code", "formats/rounding.py",
        "torch.round(a / step) * step", "torch.floor(a / step + 0.5) * step", CHEAP),
    Bug("scale_order", "NVFP4 block scale as (bmax / 6) * S_enc, not TE's bmax * (S_enc * fp32(1/6))",
        "formats/formats.py", "rounding.round_e4m3(bmax * (s_enc * rounding.F32_SIXTH))",
        "rounding.round_e4m3((bmax / 6.0) * s_enc)", CHEAP),
    Bug("int8_scale", "integer scale amax / (qmax + 1) instead of amax / qmax", "formats/formats.py",
        "        return float(self.qmax)\n", "        return float(self.qmax + 1)\n", CHEAP),
    Bug("hadamard_inverse", "rot=hadamard decodes without rotating back", "formats/rotation.py",
        "return self.rotate(super().decode(packed), inverse=True)", "return super().decode(packed)", CHEAP),
    Bug("buf_rounding", "#buf=fp16 buffers rounded to BF16 (torch side)", "replay/config.py",
        "return t.to(_TORCH_DTYPES[self.buffer_dtype]).to(t.dtype)", "return t.to(torch.bfloat16).to(t.dtype)",
        ("--part", "bits", "--part", "kernel", "--only", "bits/buffer/*", "--only", "kernel/*/ref_rel_rms")),
    Bug("kl_direction", "the KL column holds KL(q‖p) instead of KL(p‖q)", "kl/metrics.py",
        "out[:, 0, t0:t1] = _kl(logp, logq)", "out[:, 0, t0:t1] = _kl(logq, logp)",
        ("--part", "kl", "--only", "kl/formula/*", "--only", "kl/buckets/*")),
    Bug("bucket_from_config_length", "accuracy buckets from each config's own lengths, not FP32's",
        "results/accuracy_tables.py", "question_lengths = np.floor(lengths.mean(1) + 0.5).astype(np.int64)",
        "question_lengths = np.floor((next(iter(others.values()))[2] if others else lengths).mean(1) + 0.5)"
        ".astype(np.int64)", ("--part", "stats")),
    Bug("loop_detector", "a loop needs 3 copies of its span, not 4", "generate/degeneration.py",
        "        n = max(MIN_REPEATS * p, MIN_TAIL)\n", "        n = max((MIN_REPEATS - 1) * p, MIN_TAIL)\n",
        ("--part", "stats")),
    Bug("ci_dof", "KL interval t quantile with n degrees of freedom, not n - 1", "results/buckets.py",
        "stats.t.ppf(0.5 + CI_LEVEL / 2, n - 1)", "stats.t.ppf(0.5 + CI_LEVEL / 2, n)",
        ("--part", "kl", "--only", "kl/buckets/*")),
    Bug("triton_scale_order", "Triton NVFP4 block scale as (bmax / 6) * S_enc", "formats/device.py",
        "s_b = round_e4m3(bmax * (s_enc * _F32_SIXTH))", "s_b = round_e4m3((bmax / 6.0) * s_enc)",
        ("--part", "kernel", "--only", "kernel/encode/*")),
    Bug("triton_buf_fold", "the Mamba-2 Triton step folds unrounded B dt (ignores #buf=)", "kernels/mamba2/triton_step.py",
        "upd += x_e[:, None] * round_buffered(w_e * b_e, BUF)[None, :]", "upd += x_e[:, None] * (w_e * b_e)[None, :]",
        ("--part", "kernel", "--only", "kernel/mamba2/fp32@4#buf=bf16/*")),
    Bug("triton_buf_fold_conformance", "as triton_buf_fold, through `regress --kernel` (the package's Triton step "
        "as an external kernel)", "kernels/mamba2/triton_step.py",
        "upd += x_e[:, None] * round_buffered(w_e * b_e, BUF)[None, :]", "upd += x_e[:, None] * (w_e * b_e)[None, :]",
        ("--kernel", f"{ADAPTER}:triton_step", "--kernel-grid", "quick", "--kernel-family", "mamba2",
         "--kernel-configs", "fp32@{L}#buf=bf16")),
    Bug("triton_d_term", "the Mamba-2 Triton step drops the skip term D x", "kernels/mamba2/triton_step.py",
        "    y = y + inp.D[:, None] * inp.x_skip[:, 0]\n", "    y = y + 0 * inp.x_skip[:, 0]\n",
        ("--part", "kernel", "--only", "kernel/mamba2/nvfp4/fp16sr@4/*")),
    Bug("closed_fold_decay", "the reference's closed fold forgets the decay in the delta-rule prediction",
        "kernels/delta/reference.py", "(buf[\"v\"][:, i] - alpha * torch.einsum(\"bhkv,bhk->bhv\", state, k_i))",
        "(buf[\"v\"][:, i] - torch.einsum(\"bhkv,bhk->bhv\", state, k_i))",
        ("--part", "kernel", "--only", "kernel/gdn/*#closed*")),
    Bug("kl_driver_direction", "the KL driver passes (config, reference) logits to the metrics", "kl/driver.py",
        "token_metrics(ref_logits, feed(i), targets)", "token_metrics(feed(i), ref_logits, targets)",
        ("--part", "kl", "--only", "kl/tiny-*")),
    Bug("mcnemar_one_sided", "McNemar p-value one-sided", "results/stats.py",
        "discordant, 0.5).pvalue", "discordant, 0.5, alternative=\"less\").pvalue", ("--part", "stats")),
    Bug("kl_bucket_reverse", "bucket statistics report the forward KL as the reverse", "results/buckets.py",
        "\"reverse_kl_mean\": float(reverse_kl[:, cols]", "\"reverse_kl_mean\": float(kl[:, cols]",
        ("--part", "kl", "--only", "kl/buckets/*")),
    Bug("fp8_max_ignored", "fp8 max=M ignored (scale always amax / 448)", "formats/formats.py",
        "        return float(self.max)\n", "        return 57344.0 if self.base == 'fp8e5m2' else 448.0\n", CHEAP),
    Bug("sr_bits_ignored", "SR bits=K ignored (the default K always)", "formats/formats.py",
        "        return int(self.bits)\n", "        return self.SR_BITS[self.base][0]\n", CHEAP),
    Bug("mx_scale", "MX shared exponent one too large", "formats/formats.py",
        "torch.frexp(bmax).exponent - 1 - self.emax + 127", "torch.frexp(bmax).exponent - self.emax + 127", CHEAP),
    Bug("rowcol_sum", "scale=rowcol column factors: the sum of magnitudes over the rows, not the max", "formats/formats.py",
        "col = xo.abs().amax(dim=2, keepdim=True)", "col = xo.abs().sum(dim=2, keepdim=True)", CHEAP),
    Bug("tile_rows_ignored", "scale=tile:RxC tiles span every row of a head (one scale per head and column tile)",
        "formats/formats.py", "return rows or r, cols or c", "return r, cols or c",
        ("--part", "bits", "--part", "kl", "--only", "bits/*tile*", "--only", "kl/tiny-qwen3.5/fp8:scale=tile*")),
    Bug("feedback_not_added", "ef=: the residual is kept but not added before the next rounding", "replay/state.py",
        "target = state + residual[copy]", "target = state", ("--part", "kl", "--only", "kl/tiny-qwen3.5/*ef=*")),
    Bug("round_trip_unrounded", "a round trip restores the live state without storing it in its format",
        "kernels/round_trip.py", "return restored.copy_(fmt.decode(encode_keyed(live.float(), fmt, keys, checkpoint)))",
        "return restored.copy_(live)", ("--part", "kl", "--only", "kl/tiny-qwen3.5/*#rt=*")),
    Bug("round_trip_prompt_late", "#rt=...@prompt applied at the end of the first call after the prompt, not its start",
        "models/session.py", "hits[:, 0] = True", "hits[:, -1] = True",
        ("--part", "kl", "--only", "kl/tiny-qwen3.5/*@prompt/*")),
    Bug("round_trip_every_late", "#rt=...@every:N one token late (positions N + 1, 2N + 1, ...)",
        "replay/round_trip.py", "hit |= (positions > 0) & (positions % self.every == 0)",
        "hit |= (positions > 1) & (positions % self.every == 1)", ("--part", "kl", "--only", "kl/tiny-qwen3.5/*@every:*")),
)


def copy_package(dest: Path) -> Path:
    shutil.copytree(PACKAGE, dest / "replayssm_eval", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def plant(root: Path, bug: Bug) -> None:
    path = root / "replayssm_eval" / bug.module
    text = path.read_text(encoding="utf-8")
    if text.count(bug.old) != 1:
        raise SystemExit(f"bug {bug.name}: {bug.old!r} occurs {text.count(bug.old)} times in {bug.module}, expected once")
    path.write_text(text.replace(bug.old, bug.new), encoding="utf-8")


def run_regress(root: Path, args: tuple[str, ...]) -> tuple[int, list[str], float, float | None]:
    """Exit status, the failing metrics, the seconds of `regress args` run from the package copy in `root` and the
    largest |current - baseline| / |baseline| of a failing numeric metric (None when there is none)."""
    out = root / "regress.json"
    out.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(root), "TRITON_INTERPRET": "1"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "replayssm_eval", "regress", *args, "--json-output", str(out)],
                          cwd=root, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if not out.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return proc.returncode, [f"(no result: {tail[0]})"], seconds, None
    result = json.loads(out.read_text())
    if isinstance(result, list):  # --kernel: one entry per conformance case
        return proc.returncode, [f"{r['case']}: {r['message']}" for r in result if r["status"] == "FAIL"], seconds, None
    failing = [r for r in result["metrics"] if r["status"] in ("REGRESSED", "MISSING")]
    moves = [abs(r["current"] - r["baseline"]) / abs(r["baseline"]) for r in failing
             if isinstance(r["current"], float) and isinstance(r["baseline"], float) and r["baseline"]]
    return proc.returncode, [r["name"] for r in failing], seconds, max(moves, default=None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="bug name (repeatable; default: every bug)")
    options = parser.parse_args(argv)
    known = [b.name for b in BUGS]
    unknown = [n for n in options.only if n not in known]
    if unknown:
        parser.error(f"unknown bug {unknown[0]!r}; known: {', '.join(known)}")
    bugs = [b for b in BUGS if not options.only or b.name in options.only]
    rows, missed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        clean = copy_package(Path(tmp) / "clean")
        for args in dict.fromkeys(b.args for b in bugs):  # the controls: each set of parts passes unpatched
            code, failing, seconds, _ = run_regress(clean, args)
            if code != 0:
                print(f"control {' '.join(args)} fails unpatched (exit {code}): {', '.join(failing[:3])}")
                return 1
            print(f"control {' '.join(args)}: passes ({seconds:.0f} s)", file=sys.stderr)
        for bug in bugs:
            root = copy_package(Path(tmp) / bug.name)
            plant(root, bug)
            code, failing, seconds, move = run_regress(root, bug.args)
            caught = code == 1 and bool(failing)
            missed += not caught
            moved = "-" if move is None else f"{move:.0%}"
            rows.append((bug.name, "yes" if caught else "NO", len(failing), moved, ", ".join(failing[:2]), seconds,
                         bug.what))
            print(f"{bug.name}: {'caught' if caught else 'MISSED'} ({seconds:.0f} s)", file=sys.stderr)
            shutil.rmtree(root)
    width = max(len(r[0]) for r in rows)
    print(f"| {'bug':{width}} | caught | failing | largest move | first failing metrics | s | planted |")
    print(f"|{'-' * (width + 2)}|--------|---------|--------------|---|---|---|")
    for name, caught, count, moved, first, seconds, what in rows:
        print(f"| {name:{width}} | {caught:6} | {count:7} | {moved:>12} | {first} | {seconds:.0f} | {what} |")
    print(f"{len(rows) - missed} of {len(rows)} planted bugs caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
