"""Shared test fixtures."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

# The shared data lives beside the checkout (../shared), wherever the checkout is (CI clones it afresh).
MULTI30K_DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"
MULTI30K_FILES = [f"{tok}{split}.{lang}.gz" for tok in ("", "tok/") for split in ("train", "val", "test_2016_flickr")
                  for lang in ("en", "de", "fr")]  # raw, and the dataset's lowercased, normalized, tokenized text


def multi30k_or_skip(env: Mapping[str, str], default: Path = MULTI30K_DEFAULT) -> Path:
    """The Multi30k directory ($RPR_MT_MULTI30K_DIR, else ``default``) if it holds every file the tests read.

    Otherwise the test is skipped with the reason, so that a fresh clone without ../shared passes and says what it
    did not test; under CI (CI=true) the corpus is part of the set-up, and its absence fails the test instead.
    """
    path = Path(env.get("RPR_MT_MULTI30K_DIR") or default)
    missing = [name for name in MULTI30K_FILES if not (path / name).is_file()]
    if not missing:
        return path
    reason = (f"the Multi30k corpus is not in {path} (missing {', '.join(missing[:3])}"
              f"{', ...' if len(missing) > 3 else ''}): put it in ../shared/data/multi30k beside the checkout "
              "or set RPR_MT_MULTI30K_DIR")
    if env.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"{reason} (CI=true: the corpus is required there)", pytrace=False)
    pytest.skip(reason)


# The committed Multi30k configs name no directory (prepare then downloads the dataset): a test that prepares one
# reads the copy beside the checkout instead, when it is complete, as .ci/run does. Tests of the download unset it.
if not os.environ.get("RPR_MT_MULTI30K_DIR") and all((MULTI30K_DEFAULT / name).is_file() for name in MULTI30K_FILES):
    os.environ["RPR_MT_MULTI30K_DIR"] = str(MULTI30K_DEFAULT)


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The local Multi30k copy; see ``multi30k_or_skip``."""
    return multi30k_or_skip(os.environ)


@pytest.fixture(autouse=True)
def single_thread_torch():
    """One intra-op thread per test: tiny tensors gain nothing from two, and on a loaded 2-core machine threads
    waiting for a free core made small tests 100x slower."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
