"""Token-id arrays: layout, dtype, memory mapping, the reader API."""

from __future__ import annotations

import numpy as np
import pytest

from rpr_mt.data import binarize, demo
from rpr_mt.data.binarize import ParallelIds, load_split
from rpr_mt.data.vocab import Vocab, train_sentencepiece
from rpr_mt.errors import UserError


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Vocab:
    work = tmp_path_factory.mktemp("spm")
    sentences = [s for pair in demo.generate_demo(500, seed=4) for s in pair]
    return Vocab.load(train_sentencepiece(sentences, work, vocab_size=200, model_type="bpe",
                                          character_coverage=1.0))


def test_ids_offsets_and_lengths(tmp_path, vocab):
    src_lines = ["the dog sees a cat", "", "those three red birds saw the king"]
    tgt_lines = ["a b", "c", ""]
    (tmp_path / "dev.en").write_text("\n".join(src_lines) + "\n")
    (tmp_path / "dev.de").write_text("\n".join(tgt_lines) + "\n")
    binarize.binarize_text(tmp_path / "dev.en", vocab, tmp_path, "dev", "src", 3, progress=False)
    stats = binarize.binarize_text(tmp_path / "dev.de", vocab, tmp_path, "dev", "tgt", 3, progress=False)
    assert stats.sentences == 3
    ids = np.load(binarize.ids_file(tmp_path, "dev", "src"), mmap_mode="r")
    offsets = np.load(binarize.offsets_file(tmp_path, "dev", "src"), mmap_mode="r")
    assert ids.dtype == np.uint16 and offsets.dtype == np.int64 and isinstance(ids, np.memmap)
    assert offsets[0] == 0 and offsets[-1] == len(ids) and len(offsets) == 4

    split = load_split(tmp_path, "dev")
    assert isinstance(split, ParallelIds) and len(split) == 3
    assert split.src_lengths.tolist() == [len(vocab.encode(s)) for s in src_lines]
    assert split.src_lengths[1] == 0 and split.tgt_lengths[2] == 0  # empty lines stay, as empty sequences
    for i, text in enumerate(src_lines):
        assert split.src(i).tolist() == vocab.encode(text)
        assert vocab.decode(split.src(i)) == text
    assert not list((tmp_path).glob("*.tmp"))  # scratch files are gone


def test_all_empty_side_still_loads(tmp_path, vocab):
    (tmp_path / "x.en").write_text("\n\n")
    binarize.binarize_text(tmp_path / "x.en", vocab, tmp_path, "x", "src", 2, progress=False)
    binarize.binarize_text(tmp_path / "x.en", vocab, tmp_path, "x", "tgt", 2, progress=False)
    split = load_split(tmp_path, "x")
    assert len(split) == 2 and split.src(1).size == 0


def test_id_dtype_depends_on_vocab_size():
    assert binarize.id_dtype(8000) == np.uint16
    assert binarize.id_dtype(65535) == np.uint16
    assert binarize.id_dtype(65536) == np.int32


def test_missing_split_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"no prepared 'test' split in .*run `rpr-mt prepare`"):
        load_split(tmp_path, "test")


def test_the_written_arrays_are_the_bytes_np_save_writes(tmp_path, vocab):
    """binarize writes its .npy files with plain writes (a header, then the values): they are what np.save writes
    for the same arrays, so np.load, memory-mapped or not, reads them as any .npy."""
    (tmp_path / "dev.en").write_text("the dog sees a cat\n\nthose three red birds saw the king\n")
    binarize.binarize_text(tmp_path / "dev.en", vocab, tmp_path, "dev", "src", 3, progress=False)
    for path in (binarize.ids_file(tmp_path, "dev", "src"), binarize.offsets_file(tmp_path, "dev", "src")):
        array = np.load(path)
        np.save(tmp_path / "expected.npy", array)
        assert path.read_bytes() == (tmp_path / "expected.npy").read_bytes(), path
