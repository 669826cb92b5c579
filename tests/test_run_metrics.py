"""The shared metrics.jsonl reader: a cut-off last line (a killed run) is skipped with one warning; a bad line before
the last is corruption, named by file and line."""

from __future__ import annotations

import logging

import pytest

from rpr_mt.errors import UserError
from rpr_mt.run_metrics import read_records

WHOLE = b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'


@pytest.mark.parametrize("tail", [b'{"step": 3, "lo', b'{"step": 3, "loss": 1.', b'{"step": 3, "loss": 1.2}\n\x00\x00'])
def test_cut_off_last_line_is_skipped_with_one_warning(tmp_path, caplog, tail):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(WHOLE + tail)
    with caplog.at_level(logging.WARNING):
        records = read_records(path)
    assert [r["step"] for r in records] == [1, 2] + ([3] if tail.startswith(b'{"step": 3, "loss": 1.2}') else [])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"{path}: line " in warnings[0] and "cut off" in warnings[0]


def test_whole_file_reads_without_a_warning(tmp_path, caplog):
    (tmp_path / "metrics.jsonl").write_bytes(WHOLE + b"\n")
    with caplog.at_level(logging.WARNING):
        assert [r["step"] for r in read_records(tmp_path / "metrics.jsonl")] == [1, 2]
    assert not caplog.records


@pytest.mark.parametrize("middle, message", [(b'{"step": 2, "lo\n', "line 2 is not a metrics record"),
                                             (b'{"step": "\xff"}\n', "line 2: invalid UTF-8"),
                                             (b'{"loss": 1.0}\n', "line 2 is not a metrics record")])
def test_bad_line_before_the_last_is_corruption(tmp_path, middle, message):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n' + middle + b'{"step": 3, "loss": 1.0}\n')
    with pytest.raises(UserError, match=f"metrics.jsonl: {message}"):
        read_records(path)
