"""TrainState: the run state writes and reads its own checkpoint payload (through a real checkpoint file, with the keys
every earlier checkpoint has), restores the RNG so that the random draws go on as before, keeps the run's totals and
best scores, and reads payloads written before some entries existed, down to resuming a run from one."""

from __future__ import annotations

import math
import time

import pytest
import torch
from torch import nn

from rpr_mt import checkpoint_files as ckpt
from rpr_mt.config import config_from_dict
from rpr_mt.train.state import PAYLOAD_KEYS, TrainState
from rpr_mt.train.trainer import train
from tests.train.test_trainer import demo_data, final_weights, tiny  # noqa: F401  (demo_data is a fixture)

CPU = torch.device("cpu")


def parts(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler]:
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return model, optimizer, torch.amp.GradScaler("cpu", enabled=False)


def payload_of(state: TrainState, seed: int = 0) -> dict:
    model, optimizer, scaler = parts(seed)
    return state.payload(model=model, optimizer=optimizer, scaler=scaler, device=CPU, config={"model": {}},
                         vocab={"size": 2})


def test_round_trip_through_a_checkpoint_file(tmp_path):
    model, optimizer, scaler = parts(0)
    dev = {"step": 7, "nll": 2.25, "bleu": 12.5, "sentences": 5, "beam_size": 2}
    state = TrainState(step=7, epoch=2, position=5, elapsed_before=10.0, tokens_before=300, schedule_origin=1.5,
                       best_bleu=12.5, best_loss=2.25, bad_validations=1, dev=dev, tokens=100,
                       started=time.monotonic() - 2.0)
    path = tmp_path / "checkpoint_00000007.pt"
    ckpt.save_checkpoint(state.payload(model=model, optimizer=optimizer, scaler=scaler, device=CPU,
                                       config={"model": {}}, vocab={"size": 2}), path)
    payload = ckpt.load_checkpoint(path)  # verifies the checksum
    assert set(payload) == {*PAYLOAD_KEYS, "checksum"}
    # the totals written are the run's: the earlier invocations' plus this one's
    assert payload["target_tokens"] == 400 and 12.0 <= payload["elapsed"] < 20.0 and payload["dev"] == dev

    other_model, other_optimizer, other_scaler = parts(1)
    started = time.monotonic()
    restored = TrainState.restore(payload, model=other_model, optimizer=other_optimizer, scaler=other_scaler,
                                  device=CPU, started=started)
    assert restored == TrainState(step=7, epoch=2, position=5, elapsed_before=payload["elapsed"], tokens_before=400,
                                  schedule_origin=1.5, best_bleu=12.5, best_loss=2.25, bad_validations=1, dev=dev)
    assert restored.started == started and restored.tokens == 0 and restored.run_tokens() == 400
    for a, b in zip(model.parameters(), other_model.parameters()):
        assert torch.equal(a, b)
    assert other_optimizer.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]


def test_the_payload_keys_are_those_of_earlier_checkpoints():
    # rpr-mt-checkpoint/1 as written since the first trainer, with the entries added later: renaming one would leave
    # existing runs unable to resume
    assert set(payload_of(TrainState())) == {
        "format", "step", "epoch", "position", "elapsed", "config", "vocab", "model", "optimizer", "scaler", "rng",
        "best_bleu", "target_tokens", "schedule_origin", "best_loss", "bad_validations", "dev", "train_data",
    }
    assert payload_of(TrainState())["format"] == ckpt.FORMAT == "rpr-mt-checkpoint/1"


def test_dev_scores_are_written_only_for_the_weights_they_belong_to():
    state = TrainState(step=8, dev={"step": 6, "nll": 1.0, "bleu": None, "sentences": 5, "beam_size": 2})
    assert payload_of(state)["dev"] is None
    state.step = 6
    assert payload_of(state)["dev"]["nll"] == 1.0


