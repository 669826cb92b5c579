"""The one line reader (rpr_mt.lines): UTF-8 plain or gzip, stdin, ``\\n`` alone ends a line, a ``\\r`` before it and
a byte-order mark opening a line dropped, bad bytes named with their file and line."""

from __future__ import annotations

import gzip
import io
import sys

import pytest

from rpr_mt.data import sources
from rpr_mt.errors import UserError
from rpr_mt.lines import iter_lines, read_lines


def test_read_lines_plain_gz_and_crlf(tmp_path) -> None:
    plain = tmp_path / "x.txt"
    plain.write_bytes("\ufeffeins\r\nzwei\n\ndrei\n\ufeffvier".encode("utf-8"))  # (the second file's mark, joined by cat)
    assert read_lines(plain) == ["eins", "zwei", "", "drei", "vier"]
    packed = tmp_path / "x.txt.gz"
    with gzip.open(packed, "wb") as f:
        f.write("Grüße\nü\n".encode("utf-8"))
    assert read_lines(packed) == ["Grüße", "ü"]


def test_read_lines_reports_invalid_utf8_with_line_number(tmp_path) -> None:
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"fine\nalso fine\nbroken \xff here\n")
    with pytest.raises(UserError, match=r"bad\.en: line 3: invalid UTF-8"):
        read_lines(bad)


def test_read_lines_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    """stdin is named as the empty-input error names it ("-: line 2" before)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ok\n\xc3\n")))
    with pytest.raises(UserError, match=r"^stdin: line 2: invalid UTF-8"):
        read_lines("-")


def test_read_lines_missing_file(tmp_path) -> None:
    with pytest.raises(UserError, match="file not found"):
        read_lines(tmp_path / "nope.txt")


def test_read_lines_corrupt_gzip_is_a_user_error(tmp_path) -> None:
    packed = tmp_path / "x.de.gz"
    with gzip.open(packed, "wb") as f:
        f.write(("ein Satz\n" * 200).encode())
    data = bytearray(packed.read_bytes())
    data[30:40] = b"\x00" * 10  # damage the deflate stream itself (not only the trailer)
    packed.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"x\.de\.gz: cannot read"):
        read_lines(packed)
    packed.write_bytes(bytes(data[: len(data) // 2]))  # truncated
    with pytest.raises(UserError, match=r"x\.de\.gz: cannot read"):
        read_lines(packed)


def test_iter_lines_reads_as_it_goes_and_agrees_with_read_lines(tmp_path) -> None:
    plain = tmp_path / "x.txt"
    plain.write_bytes("\ufeffeins\r\nzwei\n\ndrei".encode("utf-8"))
    assert list(iter_lines(plain)) == read_lines(plain) == ["eins", "zwei", "", "drei"]
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"fine\nalso fine\nbroken \xff here\n")
    lines = iter_lines(bad)
    assert next(lines) == "fine"  # given before the bad line is read
    with pytest.raises(UserError, match=r"bad\.en: line 3: invalid UTF-8"):
        list(lines)


def test_the_rule_is_the_same_for_translate_and_for_prepare(tmp_path) -> None:
    """One rule for every reader: prepare's local corpora (rpr_mt.data.sources) and translate's input read a file of
    CRLF lines, byte-order marks (its own, one opening a line joined with cat, one inside a line), a \\u2028 and a
    \\r inside a line as the same lines."""
    path = tmp_path / "mixed.en"
    path.write_bytes("\ufeffeins\r\nzw\rei\r\n\ufeffdrei\nvi\ufeffer \u2028 f\u00fcnf\n\nlast".encode("utf-8"))
    expected = ["eins", "zw\rei", "drei", "vi\ufeffer \u2028 f\u00fcnf", "", "last"]
    assert read_lines(path) == list(sources.read_lines(path)) == expected
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"fine\n\xff\n")
    for reader in (read_lines, lambda p: list(sources.read_lines(p))):
        with pytest.raises(UserError, match=r"^.*bad\.en: line 2: invalid UTF-8"):
            reader(bad)
