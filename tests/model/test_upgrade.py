"""Checkpoints written before position schemes became modules (code at 45231a7) load and translate identically.

The fixtures were made by ``fixtures/make_old_checkpoints.py`` with that code: four tiny models (Shaw per head,
Shaw shared K-only pre-norm, learned absolute + Shaw V-only, sinusoidal absolute), with their greedy and beam-4
translations of six demo sentences, n-best lists and scores included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rpr_mt.config import DecodeConfig
from rpr_mt.decode.translate import translate_lines
from rpr_mt.model.upgrade import upgrade_state_dict
from rpr_mt.checkpoint_files import average_checkpoints, load_checkpoint, load_for_inference, save_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "old_checkpoints_expected.json").read_text())
CELLS = ["shaw_per_head", "shaw_shared_k_only", "abs_learned_rel", "abs_sinusoidal"]


@pytest.mark.parametrize("cell", CELLS)
def test_old_checkpoint_translates_as_before(cell):
    loaded = load_for_inference(FIXTURES / f"old_{cell}.pt")
    model, vocab = loaded.model, loaded.vocab
    for beam in (1, 4):
        # min_length 0: the code that made the fixtures let eos end an output at any step
        decode = DecodeConfig(beam_size=beam, nbest=beam, max_len_a=1.0, max_len_b=5, min_length=0)
        got = translate_lines(model, vocab, EXPECTED["lines"], decode=decode, device="cpu")
        _assert_same_nbest(got, EXPECTED[cell][f"beam{beam}"])


def _assert_same_nbest(got: list[str], expected: list[str]) -> None:
    """The same n-best lists ("index<TAB>score<TAB>hypothesis" lines), hypothesis by hypothesis.

    Scores agree to the printed precision: one rounding step of the last digit is float32 summation order (where the
    d^-1/2 scale is applied), not a change of model. Hypotheses whose recorded scores are equal are exact ties (these
    tiny models score some outputs that differ only in blanks alike), and beam search's topk may order a tie either
    way depending on the CPU's vector width, so within a tie only the set of hypotheses is compared."""
    assert len(got) == len(expected), (got, expected)
    if not any("\t" in line for line in expected):  # one best: plain hypotheses
        assert got == expected
        return
    got_parts = [line.split("\t") for line in got]
    expected_parts = [line.split("\t") for line in expected]
    ties: dict[tuple[str, str], list[int]] = {}
    for i, ((g_index, g_score, _), (e_index, e_score, _)) in enumerate(zip(got_parts, expected_parts)):
        assert g_index == e_index and abs(float(g_score) - float(e_score)) <= 1.5e-4, (got[i], expected[i])
        ties.setdefault((e_index, e_score), []).append(i)
    for positions in ties.values():
        assert sorted(got_parts[i][2] for i in positions) == sorted(expected_parts[i][2] for i in positions), \
            [got[i] for i in positions]


def test_old_names_are_renamed_and_nothing_is_left_over():
    raw = torch.load(FIXTURES / "old_abs_learned_rel.pt", weights_only=True)["model"]
    assert "learned_positions.weight" in raw and "encoder_layers.0.self_attn.rel_v" in raw
    upgraded = upgrade_state_dict(raw)
    assert "positions.absolute.learned.weight" in upgraded
    assert "encoder_layers.0.self_attn.positions.rel_v" in upgraded
    assert "decoder_layers.0.self_attn.positions.rel_v" in upgraded
    assert len(upgraded) == len(raw) and not any(k.endswith("self_attn.rel_v") for k in upgraded)
    assert list(upgrade_state_dict(upgraded)) == list(upgraded)  # idempotent


def test_old_and_new_checkpoints_average_together(tmp_path):
    path = FIXTURES / "old_shaw_per_head.pt"
    old = load_checkpoint(path)  # loading renames the old parameters: saved again, a checkpoint of today's names
    new = tmp_path / "new.pt"
    save_checkpoint({**old, "step": old["step"] + 1}, new)  # another update: one file twice is refused
    averaged = average_checkpoints([path, new])
    assert "encoder_layers.0.self_attn.positions.rel_k" in averaged["model"]
    assert all(torch.equal(averaged["model"][key], value) for key, value in old["model"].items())
