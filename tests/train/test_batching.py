"""Token-budget batching: budgets respected, every example once per epoch, deterministic per (seed, epoch)."""

import numpy as np

from rpr_mt.train.batching import EpochIterator, collate, make_batches, usable_examples


class FakeIds:
    def __init__(self, n=200, seed=0):
        rng = np.random.default_rng(seed)
        self.src_lengths = rng.integers(1, 40, n)
        self.tgt_lengths = rng.integers(1, 40, n)
        self._src = [rng.integers(4, 50, k).astype(np.uint16) for k in self.src_lengths]
        self._tgt = [rng.integers(4, 50, k).astype(np.uint16) for k in self.tgt_lengths]

    def __len__(self):
        return len(self.src_lengths)

    def src(self, i):
        return self._src[i]

    def tgt(self, i):
        return self._tgt[i]


def test_budget_and_coverage():
    data = FakeIds()
    idx = usable_examples(data, max_positions=1024)
    batches = make_batches(data, idx, max_tokens=200, seed=1, epoch=0)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(len(data)))
    for rows in batches:
        assert (data.src_lengths[rows].max() + 1) * len(rows) <= 200 or len(rows) == 1
        assert (data.tgt_lengths[rows].max() + 1) * len(rows) <= 200 or len(rows) == 1


def test_deterministic_per_epoch_and_different_across_epochs():
    data = FakeIds()
    idx = np.arange(len(data))
    a = make_batches(data, idx, 300, seed=3, epoch=2)
    b = make_batches(data, idx, 300, seed=3, epoch=2)
    c = make_batches(data, idx, 300, seed=3, epoch=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, c))


def test_usable_examples_drops_too_long_and_empty():
    data = FakeIds()
    data.src_lengths[0] = 0
    idx = usable_examples(data, max_positions=20)
    assert 0 not in idx
    assert all(data.src_lengths[i] + 1 <= 20 and data.tgt_lengths[i] + 1 <= 20 for i in idx)


def test_usable_examples_training_length_cap():
    data = FakeIds()
    capped = usable_examples(data, max_positions=1024, max_tokens=12)
    expected = [i for i in range(len(data.src_lengths))
                if 0 < data.src_lengths[i] <= 12 and 0 < data.tgt_lengths[i] <= 12]
    assert capped.tolist() == expected and 0 < len(expected) < len(data.src_lengths)
    # the tighter of the two limits wins
    assert usable_examples(data, max_positions=8, max_tokens=12).tolist() == usable_examples(data, 8).tolist()


def test_collate_adds_bos_eos_and_ranks_split_rows():
    data = FakeIds(10)
    rows = np.arange(5)
    full = collate(data, rows, pad_id=0, bos_id=2, eos_id=3)
    assert full.global_tgt_tokens == int((data.tgt_lengths[:5] + 1).sum())
    for b in range(5):
        n = data.tgt_lengths[b]
        assert full.tgt_in[b, 0] == 2 and full.tgt_out[b, n] == 3
        assert np.array_equal(full.tgt_in[b, 1 : n + 1].numpy(), data.tgt(b))
        assert full.src[b, data.src_lengths[b]] == 3
    r0 = collate(data, rows, 0, 2, 3, rank=0, world=2)
    r1 = collate(data, rows, 0, 2, 3, rank=1, world=2)
    assert r0.src.size(0) + r1.src.size(0) == 5 and r0.global_tgt_tokens == full.global_tgt_tokens


def test_a_rank_without_a_share_gets_a_pair_that_adds_no_loss():
    """One pair, two ranks (an epoch's short last batch): rank 1 runs a forward and backward like rank 0 (DDP needs
    both) on a target of padding only, which the loss skips; the update's token counts are the batch's."""
    import torch

    from rpr_mt.config import ModelConfig
    from rpr_mt.model.transformer import Seq2Seq
    from rpr_mt.train.loss import TranslationLoss

    data = FakeIds(10)
    rows = np.array([3])
    r0 = collate(data, rows, 0, 2, 3, rank=0, world=2)
    r1 = collate(data, rows, 0, 2, 3, rank=1, world=2)
    assert r1.src.size(0) == 1 and torch.equal(r1.src, r0.src)
    assert not r1.tgt_out.ne(0).any() and r1.global_tgt_tokens == r0.global_tgt_tokens
    model = Seq2Seq(ModelConfig(d_model=16, n_heads=2, encoder_layers=1, decoder_layers=1, ff_dim=32,
                                max_positions=64), 64, 0, 2, 3)
    loss, nll = TranslationLoss(model, 0.1)(r1.src.clamp_max(63), r1.tgt_in.clamp_max(63), r1.tgt_out)
    loss.backward()
    assert float(loss.detach()) == 0.0 and float(nll.detach()) == 0.0
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters() if p.requires_grad)