def test_restoring_the_rng_continues_the_same_random_draws():
    model, optimizer, scaler = parts(0)
    payload = payload_of(TrainState())
    expected = torch.rand(5), torch.nn.functional.dropout(torch.ones(8), 0.5)
    torch.manual_seed(123)
    TrainState.restore(payload, model=model, optimizer=optimizer, scaler=scaler, device=CPU)
    assert torch.equal(torch.rand(5), expected[0])
    assert torch.equal(torch.nn.functional.dropout(torch.ones(8), 0.5), expected[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_restoring_the_cuda_rng_continues_the_same_random_draws():
    device = torch.device("cuda", torch.cuda.current_device())
    model, optimizer, scaler = parts(0)
    payload = TrainState().payload(model=model, optimizer=optimizer, scaler=scaler, device=device, config={},
                                   vocab={})
    expected = torch.rand(5, device=device)
    torch.cuda.manual_seed(123)
    TrainState.restore(payload, model=model, optimizer=optimizer, scaler=scaler, device=device)
    assert torch.equal(torch.rand(5, device=device), expected)


def test_validations_move_the_best_scores_and_the_patience_count():
    state = TrainState(step=6)
    assert state.add_validation({"step": 6, "nll": 3.0, "bleu": 10.0})
    assert (state.best_bleu, state.best_loss, state.bad_validations) == (10.0, 3.0, 0)
    assert not state.add_validation({"step": 12, "nll": 2.0, "bleu": 9.0})  # BLEU decides, before the loss
    assert (state.best_bleu, state.best_loss, state.bad_validations) == (10.0, 3.0, 1)
    assert state.add_validation({"step": 18, "nll": 3.5, "bleu": 11.0})
    assert (state.best_bleu, state.best_loss, state.bad_validations) == (11.0, 3.5, 0)
    assert state.dev["step"] == 18

    no_bleu = TrainState()  # train.valid_bleu off: the dev NLL decides
    assert no_bleu.add_validation({"step": 6, "nll": 3.0, "bleu": None})
    assert not no_bleu.add_validation({"step": 12, "nll": 3.5, "bleu": None})
    assert (no_bleu.best_bleu, no_bleu.best_loss, no_bleu.bad_validations) == (None, 3.0, 1)


def test_at_equal_bleu_a_lower_dev_loss_is_an_improvement():
    """A tiny run's dev BLEU stays 0.00 while its loss falls: each validation with a lower loss is the new best (and
    resets the patience count), not the first one measured."""
    state = TrainState()
    for step, nll in ((10, 4.652), (20, 4.188), (30, 4.054)):
        assert state.add_validation({"step": step, "nll": nll, "bleu": 0.0})
        assert (state.best_bleu, state.best_loss, state.bad_validations) == (0.0, nll, 0)
    assert not state.add_validation({"step": 40, "nll": 4.054, "bleu": 0.0})  # the same scores again: no gain
    assert not state.add_validation({"step": 50, "nll": 4.3, "bleu": 0.0})
    assert (state.best_bleu, state.best_loss, state.bad_validations) == (0.0, 4.054, 2)

    # the tie is judged against the best validation's loss, not the lowest loss seen: here the better BLEU came
    # with a higher loss, and the same BLEU at a loss between the two improves on it
    state = TrainState()
    assert state.add_validation({"step": 10, "nll": 3.0, "bleu": 10.0})
    assert state.add_validation({"step": 20, "nll": 3.6, "bleu": 12.0})
    assert state.best_loss == 3.6
    assert state.add_validation({"step": 30, "nll": 3.3, "bleu": 12.0})
    assert (state.best_bleu, state.best_loss, state.bad_validations) == (12.0, 3.3, 0)


def test_totals_and_the_budget_schedule_origin():
    state = TrainState(elapsed_before=100.0, tokens_before=None, started=time.monotonic() - 5.0, tokens=40)
    assert 105.0 <= state.elapsed() < 110.0
    assert state.run_tokens() is None  # the checkpoint it resumed from predates the count
    assert state.budget_progress(None) == 0.0 and state.schedule_origin is None
    first = state.budget_progress(1000.0)
    origin = state.schedule_origin
    assert 105.0 <= origin < 110.0 and 0.0 <= first < 0.01
    state.budget_progress(1000.0)
    assert state.schedule_origin == origin  # set once, at the first update, and carried by the checkpoint


def test_a_payload_from_before_the_later_entries_reads_with_their_defaults():
    model, optimizer, scaler = parts(0)
    old = {"format": ckpt.FORMAT, "step": 3, "epoch": 0, "position": 9, "elapsed": 4.0, "config": {}, "vocab": {},
           "model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": {"torch": torch.get_rng_state()},
           "best_bleu": None}
    state = TrainState.restore(old, model=model, optimizer=optimizer, scaler=scaler, device=CPU)
    assert state == TrainState(step=3, epoch=0, position=9, elapsed_before=4.0, tokens_before=None,
                               schedule_origin=None, best_bleu=None, best_loss=math.inf, bad_validations=0, dev=None)


def test_a_run_resumes_from_a_checkpoint_without_the_later_entries(tmp_path, demo_data):
    train(config_from_dict(tiny(demo_data, tmp_path / "whole")), progress=False)
    first = train(config_from_dict(tiny(demo_data, tmp_path / "split", train={"max_steps": 6})), progress=False)
    # rewrite its checkpoints as the first trainer wrote them: none of the later entries, and no checksum
    for path in ckpt.checkpoint_dir(tmp_path / "split").glob("*.pt"):
        payload = torch.load(path, weights_only=True)
        for key in ("target_tokens", "schedule_origin", "best_loss", "bad_validations", "dev", "checksum"):
            del payload[key]
        torch.save(payload, path)
    result = train(config_from_dict(tiny(demo_data, tmp_path / "split")), progress=False)
    assert result.step == 12 and result.run_target_tokens is None and result.target_tokens > 0
    assert first.best_bleu is not None and result.best_bleu >= first.best_bleu  # the best score carried over
    a, b = final_weights(tmp_path / "whole"), final_weights(tmp_path / "split")
    assert all(torch.equal(a[key], b[key]) for key in a)  # still the uninterrupted run
