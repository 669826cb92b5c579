"""The joint SentencePiece vocabulary: training on a bounded random sample, and the ``Vocab`` used everywhere else.

This is the only module that imports sentencepiece. Special ids are fixed: pad=0, unk=1, bos=2, eos=3.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import sentencepiece as spm

from rpr_mt.errors import UserError

if TYPE_CHECKING:
    from rpr_mt.text.casing import Casing

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
MODEL_FILE = "spm.model"


class ReservoirSample:
    """Uniform random sample of at most ``capacity`` sentences from a stream (Algorithm R), seeded.

    Memory is O(capacity) whatever the stream length.
    """

    def __init__(self, capacity: int, seed: int = 0) -> None:
        self.capacity, self.seen = capacity, 0
        self.items: list[str] = []
        self._rng = random.Random(seed)

    def add(self, sentence: str) -> None:
        self.seen += 1
        if len(self.items) < self.capacity:
            self.items.append(sentence)
        else:
            j = self._rng.randrange(self.seen)
            if j < self.capacity:
                self.items[j] = sentence


def train_sentencepiece(
    sentences: Iterable[str],
    workdir: Path,
    *,
    vocab_size: int,
    model_type: str,
    character_coverage: float,
) -> Path:
    """Train ``workdir/spm.model`` (and ``spm.vocab``) on ``sentences``, which should already be a random sample.

    Because we sample ourselves (reservoir, bounded memory), SentencePiece reads the whole sample file
    (``input_sentence_size=0``) without its own shuffling. ``hard_vocab_limit`` stays on: a corpus too small for
    ``vocab_size`` is an error suggesting a size that works, rather than a silently smaller vocabulary.
    """
    workdir = Path(workdir)
    sample_file = workdir / "spm_sample.txt"
    with open(sample_file, "w", encoding="utf-8", newline="\n") as f:
        for sentence in sentences:
            f.write(sentence + "\n")
    prefix = workdir / Path(MODEL_FILE).stem
    try:
        spm.SentencePieceTrainer.train(
            input=str(sample_file), model_prefix=str(prefix), vocab_size=vocab_size, model_type=model_type,
            character_coverage=character_coverage, input_sentence_size=0, shuffle_input_sentence=False,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
            hard_vocab_limit=True, num_threads=os.cpu_count() or 1, minloglevel=2,
        )
    except RuntimeError as exc:
        raise _training_error(str(exc), vocab_size) from None
    finally:
        sample_file.unlink(missing_ok=True)
    _drop_build_details(workdir / MODEL_FILE)
    return workdir / MODEL_FILE


def _drop_build_details(path: Path) -> None:
    """Clear what SentencePiece records about the build itself: the sample file's path (inside a temporary
    directory named after the preparing process), the output prefix and the thread count. Encoding never reads them,
    but kept, they would make every preparation of the same corpus a different file: the vocabulary fingerprint (the
    file's sha256) would change when the same data is prepared again, and a run could not resume from its
    checkpoints."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    for name in ("input", "model_prefix", "num_threads"):
        proto.trainer_spec.ClearField(name)
    path.write_bytes(proto.SerializeToString())


def _training_error(message: str, vocab_size: int) -> UserError:
    too_high = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", message)
    if too_high:
        return UserError(f"data.vocab_size={vocab_size} is too large for this training corpus (SentencePiece can "
                         f"build at most {too_high.group(2)} pieces from it); set data.vocab_size to "
                         f"{too_high.group(2)} or less")
    too_low = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", message)
    if too_low:
        return UserError(f"data.vocab_size={vocab_size} is smaller than the {too_low.group(2)} characters the "
                         f"corpus needs; raise data.vocab_size or lower data.spm_character_coverage")
    last = message.strip().splitlines()[-1] if message.strip() else "unknown error"
    return UserError(f"SentencePiece training failed: {last}")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class Vocab:
    """A trained SentencePiece model. ``encode`` gives bare pieces (no bos/eos: the batcher adds them)."""

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path) -> None:
        self._sp, self.path = processor, Path(path)
        self.size: int = processor.get_piece_size()
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
        self._fingerprint: str | None = None
        # how to case the words of lowercased output (data.multi30k_text: tok), when the checkpoint or data has it
        self.casing: Casing | None = None

    @classmethod
    def load(cls, path: str | Path) -> "Vocab":
        """Load ``path`` (the .model file, or a prepared data directory holding spm.model)."""
        path = Path(path)
        if path.is_dir():
            path = path / MODEL_FILE
        if not path.is_file():
            raise UserError(f"SentencePiece model not found: {path} (run `rpr-mt prepare` first)")
        processor = spm.SentencePieceProcessor()
        try:
            processor.load(str(path))
        except (OSError, RuntimeError) as exc:
            raise UserError(f"{path}: not a SentencePiece model ({str(exc).strip().splitlines()[-1]})") from None
        ids = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise UserError(f"{path}: special ids pad/unk/bos/eos are {ids}, expected (0, 1, 2, 3)")
        return cls(processor, path)

    @property
    def fingerprint(self) -> str:
        """sha256 of the model file: checkpoints compare it to detect data prepared with another vocabulary."""
        if self._fingerprint is None:
            self._fingerprint = sha256_of(self.path)
        return self._fingerprint

    def __len__(self) -> int:
        return self.size

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        return self._sp.encode(list(texts), out_type=int, num_threads=num_threads or os.cpu_count() or 1)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first eos; pad and bos are skipped."""
        kept: list[int] = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                kept.append(i)
        return self._sp.decode(kept)

    def piece(self, id: int) -> str:
        return self._sp.id_to_piece(int(id))

    def pieces(self, text: str) -> list[str]:
        return self._sp.encode(text, out_type=str)
