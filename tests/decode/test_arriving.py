"""Input that arrives while it is translated: a window ends when the input pauses, not only after 2,000 lines."""

from __future__ import annotations

import threading
import time

import pytest

from rpr_mt.decode.arriving import ArrivingLines, take_window
from rpr_mt.errors import UserError


def _paused(first: list[str], resume: threading.Event, rest: list[str]):
    """Lines that stop after ``first`` until ``resume`` is set, as a user at a terminal or a program awaiting an
    answer would."""
    yield from first
    assert resume.wait(10)
    yield from rest


def _read_ahead(lines: ArrivingLines, count: int) -> None:
    """Wait until the reader thread has queued ``count`` items: on a loaded machine it may lag the 50 ms a window
    waits, which would make the windows below smaller (as they should be: the lines had not arrived)."""
    deadline = time.monotonic() + 30
    while lines._queue.qsize() < count:
        assert time.monotonic() < deadline, "the reader thread did not read its input"
        time.sleep(0.01)


def test_a_window_of_arriving_lines_ends_when_the_input_pauses():
    resume = threading.Event()
    lines = ArrivingLines(_paused(["a", "b"], resume, ["c"]))
    _read_ahead(lines, 2)
    started = time.monotonic()
    assert take_window(lines, 2000) == ["a", "b"]  # islice waited here until the input ended
    assert time.monotonic() - started < 5
    resume.set()
    assert take_window(lines, 2000) == ["c"]
    assert take_window(lines, 2000) == [] and take_window(lines, 2000) == []


def test_lines_that_stream_fill_whole_windows():
    lines = ArrivingLines(f"line {i}" for i in range(5000))
    _read_ahead(lines, 5001)  # and the end
    windows = [take_window(lines, 2000) for _ in range(4)]
    assert [len(w) for w in windows] == [2000, 2000, 1000, 0]
    assert sum(windows, []) == [f"line {i}" for i in range(5000)]


def test_files_are_windowed_as_before():
    assert take_window(iter(["a", "b", "c"]), 2) == ["a", "b"]


def test_a_reading_error_comes_after_the_lines_before_it():
    def bad_bytes():
        yield "fine"
        raise UserError("stdin: line 2: invalid UTF-8")

    lines = ArrivingLines(bad_bytes())
    assert not lines.empty()
    assert next(lines) == "fine"
    with pytest.raises(UserError, match="line 2"):
        next(lines)
    with pytest.raises(UserError, match="line 2"):  # again, not a silent end
        next(lines)


def test_empty_input_is_said_before_anything_is_read():
    assert ArrivingLines(iter([])).empty()
    lines = ArrivingLines(iter(["x"]))
    assert not lines.empty() and list(lines) == ["x"]


def test_bad_bytes_in_the_first_line_are_said_by_empty():
    """translate asks empty() before it loads the model: bad bytes in the first line were said only after the load."""
    def bad_first():
        raise UserError("stdin: line 1: invalid UTF-8")
        yield  # a generator

    with pytest.raises(UserError, match="line 1"):
        ArrivingLines(bad_first()).empty()
