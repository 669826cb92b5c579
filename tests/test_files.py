"""Files a command writes (rpr_mt.files): outputs checked before any work, never over the command's inputs or the
records of prepared data, written atomically, through symlinks, FIFOs and devices as a shell would."""

from __future__ import annotations

import gzip
import os

import pytest

from rpr_mt.errors import UserError
from rpr_mt.files import check_output, write_json, write_lines
from rpr_mt.lines import read_lines


def test_an_output_beside_prepared_data_may_be_written_again(tmp_path):
    """Only the files prepare wrote are refused: translations written into a data directory once (test.hyp) were
    refused the second time, and so was every file of any folder holding some manifest.json."""
    (tmp_path / "manifest.json").write_text('{"files": ["test.de"]}', encoding="utf-8")
    for name in ("test.de", "test.hyp"):
        (tmp_path / name).write_text("x\n", encoding="utf-8")
    check_output(str(tmp_path / "test.hyp"), "-o")
    with pytest.raises(UserError, match="test.de is a file of the prepared data in"):
        check_output(str(tmp_path / "test.de"), "-o")


def test_an_output_named_gz_is_gzip_like_an_input_named_gz(tmp_path):
    write_lines(str(tmp_path / "out.de.gz"), ["eins", "zwei"])
    write_lines(str(tmp_path / "out.de"), ["eins", "zwei"])
    with gzip.open(tmp_path / "out.de.gz", "rt", encoding="utf-8") as handle:
        assert handle.read() == "eins\nzwei\n"
    assert (tmp_path / "out.de").read_text(encoding="utf-8") == "eins\nzwei\n"
    assert read_lines(tmp_path / "out.de.gz") == ["eins", "zwei"]
    # the name gzip keeps in its header (FNAME, after the 10-byte header) is the output's, not its temporary's
    header = (tmp_path / "out.de.gz").read_bytes()
    assert header[3] & 0x08 and header[10:].split(b"\0")[0] == b"out.de"


# -- outputs that are not regular files: a symlink is followed, a FIFO or device is written through -----------------


def test_an_output_symlink_is_followed_and_stays_a_link(tmp_path):
    """`-o link` writes the file the link points to (atomically, beside that file), as `> link` would; replacing
    the link with a regular file lost the output to where the user looked."""
    (tmp_path / "real").mkdir()
    target, link = tmp_path / "real" / "t.txt", tmp_path / "link.txt"
    target.write_text("old\n", encoding="utf-8")
    link.symlink_to(target)
    check_output(str(link), "--output")
    write_lines(str(link), ["eins", "zwei"])
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "eins\nzwei\n"
    dangling = tmp_path / "dangling.txt"  # to a file not there yet: created, as the shell would
    dangling.symlink_to(tmp_path / "real" / "new.txt")
    write_lines(str(dangling), ["drei"])
    assert dangling.is_symlink() and (tmp_path / "real" / "new.txt").read_text(encoding="utf-8") == "drei\n"

    def stopped():
        yield "vier"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # the finished lines are kept beside the file they were meant for
        write_lines(str(link), stopped())
    assert (tmp_path / "real" / "t.txt.partial").read_text(encoding="utf-8") == "vier\n"
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "eins\nzwei\n"
    assert not list(tmp_path.rglob(".*.tmp"))


def test_an_output_fifo_is_written_through_and_stays_a_fifo(tmp_path):
    """`-o fifo` with a reader on the other end: the lines go into the pipe; a temporary renamed over the FIFO left
    the reader waiting for ever and a regular file in its place."""
    import stat
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text(encoding="utf-8")), daemon=True)
    reader.start()
    check_output(str(fifo), "--output")
    write_lines(str(fifo), ["eins", "zwei"])
    reader.join(timeout=30)
    assert received == ["eins\nzwei\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]  # no temporary, no .partial


def test_write_json_replaces_the_file_whole_with_a_new_files_mode(tmp_path):
    """The experiments' result.json and plans are written through this: the old content stays until the new one is
    complete, no temporary is left, and the file is readable by others as a file ``open`` makes (not mkstemp's
    0o600)."""
    path = tmp_path / "nested" / "result.json"
    write_json(path, {"a": 1})
    write_json(path, {"b": [1, 2]})
    assert path.read_text(encoding="utf-8") == '{\n  "b": [\n    1,\n    2\n  ]\n}\n'
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(p.name for p in path.parent.iterdir()) == ["result.json"]

    class Unwritable:
        pass

    with pytest.raises(TypeError):  # a value that fails halfway: the file keeps its content, no temporary is left
        write_json(path, {"c": Unwritable()})
    assert '"b"' in path.read_text(encoding="utf-8")
    assert sorted(p.name for p in path.parent.iterdir()) == ["result.json"]
