"""Documents split across two CPU processes (gloo) and merged on rank 0 equal a one-process run."""

import json

import torch.multiprocessing as mp

from replayssm_eval.kl.ranks import Ranks, batches_for_rank

from tests.helpers.kl_fakes import free_port, run_rank


def test_batches_are_dealt_round_robin():
    assert batches_for_rank(7, 2, Ranks(0, 2)) == [[0, 1], [4, 5]]
    assert batches_for_rank(7, 2, Ranks(1, 2)) == [[2, 3], [6]]
    assert batches_for_rank(3, 1, Ranks(0, 1)) == [[0], [1], [2]]


def test_two_gloo_processes_merge_on_rank_0(fake, small, tmp_path):
    fake()
    from replayssm_eval.kl.driver import run_kl

    options = small(output=str(tmp_path / "two"), tokens=120, num_docs=3)
    single = json.loads((run_kl(small(output=str(tmp_path / "one"), tokens=120)) / "kl.json").read_text())
    # fork: the children inherit the imported modules (spawn re-imports torch and transformers, ~10 s)
    mp.start_processes(run_rank, args=(2, free_port(), options), nprocs=2, join=True, start_method="fork")
    merged = json.loads((tmp_path / "two" / "kl.json").read_text())
    assert merged["complete"] and merged["document_indices"] == [0, 1, 2]
    assert merged["configs"] == single["configs"] and merged["reference"] == single["reference"]
    assert not (tmp_path / "two" / "tokens").exists()
