"""Tests of rpr_mt.data; small helpers shared by them."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any, Iterable

from rpr_mt.config import DataConfig, SplitFiles


def write_lines(path: Path, lines: Iterable[str], *, gz: bool | None = None) -> Path:
    """Write UTF-8 lines (each followed by a newline); gzip when the name ends in .gz."""
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if gz if gz is not None else path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def demo_config(tmp_path: Path, **overrides: Any) -> DataConfig:
    """A demo config small enough to prepare in about a second."""
    values: dict[str, Any] = dict(source="demo", output_dir=str(tmp_path / "prepared"),
                                  demo_sizes={"train": 400, "dev": 30, "test": 30}, vocab_size=120)
    values.update(overrides)
    return DataConfig(**values)


def files_config(tmp_path: Path, splits: dict[str, SplitFiles], **overrides: Any) -> DataConfig:
    values: dict[str, Any] = dict(source="files", output_dir=str(tmp_path / "prepared"), splits=splits,
                                  vocab_size=60)
    values.update(overrides)
    return DataConfig(**values)


SENTENCES_EN = [
    "the cat sits on the mat", "a dog runs in the park", "we like green apples", "the sun is bright today",
    "my friend reads a book", "birds sing in the morning", "the river flows to the sea", "she writes a long letter",
    "they play football after school", "the old man walks slowly", "children laugh at the clown",
    "the train leaves at noon",
]
SENTENCES_DE = [
    "die katze sitzt auf der matte", "ein hund rennt im park", "wir mögen grüne äpfel", "die sonne ist heute hell",
    "mein freund liest ein buch", "vögel singen am morgen", "der fluss fließt zum meer",
    "sie schreibt einen langen brief",
    "sie spielen fußball nach der schule", "der alte mann geht langsam", "kinder lachen über den clown",
    "der zug fährt mittags ab",
]


def small_parallel(tmp_path: Path, *, repeat: int = 10, gz: bool = False) -> dict[str, SplitFiles]:
    """Tiny train/dev/test files written under tmp_path."""
    ext = ".gz" if gz else ""
    src_train = write_lines(tmp_path / f"train.en{ext}", SENTENCES_EN * repeat)
    tgt_train = write_lines(tmp_path / f"train.de{ext}", SENTENCES_DE * repeat)
    src_dev = write_lines(tmp_path / f"dev.en{ext}", SENTENCES_EN[:4])
    tgt_dev = write_lines(tmp_path / f"dev.de{ext}", SENTENCES_DE[:4])
    return {
        "train": SplitFiles(src=str(src_train), tgt=str(tgt_train)),
        "dev": SplitFiles(src=str(src_dev), tgt=str(tgt_dev)),
    }


CASED_DE = ["Ein Hund rennt im Park.", "Die Katze sitzt auf der Matte.", "Zwei Männer spielen Fußball in Berlin.",
            "Der alte Mann liest ein Buch im Park.", "Ein Kind lacht über den Clown.", "Vögel singen am Morgen."]
CASED_EN = ["A dog runs in the park.", "The cat sits on the mat.", "Two men play soccer in Berlin.",
            "The old man reads a book in the park.", "A child laughs at the clown.", "Birds sing in the morning."]


def multi30k_tok_corpus(root: Path) -> DataConfig:
    """Multi30k's layout in miniature: raw files and tok/ files made from them by the dataset's script."""
    from rpr_mt.text.multi30k import lowercase_normalize_tokenize

    (root / "tok").mkdir(parents=True)
    for prefix, n in (("train", 10), ("val", 1), ("test_2016_flickr", 1)):
        for lang, lines in (("en", CASED_EN * n), ("de", CASED_DE * n)):
            write_lines(root / f"{prefix}.{lang}.gz", lines)
            write_lines(root / "tok" / f"{prefix}.{lang}.gz", lowercase_normalize_tokenize(lines, lang))
    return DataConfig(source="multi30k", multi30k_dir=str(root), multi30k_text="tok", vocab_size=80,
                      output_dir=str(root.parent / "prepared"))
