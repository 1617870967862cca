"""Several processes (torchrun, accelerate launch): which documents each rank runs, and the merge on rank 0.

Launchers set RANK, WORLD_SIZE and LOCAL_RANK (and MASTER_ADDR/MASTER_PORT); with WORLD_SIZE > 1
the process group is started here (NCCL on CUDA, gloo on CPU) unless the caller already did.
Documents are grouped into fixed batches of `batch_size` consecutive indices and the batches are
dealt round-robin to the ranks, so a document's batch (and so its numbers) does not depend on the
number of processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_ranks(device_type: str) -> Ranks:
    """Ranks from the launcher's environment; starts the process group when there are several."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Ranks()
    ranks = Ranks(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        if device_type == "cuda":
            torch.cuda.set_device(ranks.local_rank)
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return ranks


def batches_for_rank(num_docs: int, batch_size: int, ranks: Ranks) -> list[list[int]]:
    """Document indices of this rank's batches: batch k = [k*batch_size, (k+1)*batch_size), dealt round-robin."""
    batches = [list(range(s, min(s + batch_size, num_docs))) for s in range(0, num_docs, batch_size)]
    return batches[ranks.rank :: ranks.world]


def gather_on_main(ranks: Ranks, results: dict) -> dict | None:
    """Merge every rank's `results` dict on rank 0 (others get None); a no-op for one process."""
    if ranks.world == 1:
        return results
    parts = [None] * ranks.world if ranks.is_main else None
    dist.gather_object(results, parts, dst=0)
    if not ranks.is_main:
        return None
    merged = {}
    for part in parts:
        merged.update(part)
    return merged


def barrier(ranks: Ranks) -> None:
    if ranks.world > 1:
        dist.barrier()


def on_main(ranks: Ranks, fn):
    """Run `fn()` on rank 0 and give every rank its result; a ValueError there is raised on every rank."""
    if ranks.world == 1:
        return fn()
    box = [None]
    if ranks.is_main:
        try:
            box[0] = ("ok", fn())
        except ValueError as err:
            box[0] = ("error", str(err))
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status == "error":
        raise ValueError(value)
    return value
