"""Data preparation (``rpr-mt prepare``) and the readers the trainer uses.

    prepare(config.data) -> Path        build or reuse the prepared data directory
    check_prepared(config.data)         None if up to date, else a one-line reason
    load_split(dir, "train")            memory-mapped token ids (ParallelIds)
    Vocab.load(dir)                     the joint SentencePiece model
"""

from rpr_mt.data.binarize import ParallelIds, load_split
from rpr_mt.data.prepare import check_prepared, prepare, read_manifest, reference_files
from rpr_mt.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Vocab

__all__ = [
    "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "ParallelIds", "Vocab", "check_prepared", "load_split", "prepare",
    "read_manifest", "reference_files",
]
