"""One progress-bar decision for every command: the option if given, else whether stderr is a terminal."""

from __future__ import annotations

import io
import sys

from rpr_mt.progress import show_progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_option_wins_and_a_terminal_decides_otherwise(monkeypatch):
    assert show_progress(None, _Terminal()) is True
    assert show_progress(None, io.StringIO()) is False  # a pipe or a log file: no \r frames
    assert show_progress(False, _Terminal()) is False and show_progress(True, io.StringIO()) is True
    monkeypatch.setattr(sys, "stderr", _Terminal())  # the default is the stderr of the moment, where bars go
    assert show_progress(None) is True
