"""TrainState: the run state writes and reads its own checkpoint payload (through a real checkpoint file), restores
the RNG so that the random draws go on as before, and reads payloads written before some entries existed."""

from __future__ import annotations

import math

import torch
from torch import nn

from rpr_mt.train import checkpoint as ckpt
from rpr_mt.train.state import TrainState


def parts(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler]:
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return model, optimizer, torch.amp.GradScaler("cpu", enabled=False)


def test_round_trip_through_a_checkpoint_file(tmp_path):
    model, optimizer, scaler = parts(0)
    state = TrainState(step=7, epoch=2, position=5, elapsed_before=10.0, tokens_before=300, schedule_origin=1.5,
                       best_bleu=12.5, best_loss=2.25, bad_validations=1,
                       dev={"step": 7, "nll": 2.25, "bleu": 12.5, "sentences": 5, "beam_size": 2})
    path = tmp_path / "checkpoint_00000007.pt"
    ckpt.save_checkpoint(state.payload(model=model, optimizer=optimizer, scaler=scaler, device=torch.device("cpu"),
                                       config={"model": {}}, vocab={"size": 2}, elapsed=12.0, target_tokens=400),
                         path)
    payload = ckpt.load_checkpoint(path)
    assert payload["elapsed"] == 12.0 and payload["target_tokens"] == 400 and payload["dev"]["bleu"] == 12.5

    other_model, other_optimizer, other_scaler = parts(1)
    restored = TrainState.restore(payload, model=other_model, optimizer=other_optimizer, scaler=other_scaler,
                                  device=torch.device("cpu"))
    assert restored == TrainState(step=7, epoch=2, position=5, elapsed_before=12.0, tokens_before=400,
                                  schedule_origin=1.5, best_bleu=12.5, best_loss=2.25, bad_validations=1,
                                  dev=state.dev)
    for a, b in zip(model.parameters(), other_model.parameters()):
        assert torch.equal(a, b)
    assert other_optimizer.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]


def test_dev_scores_are_written_only_for_the_weights_they_belong_to():
    model, optimizer, scaler = parts(0)
    state = TrainState(step=8, dev={"step": 6, "nll": 1.0, "bleu": None, "sentences": 5, "beam_size": 2})
    kwargs = dict(model=model, optimizer=optimizer, scaler=scaler, device=torch.device("cpu"), config={}, vocab={},
                  elapsed=0.0, target_tokens=0)
    assert state.payload(**kwargs)["dev"] is None
    assert state.payload(**kwargs, best_bleu=3.0)["best_bleu"] == 3.0  # changes replace entries


def test_restoring_the_rng_continues_the_same_random_draws():
    model, optimizer, scaler = parts(0)
    payload = TrainState().payload(model=model, optimizer=optimizer, scaler=scaler, device=torch.device("cpu"),
                                   config={}, vocab={}, elapsed=0.0, target_tokens=0)
    expected = torch.rand(5)
    torch.manual_seed(123)
    TrainState.restore(payload, model=model, optimizer=optimizer, scaler=scaler, device=torch.device("cpu"))
    assert torch.equal(torch.rand(5), expected)


def test_a_payload_from_before_the_later_entries_reads_with_their_defaults():
    model, optimizer, scaler = parts(0)
    old = {"format": ckpt.FORMAT, "step": 3, "epoch": 0, "position": 9, "elapsed": 4.0, "config": {}, "vocab": {},
           "model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": {"torch": torch.get_rng_state()},
           "best_bleu": None}
    state = TrainState.restore(old, model=model, optimizer=optimizer, scaler=scaler, device=torch.device("cpu"))
    assert state == TrainState(step=3, epoch=0, position=9, elapsed_before=4.0, tokens_before=None,
                               schedule_origin=None, best_bleu=None, best_loss=math.inf, bad_validations=0, dev=None)
