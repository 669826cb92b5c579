"""The optimizer: Adam as in the paper (beta 0.9, 0.98, epsilon 1e-9), or AdamW when ``train.weight_decay`` > 0.

Decoupled weight decay (Loshchilov & Hutter 2019) applies to weight matrices only: not to biases and layer norms
(1-d parameters) and not to position parameters (Shaw tables, T5 bias tables, Transformer-XL's W_R, u and v,
learned absolute positions), whose pull towards zero would be a pull towards "no order information". With
``weight_decay`` 0 the optimizer is plain Adam in one parameter group, as before, so older runs resume unchanged.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from rpr_mt.config import TrainConfig

__all__ = ["build_optimizer", "decays"]


def decays(name: str, param: nn.Parameter) -> bool:
    """Whether weight decay applies to the parameter ``name`` of the model."""
    is_position = name.startswith("positions.") or ".positions." in name
    return param.dim() >= 2 and not is_position


def build_optimizer(model: nn.Module, t: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """Adam (weight_decay 0) or AdamW with decay on the parameters ``decays`` picks; the learning rate is set by the
    schedule before every update."""
    fused = {"fused": True} if _fused_ok(device) else {}
    if t.weight_decay == 0:
        return torch.optim.Adam(model.parameters(), lr=1e-7, betas=t.adam_betas, eps=t.adam_eps, **fused)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if decays(n, p)], "weight_decay": t.weight_decay},
        {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=1e-7, betas=t.adam_betas, eps=t.adam_eps, **fused)


def _fused_ok(device: torch.device) -> bool:
    """Fused Adam exists for CPU and CUDA in recent torch; it is one kernel per step instead of several."""
    return "fused" in inspect.signature(torch.optim.Adam).parameters and device.type in ("cpu", "cuda")
