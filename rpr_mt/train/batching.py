"""Token-budget batches from length-sorted examples, reproducible per (seed, epoch) and resumable by position.

An epoch's batches are a pure function of (seed, epoch): examples are sorted by length with a seeded random
tie-break, packed greedily so that neither the padded source nor the padded target side exceeds ``max_tokens``,
and the batch order is shuffled with the same seed. The training position is therefore just (epoch, batch index),
which is what checkpoints store.

Distributed training splits every batch between ranks (rank r takes rows r, r + W, ...), so W processes see exactly
the global batch that one process would see, and the loss is normalised by the global target-token count.
``BatchStream`` is the training loop's view: one batch after another, across epochs, keeping the resume point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Protocol

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from rpr_mt.config import TrainConfig
    from rpr_mt.model.transformer import Seq2Seq
    from rpr_mt.train.distributed import Distributed
    from rpr_mt.train.state import TrainState


class ParallelIdsLike(Protocol):
    src_lengths: np.ndarray
    tgt_lengths: np.ndarray

    def __len__(self) -> int: ...
    def src(self, i: int) -> np.ndarray: ...
    def tgt(self, i: int) -> np.ndarray: ...


@dataclass
class Batch:
    src: Tensor  # [B, S] source ids + eos, padded
    tgt_in: Tensor  # [B, T] bos + target ids, padded
    tgt_out: Tensor  # [B, T] target ids + eos, padded
    global_tgt_tokens: int  # non-pad target tokens in the whole (all-rank) batch: the loss normaliser
    global_src_tokens: int

    def to(self, device: torch.device) -> "Batch":
        return Batch(
            self.src.to(device, non_blocking=True),
            self.tgt_in.to(device, non_blocking=True),
            self.tgt_out.to(device, non_blocking=True),
            self.global_tgt_tokens,
            self.global_src_tokens,
        )


def usable_examples(data: ParallelIdsLike, max_positions: int, max_tokens: int | None = None) -> np.ndarray:
    """Indices of examples that fit the model (pieces + eos/bos <= max_positions), are non-empty and, with
    ``max_tokens``, have at most that many pieces a side (eos not counted)."""
    src_len = np.asarray(data.src_lengths) + 1
    tgt_len = np.asarray(data.tgt_lengths) + 1
    limit = max_positions if max_tokens is None else min(max_positions, max_tokens + 1)
    keep = (src_len <= limit) & (tgt_len <= limit) & (src_len > 1) & (tgt_len > 1)
    return np.flatnonzero(keep)


def make_batches(
    data: ParallelIdsLike, indices: np.ndarray, max_tokens: int, seed: int, epoch: int, shuffle: bool = True
) -> list[np.ndarray]:
    """Pack ``indices`` into batches of at most ``max_tokens`` padded tokens on each side.

    Sorting by (target, source) length keeps padding low; the random tie-break and the shuffled batch order
    change every epoch but are fixed by (seed, epoch).
    """
    src_len = np.asarray(data.src_lengths)[indices] + 1
    tgt_len = np.asarray(data.tgt_lengths)[indices] + 1
    rng = np.random.default_rng([seed, epoch])
    tie_break = rng.random(len(indices)) if shuffle else np.arange(len(indices))
    order = np.lexsort((tie_break, src_len, tgt_len))
    bounds = _pack(src_len[order], tgt_len[order], max_tokens)
    batches = [indices[order[a:b]] for a, b in zip(bounds[:-1], bounds[1:])]
    if shuffle:
        perm = rng.permutation(len(batches))
        batches = [batches[i] for i in perm]
    return batches


def _pack(src_len: np.ndarray, tgt_len: np.ndarray, max_tokens: int) -> list[int]:
    """Greedy packing of examples in this order: a batch grows while (its longest source) x (its size) and the
    same for targets stay within ``max_tokens`` (one example alone always fits). Returns the batches' boundaries,
    0 first and len last. Each batch is found with numpy over a window of the examples after its start (doubled
    until it holds the batch's end), not a Python step per example: 4.5M examples take a second, not ten."""
    n, bounds, start, window = len(src_len), [0], 0, 64
    while start < n:
        while True:
            stop = min(n, start + window)
            size = np.arange(1, stop - start + 1)
            over = ((np.maximum.accumulate(src_len[start:stop]) * size > max_tokens)
                    | (np.maximum.accumulate(tgt_len[start:stop]) * size > max_tokens))
            over[0] = False
            if over.any():
                end = start + int(over.argmax())
                break
            if stop == n:
                end = n
                break
            window *= 2
        bounds.append(end)
        start, window = end, max(64, 2 * (end - bounds[-2]))
    return bounds


def collate(
    data: ParallelIdsLike, rows: np.ndarray, pad_id: int, bos_id: int, eos_id: int, rank: int = 0, world: int = 1
) -> Batch:
    """Tensors for this rank's share (rows[rank::world]) of one global batch.

    A batch of fewer pairs than ranks (the short last batch of an epoch's packing can hold one) leaves some ranks
    no share: such a rank gets the batch's first pair with an all-padding target, so that it runs the same forward
    and backward as the others (DDP's gradient all-reduce needs every rank) and adds nothing to the loss."""
    global_tgt = int(sum(int(data.tgt_lengths[i]) + 1 for i in rows))
    global_src = int(sum(int(data.src_lengths[i]) + 1 for i in rows))
    mine = rows[rank::world]
    empty_share = len(mine) == 0 and len(rows) > 0
    if empty_share:
        mine = rows[:1]
    srcs = [data.src(int(i)) for i in mine]
    tgts = [data.tgt(int(i)) for i in mine]
    n = len(mine)
    src = torch.full((n, max((len(s) for s in srcs), default=0) + 1), pad_id, dtype=torch.long)
    tgt_len = max((len(t) for t in tgts), default=0) + 1
    tgt_in = torch.full((n, tgt_len), pad_id, dtype=torch.long)
    tgt_out = torch.full((n, tgt_len), pad_id, dtype=torch.long)
    for b, (s, t) in enumerate(zip(srcs, tgts)):
        src[b, : len(s)] = torch.from_numpy(s.astype(np.int64))
        src[b, len(s)] = eos_id
        t64 = torch.from_numpy(t.astype(np.int64))
        tgt_in[b, 0] = bos_id
        tgt_in[b, 1 : len(t) + 1] = t64
        tgt_out[b, : len(t)] = t64
        tgt_out[b, len(t)] = eos_id
    if empty_share:
        tgt_out.fill_(pad_id)  # no target token: no loss, zero gradients
    return Batch(src, tgt_in, tgt_out, global_tgt, global_src)


class EpochIterator:
    """Batches of one epoch starting at batch ``start`` (for resuming mid-epoch)."""

    def __init__(
        self,
        data: ParallelIdsLike,
        indices: np.ndarray,
        *,
        max_tokens: int,
        seed: int,
        epoch: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        rank: int = 0,
        world: int = 1,
        start: int = 0,
    ) -> None:
        self.batches = make_batches(data, indices, max_tokens, seed, epoch)
        self.data, self.position = data, start
        self.pad_id, self.bos_id, self.eos_id, self.rank, self.world = pad_id, bos_id, eos_id, rank, world

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Batch]:
        while self.position < len(self.batches):
            rows = self.batches[self.position]
            self.position += 1
            yield collate(self.data, rows, self.pad_id, self.bos_id, self.eos_id, self.rank, self.world)


class BatchStream:
    """The training batches in order, across epochs, keeping ``state.epoch`` and ``state.position`` (the resume
    point) up to date."""

    def __init__(self, data, indices: np.ndarray, t: TrainConfig, model: Seq2Seq, dd: Distributed,
                 state: TrainState) -> None:
        self.data, self.indices, self.t, self.model, self.dd, self.state = data, indices, t, model, dd, state
        self._start(state.position)

    def _start(self, position: int) -> None:
        t, model, dd = self.t, self.model, self.dd
        self.iterator = EpochIterator(
            self.data, self.indices, max_tokens=t.max_tokens, seed=t.seed, epoch=self.state.epoch, pad_id=model.pad_id,
            bos_id=model.bos_id, eos_id=model.eos_id, rank=dd.rank, world=dd.world, start=position,
        )
        self.batches = iter(self.iterator)

    @property
    def epoch_done(self) -> bool:
        """Whether every batch of the current epoch has been drawn (the next one starts another epoch)."""
        return self.iterator.position >= len(self.iterator)

    def next(self) -> Batch:
        while True:
            batch = next(self.batches, None)
            if batch is not None:
                self.state.position = self.iterator.position
                return batch
            self.state.epoch += 1
            self.state.position = 0
            self._start(0)
