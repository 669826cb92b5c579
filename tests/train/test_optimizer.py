"""Weight decay: decoupled (AdamW), on weight matrices only; plain Adam without it."""

from __future__ import annotations

import torch

from rpr_mt.config import TrainConfig, config_from_dict
from rpr_mt.model.transformer import Seq2Seq
from rpr_mt.train.optimizer import build_optimizer


def model(positions: str) -> Seq2Seq:
    cfg = config_from_dict({"model": dict(d_model=16, n_heads=2, encoder_layers=1, decoder_layers=1, ff_dim=32,
                                          positions=positions, absolute_kind="learned")}).model
    return Seq2Seq(cfg, 30)


def test_decay_shrinks_weight_matrices_only():
    for positions in ("absolute+relative", "t5", "xl"):
        m = model(positions)
        optimizer = build_optimizer(m, TrainConfig(weight_decay=0.1), torch.device("cpu"))
        assert isinstance(optimizer, torch.optim.AdamW)
        before = {n: p.detach().clone() for n, p in m.named_parameters()}
        for p in m.parameters():
            p.grad = torch.zeros_like(p)  # Adam's own step is then 0: only the decay moves a parameter
        for group in optimizer.param_groups:
            group["lr"] = 1.0
        optimizer.step()
        for name, p in m.named_parameters():
            shrunk = p.dim() >= 2 and "positions." not in name
            expected = before[name] * (0.9 if shrunk else 1.0)
            torch.testing.assert_close(p.detach(), expected, msg=f"{positions}: {name}")
        names = {n for n, p in m.named_parameters() if p.dim() >= 2 and "positions." in n}
        assert names, positions  # the position parameters really were among them


def test_no_decay_is_plain_adam_in_one_group():
    optimizer = build_optimizer(model("relative"), TrainConfig(), torch.device("cpu"))
    assert type(optimizer) is torch.optim.Adam and len(optimizer.param_groups) == 1
    assert optimizer.param_groups[0]["weight_decay"] == 0
