"""The one error type users see.

Anything raised as ``UserError`` is a problem with the user's input (a config key, a file, a checkpoint), not a
bug: the CLI prints its message on one line of stderr and exits with code 2, without a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path


class UserError(Exception):
    """A problem with the user's input, reported as one line and exit code 2."""

    exit_code = 2


def check_creatable_directory(path: str | Path, option: str) -> None:
    """A UserError naming ``option`` unless ``path`` is a directory or one that can be made (its nearest existing
    ancestor is a writable directory); nothing is created. For outputs made only after long work, so that a path under
    a file or in a read-only place is said before the work, not as a traceback after it."""
    target = Path(path).absolute()
    if target.exists():
        if not target.is_dir():
            raise UserError(f"{option} {path} is a file; give a directory")
        return
    above = next(p for p in target.parents if p.exists())
    if not above.is_dir():
        raise UserError(f"{option} {path}: cannot create the directory ({above} is a file)")
    if not os.access(above, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: cannot create the directory (Permission denied: {above})")

