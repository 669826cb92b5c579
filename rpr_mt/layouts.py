"""The CTranslate2 model directory that ``rpr-mt export`` writes, as its readers see it.

``rpr_mt.export.ctranslate2`` writes the directory; ``rpr_mt.decode.ctranslate2`` translates with it and
``rpr_mt.checkpoint_files`` recognises it where a checkpoint was expected. Decoding must not import the exporter (nor
checkpoint I/O the exporter), so the file names and the reading of the info file live here, below all three::

    model.bin, config.json, shared_vocabulary.json   CTranslate2's model: weights, tokens, the pieces in id order
    spm.model                                        the run's SentencePiece model (text <-> pieces)
    rpr_mt.json                                      where the model came from and the run's decode settings
    casing.json                                      the casing model, for models of lowercased text that have one
                                                     (``rpr_mt.text.casing``; the info file names it)

This module imports nothing else of ``rpr_mt`` but the error type.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rpr_mt.errors import UserError

__all__ = ["CTRANSLATE2_CONFIG", "CTRANSLATE2_WEIGHTS", "EXPORT_FORMAT", "EXPORT_INFO_FILE", "exported_from",
           "is_ctranslate2_model", "read_export_info"]

CTRANSLATE2_WEIGHTS = "model.bin"  # CTranslate2's own file names (its Converter writes them)
CTRANSLATE2_CONFIG = "config.json"
EXPORT_INFO_FILE = "rpr_mt.json"  # rpr-mt's record of the export: source checkpoint, decode settings, languages
EXPORT_FORMAT = "rpr-mt-ctranslate2/1"  # the info file's "format"


def is_ctranslate2_model(folder: Path) -> bool:
    """Whether ``folder`` holds a CTranslate2 model (its weights and config), written by rpr-mt or not."""
    return (folder / CTRANSLATE2_WEIGHTS).is_file() and (folder / CTRANSLATE2_CONFIG).is_file()


def read_export_info(model_dir: Path) -> dict[str, Any]:
    """The info file of an ``rpr-mt export`` directory; a UserError when ``model_dir`` has none."""
    path = model_dir / EXPORT_INFO_FILE
    if not path.is_file():
        raise UserError(f"{model_dir} is not a model directory written by `rpr-mt export` (no {EXPORT_INFO_FILE})")
    return json.loads(path.read_text(encoding="utf-8"))


def exported_from(model_dir: Path) -> str:
    """The checkpoint an export was made from, as its info file records it ("" when that cannot be read)."""
    try:
        return json.loads((model_dir / EXPORT_INFO_FILE).read_text(encoding="utf-8")).get("checkpoint") or ""
    except (OSError, ValueError, AttributeError):
        return ""
