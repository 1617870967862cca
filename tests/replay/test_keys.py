"""`sr_keys`: one splitmix64 key per sequence, remembered per seq_ids tensor while that tensor stands."""

import torch

from replayssm_eval.replay.keys import READ_COPY, RECUR_COPY, sr_key, sr_keys

IDS = [0, 7, 2**62 + 12345, 2**63 - 1, 987654321]


def test_keys_are_the_per_sequence_formula():
    seq_ids = torch.tensor(IDS, dtype=torch.int64)
    for seed, layer, copy in ((0, 0, RECUR_COPY), (2**63 - 1, 47, READ_COPY), (1234, 5, 2)):
        assert sr_keys(seed, layer, seq_ids, copy).tolist() == [sr_key(seed, layer, s, copy) for s in IDS]


def test_keys_are_remembered_until_the_ids_change_in_place():
    seq_ids = torch.tensor(IDS, dtype=torch.int64)
    first = sr_keys(3, 2, seq_ids, RECUR_COPY)
    assert sr_keys(3, 2, seq_ids, RECUR_COPY) is first
    assert sr_keys(3, 2, seq_ids, READ_COPY).tolist() == [sr_key(3, 2, s, READ_COPY) for s in IDS]
    seq_ids[1] = 11
    again = sr_keys(3, 2, seq_ids, RECUR_COPY)
    assert again[1].item() == sr_key(3, 2, 11, RECUR_COPY) != first[1].item()
    other = torch.tensor(IDS, dtype=torch.int64)  # equal values, another tensor: its own keys, the same values
    assert torch.equal(sr_keys(3, 2, other, RECUR_COPY), first)
