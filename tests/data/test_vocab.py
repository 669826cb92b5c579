"""SentencePiece training and the Vocab API."""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pytest

from rpr_mt.data import demo
from rpr_mt.data.vocab import ReservoirSample, Vocab, train_sentencepiece
from rpr_mt.errors import UserError


@pytest.fixture(scope="module")
def demo_vocab(tmp_path_factory) -> Vocab:
    work = tmp_path_factory.mktemp("spm")
    sentences = [s for pair in demo.generate_demo(1000, seed=1) for s in pair]
    return Vocab.load(train_sentencepiece(sentences, work, vocab_size=300, model_type="bpe",
                                          character_coverage=1.0))


def test_special_ids_and_size(demo_vocab):
    v = demo_vocab
    assert (v.pad_id, v.unk_id, v.bos_id, v.eos_id) == (0, 1, 2, 3)
    assert [v.piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert v.size == len(v) == 300


def test_round_trip_on_unseen_demo_text(demo_vocab):
    for src, tgt in demo.generate_demo(50, seed=99, split="test"):
        for text in (src, tgt):
            ids = demo_vocab.encode(text)
            assert demo_vocab.unk_id not in ids and all(i >= 4 for i in ids)  # bare pieces: no bos/eos
            assert demo_vocab.decode(ids) == text


def test_decode_stops_at_eos_and_skips_pad_and_bos(demo_vocab):
    ids = demo_vocab.encode("the dog sees a cat")
    noisy = [demo_vocab.bos_id, *ids, demo_vocab.eos_id, *demo_vocab.encode("every boy"), 0, 0]
    assert demo_vocab.decode(noisy) == "the dog sees a cat"
    assert demo_vocab.decode(np.array([0, 2, *ids], dtype=np.uint16)) == "the dog sees a cat"
    assert demo_vocab.decode([]) == ""


def test_encode_batch_matches_encode(demo_vocab):
    texts = ["the dog sees a cat", "", "those three red birds"]
    assert demo_vocab.encode_batch(texts) == [demo_vocab.encode(t) for t in texts]


def test_unknown_characters_map_to_unk(demo_vocab):
    assert demo_vocab.unk_id in demo_vocab.encode("the dog sees ☃")


def test_fingerprint_is_sha256_of_the_model(demo_vocab):
    assert demo_vocab.fingerprint == hashlib.sha256(demo_vocab.path.read_bytes()).hexdigest()
    assert Vocab.load(demo_vocab.path.parent).fingerprint == demo_vocab.fingerprint  # a directory works too


def test_the_same_corpus_gives_the_same_model_file_wherever_it_is_built(tmp_path):
    """Preparing the same data again (`prepare --force`, or a stale or damaged prepared directory) must not change
    the vocabulary fingerprint that a run's checkpoints are checked against: SentencePiece records the sample file's
    path (a temporary directory named after the process) and the thread count, which are now cleared."""
    sentences = [s for pair in demo.generate_demo(300, seed=3) for s in pair]
    built = []
    for name in (".data.tmp-101", ".data.tmp-202"):
        (tmp_path / name).mkdir()
        built.append(train_sentencepiece(sentences, tmp_path / name, vocab_size=150, model_type="bpe",
                                         character_coverage=1.0))
    assert built[0].read_bytes() == built[1].read_bytes()
    assert Vocab.load(built[0]).encode(sentences[0]) == Vocab.load(built[1]).encode(sentences[0])


def test_vocab_too_large_for_the_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match=r"data.vocab_size=5000 is too large .* set data.vocab_size to \d+ or less"):
        train_sentencepiece(["a tiny corpus", "with few words"] * 10, tmp_path, vocab_size=5000, model_type="bpe",
                            character_coverage=1.0)
    assert not (tmp_path / "spm_sample.txt").exists()


def test_unigram_model_type(tmp_path):
    sentences = [s for pair in demo.generate_demo(300, seed=2) for s in pair]
    v = Vocab.load(train_sentencepiece(sentences, tmp_path, vocab_size=150, model_type="unigram",
                                       character_coverage=1.0))
    assert v.decode(v.encode(sentences[0])) == sentences[0]


def test_missing_model_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="SentencePiece model not found"):
        Vocab.load(tmp_path / "nothing.model")
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(UserError, match="not a SentencePiece model"):
        Vocab.load(tmp_path / "junk.model")


def test_reservoir_sample_is_bounded_seeded_and_uniform():
    def sample(seed: int, n: int = 10_000, k: int = 100) -> list[str]:
        r = ReservoirSample(k, seed)
        for i in range(n):
            r.add(str(i))
        assert r.seen == n and len(r.items) == k
        return r.items

    assert sample(1) == sample(1) and sample(1) != sample(2)
    small = ReservoirSample(100, 0)
    for s in "abc":
        small.add(s)
    assert small.items == ["a", "b", "c"]  # fewer than capacity: everything, in order
    # Uniformity: over many seeds each tenth of the stream gets about a tenth of the sample.
    counts = Counter(int(x) // 1000 for seed in range(30) for x in sample(seed))
    assert all(200 <= counts[b] <= 400 for b in range(10)), counts
