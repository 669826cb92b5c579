"""Fixtures of the export tests: a prepared demo corpus whose training split is cut to a few pairs (a tiny model
learns them in seconds, so that its translations end with eos well before the length limit), and tiny models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rpr_mt.config import Config, config_from_dict
from rpr_mt.data.prepare import prepare

TRAIN_PAIRS = 12


def tiny_config(data_dir: Path, run_dir: Path, **model: Any) -> Config:
    """A model of a few thousand parameters that memorises TRAIN_PAIRS demo pairs in 100 updates."""
    return config_from_dict({
        "data": {"source": "demo", "output_dir": str(data_dir), "demo_sizes": {"train": 400, "dev": 20, "test": 20},
                 "vocab_size": 300, "max_train_pairs": TRAIN_PAIRS},
        "model": {"d_model": 32, "n_heads": 4, "encoder_layers": 1, "decoder_layers": 1, "ff_dim": 64,
                  "dropout": 0.0, "clip": 4, "max_positions": 128, **model},
        "train": {"run_dir": str(run_dir), "max_tokens": 400, "max_steps": 100, "log_every": 1000,
                  "save_every": 1000, "validate_every": 1000, "valid_bleu": False, "lr_schedule": "inverse_sqrt",
                  "peak_lr": 1e-2, "warmup_steps": 10, "num_threads": 1, "seed": 7},
        "decode": {"beam_size": 4, "length_penalty": 0.6},
    })


@pytest.fixture(scope="session")
def export_data(tmp_path_factory) -> Path:
    data_dir = tmp_path_factory.mktemp("export") / "data"
    prepare(tiny_config(data_dir, data_dir.parent / "unused").data, progress=False)
    return data_dir
