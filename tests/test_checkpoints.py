"""rpr_mt/checkpoints.py: what a checkpoint that does not fit says (the first mismatch, the checkpoint's name)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from rpr_mt.checkpoints import vocab_from_payload, weights_mismatch
from rpr_mt.errors import UserError


def test_weights_mismatch_names_the_first_difference_and_counts_the_rest():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    weights = model.state_dict()
    assert weights_mismatch(model, weights) is None
    assert weights_mismatch(model, {**weights, "0.weight": torch.zeros(5, 3)}) == (
        "0.weight is [5, 3] in the checkpoint but [4, 3] in the model")
    missing = {k: v for k, v in weights.items() if k != "1.bias"}
    assert weights_mismatch(model, missing) == "1.bias is missing from the checkpoint"
    assert weights_mismatch(model, {**weights, "2.weight": torch.zeros(1)}) == (
        "the checkpoint has 2.weight, which the model lacks")
    both = {**missing, "0.weight": torch.zeros(5, 3), "2.weight": torch.zeros(1)}
    assert weights_mismatch(model, both) == "0.weight is [5, 3] in the checkpoint but [4, 3] in the model; 2 more differences"


def test_a_broken_vocabulary_names_the_checkpoint_not_a_temporary_file(tmp_path):
    broken = {"spm_model": torch.frombuffer(bytearray(b"no model"), dtype=torch.uint8)}
    with pytest.raises(UserError, match=r"^checkpoint old\.pt: its vocabulary is broken \(not a SentencePiece") as caught:
        vocab_from_payload(broken, "old.pt")
    assert "tmp" not in str(caught.value)
    with pytest.raises(UserError, match="^checkpoint old.pt: its vocabulary holds no SentencePiece model bytes"):
        vocab_from_payload({"size": 8}, "old.pt")


def test_a_folder_of_checkpoints_resolves_to_its_own_files_never_a_neighbours(tmp_path):
    """--which last / best of a folder that holds checkpoint files itself (no checkpoints/ inside): its newest
    numbered file. Before, 'last' looked in the parent's checkpoints/ (another run's model) and 'best' had no
    fallback there."""
    from rpr_mt.checkpoints import resolve_checkpoint

    nest = tmp_path / "nest"
    (nest / "checkpoints").mkdir(parents=True)
    (nest / "checkpoints" / "checkpoint_00000040.pt").write_bytes(b"x")  # a neighbouring run's
    flat = nest / "flat"
    flat.mkdir()
    for step in (900, 1150):
        (flat / f"checkpoint_{step:08d}.pt").write_bytes(b"x")
    assert resolve_checkpoint(flat, "last") == flat / "checkpoint_00001150.pt"
    assert resolve_checkpoint(flat, "best") == flat / "checkpoint_00001150.pt"
    assert resolve_checkpoint(nest, "last") == nest / "checkpoints" / "checkpoint_00000040.pt"  # a run directory
    assert resolve_checkpoint(nest / "checkpoints", "last") == nest / "checkpoints" / "checkpoint_00000040.pt"
    empty = nest / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no numbered checkpoints in"):
        resolve_checkpoint(empty, "last")
    with pytest.raises(UserError, match="--which must be best, last or average"):
        resolve_checkpoint(flat / "checkpoint_00000900.pt", "lats")  # a file ignores --which, but not its typo


def test_a_runs_relative_data_dir_is_found_from_any_directory(tmp_path, monkeypatch):
    """eval-bleu --checkpoint from outside the project: data.output_dir saved as 'data/x' (relative to where the
    run started) is found above the checkpoint; from inside the project, or absolute, it is taken as it is."""
    from rpr_mt.checkpoints import prepared_data_of

    project = tmp_path / "project"
    (project / "data" / "x").mkdir(parents=True)
    (project / "data" / "x" / "manifest.json").write_text("{}")
    checkpoint = project / "runs" / "r" / "checkpoints" / "checkpoint_best.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert prepared_data_of("data/x", checkpoint) == project / "data" / "x"
    assert prepared_data_of("data/y", checkpoint) == Path("data/y")  # nowhere: as saved, for the error to name
    monkeypatch.chdir(project)
    assert prepared_data_of("data/x", checkpoint) == Path("data/x")
