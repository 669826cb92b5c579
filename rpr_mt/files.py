"""Files a command reads and writes, made safe: every input and output checked before any work (a wrong path is said
at once, not after a model took a minute to load), an output never allowed to replace the command's own inputs, a
checkpoint or the records of a run or of prepared data, and written atomically (a temporary renamed into place; what an
interrupted run finished is kept in ``PATH.partial``).

The CLI's commands and the experiment scripts (rpr_mt.experiments, scripts/) write through these, so each rule holds
in one place.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, TextIO, Union

from rpr_mt.errors import UserError
from rpr_mt.host import give_new_file_mode

__all__ = ["RUN_RECORDS", "check_input", "check_output", "write_json", "write_lines"]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def check_input(path: str, option: str) -> None:
    """Before any work, in this order: an input file must exist, not be a directory (a pipe such as ``-i <(zcat
    x.gz)`` is fine) and be readable (``-`` is stdin). The message names the option and the path, so a wrong path
    is not reported as something else (a language the name does not tell, after a model took a minute to load)."""
    if path == "-":
        return
    if not path:  # Path("") is ".", which would be reported as a directory
        raise UserError(f"{option}: an empty path; give a file name (or - for stdin)")
    target = Path(path)
    if not target.exists():
        raise UserError(f"{option} {path}: file not found")
    if target.is_dir():
        raise UserError(f"{option} {path} is a directory; give a text file")
    if not os.access(target, os.R_OK):
        raise UserError(f"{option} {path}: not readable (permission denied)")


def check_output(path: str, option: str, inputs: Iterable[Union[str, Path]] = (), text: bool = True) -> None:
    """Before any work: an output file's directory must exist and be writable, and the path must not be a directory
    (a failed write after decoding would lose the translations). Nor may the output replace one of the command's
    ``inputs`` or, for a ``text`` output, a checkpoint (``*.pt``): a typo must not destroy the source text, the
    references or a model. A symlink is checked as the file it points to, and a device or FIFO (``/dev/null``, a
    named pipe) only for being writable itself: ``write_lines`` writes through them, nothing beside them."""
    if not path:  # Path("") is ".", a directory: the message would name neither the option's value nor its problem
        raise UserError(f"{option}: an empty path; give a file name (or - for stdout)")
    if path == "-":
        return
    target = Path(path)
    if target.is_dir():
        raise UserError(f"{option} {path} is a directory; give a file name")
    if _written_through(target):
        if not os.access(target, os.W_OK):
            raise UserError(f"{option} {path}: not writable")
        return
    target = _link_target(target)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{option} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UserError(f"{option} {path}: not writable")
    if target.is_file():
        if any(str(source) != "-" and Path(source).is_file() and target.samefile(source) for source in inputs):
            raise UserError(f"{option} {path} is also an input of this command; writing it would destroy that "
                            "input: give another file name")
        if text and target.suffix == ".pt":
            raise UserError(f"{option} {path} is a checkpoint; text is never written over one: give another file name")
        record = _record_of_a_run_or_data(target)  # (nor a checkpoint over one: average-checkpoints -o metrics.jsonl)
        if record:
            raise UserError(f"{option} {path} is {record}; it is never written over: give another file name")


# What a run directory (one with checkpoints/) keeps of its run: the trainer's config and learning curves, the sweep's
# result and invocations. Translations written over metrics.jsonl took the run's curves (plot: "no records yet").
RUN_RECORDS = ("config.yaml", "metrics.jsonl", "invocations.jsonl", "result.json")


def _record_of_a_run_or_data(target: Path) -> str:
    """What the existing file ``target`` is, if it is a run's record or a file that prepare wrote; else ""."""
    from rpr_mt.data.prepare import written_by_prepare

    folder = target.parent
    if target.name in RUN_RECORDS and (folder / "checkpoints").is_dir():
        return f"the {target.name} of the run in {folder}"
    if written_by_prepare(target):
        return f"a file of the prepared data in {folder}"
    return ""


