"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The shared data lives beside the checkout (../shared), wherever the checkout is (CI clones it afresh).
MULTI30K_DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"
MULTI30K_FILES = [f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("en", "de", "fr")]


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The local Multi30k copy (override with RPR_MT_MULTI30K_DIR). Missing data FAILS the test: it must not pass
    silently on a machine without the shared data."""
    path = Path(os.environ.get("RPR_MT_MULTI30K_DIR", MULTI30K_DEFAULT))
    missing = [name for name in MULTI30K_FILES if not (path / name).is_file()]
    if missing:
        pytest.fail(f"shared Multi30k data is missing: {path} lacks {', '.join(missing)} "
                    "(it is expected in ../shared beside the checkout; or set RPR_MT_MULTI30K_DIR)")
    return path


@pytest.fixture(autouse=True)
def single_thread_torch():
    """One intra-op thread per test: tiny tensors gain nothing from two, and on a loaded 2-core machine threads
    waiting for a free core made small tests 100x slower."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
