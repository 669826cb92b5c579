"""Input that arrives while it is translated: a terminal, a pipe, a program that writes a line and waits for its
translation.

``translate`` decodes its input in windows (``decode.buffer_lines``, 2,000 lines) for batching. Taken with
``itertools.islice``, a window of a pipe waited for 2,000 lines or the end of the input: a sentence typed at a terminal,
or written by a program that then waited for the answer, got no translation until the input was closed.
``ArrivingLines`` reads such input on a thread, and ``take_window`` ends a window early when no further line comes
within ``WINDOW_WAIT_S`` of the last: a line on its own is translated at once (as fairseq-interactive with
``--buffer-size 1``), while a pipe that streams lines still fills whole windows. Files are read as before: their
lines are all there.
"""

from __future__ import annotations

import itertools
import queue
import threading
from pathlib import Path
from typing import Iterable, Iterator, Optional

from rpr_mt.errors import UserError
from rpr_mt.lines import count_lines, iter_lines

__all__ = ["ArrivingLines", "WINDOW_WAIT_S", "more_within", "open_input", "take_window"]

# How long a window waits for one more line before it is translated without it: unnoticed at a terminal, and far
# longer than the gap between the lines of a pipe that streams a file.
WINDOW_WAIT_S = 0.05

_END = object()


class ArrivingLines:
    """The lines of ``lines`` (an iterator that may block, as reading stdin does), read ahead on a daemon thread into
    a queue of at most ``capacity`` lines. An error of the reading (bad bytes: a ``UserError``) is raised where it
    was met, after the lines before it."""

    def __init__(self, lines: Iterable[str], capacity: int = 10_000) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=capacity)
        self._head: list[tuple[object, Optional[BaseException]]] = []  # taken off the queue by a wait, not yet given
        threading.Thread(target=self._read, args=(iter(lines),), daemon=True, name="rpr-mt-input").start()

    def _read(self, lines: Iterator[str]) -> None:
        try:
            for line in lines:
                self._queue.put((line, None))
        except BaseException as exc:  # noqa: BLE001 (handed to the reading side, which raises it)
            self._queue.put((_END, exc))
            return
        self._queue.put((_END, None))

    def __iter__(self) -> "ArrivingLines":
        return self

    def __next__(self) -> str:
        item = self._head[0] if self._head else self._queue.get()
        line, error = item
        if line is _END:  # kept: the end (or the error) is given again to every later call
            self._head[:] = [item]
            if error is not None:
                raise error
            raise StopIteration
        self._head.clear()
        return line  # type: ignore[return-value]

    def arrives_within(self, seconds: Optional[float]) -> bool:
        """Whether the next line (or the end of the input) is there, waiting up to ``seconds`` for it (None: until
        it is)."""
        if self._head:
            return True
        try:
            self._head.append(self._queue.get(timeout=seconds))
        except queue.Empty:
            return False
        return True

    def empty(self) -> bool:
        """Whether the input ends before its first line (waits for that line). An error of reading that line (bad
        bytes) is raised here, as it would be by ``next``: before the caller does more (translate loads a model)."""
        self.arrives_within(None)
        line, error = self._head[0]
        if error is not None:
            raise error
        return line is _END


def more_within(lines: Iterator[str], seconds: Optional[float]) -> bool:
    """Whether ``lines`` has its next line (or its end) within ``seconds``: for input read on a thread
    (``ArrivingLines``, or a wrapper that says so by ``arrives_within``) a wait; for others, whose lines are all
    there, True."""
    arrives = getattr(lines, "arrives_within", None)
    return True if arrives is None else arrives(seconds)


def take_window(lines: Iterator[str], size: int) -> list[str]:
    """The next window of ``lines``: up to ``size`` lines, waiting for the first; of arriving input, only the lines
    that come within ``WINDOW_WAIT_S`` of the one before. [] at the end."""
    window: list[str] = []
    for line in lines:
        window.append(line)
        if len(window) >= size or not more_within(lines, WINDOW_WAIT_S):
            break
    return window


def open_input(path: str) -> tuple[Iterator[str], Optional[int]]:
    """Translate's input lines and their number where it is known ahead (a file's, for the progress bar), checked
    before a model loads (which can take a minute): a file is read whole first for bad bytes and its line count, then
    again window by window; stdin or a pipe (``-i <(zcat x.gz)``) can be read once only, so its first line is waited
    for, and bad bytes further on stop the run when they are reached. Its lines are read on a thread
    (``ArrivingLines``), so that a line typed at a terminal, or written by a program that waits for its translation,
    is translated when it is in, not when a window's worth more has come. An empty input is a ``UserError``: a wrong
    file or an empty pipe is said instead of writing nothing."""
    is_file = path != "-" and Path(path).is_file()
    lines: Iterator[str]
    if is_file:
        total: Optional[int] = count_lines(path)
        lines = iter_lines(path)
        first = next(lines, None)
        empty = first is None
        lines = itertools.chain([] if empty else [first], lines)  # type: ignore[list-item]
    else:
        total = None
        lines = ArrivingLines(iter_lines(path))
        empty = lines.empty()
    if empty:
        raise UserError(f"{'stdin' if path == '-' else path}: no lines to translate (empty input)")
    return lines, total
