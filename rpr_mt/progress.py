"""Whether a command draws a progress bar: the one decision every command makes the same way.

A tqdm bar redraws itself with ``\\r``: on a terminal that is one line, in a pipe or a log file it is hundreds of
frames. So the bar is on where stderr is a terminal, unless ``--progress/--no-progress`` says otherwise.
"""

from __future__ import annotations

import sys
from typing import Optional, TextIO

__all__ = ["show_progress"]


def show_progress(choice: Optional[bool], stream: Optional[TextIO] = None) -> bool:
    """``choice`` (``--progress`` True, ``--no-progress`` False) if given, else whether ``stream`` (default: the
    current ``sys.stderr``, where the bars are drawn) is a terminal."""
    if choice is not None:
        return choice
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
