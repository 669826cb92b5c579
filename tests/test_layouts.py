"""rpr_mt/layouts.py: the exported model directory as its readers see it."""

from __future__ import annotations

import json

import pytest

from rpr_mt.errors import UserError
from rpr_mt.layouts import EXPORT_INFO_FILE, exported_from, is_ctranslate2_model, read_export_info


def test_an_export_is_recognised_and_its_info_read(tmp_path):
    assert not is_ctranslate2_model(tmp_path) and exported_from(tmp_path) == ""
    (tmp_path / "model.bin").write_bytes(b"\0")
    (tmp_path / "config.json").write_text("{}")
    assert is_ctranslate2_model(tmp_path)
    with pytest.raises(UserError, match=rf"^{tmp_path} is not a model directory written by `rpr-mt export` "
                                        rf"\(no {EXPORT_INFO_FILE}\)$"):
        read_export_info(tmp_path)
    (tmp_path / EXPORT_INFO_FILE).write_text(json.dumps({"checkpoint": "runs/x/checkpoints/checkpoint_best.pt"}))
    assert read_export_info(tmp_path)["checkpoint"] == exported_from(tmp_path) == "runs/x/checkpoints/checkpoint_best.pt"
    (tmp_path / EXPORT_INFO_FILE).write_text("[1]")  # not an object: no source to name
    assert exported_from(tmp_path) == ""
