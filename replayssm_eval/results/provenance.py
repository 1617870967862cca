"""What every result records about where it came from: software versions and the git commit; and the
JSON-safe copy of a result (no NaN or infinities)."""

from __future__ import annotations

import math
import platform
import subprocess
from pathlib import Path


def versions() -> dict:
    """Versions of the software that produced the numbers (None where a package is absent)."""
    import torch
    import transformers

    import replayssm_eval

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": triton_version,
        "replayssm_eval": replayssm_eval.__version__,
    }


def machine() -> dict:
    """The CPU that produced the numbers: BLAS and ATen pick their kernels by it, so float results differ between
    CPUs at the last bits (the processor is /proc/cpuinfo's model name where there is one)."""
    import torch

    model = None
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text(errors="replace").splitlines()
                      if line.startswith("model name")), None)
    return {"platform": platform.platform(), "processor": model or platform.processor() or platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def git_state() -> dict:
    """Commit of the replayssm_eval checkout and whether it has uncommitted changes (None outside git)."""
    root = Path(__file__).resolve().parents[2]

    def git(*args):
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        return done.stdout.strip() if done.returncode == 0 else None

    try:
        commit = git("rev-parse", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        commit = status = None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def finite(obj):
    """A copy of `obj` with NaN and infinities replaced by None (JSON has no such numbers)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj
