"""benchmarks/check_ddp_batches.py's comparison: a pair's key, and what counts as the ranks reading one process's
batches (the runs themselves are the benchmark: a trainer in one process and under torchrun)."""

from __future__ import annotations

import torch

from . import load_script

check = load_script("benchmarks/check_ddp_batches.py")


def test_a_pairs_key_ignores_padding_and_a_stand_in_pair_has_none():
    src = torch.tensor([[5, 6, 2, 0], [5, 6, 2, 0], [7, 2, 0, 0]])
    tgt_out = torch.tensor([[8, 2, 0], [8, 2, 0], [0, 0, 0]])  # the last: a share-less rank's all-padding target
    keys = check.pair_keys(src, tgt_out, pad_id=0)
    assert len(keys) == 2 and keys[0] == keys[1]
    assert check.pair_keys(src[:1], torch.tensor([[9, 2, 0]]), pad_id=0) != keys[:1]


def test_disjoint_shares_that_make_up_each_batch_pass():
    single = [["a", "b", "c"], ["d"]]
    ranks = [[["a", "c"], ["d"]], [["b"], []]]
    assert check.compare(single, ranks) == []


def test_a_pair_on_two_ranks_a_lost_pair_and_a_batch_too_many_are_reported():
    single = [["a", "b"], ["c", "d"]]
    assert check.compare(single, [[["a", "b"], ["c"]], [["b"], ["d"]]]) == [
        "batch 0: a pair read by two ranks", "batch 0: the ranks' pairs (3) are not one process's (2)"]
    assert check.compare(single, [[["a"], ["c"]], [["b"], []]]) == [
        "batch 1: the ranks' pairs (1) are not one process's (2)"]
    assert check.compare(single, [[["a"], ["c"], ["e"]], [["b"], ["d"], []]])[0].startswith("batch counts differ")
