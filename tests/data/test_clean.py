"""Cleaning rules: train is filtered (and counted per rule), dev/test only stripped."""

from __future__ import annotations

import pytest

from rpr_mt.data.clean import CleanStats, TrainFilter, normalize, require_some_kept, write_clean_split
from rpr_mt.errors import UserError


def test_normalize_strips_and_flattens_line_breaks():
    assert normalize("  hello world \t") == "hello world"
    assert normalize("a\rb\u2028c\x0bd") == "a b c d"
    assert normalize("   ") == ""


def test_normalize_drops_byte_order_marks_inside_a_file():
    """Files joined with cat put each one's byte-order mark at the head of a line in the middle: left in, the line's
    first word was a piece seen nowhere else (read_lines drops only the file's own first one)."""
    assert normalize("\ufeffa dog runs") == "a dog runs"
    assert normalize("the \ufeffcat") == "the cat"


def test_train_rules_are_counted_separately(tmp_path):
    pairs = [
        ("a b c", "x y z"),            # kept
        ("  ", "x"),                   # empty source
        ("a", ""),                     # empty target
        ("w " * 6, "x"),               # 6 words > max_words=5
        ("a b c d", "x"),              # ratio 4 > 3
        ("a b c", "x y z"),            # duplicate of the first
        ("  a b c ", " x y z"),        # duplicate after stripping
        ("a b", "x y z w"),            # ratio 2: kept
    ]
    stats = write_clean_split(pairs, tmp_path / "s", tmp_path / "t", keep=TrainFilter(5, 3.0, dedup=True),
                              progress=False)
    assert (stats.read, stats.kept) == (8, 2)
    assert stats.dropped == {"empty": 2, "too_long": 1, "length_ratio": 1, "duplicate": 2}
    assert (tmp_path / "s").read_text() == "a b c\na b\n"
    assert (tmp_path / "t").read_text() == "x y z\nx y z w\n"


def test_duplicates_are_kept_without_dedup(tmp_path):
    stats = write_clean_split([("a", "b")] * 3, tmp_path / "s", tmp_path / "t",
                              keep=TrainFilter(10, 3.0, dedup=False), progress=False)
    assert stats.kept == 3


def test_eval_splits_keep_every_line(tmp_path):
    pairs = [(" a ", "b "), ("", ""), ("one two three four five six seven", "x"), ("c", "")]
    stats = write_clean_split(pairs, tmp_path / "s", tmp_path / "t", keep=None, progress=False)
    assert stats.kept == stats.read == 4
    assert (tmp_path / "s").read_text().split("\n") == ["a", "", "one two three four five six seven", "c", ""]
    assert (tmp_path / "t").read_text().split("\n") == ["b", "", "x", "", ""]


def test_limit_stops_reading_early(tmp_path):
    read = []

    def endless():
        i = 0
        while True:
            read.append(i)
            yield f"s {i}", f"t {i}"
            i += 1

    stats = write_clean_split(endless(), tmp_path / "s", tmp_path / "t", keep=TrainFilter(10, 3.0, False),
                              limit=5, progress=False)
    assert stats.kept == 5 and len(read) == 5


def test_everything_dropped_is_a_user_error():
    stats = CleanStats(read=3, kept=0, empty=1, too_long=2)
    with pytest.raises(UserError, match=r"dropped all 3 training pairs of corpus.txt \(empty 1, longer than "
                                        r"data.max_words=5 2"):
        require_some_kept(stats, "corpus.txt", 5, 3.0)


def _reference_dedup(pairs, max_words, ratio, limit=None):
    """The rules as one Python set of the kept pairs would apply them: the first occurrence is kept."""
    seen, kept, counts = set(), [], dict(read=0, empty=0, too_long=0, length_ratio=0, duplicate=0)
    for src, tgt in pairs:
        counts["read"] += 1
        src, tgt = normalize(src), normalize(tgt)
        ns, nt = len(src.split()), len(tgt.split())
        if not src or not tgt:
            counts["empty"] += 1
        elif ns > max_words or nt > max_words:
            counts["too_long"] += 1
        elif max(ns, nt) > ratio * min(ns, nt):
            counts["length_ratio"] += 1
        elif (src, tgt) in seen:
            counts["duplicate"] += 1
        else:
            seen.add((src, tgt))
            kept.append((src, tgt))
            if limit is not None and len(kept) >= limit:
                break
    return kept, counts


@pytest.mark.parametrize("limit", [None, 1, 333, 2500])
@pytest.mark.parametrize("batch", [1, 7, 8192])
def test_dedup_keeps_the_first_of_each_pair_as_a_set_would(tmp_path, monkeypatch, limit, batch):
    """Batched lookups in sorted runs keep the same pairs, in the same order, with the same counts (a limit stops
    the counts at the pair that reached it, whatever the batch), across batch boundaries and run merges."""
    import random

    from rpr_mt.data import clean

    monkeypatch.setattr(clean, "_DEDUP_BATCH", batch)
    rng = random.Random(batch)
    words = ["a", "b", "c", "d", " ", ""]
    pairs = [(" ".join(rng.choices(words, k=rng.randint(0, 4))), " ".join(rng.choices(words, k=rng.randint(0, 4))))
             for _ in range(4000)]
    kept, counts = _reference_dedup(pairs, 3, 2.0, limit)
    stats = write_clean_split(pairs, tmp_path / "s", tmp_path / "t", keep=TrainFilter(3, 2.0, dedup=True),
                              limit=limit, progress=False)
    written = list(zip((tmp_path / "s").read_text().splitlines(), (tmp_path / "t").read_text().splitlines()))
    assert written == kept and stats.kept == len(kept)
    assert {"read": stats.read, **stats.dropped} == counts
    if limit is None:
        assert counts["duplicate"] > 500 and counts["empty"] > 0  # the case is one of many duplicates


def test_seen_hashes_is_an_exact_set_in_few_sorted_runs():
    import numpy as np

    from rpr_mt.data.clean import SeenHashes

    rng = np.random.default_rng(0)
    seen, reference = SeenHashes(), set()
    for _ in range(300):
        keys = rng.integers(0, 50_000, size=int(rng.integers(1, 400)), dtype=np.uint64)
        expected = []
        for key in keys.tolist():
            expected.append(key not in reference)
            reference.add(key)
        assert seen.first_seen(keys).tolist() == expected
    assert len(seen) == len(reference) and len(seen.runs) <= 2 * np.log2(len(reference))
    assert all(np.all(run[1:] > run[:-1]) for run in seen.runs)  # sorted, no key twice


def test_normalize_equals_translating_every_character():
    """The search that skips str.translate for most texts changes no result."""
    import random

    from rpr_mt.data.clean import _LINE_BREAKS

    rng = random.Random(3)
    alphabet = ["a", "ä", " ", "\t", "\u00a0", "漢"] + [chr(c) for c in _LINE_BREAKS]
    for _ in range(3000):
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 12)))
        assert normalize(text) == text.translate(_LINE_BREAKS).strip(), repr(text)
