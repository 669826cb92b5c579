"""The code version a sweep records: commit, and whether the package's files differ from it."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import rpr_mt
from rpr_mt.provenance import code_version

read_version = code_version.__wrapped__  # uncached, so one test can see a file change


def _git(cwd, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_commit_and_dirty_flag(tmp_path):
    package = tmp_path / "rpr_mt"
    package.mkdir()
    (package / "model.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("outside the package\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    commit = _git(tmp_path, "rev-parse", "--short=12", "HEAD")
    assert read_version(package) == f"{rpr_mt.__version__}+{commit}"
    (tmp_path / "notes.txt").write_text("edited outside the package: not the code\n")
    assert read_version(package) == f"{rpr_mt.__version__}+{commit}"
    (package / "model.py").write_text("x = 2\n")
    assert read_version(package) == f"{rpr_mt.__version__}+{commit}.dirty"


def test_outside_a_git_work_tree_it_is_the_package_version(tmp_path):
    assert read_version(tmp_path) == rpr_mt.__version__
