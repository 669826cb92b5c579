"""Label-smoothed cross entropy (Szegedy et al., 2016), as used by Vaswani et al. (2017) and Shaw et al. (2018)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from rpr_mt.model.transformer import Seq2Seq


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and summed NLL over the rows of ``logits`` [N, V] with gold ``target`` [N].

    The smoothed target puts 1 - epsilon on the gold token and spreads epsilon uniformly over the vocabulary
    (fairseq's formulation): loss = (1 - eps) * nll + eps * mean_v(-log p_v). Callers pass only non-pad rows, so
    padding costs neither the log-softmax nor the loss. The log-softmax runs in float32 even under autocast.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1)  # [N, V]
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [N]
    smooth = -lprobs.mean(dim=-1)  # [N]
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    return loss.sum(), nll.sum()


class TranslationLoss(nn.Module):
    """Model + label-smoothed loss in one module, so DistributedDataParallel wraps the whole forward."""

    def __init__(self, model: Seq2Seq, label_smoothing: float) -> None:
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        hidden = self.model.decode_hidden(tgt_in, self.model.encode(src))  # [B, T, D]
        keep = tgt_out.ne(self.model.pad_id)
        # Project only non-pad positions: padding then costs neither the vocabulary matmul nor the log-softmax.
        logits = self.model.output_logits(hidden[keep])  # [N, V]
        return label_smoothed_nll(logits, tgt_out[keep], self.label_smoothing)
