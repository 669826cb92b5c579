"""Learning-rate schedules at known steps."""

import math

import pytest

from rpr_mt.config import TrainConfig
from rpr_mt.train.schedule import budget_lr, inverse_sqrt_lr, learning_rate, noam_lr


def test_noam_formula_at_known_steps():
    # Vaswani et al. eq. 3 with d_model 512, warmup 4000: peak at step 4000 = 512^-0.5 * 4000^-0.5.
    assert noam_lr(4000, 512, 4000) == pytest.approx(512**-0.5 * 4000**-0.5)
    assert noam_lr(4000, 512, 4000) == pytest.approx(6.9877e-4, rel=1e-4)
    assert noam_lr(1, 512, 4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert noam_lr(16000, 512, 4000) == pytest.approx(noam_lr(4000, 512, 4000) / 2)
    assert noam_lr(2000, 512, 4000, scale=2.0) == pytest.approx(2 * 512**-0.5 * 2000 * 4000**-1.5)


def test_inverse_sqrt():
    assert inverse_sqrt_lr(500, 1e-3, 1000) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(1000, 1e-3, 1000) == pytest.approx(1e-3)
    assert inverse_sqrt_lr(4000, 1e-3, 1000) == pytest.approx(5e-4)


def test_budget_warms_up_then_anneals_to_the_floor_exactly_at_the_end():
    assert budget_lr(0.05, 1e-3, 0.1, 0.0) == pytest.approx(5e-4)
    assert budget_lr(0.1, 1e-3, 0.1, 0.0) == pytest.approx(1e-3)
    assert budget_lr(0.55, 1e-3, 0.1, 0.0) == pytest.approx(5e-4)
    assert budget_lr(1.0, 1e-3, 0.1, 0.1) == pytest.approx(1e-4)
    assert budget_lr(2.0, 1e-3, 0.1, 0.0) == pytest.approx(0.0)


def test_learning_rate_dispatch():
    cfg = TrainConfig(lr_schedule="budget", max_time=100.0, peak_lr=1e-3, warmup_fraction=0.2)
    assert learning_rate(cfg, 512, step=7, progress=0.1) == pytest.approx(5e-4)
    cfg = TrainConfig(lr_schedule="noam", warmup_steps=4000)
    assert math.isclose(learning_rate(cfg, 512, 4000), noam_lr(4000, 512, 4000))


def test_cosine_is_the_budget_shape_over_max_steps():
    cfg = TrainConfig(lr_schedule="cosine", max_steps=100, peak_lr=1e-3, warmup_fraction=0.1)
    assert learning_rate(cfg, 512, step=6, progress=0.9) == pytest.approx(5e-4)  # progress (time) is ignored
    assert learning_rate(cfg, 512, step=11) == pytest.approx(1e-3)
    assert learning_rate(cfg, 512, step=56) == pytest.approx(5e-4)
    assert learning_rate(cfg, 512, step=101) == pytest.approx(0.0)


def test_cosine_needs_max_steps():
    from rpr_mt.config import config_from_dict
    from rpr_mt.errors import UserError

    with pytest.raises(UserError, match="'cosine' needs train.max_steps"):
        config_from_dict({"train": {"lr_schedule": "cosine", "max_steps": None, "max_time": 60}})
