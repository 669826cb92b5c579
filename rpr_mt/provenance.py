"""Which code a run was trained with: the package version and, in a git checkout, the commit and whether the
package's own files differ from it.

A sweep runs for hours and is stopped and resumed; a run whose invocations used different or uncommitted code is
not comparable with the others, so the sweep records this with every invocation and the aggregator flags such runs.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import rpr_mt


@functools.cache
def code_version(package_dir: Path | None = None) -> str:
    """``"0.1.0+<commit>"``, with ``".dirty"`` when ``rpr_mt/`` differs from that commit; just the version when the
    package is not in a git work tree (an installed wheel) or git is missing.

    Read once per process: Python imports a module once, so later edits to the files do not change the code that
    runs. Call it before importing the modules it should describe.
    """
    package_dir = package_dir or Path(rpr_mt.__file__).resolve().parent
    try:
        commit = _git(package_dir, "rev-parse", "--short=12", "HEAD")
        changed = _git(package_dir, "status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return rpr_mt.__version__
    return f"{rpr_mt.__version__}+{commit}" + (".dirty" if changed else "")


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.strip()