def _written_through(target: Path) -> bool:
    """Whether an output is written in place rather than through a temporary renamed over it: an existing target
    (links followed) that is not a regular file, such as a device (/dev/null), a FIFO or a socket, which a rename
    would replace by a regular file; and the paths of streams already open, /dev/stdout, /dev/fd/N and
    /proc/self/fd/N, which may lead to a regular file that a rename would take away from that stream."""
    absolute = os.path.abspath(target)
    if absolute.startswith(("/dev/std", "/dev/fd/", "/proc/")):
        return True
    return target.exists() and not target.is_file() and not target.is_dir()


def _link_target(target: Path) -> Path:
    """The file a symlink leads to (through every link; it may not exist yet), else ``target``: the file that is
    written, with its temporary beside it, while the link stays."""
    return target.resolve() if target.is_symlink() else target


def _text_writer(raw: BinaryIO, target: Path) -> TextIO:
    """UTF-8 text into ``raw``, gzip-compressed when ``target`` is named .gz. gzip's header keeps a file name (what
    ``gunzip -N`` restores): the target's, not the name of the temporary file that ``raw`` writes."""
    if target.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.GzipFile(filename=target.name, mode="wb", fileobj=raw), encoding="utf-8")
    return io.TextIOWrapper(raw, encoding="utf-8")  # type: ignore[arg-type]


def write_lines(path: str, lines: Iterable[str], report: Callable[[str], None] = _say) -> None:
    """Write ``lines`` as they come (a generator's translations, window by window): to stdout, flushed as they come;
    to a file through a temporary beside it, moved into place when complete, so an existing file is never left
    half-written. If the lines stop with an error or an interrupt, those written so far are kept in
    ``PATH.partial`` (said on stderr) and the error goes on; once ``PATH`` is complete, a ``PATH.partial`` left by an
    earlier interrupted run is removed (said on stderr). A symlink is followed (the file it points to is written,
    the link stays); a device, FIFO or open stream (``_written_through``) is written in place, flushed as stdout is.
    ``report``: where those two notes go (default: stderr).
    """
    # a .gz name is gzip, as it is for the inputs (rpr_mt.lines)
    opener = gzip.open if path.endswith(".gz") else open
    if path == "-" or _written_through(Path(path)):
        # appending, not truncating: /dev/stdout led to a file the shell opened (`>> log` must stay appended to)
        handle = sys.stdout if path == "-" else opener(path, "at", encoding="utf-8")
        try:
            for line in lines:
                handle.write(line + "\n")
                if opener is open:  # a pipe is block-buffered: a reader sees each window when it is done
                    handle.flush()
        finally:
            if handle is not sys.stdout:
                handle.close()
        return

    target = _link_target(Path(path))
    tmp = target.with_name(f".{target.name}.tmp")
    written = 0
    try:
        with open(tmp, "wb") as raw, _text_writer(raw, target) as handle:
            for line in lines:
                handle.write(line + "\n")
                written += 1
    except BaseException:
        if written:
            partial = target.with_name(f"{target.name}.partial")
            tmp.replace(partial)
            report(f"stopped: the {written:,} output lines written so far are in {partial}")
        else:
            tmp.unlink(missing_ok=True)
        raise
    tmp.replace(target)
    # the complete file supersedes an earlier run's finished lines: left beside it, they look like this run's
    stale = target.with_name(f"{target.name}.partial")
    if stale.is_file():
        stale.unlink()
        report(f"note: removed {stale}, left by an earlier interrupted run; {target} is complete")


def write_json(path: Union[str, Path], value: Any) -> None:
    """``value`` as indented JSON, written whole to a temporary of this writer's own beside ``path`` (mkstemp: two
    writers never share one), then renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            give_new_file_mode(handle.fileno())  # mkstemp's 0o600 would hide the file from others
            handle.write(json.dumps(value, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