def test_epoch_iterator_resumes_at_a_position():
    data = FakeIds()
    kwargs = dict(max_tokens=300, seed=1, epoch=0, pad_id=0, bos_id=2, eos_id=3)
    whole = list(EpochIterator(data, np.arange(len(data)), **kwargs))
    tail = list(EpochIterator(data, np.arange(len(data)), start=4, **kwargs))
    assert len(tail) == len(whole) - 4
    assert all(torch_equal(a.src, b.src) for a, b in zip(whole[4:], tail))


def torch_equal(a, b):
    return a.shape == b.shape and bool((a == b).all())


def test_two_ranks_read_disjoint_shares_that_cover_one_process_epoch():
    """Under torchrun (world 2) each rank builds the same epoch plan and collates its share of every batch: over a
    whole epoch the two shares are disjoint and together are the pairs one process reads, batch by batch (a rank
    without a share of a one-pair batch gets a pair whose target is all padding, which adds nothing)."""
    data = FakeIds(n=301, seed=5)
    for i in range(len(data)):  # every source starts with its own index, so a batch says which pairs it holds
        data._src[i] = np.concatenate([[i + 4], data._src[i]]).astype(np.uint16)
    data.src_lengths = data.src_lengths + 1
    kwargs = dict(max_tokens=120, seed=7, epoch=3, pad_id=0, bos_id=2, eos_id=3)
    indices = usable_examples(data, max_positions=1024)
    single = list(EpochIterator(data, indices, **kwargs))
    ranks = [list(EpochIterator(data, indices, rank=r, world=2, **kwargs)) for r in range(2)]
    assert len(single) == len(ranks[0]) == len(ranks[1]) > 10

    def pairs(batch):
        real = batch.tgt_out.ne(0).any(dim=1)  # a share-less rank's stand-in pair has no target token
        return set((batch.src[real, 0] - 4).tolist())

    covered = []
    for one, r0, r1 in zip(single, ranks[0], ranks[1]):
        assert not pairs(r0) & pairs(r1)
        assert pairs(r0) | pairs(r1) == pairs(one)
        assert r0.global_tgt_tokens == r1.global_tgt_tokens == one.global_tgt_tokens
        covered += pairs(one)
    assert sorted(covered) == indices.tolist()


def _packed_one_by_one(src_len, tgt_len, max_tokens):
    """The greedy packing written as a loop over the examples (the reference)."""
    bounds, start, max_src, max_tgt = [0], 0, 0, 0
    for pos, (s, t) in enumerate(zip(src_len.tolist(), tgt_len.tolist())):
        new_src, new_tgt, size = max(max_src, s), max(max_tgt, t), pos - start + 1
        if size > 1 and (new_src * size > max_tokens or new_tgt * size > max_tokens):
            bounds.append(pos)
            start, new_src, new_tgt = pos, s, t
        max_src, max_tgt = new_src, new_tgt
    return bounds + [len(src_len)] if len(src_len) else bounds


def test_packing_in_windows_equals_the_example_by_example_loop():
    from rpr_mt.train.batching import _pack

    rng = np.random.default_rng(11)
    for n, max_tokens in ((0, 100), (1, 100), (5000, 6250), (5000, 300), (3000, 40), (2000, 3), (700, 100000)):
        tgt = np.sort(rng.integers(2, 120, n))  # sorted by target length first, as make_batches orders them
        src = rng.integers(2, 150, n)
        src[rng.random(n) < 0.01] = 400  # a long source now and then
        assert _pack(src, tgt, max_tokens) == _packed_one_by_one(src, tgt, max_tokens), (n, max_tokens)
