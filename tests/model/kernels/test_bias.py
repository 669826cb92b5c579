"""The float logit bias of every kernel path (what T5, ALiBi and Transformer-XL add) against the float64 loop
reference: outputs and gradients, the bias's own gradient reduced to its broadcast shape included."""

from __future__ import annotations

import pytest
import torch

from rpr_mt.model.kernels import c_library
from rpr_mt.model.kernels import relative_attention
from rpr_mt.model.kernels.geometry import relative_position_index
from rpr_mt.model.kernels.native import relative_rows_forward

from ..reference import reference_attention
from ..test_attention import make_inputs, make_mask

F64 = torch.float64
BIAS_SHAPES = {"per-head [H,Lq,Lk]": lambda b, h, q, k: (h, q, k), "per-key [B,H,1,Lk]": lambda b, h, q, k: (b, h, 1, k),
               "full [B,H,Lq,Lk]": lambda b, h, q, k: (b, h, q, k)}
IMPLS = ["native", "fused", "gather", "sdpa"]


def run_impl(impl, inputs, clip, **kwargs):
    if impl == "native":
        if c_library._compiler() is None:
            pytest.skip("no C compiler")
        inputs = [None if t is None else t.detach().float().requires_grad_() for t in inputs]
        kwargs["bias"] = kwargs["bias"].detach().float().requires_grad_()
    out = relative_attention(*inputs, clip=clip, impl=impl, **kwargs)
    live = [t for t in inputs if t is not None] + [kwargs["bias"]]
    gen = torch.Generator().manual_seed(5)
    grad_out = torch.randn(out.shape, dtype=F64, generator=gen).to(out.dtype)
    return [out] + list(torch.autograd.grad(out, live, grad_out))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", list(BIAS_SHAPES), ids=list(BIAS_SHAPES))
@pytest.mark.parametrize("tables", [True, False], ids=["shaw", "content"])
def test_bias_matches_reference(impl, shape, tables):
    if impl == "sdpa" and tables:
        pytest.skip("sdpa computes content attention only")
    batch, heads, q_len, k_len, dim, clip, offset = 2, 3, 9, 11, 4, 2, 2
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip, True, tables, tables, seed=1)
    if not tables:
        inputs = list(inputs[:3]) + [None, None]
    gen = torch.Generator().manual_seed(3)
    bias = (torch.randn(BIAS_SHAPES[shape](batch, heads, q_len, k_len), dtype=F64, generator=gen) * 2).requires_grad_()
    mask = make_mask("dead", batch, heads, q_len, k_len, offset)
    expected = run_reference(inputs, clip if tables else 0, mask, offset, bias)
    actual = run_impl(impl, inputs, clip if tables else None, attn_mask=mask, offset=offset, bias=bias)
    tol = 2e-5 if impl == "native" else 1e-7
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.double(), e, atol=tol, rtol=tol)


def run_reference(inputs, clip, mask, offset, bias):
    out = reference_attention(*inputs, clip, mask, offset, bias=bias)
    live = [t for t in inputs if t is not None] + [bias]
    gen = torch.Generator().manual_seed(5)
    return [out] + list(torch.autograd.grad(out, live, torch.randn(out.shape, dtype=F64, generator=gen)))


@pytest.mark.parametrize("impl", ["native", "fused", "gather"])
@pytest.mark.parametrize("shared", [False, True], ids=["per-head", "shared"])
@pytest.mark.parametrize("clip", [2, 30], ids=["clipped", "beyond-reach"])
@pytest.mark.parametrize("tables", ["k", "kv", "none"])
def test_bucket_bias_matches_its_spread_as_a_bias(impl, shared, clip, tables):
    """bucket_bias[r_ij] (Transformer-XL's v . W_R R) equals the same values spread to a [H, Lq, Lk] bias: on the
    native path with rel_k it is added to the table products, elsewhere spread; outputs and every gradient."""
    batch, heads, q_len, k_len, dim, offset = 2, 3, 9, 11, 4, 2
    inputs = list(make_inputs(batch, heads, q_len, k_len, dim, clip, True, tables != "none", tables == "kv", seed=1))
    gen = torch.Generator().manual_seed(4)
    bucket = torch.randn((2 * clip + 1,) if shared else (heads, 2 * clip + 1), dtype=F64, generator=gen)
    mask = make_mask("dead", batch, heads, q_len, k_len, offset)
    bucket_ref = bucket.clone().requires_grad_()
    spread = bucket_ref[..., relative_position_index(q_len, k_len, clip, offset)]
    out = reference_attention(*inputs, clip, mask, offset, bias=spread)
    live = [t for t in inputs if t is not None] + [bucket_ref]
    grad_out = torch.randn(out.shape, dtype=F64, generator=gen)
    expected = [out, *torch.autograd.grad(out, live, grad_out)]

    if impl == "native":
        if c_library._compiler() is None:
            pytest.skip("no C compiler")
        inputs = [None if t is None else t.detach().float().requires_grad_() for t in inputs]
        bucket = bucket.float()
    bucket.requires_grad_()
    actual = relative_attention(*inputs, clip=clip, impl=impl, attn_mask=mask, offset=offset, bucket_bias=bucket)
    live = [t for t in inputs if t is not None] + [bucket]
    actual = [actual, *torch.autograd.grad(actual, live, grad_out.to(actual.dtype))]
    tol = 2e-5 if impl == "native" else 1e-7
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.double(), e, atol=tol, rtol=tol)


