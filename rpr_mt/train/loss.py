"""Label-smoothed cross entropy (Szegedy et al., 2016), as used by Vaswani et al. (2017) and Shaw et al. (2018)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from rpr_mt.model.transformer import Seq2Seq


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """The loss and its gradient in closed form, so that autograd keeps no [N, V] log-probabilities.

    With lse = logsumexp(x): nll = lse - x[gold] and the smoothing term mean_v(-log p_v) = lse - mean_v(x), so the
    forward pass reads the logits without writing an [N, V] tensor of log-probabilities; the gradient of
    a * loss + b * nll is (a + b) * softmax(x) - (a * (1 - eps) + b) * onehot(gold) - a * eps / V, one [N, V] tensor
    written once. Autograd through log_softmax, gather and mean wrote four such tensors and read them back (about a
    quarter of a training update of a d_model 128 model with an 8,000-piece vocabulary on a CPU). The log-sum-exp
    runs over blocks of rows, so that its temporaries stay in cache instead of being fresh [N, V] allocations.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        lse = torch.cat([torch.logsumexp(logits[rows], dim=-1) for rows in _row_blocks(logits)])  # [N]
        nll = lse - logits.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [N]
        smooth = lse - logits.mean(dim=-1)  # [N]
        ctx.save_for_backward(logits, target, lse)
        ctx.epsilon = epsilon
        return ((1.0 - epsilon) * nll + epsilon * smooth).sum(), nll.sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        logits, target, lse = ctx.saved_tensors
        eps, vocab = ctx.epsilon, logits.shape[-1]
        grad_loss = torch.zeros((), dtype=logits.dtype, device=logits.device) if grad_loss is None else grad_loss
        grad_nll = torch.zeros((), dtype=logits.dtype, device=logits.device) if grad_nll is None else grad_nll
        grad = torch.empty_like(logits)
        for rows in _row_blocks(logits):  # softmax, written once
            torch.sub(logits[rows], lse[rows].unsqueeze(-1), out=grad[rows]).exp_()
        grad.mul_(grad_loss + grad_nll).sub_(grad_loss * (eps / vocab))
        gold = (grad_loss * (1.0 - eps) + grad_nll).expand(target.shape[0], 1)
        grad.scatter_add_(-1, target.unsqueeze(-1), -gold)
        return grad, None, None


def _row_blocks(x: Tensor, elements: int = 1 << 19) -> list[slice]:
    """Slices of the rows of ``x`` [N, V], about ``elements`` elements (2 MiB of float32) each."""
    step = max(1, elements // max(1, x.shape[-1]))
    return [slice(i, i + step) for i in range(0, x.shape[0], step)]


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and summed NLL over the rows of ``logits`` [N, V] with gold ``target`` [N].

    The smoothed target puts 1 - epsilon on the gold token and spreads epsilon uniformly over the vocabulary
    (fairseq's formulation): loss = (1 - eps) * nll + eps * mean_v(-log p_v). Callers pass only non-pad rows, so
    padding costs neither the log-softmax nor the loss. Half-precision logits (autocast) are computed in float32, and
    their gradient returns in their own dtype; float32 and float64 stay as they are.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    with torch.autocast(logits.device.type, enabled=False):
        loss, nll = _LabelSmoothedCrossEntropy.apply(logits, target, float(epsilon))
    return loss, nll


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
