"""The KL run directory: the run settings, per-document token metrics, the batch in flight.

    run.json                  settings of the run (written once; `--resume` reads them back)
    progress.json             the batch in flight, rewritten after every segment
    tokens/doc-000012.npz     one finished document: metrics [C, M, N] float32, ref_nll [N] float32
    inflight/batch-000012.npz this rank's batch in flight (named by its first document), rewritten after
                              every segment: metrics [B, C, M, n], ref_nll [B, n] of the n tokens done so far
    inflight/batch-000012.pt  snapshot of that batch at a segment boundary (written on Ctrl-C only): every
                              stream's state (HF cache, ReplayStates) and the metrics so far
    kl.json, kl_buckets.csv, kl_vs_length.png    rendered from the finished documents

Every file is written atomically (`files.atomic_write`), so an interrupted write leaves the previous
version (or nothing), never half a file. A batch's inflight files are removed once its documents are stored.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import numpy as np
import torch

from replayssm_eval.results.files import atomic_write

RUN_FILE = "run.json"
PROGRESS_FILE = "progress.json"
TOKENS_DIR = "tokens"
INFLIGHT_DIR = "inflight"


def _save_npz(path: Path, **arrays) -> None:
    """`np.savez` of `arrays` to `path` (atomically), creating its folder."""
    path.parent.mkdir(exist_ok=True)
    atomic_write(path, lambda f: np.savez(f, **arrays))


def doc_path(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / TOKENS_DIR / f"doc-{index:06d}.npz"


def save_document(run_dir: Path, index: int, metrics: np.ndarray, ref_nll: np.ndarray, config_names: list[str]) -> None:
    """Store one finished document: metrics [C, M, N] float32, ref_nll [N] float32."""
    _save_npz(doc_path(run_dir, index), metrics=metrics, ref_nll=ref_nll, configs=np.array(config_names))


def load_documents(run_dir: Path, indices, config_names: list[str], tokens: int,
                   metric_count: int) -> dict[int, tuple]:
    """The finished documents among `indices`: index -> (metrics [C, M, N], ref_nll [N]), M = `metric_count`."""
    done = {}
    for index in indices:
        path = doc_path(run_dir, index)
        if not path.exists():
            continue
        try:
            with open(path, "rb") as f, np.load(f) as data:
                names, metrics, ref_nll = list(data["configs"]), data["metrics"], data["ref_nll"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            raise ValueError(f"{path} cannot be read ({type(err).__name__}: {err}); "
                             f"delete it and --resume again to redo document {index}") from err
        if names != list(config_names) or metrics.shape[1:] != (metric_count, tokens) or ref_nll.shape != (tokens,):
            raise ValueError(
                f"{path} holds configs {names} with {metrics.shape[1]} metrics of {metrics.shape[-1]} tokens, "
                f"but the run has configs {list(config_names)} with {metric_count} metrics of {tokens} tokens"
            )
        done[index] = (metrics, ref_nll)
    return done


def inflight_path(run_dir: Path, batch: list[int], suffix: str) -> Path:
    """inflight/batch-<first document>.<suffix>; batches are fixed by index, so the name is too."""
    return Path(run_dir) / INFLIGHT_DIR / f"batch-{batch[0]:06d}.{suffix}"


def save_partial(run_dir: Path, batch: list[int], metrics: np.ndarray, ref_nll: np.ndarray,
                 config_names: list[str]) -> None:
    """Store the batch's metrics so far: metrics [B, C, M, n], ref_nll [B, n] for the first n generated tokens."""
    _save_npz(inflight_path(run_dir, batch, "npz"), metrics=metrics, ref_nll=ref_nll, documents=np.array(batch),
              configs=np.array(config_names))


def save_snapshot(run_dir: Path, batch: list[int], snapshot: dict) -> Path:
    """Store a batch's snapshot (`driver.Boundary.snapshot`) with torch.save; returns its path."""
    path = inflight_path(run_dir, batch, "pt")
    path.parent.mkdir(exist_ok=True)
    atomic_write(path, lambda f: torch.save(snapshot, f))
    return path


def check_snapshot(run_dir: Path, batch: list[int], configs: int, metric_count: int) -> None:
    """ValueError naming the batch's snapshot if it is truncated (its zip directory, at the end, is unreadable) or
    of another run (other batch size, config count than `configs` or metric count than `metric_count`); the tensors are
    only mapped, not read."""
    path = inflight_path(run_dir, batch, "pt")
    if not path.exists():
        return
    try:
        zipfile.ZipFile(path).close()
        snapshot = _load(path, "cpu", mmap=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as err:
        raise _unreadable_snapshot(path, batch, err) from err
    expected = (len(batch), configs, metric_count)
    found = tuple(snapshot["metrics"].shape[:3]) if isinstance(snapshot, dict) and "metrics" in snapshot else None
    if found != expected or len(snapshot.get("streams", ())) != configs + 1:
        raise ValueError(f"{path} is not a snapshot of this run (it holds documents x configs x metrics {found}, "
                         f"this batch has {expected}); delete it and --resume again to redo documents {batch} "
                         f"from their start")


def _unreadable_snapshot(path: Path, batch: list[int], err: Exception) -> ValueError:
    return ValueError(f"{path} cannot be read ({type(err).__name__}: {str(err).split('. ')[0]}); "
                      f"delete it and --resume again to redo documents {batch} from their start")


def _load(path: Path, map_location, mmap: bool = False):
    # weights_only=False: the HF cache and ReplayState objects are pickled; the file is this run's own
    return torch.load(path, map_location=map_location, weights_only=False, mmap=mmap)


def load_snapshot(run_dir: Path, batch: list[int], map_location) -> dict | None:
    """The batch's snapshot (checked by `check_snapshot`), its tensors moved to `map_location` (None: where they
    were); None if there is none."""
    path = inflight_path(run_dir, batch, "pt")
    if not path.exists():
        return None
    try:
        return _load(path, map_location)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
        raise _unreadable_snapshot(path, batch, err) from err


def clear_inflight(run_dir: Path, batch: list[int]) -> None:
    """Remove a finished batch's partial metrics and snapshot."""
    for suffix in ("npz", "pt"):
        inflight_path(run_dir, batch, suffix).unlink(missing_ok=True)
