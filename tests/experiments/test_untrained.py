"""Untrained position rows: a model trained only on short inputs keeps the rows of longer positions and distances
at their initial values, and ``untrained_rows`` finds exactly those."""

from __future__ import annotations

import copy

import pytest
import torch

from rpr_mt.config import config_from_dict
from rpr_mt.errors import UserError
from rpr_mt.experiments.untrained import render_untrained, spans, untrained_positions, untrained_rows
from rpr_mt.model.transformer import Seq2Seq
from tests.scripts import load_script

L = 16  # model.max_positions: distances -15 .. 15
SRC, TGT = 5, 5  # training lengths: source positions 0..4, decoder inputs 0..4


def trained_on_short_inputs(model_keys: dict, steps: int = 3) -> tuple[Seq2Seq, Seq2Seq]:
    """A tiny model before and after a few Adam steps on unpadded [2, SRC] -> [2, TGT] batches."""
    cfg = config_from_dict({"model": dict(d_model=16, n_heads=2, encoder_layers=2, decoder_layers=1, ff_dim=32,
                                          dropout=0.0, max_positions=L, **model_keys)}).model
    torch.manual_seed(0)
    model = Seq2Seq(cfg, 20)
    initial = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        src = torch.randint(4, 20, (2, SRC), generator=gen)
        tgt = torch.randint(4, 20, (2, TGT + 1), generator=gen)
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, initial


FAR_ENCODER = (*range(-(L - 1), -SRC + 1), *range(SRC, L))  # |distance| >= 5: no source pair is that far apart
FAR_DECODER = tuple(range(-(L - 1), -TGT + 1))  # looking back 5 or more


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("clip", [SRC, 8])  # clip = SRC: rows +-k themselves untrained (an off-by-one would train them)
def test_shaw_rows_past_the_training_length_stay_untrained(share, clip):
    model, initial = trained_on_short_inputs({"positions": "relative", "clip": clip, "share_across_heads": share})
    found = untrained_rows(model, initial)
    assert len(found) == 2 * 3  # rel_k and rel_v of 2 encoder layers and 1 decoder layer
    for t in found:
        assert t.key == "distance" and t.table in ("rel_k", "rel_v")
        assert t.untrained == (FAR_ENCODER if t.stack == "encoder" else FAR_DECODER), t.parameter


def test_clipping_below_the_training_length_leaves_no_row_untrained():
    model, initial = trained_on_short_inputs({"positions": "relative", "clip": 2})
    found = untrained_rows(model, initial)
    assert len(found) == 6 and all(t.untrained == () for t in found)


def test_learned_absolute_positions_past_the_training_length_stay_untrained():
    model, initial = trained_on_short_inputs({"positions": "absolute", "absolute_kind": "learned"})
    [table] = untrained_rows(model, initial)
    assert (table.table, table.stack, table.key, table.untrained) == ("learned", "both", "position", tuple(range(5, L)))
    model, initial = trained_on_short_inputs({"positions": "absolute"})  # sinusoids: nothing learned
    assert untrained_rows(model, initial) == []


@pytest.mark.parametrize("per_layer", [False, True])
def test_t5_buckets_of_distances_past_the_training_length_stay_untrained(per_layer):
    # 16 buckets, max distance 10: the encoder's exact buckets hold distances 0..3 of each direction, then
    # log-spaced ones share 4 and 5 (so 5 is trained through 4), then 6, 7, ...; the decoder's 8 exact buckets
    # hold looking back 0..7, so what a 5-token decoder input never reaches starts at -5 (two-sided buckets would
    # share 4 and 5 there too, and start at -6)
    model, initial = trained_on_short_inputs({"positions": "t5", "t5": {"num_buckets": 16, "max_distance": 10,
                                                                        "per_layer": per_layer}})
    found = untrained_rows(model, initial)
    assert len(found) == (3 if per_layer else 2)
    for t in found:
        far = (*range(-(L - 1), -5), *range(6, L)) if t.stack == "encoder" else FAR_DECODER
        assert t.untrained == far, t.parameter


def test_an_unchanged_model_is_untrained_everywhere_and_a_changed_row_is_seen():
    model, initial = trained_on_short_inputs({"positions": "relative", "clip": 3}, steps=0)
    assert all(len(t.untrained) == (2 * L - 1 if t.stack == "encoder" else L) for t in untrained_rows(model, initial))
    with torch.no_grad():
        model.encoder_layers[0].self_attn.positions.rel_k[1, 3, 0] += 1.0  # head 1, distance 0, one component
    first = untrained_rows(model, initial)[0]
    assert first.parameter.endswith("encoder_layers.0.self_attn.positions.rel_k") and 0 not in first.untrained


@pytest.mark.parametrize("model_keys", [{"positions": "relative", "clip": 3},
                                        {"positions": "t5", "t5": {"num_buckets": 16, "max_distance": 10}}])
def test_a_start_that_is_not_the_runs_is_refused(model_keys):
    """Against another initial model every row differs, which would read as 'all trained'; the rows no input can
    reach (Shaw: the decoder's future distances; T5: the encoder's unused bucket +0) tell."""
    model, _ = trained_on_short_inputs(model_keys)
    torch.manual_seed(99)
    other = Seq2Seq(model.cfg, 20)
    if model_keys["positions"] == "t5":  # T5 tables start at zero whatever the seed: make the start differ
        with torch.no_grad():
            other.positions.encoder_table.weight.add_(0.5)
    with pytest.raises(UserError, match="not where this run started"):
        untrained_rows(model, other)


def test_spans_and_the_rendered_table():
    assert spans((-3, -2, -1, 5, 7, 8)) == "-3..-1, 5, 7..8" and spans(()) == "none" and spans([4]) == "4"
    model, initial = trained_on_short_inputs({"positions": "relative", "clip": 8})
    text = render_untrained({"demo": untrained_rows(model, initial), "sinusoidal": []})
    assert "| demo | encoder: rel_k, rel_v (4 tables) | distances -15..-5, 5..15 |" in text
    assert "| demo | decoder: rel_k, rel_v (2 tables) | distances -15..-5 |" in text
    assert "| sinusoidal | no learned position table | - |" in text


def test_a_trained_run_against_its_rebuilt_initial_model(tmp_path, capsys):
    """Through the trainer: ``initial_model`` must rebuild its starting point (else no row would match), and with
    training capped at 12 pieces a side, no distance of 13 or more, in either direction, is trained."""
    from rpr_mt.train.trainer import train
    from tests.train.test_trainer import tiny

    cap, length = 12, 40
    cfg = config_from_dict(tiny(tmp_path / "data", tmp_path / "run", data={"max_train_tokens": cap},
                                model={"clip": 24, "max_positions": length},
                                train={"max_steps": 6, "validate_every": 100, "save_every": 3}))
    train(cfg, progress=False)
    found = untrained_positions(tmp_path / "run")
    assert len(found) == 4  # rel_k and rel_v of 1 encoder and 1 decoder layer
    for t in found:
        keys = range(-(length - 1), length if t.stack == "encoder" else 1)  # the decoder only looks back
        reach = max(abs(d) for d in keys if d not in t.untrained)
        assert 0 < reach <= cap, t.parameter  # cap pieces + eos (or bos): distances up to cap
        assert t.untrained == tuple(d for d in keys if abs(d) > reach), t.parameter  # all past it, none within

    script = load_script("scripts/untrained_positions.py")
    assert script.main([str(tmp_path / "run")]) == 0
    assert f"| {tmp_path / 'run'} | encoder: rel_k, rel_v (2 tables) | distances " in capsys.readouterr().out
    assert script.main([str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0  # one line, no traceback
