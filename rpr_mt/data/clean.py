"""Cleaning rules, and the streaming pass that writes a split's cleaned text to disk.

Training pairs are stripped and filtered (empty, too long, length ratio, optional exact duplicates). Dev and test
pairs are only stripped: every line is kept, so BLEU is computed on the full official set.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from tqdm import tqdm

from rpr_mt.errors import UserError

Pair = tuple[str, str]

# Characters that some readers treat as line breaks (str.splitlines, text-mode universal newlines). Inside a
# sentence they would break the line alignment of the text files we write, so they become plain spaces. A
# byte-order mark inside a file (files joined with cat, each opening with one) is no text: it is dropped, else the
# line's first word became a piece of its own, seen nowhere else (and a reference word no hypothesis can match).
_LINE_BREAKS = str.maketrans({**{c: " " for c in "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}, "\ufeff": None})


def normalize(text: str) -> str:
    """Strip surrounding whitespace; internal line-break characters become spaces; byte-order marks go."""
    return text.translate(_LINE_BREAKS).strip()


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


class TrainFilter:
    """The training-set rules. Memory: with dedup, one 8-byte hash per kept pair (~70 bytes in a Python set)."""

    def __init__(self, max_words: int, max_length_ratio: float, dedup: bool) -> None:
        self.max_words, self.max_length_ratio = max_words, max_length_ratio
        self._seen: Optional[set[int]] = set() if dedup else None

    def __call__(self, src: str, tgt: str, stats: CleanStats) -> bool:
        """True to keep the (already normalized) pair; counts the rule that dropped it otherwise."""
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
        if self._seen is not None:
            # 64-bit digest: collisions are negligible (~1e-5 for 36M pairs) and far cheaper than the strings.
            key = int.from_bytes(hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=8).digest(), "big")
            if key in self._seen:
                stats.duplicate += 1
                return False
            self._seen.add(key)
        return True


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
) -> CleanStats:
    """Stream ``pairs`` through normalization (and ``keep`` for training data) into two UTF-8 text files.

    Memory is O(1) per pair (plus ``keep``'s dedup set and whatever ``on_kept`` retains): nothing is accumulated.
    ``limit`` stops after that many kept pairs (data.max_train_pairs).
    """
    stats = CleanStats()
    with open(src_out, "w", encoding="utf-8", newline="\n") as fs, \
            open(tgt_out, "w", encoding="utf-8", newline="\n") as ft, \
            tqdm(pairs, desc=desc, total=total, unit=" pairs", unit_scale=True, disable=not progress,
                 leave=False) as bar:
        for src, tgt in bar:
            stats.read += 1
            src, tgt = normalize(src), normalize(tgt)
            if keep is not None and not keep(src, tgt, stats):
                continue
            fs.write(src + "\n")
            ft.write(tgt + "\n")
            stats.kept += 1
            if on_kept is not None:
                on_kept(src, tgt)
            if limit is not None and stats.kept >= limit:
                break
    return stats


def require_some_kept(stats: CleanStats, origin: str, max_words: int, max_length_ratio: float) -> None:
    if stats.kept == 0:
        raise UserError(f"cleaning dropped all {stats.read} training pairs of {origin} "
                        f"({stats.describe(max_words, max_length_ratio)})")
