"""Tests of the scripts under scripts/ and benchmarks/; ``load_script`` imports one as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_script(relative: str) -> ModuleType:
    """The script at ``relative`` (to the repository root, e.g. "scripts/study_positions.py"), imported."""
    spec = importlib.util.spec_from_file_location(Path(relative).stem, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
