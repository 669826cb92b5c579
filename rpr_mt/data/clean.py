"""Cleaning rules, and the streaming pass that writes a split's cleaned text to disk.

Training pairs are stripped and filtered (empty, too long, length ratio, optional exact duplicates). Dev and test
pairs are only stripped: every line is kept, so BLEU is computed on the full official set.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np
from tqdm import tqdm

from rpr_mt.errors import UserError

Pair = tuple[str, str]

# Characters that some readers treat as line breaks (str.splitlines, text-mode universal newlines). Inside a
# sentence they would break the line alignment of the text files we write, so they become plain spaces. A
# byte-order mark inside a file (files joined with cat, each opening with one) is no text: it is dropped, else the
# line's first word became a piece of its own, seen nowhere else (and a reference word no hypothesis can match).
_LINE_BREAKS = str.maketrans({**{c: " " for c in "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}, "\ufeff": None})


# Whether a text holds any of them: a search is ~20x faster than str.translate's lookup of every character, and
# almost no sentence has one.
_ANY_LINE_BREAK = re.compile("[" + "".join(map(chr, _LINE_BREAKS)) + "]")


def normalize(text: str) -> str:
    """Strip surrounding whitespace; internal line-break characters become spaces; byte-order marks go."""
    return (text.translate(_LINE_BREAKS) if _ANY_LINE_BREAK.search(text) else text).strip()


@dataclass
class CleanStats:
    read: int = 0  # pairs read from the input
    kept: int = 0
    empty: int = 0  # dropped: source or target empty
    too_long: int = 0  # dropped: more than max_words words on either side
    length_ratio: int = 0  # dropped: word-count ratio above max_length_ratio
    duplicate: int = 0  # dropped: exact repeat of an earlier pair (dedup only)

    @property
    def dropped(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if k not in ("read", "kept")}

    def describe(self, max_words: int, max_length_ratio: float) -> str:
        d = self.dropped
        return (f"empty {d['empty']}, longer than data.max_words={max_words} {d['too_long']}, "
                f"word ratio above data.max_length_ratio={max_length_ratio:g} {d['length_ratio']}, "
                f"duplicates {d['duplicate']}")


class SeenHashes:
    """Exact set of 64-bit hashes in sorted numpy runs: 8 bytes a hash, where a Python set of ints takes ~70.

    Queried a batch at a time (``first_seen``). New hashes form a sorted run; a run is merged into the one before it
    while that one is no more than twice its size, so there are O(log n) runs, each hash is merged O(log n) times
    (two sorted runs merge in linear time: numpy's stable sort is a timsort), and memory is ~8 bytes a hash, twice
    that for the moment of the largest merge."""

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(run) for run in self.runs)

    def first_seen(self, keys: np.ndarray) -> np.ndarray:
        """A mask over ``keys`` (uint64), True where a key is seen for the first time (earlier in ``keys`` counts);
        the new keys are added."""
        unique, first = np.unique(np.asarray(keys, dtype=np.uint64), return_index=True)  # sorted: cache-friendly
        fresh = np.ones(len(unique), dtype=bool)
        for run in self.runs:
            fresh &= run[np.minimum(np.searchsorted(run, unique), len(run) - 1)] != unique
        new = np.zeros(len(keys), dtype=bool)
        new[first[fresh]] = True  # each new key's first occurrence in the batch
        if fresh.any():
            self.runs.append(unique[fresh])  # sorted already
            while len(self.runs) > 1 and len(self.runs[-2]) <= 2 * len(self.runs[-1]):
                last = self.runs.pop()
                merged = np.concatenate((self.runs.pop(), last))
                del last
                merged.sort(kind="stable")  # two sorted runs: timsort merges them in linear time
                self.runs.append(merged)
        return new


def pair_hash(src: str, tgt: str) -> bytes:
    """The 64-bit digest that dedup compares (collisions are negligible: ~1e-5 for 36M pairs)."""
    return hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=8).digest()


class TrainFilter:
    """The training-set rules. Memory: with dedup, 8 bytes a kept pair (``SeenHashes``)."""

    def __init__(self, max_words: int, max_length_ratio: float, dedup: bool) -> None:
        self.max_words, self.max_length_ratio = max_words, max_length_ratio
        self.seen: Optional[SeenHashes] = SeenHashes() if dedup else None

    def passes(self, src: str, tgt: str, stats: CleanStats) -> bool:
        """The rules other than dedup: True to keep the (already normalized) pair; else counts the rule that
        dropped it."""
        if not src or not tgt:
            stats.empty += 1
            return False
        ns, nt = len(src.split()), len(tgt.split())
        if ns > self.max_words or nt > self.max_words:
            stats.too_long += 1
            return False
        if max(ns, nt) > self.max_length_ratio * min(ns, nt):
            stats.length_ratio += 1
            return False
        return True

    def __call__(self, src: str, tgt: str, stats: CleanStats) -> bool:
        """All the rules for one pair (``write_clean_split`` asks dedup a batch at a time instead)."""
        if not self.passes(src, tgt, stats):
            return False
        if self.seen is not None:
            key = np.frombuffer(pair_hash(src, tgt), dtype=">u8")
            if not self.seen.first_seen(key)[0]:
                stats.duplicate += 1
                return False
        return True


_DEDUP_BATCH = 8192  # pairs whose hashes are looked up together


def write_clean_split(
    pairs: Iterable[Pair],
    src_out: Path,
    tgt_out: Path,
    *,
    keep: Optional[TrainFilter] = None,
    limit: Optional[int] = None,
    on_kept: Optional[Callable[[str, str], None]] = None,
    progress: bool = True,
    desc: str = "",
    total: Optional[int] = None,
    times: Optional[dict[str, float]] = None,
) -> CleanStats:
    """Stream ``pairs`` through normalization (and ``keep`` for training data) into two UTF-8 text files.

    Memory is O(1) per pair (plus ``keep``'s dedup hashes and whatever ``on_kept`` retains): nothing is accumulated.
    ``limit`` stops after that many kept pairs (data.max_train_pairs; with dedup the read may run up to a dedup
    batch past it, but the counts stop at the pair that reached it). ``times`` (optional) accumulates the seconds
    spent pulling pairs from ``pairs`` ("reading") and the rest ("cleaning")."""
    stats = CleanStats()
    seen = keep.seen if keep is not None else None
    pending: list[tuple[str, str, bytes, tuple[int, int, int, int]]] = []  # pairs awaiting the dedup lookup
    clock = time.perf_counter
    reading, started = 0.0, clock()

    def emit(src: str, tgt: str) -> bool:
        """Write a kept pair; True once ``limit`` is reached."""
        fs.write(src + "\n")
        ft.write(tgt + "\n")
        stats.kept += 1
        if on_kept is not None:
            on_kept(src, tgt)
        return limit is not None and stats.kept >= limit

    def flush() -> bool:
        """Dedup the pending pairs and write the new ones, in order; True once ``limit`` is reached."""
        assert seen is not None
        new = seen.first_seen(np.frombuffer(b"".join(p[2] for p in pending), dtype=">u8"))
        for (src, tgt, _, counts), is_new in zip(pending, new):
            if not is_new:
                stats.duplicate += 1
            elif emit(src, tgt):  # the pairs read after this one do not count
                stats.read, stats.empty, stats.too_long, stats.length_ratio = counts
                return True
        pending.clear()
        return False

    with open(src_out, "w", encoding="utf-8", newline="\n") as fs, \
            open(tgt_out, "w", encoding="utf-8", newline="\n") as ft, \
            tqdm(pairs, desc=desc, total=total, unit=" pairs", unit_scale=True, disable=not progress,
                 leave=False) as bar:
        stream, done = iter(bar), False
        while not done:
            before = clock()
            pair = next(stream, None)
            reading += clock() - before
            if pair is None:
                if pending:
                    flush()
                break
            stats.read += 1
            src, tgt = normalize(pair[0]), normalize(pair[1])
            if keep is not None and not keep.passes(src, tgt, stats):
                continue
            if seen is None:
                done = emit(src, tgt)
                continue
            pending.append((src, tgt, pair_hash(src, tgt),
                            (stats.read, stats.empty, stats.too_long, stats.length_ratio)))
            if len(pending) >= _DEDUP_BATCH:
                done = flush()
    if times is not None:
        times["reading"] = times.get("reading", 0.0) + reading
        times["cleaning"] = times.get("cleaning", 0.0) + clock() - started - reading
    return stats


def require_some_kept(stats: CleanStats, origin: str, max_words: int, max_length_ratio: float) -> None:
    if stats.kept == 0:
        raise UserError(f"cleaning dropped all {stats.read} training pairs of {origin} "
                        f"({stats.describe(max_words, max_length_ratio)})")