def test_bucket_bias_shape_is_checked():
    q = k = v = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="bucket_bias must be"):
        relative_attention(q, k, v, None, None, clip=1, bucket_bias=torch.zeros(4))
    with pytest.raises(ValueError, match="clip must be"):
        relative_attention(q, k, v, None, None, clip=None, bucket_bias=torch.zeros(3))


@pytest.mark.parametrize("masked", [False, True])
def test_infinities_and_nan_keep_their_ieee_meaning_in_the_c_kernel(masked: bool):
    """Built without finite-math-only: a -inf bias gives probability exactly 0 and a NaN logit makes its row NaN,
    as in torch.softmax; other rows are untouched. Rows of 37 keys put the special values both in the vectorized
    body of the row loops (the max reduction, expf) and in their scalar tails."""
    if c_library._compiler() is None:
        pytest.skip("no C compiler")
    scores = torch.randn(1, 1, 6, 37)
    bias = torch.zeros(1, 1, 6, 37)
    bias[0, 0, 0, 1] = bias[0, 0, 0, 36] = float("-inf")  # vector body and tail
    bias[0, 0, 1, :36] = float("-inf")  # only the last key is left
    scores[0, 0, 2, 3] = float("nan")
    scores[0, 0, 3, 36] = float("nan")
    scores[0, 0, 4, 20] = 1e30  # a huge finite logit: the max must see it
    mask = torch.ones(1, 1, 6, 37, dtype=torch.uint8)
    if masked:
        mask[0, 0, 5, ::2] = 0  # and for the masked branch, masked keys: probability 0
    expected = torch.softmax((scores + bias).masked_fill(mask == 0, float("-inf")), -1)
    relative_rows_forward(scores, None, mask if masked else None, None, bias, None, None, 0, 0, 1.0)
    assert scores[0, 0, 0, 1] == 0 and scores[0, 0, 0, 36] == 0
    assert torch.isnan(scores[0, 0, 2]).all() and torch.isnan(scores[0, 0, 3]).all()
    for row in (0, 1, 4, 5):
        torch.testing.assert_close(scores[0, 0, row], expected[0, 0, row])
    if masked:
        assert (scores[0, 0, 5, ::2] == 0).all()


def test_custom_ops_check_their_operands():
    if c_library._compiler() is None:
        pytest.skip("no C compiler")
    scores = torch.randn(2, 3, 4, 5)
    with pytest.raises(ValueError, match="key_buckets must have shape"):
        torch.ops.rpr_mt.relative_rows_forward(scores, torch.randn(2, 3, 4, 4), None, None, None, None, None, 2, 0, 1.0)
    with pytest.raises(ValueError, match="bias must be a torch.float32"):
        torch.ops.rpr_mt.relative_rows_forward(scores, None, None, None, torch.randn(5, dtype=F64).expand(2, 3, 4, 5),
                                               None, None, 0, 0, 1.0)
    with pytest.raises(ValueError, match="contiguous columns"):
        torch.ops.rpr_mt.relative_rows_forward(torch.randn(2, 3, 5, 4).transpose(-1, -2), None, None, None, None, None,
                                               None, 0, 0, 1.0)
    with pytest.raises(ValueError, match="mask must have shape"):
        torch.ops.rpr_mt.relative_rows_forward(scores, None, torch.ones(2, 3, 4, 4, dtype=torch.uint8), None, None,
                                               None, None, 0, 0, 1.0)
    with pytest.raises(ValueError, match="probs must have shape"):
        torch.ops.rpr_mt.relative_rows_backward(scores, None, torch.randn(2, 3, 4, 6), None, None, None, 0, 0, 1.0)


def test_custom_op_is_visible_to_the_profiler():
    if c_library._compiler() is None:
        pytest.skip("no C compiler")
    inputs = [t.detach().float().requires_grad_() for t in make_inputs(2, 2, 8, 8, 4, 2, True, True, True)]
    with torch.profiler.profile() as prof:
        relative_attention(*inputs, clip=2, impl="native").sum().backward()
    names = {event.key for event in prof.key_averages()}
    assert {"rpr_mt::relative_rows_forward", "rpr_mt::relative_rows_backward"} <= names
