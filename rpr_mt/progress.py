"""Whether a command draws a progress bar: the one decision every command makes the same way; and terminal output
that a long job survives losing.

A tqdm bar redraws itself with ``\\r``: on a terminal that is one line, in a pipe or a log file it is hundreds of
frames. So the bar is on where stderr is a terminal, unless ``--progress/--no-progress`` says otherwise.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator, Optional, TextIO

__all__ = ["StreamThatOutlivesItsReader", "outlive_readers", "show_progress"]


def show_progress(choice: Optional[bool], stream: Optional[TextIO] = None) -> bool:
    """``choice`` (``--progress`` True, ``--no-progress`` False) if given, else whether ``stream`` (default: the
    current ``sys.stderr``, where the bars are drawn) is a terminal."""
    if choice is not None:
        return choice
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class StreamThatOutlivesItsReader:
    """A text stream that drops its output once writing fails (the reader of a pipe gone: ``rpr-mt train ... 2>&1 |
    head``, a closed ssh session) instead of raising BrokenPipeError into the job, which would end a training run
    between checkpoints. Everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self.stream.write(text)
            except OSError:  # BrokenPipeError, EIO from a hung-up terminal
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except OSError:
                self.broken = True

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextlib.contextmanager
def outlive_readers() -> Iterator[None]:
    """sys.stdout and sys.stderr as ``StreamThatOutlivesItsReader`` while a long job runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = StreamThatOutlivesItsReader(saved[0]), StreamThatOutlivesItsReader(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
