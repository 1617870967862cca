"""The run directory: atomic file writes, the run settings, and per-document token metrics.

    run.json                  settings of the run (written once; `--resume` reads them back)
    progress.json             the batch in flight, rewritten after every segment
    tokens/doc-000012.npz     one finished document: metrics [C, 4, N] float32, ref_nll [N] float32
    kl.json, kl_buckets.csv, kl_vs_length.png    rendered from the finished documents

Every file is written to a temporary name in the same folder and moved into place with
`os.replace`, so an interrupted write leaves the previous version (or nothing), never half a file.
A document is the unit of resumption: its file exists only once all its segments are done.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np

RUN_FILE = "run.json"
PROGRESS_FILE = "progress.json"
TOKENS_DIR = "tokens"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temporary file and `os.replace`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj) -> None:
    """Write `obj` as indented JSON (non-finite floats must already be replaced; see output.py)."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode())


def read_json(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def doc_path(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / TOKENS_DIR / f"doc-{index:06d}.npz"


def save_document(run_dir: Path, index: int, metrics: np.ndarray, ref_nll: np.ndarray, config_names: list[str]) -> None:
    """Store one finished document: metrics [C, 4, N] float32, ref_nll [N] float32."""
    buffer = io.BytesIO()
    np.savez(buffer, metrics=metrics, ref_nll=ref_nll, configs=np.array(config_names))
    (Path(run_dir) / TOKENS_DIR).mkdir(exist_ok=True)
    atomic_write_bytes(doc_path(run_dir, index), buffer.getvalue())


def load_documents(run_dir: Path, indices, config_names: list[str], tokens: int) -> dict[int, tuple]:
    """The finished documents among `indices`: index -> (metrics [C, 4, N], ref_nll [N])."""
    done = {}
    for index in indices:
        path = doc_path(run_dir, index)
        if not path.exists():
            continue
        with np.load(path) as data:
            names, metrics, ref_nll = list(data["configs"]), data["metrics"], data["ref_nll"]
        if names != list(config_names) or metrics.shape[1:] != (4, tokens) or ref_nll.shape != (tokens,):
            raise ValueError(
                f"{path} holds configs {names} with {metrics.shape[-1]} tokens, "
                f"but the run has configs {list(config_names)} with {tokens} tokens"
            )
        done[index] = (metrics, ref_nll)
    return done
