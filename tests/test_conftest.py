"""The Multi30k fixture: skipped with its reason on a fresh clone, required under CI."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.conftest import MULTI30K_FILES, multi30k_or_skip


def make_corpus(path: Path) -> Path:
    for name in MULTI30K_FILES:  # raw files and tok/ ones
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path / name, "wt", encoding="utf-8") as handle:
            handle.write("a line\n")
    return path


def test_the_default_location_is_used_when_complete(tmp_path):
    corpus = make_corpus(tmp_path / "shared" / "data" / "multi30k")
    assert multi30k_or_skip({}, default=corpus) == corpus


def test_the_environment_variable_wins(tmp_path):
    corpus = make_corpus(tmp_path / "elsewhere")
    assert multi30k_or_skip({"RPR_MT_MULTI30K_DIR": str(corpus)}, default=tmp_path / "none") == corpus


def test_a_missing_corpus_skips_with_the_reason(tmp_path):
    with pytest.raises(pytest.skip.Exception) as caught:
        multi30k_or_skip({}, default=tmp_path / "none")
    reason = str(caught.value)
    assert str(tmp_path / "none") in reason and "train.en.gz" in reason
    assert "../shared/data/multi30k" in reason and "RPR_MT_MULTI30K_DIR" in reason


def test_an_incomplete_corpus_is_missing_too(tmp_path):
    corpus = make_corpus(tmp_path / "partial")
    (corpus / "val.fr.gz").unlink()
    with pytest.raises(pytest.skip.Exception, match="missing val.fr.gz"):
        multi30k_or_skip({}, default=corpus)


@pytest.mark.parametrize("value", ["true", "True", "1"])
def test_under_ci_a_missing_corpus_fails(tmp_path, value):
    with pytest.raises(pytest.fail.Exception, match="CI=true: the corpus is required"):
        multi30k_or_skip({"CI": value}, default=tmp_path / "none")


def test_ci_false_still_skips(tmp_path):
    with pytest.raises(pytest.skip.Exception):
        multi30k_or_skip({"CI": "false"}, default=tmp_path / "none")
