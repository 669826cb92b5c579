"""Reading a sweep's finished runs: where their prepared data is."""

from __future__ import annotations

import logging

from rpr_mt.config import config_from_dict, save_config
from rpr_mt.experiments.outputs import _run_data_dir


def test_a_runs_saved_config_is_read_without_warnings_the_user_cannot_act_on(tmp_path, caplog):
    """An absolute cell of a sweep over a relative base config saves the base's model.clip; aggregate --by-length or
    --paired-bootstrap read that config.yaml to find the data and warned that model.clip is ignored, about a file the
    user never wrote."""
    data = tmp_path / "data"
    data.mkdir()
    run = tmp_path / "root" / "positions=absolute" / "seed1"
    run.mkdir(parents=True)
    cfg = config_from_dict({"data": {"output_dir": str(data)}, "model": {"positions": "absolute", "clip": 8}})
    save_config(cfg, run / "config.yaml")
    with caplog.at_level(logging.WARNING):
        assert _run_data_dir(run) == data
    assert not [r for r in caplog.records if "ignored" in r.getMessage()], caplog.text
