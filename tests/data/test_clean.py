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
