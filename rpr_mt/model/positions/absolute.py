"""Absolute positions (Vaswani et al. 2017, Section 3.5): sinusoids or a learned table added to the embeddings."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["AbsoluteEncoding", "sinusoidal_positions", "sinusoids"]


def sinusoids(positions: Tensor, dim: int) -> Tensor:
    """Sinusoidal encodings [len(positions), dim] in float64 of any (also negative or fractional) positions:

        PE[pos, 2m]     = sin(pos / 10000^(2m / dim))
        PE[pos, 2m + 1] = cos(pos / 10000^(2m / dim))

    sines on the even dimensions and cosines on the odd ones, interleaved exactly as in the paper's formula
    (tensor2tensor and fairseq concatenate the two halves instead; the information is the same up to a fixed
    permutation of dimensions). For odd ``dim`` the last dimension is a sine."""
    pos = positions.to(torch.float64)[:, None]  # [L, 1]
    two_m = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device)  # [ceil(dim/2)]
    angles = pos * torch.exp(two_m * (-math.log(10000.0) / max(dim, 1)))[None, :]  # pos / 10000^(2m/dim)
    table = torch.empty(len(positions), dim, dtype=torch.float64, device=positions.device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return table


def sinusoidal_positions(
    length: int,
    dim: int,
    offset: int = 0,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Sinusoidal absolute position encodings [length, dim] of positions offset .. offset + length - 1 (see
    ``sinusoids``), computed in float64 and then cast, so that large positions keep full precision."""
    if length < 0 or dim < 0 or offset < 0:
        raise ValueError(f"length, dim and offset must be >= 0, got {length}, {dim}, {offset}")
    return sinusoids(torch.arange(offset, offset + length, device=device), dim).to(dtype)


class AbsoluteEncoding(nn.Module):
    """Adds the vector of each position to the scaled embeddings: sinusoids (a buffer, not saved) or a learned
    [max_positions, d_model] table initialised N(0, d_model^-0.5) like the token embeddings."""

    def __init__(self, max_positions: int, d_model: int, kind: str) -> None:
        super().__init__()
        self.learned: nn.Embedding | None = None
        if kind == "learned":
            self.learned = nn.Embedding(max_positions, d_model)
            nn.init.normal_(self.learned.weight, std=d_model**-0.5)
        else:
            self.register_buffer("sinusoid", sinusoidal_positions(max_positions, d_model), persistent=False)

    def forward(self, x: Tensor, offset: int) -> Tensor:
        """x [B, L, d_model] at positions offset .. offset + L - 1."""
        length = x.size(1)
        if self.learned is not None:
            return x + self.learned.weight[offset : offset + length]
        return x + self.sinusoid[offset : offset + length].to(x.dtype)
