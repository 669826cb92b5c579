"""The one reader of text lines from files: translate's and eval-bleu's input, prepare's local corpora, the
experiments' references.

The rule, for every reader of a text file:

* UTF-8, plain or gzip (read as gzip when the name ends in ``.gz``; other compressions, and gzip under another name,
  are refused with what they are, ``refuse_unnamed_gzip``); ``-`` is stdin, read as it arrives.
* Lines end at ``\\n`` only, so line numbers agree with ``wc -l`` and ``\\u2028`` or ``\\x0c`` never split a line (nor
  break two files' alignment); a last line without ``\\n`` is a line.
* A ``\\r`` before the ``\\n`` is dropped (a file written on Windows); a ``\\r`` elsewhere is text.
* A byte-order mark opening a line is dropped: the file's own, and those of files joined with ``cat``; a U+FEFF inside
  a line is text (a zero-width no-break space).
* Invalid UTF-8 is a ``UserError`` naming the file (``stdin``) and its 1-based line: ``NAME: line N: invalid UTF-8``;
  an unreadable or corrupt file, one naming the file and the last line read.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import sys
import zlib
from pathlib import Path
from typing import Iterable, Iterator, Union

from rpr_mt.errors import UserError

__all__ = ["count_lines", "iter_lines", "read_lines", "refuse_unnamed_gzip"]

_BOM = "\ufeff"

GZIP_MAGIC = b"\x1f\x8b"
# Other compressions' first bytes, with the tool that undoes them: only gzip is read, and their bytes read as text
# give "invalid UTF-8" at some line, which says nothing of the cause.
# bzip2's "BZh" is ASCII, so its block size digit and first block's (or, empty, its end's) magic must follow.
OTHER_COMPRESSIONS = ((re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)", re.DOTALL), "bzip2", "bunzip2"),
                      (re.compile(rb"\xfd7zXZ\x00"), "xz", "unxz"), (re.compile(rb"\x28\xb5\x2f\xfd"), "zstd", "unzstd"),
                      (re.compile(rb"PK\x03\x04"), "a zip archive", "unzip"))  # OPUS's downloads


def refuse_unnamed_gzip(path: Path) -> None:
    """A compressed file that would be read as text (compressed bytes: a wrong line count, or invalid UTF-8 at a
    line that means nothing to the user): say what it is. A gzip file is read when its name ends in .gz; bzip2, xz
    and zstd are not read at all. Text never starts with these bytes."""
    if path.suffix == ".gz" or not path.is_file():
        return
    with open(path, "rb") as handle:
        head = handle.read(10)
    if head.startswith(GZIP_MAGIC):
        raise UserError(f"{path} is gzip-compressed but its name does not end in .gz: rename it {path.name}.gz "
                        "(or decompress it)")
    for magic, kind, tool in OTHER_COMPRESSIONS:
        if magic.match(head):
            if path.suffix in (".pt", ".pth"):  # torch.save writes a zip archive
                raise UserError(f"{path} is a PyTorch checkpoint, not text: give the text file")
            what = kind if kind.startswith("a ") else f"{kind}-compressed"
            raise UserError(f"{path} is {what}: rpr-mt reads plain text or gzip (.gz); {tool} {path.name} and give "
                            "it the text file")


def read_lines(path: Union[str, Path]) -> list[str]:
    """The lines of a text file (``-`` = stdin) under the module's rule, without their line terminators."""
    return list(iter_lines(path))


def iter_lines(path: Union[str, Path]) -> Iterator[str]:
    """``read_lines`` as a generator: each line as soon as it is read, so a pipe is translated as it arrives and
    a long file is never held whole. Errors (a missing file, bad bytes) come when the reading reaches them."""
    name = str(path)
    shown = "stdin" if name == "-" else name
    number = 0
    try:
        if name == "-":
            handle = _stdin_lines()
        elif name.endswith(".gz"):
            handle = gzip.open(name, "rb")
        else:
            refuse_unnamed_gzip(Path(name))
            handle = open(name, "rb")
        with contextlib.nullcontext(handle) if name == "-" else handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    line = raw.removesuffix(b"\n").removesuffix(b"\r").decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise UserError(f"{shown}: line {number}: invalid UTF-8 ({exc.reason} at byte {exc.start})") \
                        from None
                yield line.removeprefix(_BOM)
    except FileNotFoundError:
        raise UserError(f"{shown}: file not found") from None
    except (OSError, EOFError, zlib.error) as exc:  # unreadable, or a truncated or corrupt .gz
        where = f" after line {number}" if number else ""
        raise UserError(f"{shown}: cannot read{where} ({exc})") from None


def count_lines(path: Union[str, Path]) -> int:
    """The number of lines ``iter_lines(path)`` gives, every line decoded: a file is checked whole (bad bytes
    named with their line) and counted, without holding it."""
    return sum(1 for _ in iter_lines(path))


def _stdin_lines() -> Iterable[bytes]:
    """stdin's lines (each with its ``\\n``), each as soon as it arrives. Read from its file descriptor with
    ``os.read``, not through ``sys.stdin.buffer``: translate reads stdin on a thread (``ArrivingLines``), and a thread
    still blocked in the buffered reader when the program ends (an error, Ctrl-C) holds the lock that Python's
    shutdown takes to close stdin ("Fatal Python error: could not acquire lock for <stdin>", exit 134). A stdin
    without a file descriptor (a test runner's) is read through its buffer."""
    if sys.stdin is None:  # `rpr-mt translate <&-`: Python leaves sys.stdin None when descriptor 0 is closed
        raise UserError("stdin is closed: nothing to read (give the input with --input FILE)")
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return sys.stdin.buffer
    return _fd_lines(fd)


def _fd_lines(fd: int) -> Iterator[bytes]:
    pending = b""
    while chunk := os.read(fd, 1 << 16):  # returns what has arrived, without waiting for 64 KiB
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line + b"\n"
    if pending:
        yield pending
