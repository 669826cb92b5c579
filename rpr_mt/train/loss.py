"""Label-smoothed cross entropy (Szegedy et al., 2016), as used by Vaswani et al. (2017) and Shaw et al. (2018)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from rpr_mt.model.transformer import Seq2Seq


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """The loss and its gradient in closed form: the backward writes one [N, V] tensor, the gradient itself.

    The gradient of a * loss + b * nll with respect to the logits is (a + b) * softmax - (a * (1 - eps) + b) *
    onehot(gold) - a * eps / V: the exp of the saved log-probabilities, scaled and shifted in place, and a scatter
    into the gold column. Autograd through log_softmax, gather and mean wrote four [N, V] tensors in its backward
    (the mean's expanded division, the gather's zero-filled scatter, their sum, log_softmax's backward), about a
    quarter of a training update of a d_model 128 model with an 8,000-piece vocabulary on a CPU
    (benchmarks/bench_loss.py compares the two).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        lprobs = torch.log_softmax(logits, dim=-1)  # [N, V]
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [N]
        smooth = -lprobs.mean(dim=-1)  # [N]
        ctx.save_for_backward(lprobs, target)
        ctx.epsilon = epsilon
        return ((1.0 - epsilon) * nll + epsilon * smooth).sum(), nll.sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        lprobs, target = ctx.saved_tensors
        eps, vocab = ctx.epsilon, lprobs.shape[-1]
        zero = torch.zeros((), dtype=lprobs.dtype, device=lprobs.device)
        grad_loss = zero if grad_loss is None else grad_loss
        grad_nll = zero if grad_nll is None else grad_nll
        grad = lprobs.exp()  # softmax
        grad.mul_(grad_loss + grad_nll).sub_(grad_loss * (eps / vocab))
        gold = (grad_loss * (1.0 - eps) + grad_nll).expand(target.shape[0], 1)
        grad.scatter_add_(-1, target.unsqueeze(-1), -gold)
        return grad, None, None


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
