"""Label-smoothed cross entropy against a direct computation of the smoothed target distribution."""

import torch

from rpr_mt.train.loss import label_smoothed_nll


def test_matches_explicit_smoothed_distribution():
    torch.manual_seed(0)
    logits = torch.randn(7, 11, dtype=torch.float64)
    target = torch.randint(0, 11, (7,))
    eps = 0.1
    q = torch.full((7, 11), eps / 11, dtype=torch.float64)
    q[torch.arange(7), target] += 1 - eps
    expected = -(q * torch.log_softmax(logits, -1)).sum()
    loss, nll = label_smoothed_nll(logits, target, eps)
    assert torch.allclose(loss.double(), expected)
    assert torch.allclose(nll.double(), torch.nn.functional.cross_entropy(logits, target, reduction="sum"))


def test_no_smoothing_is_cross_entropy_and_bf16_logits_are_upcast():
    logits = torch.randn(5, 9).bfloat16()
    target = torch.randint(0, 9, (5,))
    loss, nll = label_smoothed_nll(logits, target, 0.0)
    assert loss.dtype == torch.float32 and torch.allclose(loss, nll)


def _reference(logits, target, eps):
    """The textbook computation through autograd: log-softmax, gather, mean."""
    lprobs = torch.log_softmax(logits, dim=-1)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return ((1 - eps) * nll + eps * -lprobs.mean(-1)).sum(), nll.sum()


def test_gradient_equals_autograd_through_log_softmax_for_loss_nll_and_both():
    """The closed-form backward against autograd of the reference, for any mix of the two outputs' gradients."""
    torch.manual_seed(0)
    for eps in (0.0, 0.1, 0.3):
        for weights in ((1.0, 0.0), (0.0, 1.0), (0.7, -0.2)):
            logits = torch.randn(13, 17, dtype=torch.float64, requires_grad=True)
            target = torch.randint(0, 17, (13,))
            target[:3] = target[3]  # repeated gold tokens: scatter_add must add, not overwrite
            loss, nll = label_smoothed_nll(logits, target, eps)
            (weights[0] * loss + weights[1] * nll).backward()
            fused = logits.grad.clone()
            logits.grad = None
            ref_loss, ref_nll = _reference(logits, target, eps)
            (weights[0] * ref_loss + weights[1] * ref_nll).backward()
            assert torch.allclose(loss, ref_loss) and torch.allclose(nll, ref_nll)
            assert torch.allclose(fused, logits.grad, atol=1e-12)


def test_gradcheck_and_only_the_loss_used():
    torch.manual_seed(1)
    logits = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 5, 5, 2])
    assert torch.autograd.gradcheck(lambda x: label_smoothed_nll(x, target, 0.1), (logits,))
    assert torch.autograd.gradcheck(lambda x: label_smoothed_nll(x, target, 0.1)[0], (logits,))


def test_large_logits_do_not_overflow_and_half_precision_gradients_keep_their_dtype():
    logits = torch.tensor([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]], requires_grad=True)
    loss, nll = label_smoothed_nll(logits, torch.tensor([0, 2]), 0.1)
    assert torch.isfinite(loss) and torch.isfinite(nll)
    loss.backward()
    assert torch.isfinite(logits.grad).all()
    half = torch.randn(5, 9).bfloat16().requires_grad_()
    label_smoothed_nll(half, torch.randint(0, 9, (5,)), 0.1)[0].backward()
    assert half.grad.dtype == torch.bfloat16


def test_a_realistic_vocabulary_equals_the_reference():
    """Hundreds of rows over a vocabulary of thousands, as in training."""
    torch.manual_seed(2)
    logits = torch.randn(203, 6000, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 6000, (203,))
    loss, nll = label_smoothed_nll(logits, target, 0.1)
    loss.backward()
    fused = logits.grad.clone()
    logits.grad = None
    ref_loss, ref_nll = _reference(logits, target, 0.1)
    ref_loss.backward()
    assert torch.allclose(loss, ref_loss) and torch.allclose(nll, ref_nll)
    assert torch.allclose(fused, logits.grad, atol=1e-12)
