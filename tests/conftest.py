"""Shared test fixtures (data only)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

MULTI30K_DEFAULT = "/work/shared/data/multi30k"
MULTI30K_FILES = [f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("en", "de", "fr")]


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The local Multi30k copy (override with RPR_MT_MULTI30K_DIR). Missing data FAILS the test: it must not pass
    silently on a machine without the shared data."""
    path = Path(os.environ.get("RPR_MT_MULTI30K_DIR", MULTI30K_DEFAULT))
    missing = [name for name in MULTI30K_FILES if not (path / name).is_file()]
    if missing:
        pytest.fail(f"shared Multi30k data is missing: {path} lacks {', '.join(missing)} "
                    "(see /work/shared/data/multi30k/README.md, or set RPR_MT_MULTI30K_DIR)")
    return path
