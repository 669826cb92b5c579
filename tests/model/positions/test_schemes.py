"""Each position scheme's attention against a slow float64 loop written from its paper, outputs and gradients
(scheme parameters included), plus the pure functions (T5 buckets, ALiBi slopes, rotation) on known values."""

from __future__ import annotations

import math

import pytest
import torch

from rpr_mt.config import config_from_dict
from rpr_mt.model.masks import causal_mask
from rpr_mt.model.positions.alibi import alibi_slopes
from rpr_mt.model.positions.build import build_position_scheme
from rpr_mt.model.positions.t5 import t5_relative_bucket
from rpr_mt.model.positions.rope import rotate

F64 = torch.float64
B, H, D = 2, 2, 4  # batch, heads, head dim


def scheme(positions: str, **model):
    cfg = config_from_dict({"model": dict(d_model=H * D, n_heads=H, positions=positions, **model)}).model
    torch.manual_seed(0)
    built = build_position_scheme(cfg).double()
    with torch.no_grad():  # parameters that start at zero must matter
        for param in built.parameters():
            param.normal_(0.0, 0.7)
    return built


def qkv(q_len, k_len, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, dtype=F64, generator=gen).requires_grad_() for n in (q_len, k_len, k_len)]


def loop_attention(q, k, v, logit, mask=None):
    """z_i = sum_j softmax_j(logit(b, h, i, j)) v_j over the allowed keys, with Python loops."""
    out = torch.zeros_like(q)
    rows = []
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                allowed = [j for j in range(k.shape[2]) if mask is None or bool(mask[i, j])]
                e = torch.stack([logit(b, h, i, j) for j in allowed])
                alpha = torch.softmax(e, 0)
                rows.append(((b, h, i), sum(a * v[b, h, j] for a, j in zip(alpha, allowed))))
    for index, z in rows:
        out = out.index_put(tuple(torch.tensor([x]) for x in index), z[None])
    return out


def check(layer, q, k, v, logit, offset, mask, extra_params=()):
    actual = layer.attend(q, k, v, attn_mask=mask, offset=offset, dropout_p=0.0)
    expected = loop_attention(q, k, v, logit, mask)
    torch.testing.assert_close(actual, expected)
    params = [q, k, v, *extra_params]
    gen = torch.Generator().manual_seed(9)
    grad_out = torch.randn(actual.shape, dtype=F64, generator=gen)
    for a, e in zip(torch.autograd.grad(actual, params, grad_out), torch.autograd.grad(expected, params, grad_out)):
        torch.testing.assert_close(a, e)


def dot(a, b):
    return (a * b).sum()


# ------------------------------------------------------------------------------------------------------------------
# T5
# ------------------------------------------------------------------------------------------------------------------


def t5_bucket_loop(rp: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Raffel et al.'s bucketing, one position at a time."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if rp > 0:
            bucket += num_buckets
        n = abs(rp)
    else:
        n = max(-rp, 0)
    exact = num_buckets // 2
    if n < exact:
        return bucket + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return bucket + min(large, num_buckets - 1)


def test_t5_buckets_known_values_and_loop():
    rp = torch.tensor([0, -1, -7, -8, -9, -20, -128, -500, 1, 8, 200])
    assert t5_relative_bucket(rp).tolist() == [0, 1, 7, 8, 8, 10, 15, 15, 17, 24, 31]
    assert t5_relative_bucket(rp, bidirectional=False).tolist() == [0, 1, 7, 8, 9, 17, 31, 31, 0, 0, 0]
    span = torch.arange(-300, 301)
    for bidirectional, nb, md in [(True, 32, 128), (False, 32, 128), (True, 8, 6), (False, 16, 20)]:
        expected = [t5_bucket_loop(int(r), bidirectional, nb, md) for r in span]
        assert t5_relative_bucket(span, bidirectional, nb, md).tolist() == expected


@pytest.mark.parametrize("stack, offset", [("encoder", 0), ("decoder", 0), ("decoder", 3)])
def test_t5_matches_loop(stack, offset):
    positions = scheme("t5", t5={"num_buckets": 8, "max_distance": 6})
    layer = positions.self_attention(stack, 0).double()
    table = (positions.encoder_table if stack == "encoder" else positions.decoder_table).weight
    q, k, v = qkv(5, 5 + offset)
    mask = causal_mask(5, 5 + offset, offset) if stack == "decoder" else None

    def logit(b, h, i, j):
        bucket = t5_bucket_loop(j - (i + offset), stack == "encoder", 8, 6)
        return dot(q[b, h, i], k[b, h, j]) / math.sqrt(D) + table[bucket, h]

    check(layer, q, k, v, logit, offset, mask, [table])


def test_t5_table_shared_by_the_stack_or_per_layer():
    shared = scheme("t5")
    assert shared.self_attention("encoder", 0)._shared[0] is shared.self_attention("encoder", 1)._shared[0]
    assert sum(p.numel() for p in shared.parameters()) == 2 * 32 * H
    per_layer = scheme("t5", t5={"per_layer": True})
    assert per_layer.encoder_table is None and per_layer.self_attention("encoder", 0).table.weight.shape == (32, H)


# ------------------------------------------------------------------------------------------------------------------
# ALiBi
# ------------------------------------------------------------------------------------------------------------------


def test_alibi_slopes_as_in_the_paper():
    assert alibi_slopes(8).tolist() == [2.0**-e for e in range(1, 9)]
    assert alibi_slopes(6).tolist() == [2.0**-e for e in (2, 4, 6, 8, 1, 3)]  # 4 heads' slopes, then every other of 8


@pytest.mark.parametrize("stack, offset", [("encoder", 0), ("decoder", 0), ("decoder", 4)])
def test_alibi_matches_loop(stack, offset):
    layer = scheme("alibi").self_attention(stack, 0)
    q, k, v = qkv(5, 5 + offset)
    mask = causal_mask(5, 5 + offset, offset) if stack == "decoder" else None
    slopes = [2.0**-4, 2.0**-8]  # two heads

    def logit(b, h, i, j):
        return dot(q[b, h, i], k[b, h, j]) / math.sqrt(D) - slopes[h] * abs(i + offset - j)

    check(layer, q, k, v, logit, offset, mask)


# ------------------------------------------------------------------------------------------------------------------
# RoPE
# ------------------------------------------------------------------------------------------------------------------


def rotate_loop(x, pos, base):
    """One vector, dimension pairs (m, m + d/2) turned by pos * base^(-2m/d)."""
    d = x.shape[-1]
    out = x.clone()
    for m in range(d // 2):
        angle = pos * base ** (-2 * m / d)
        a, b = x[m], x[m + d // 2]
        out = out.index_put((torch.tensor([m]),), (a * math.cos(angle) - b * math.sin(angle))[None])
        out = out.index_put((torch.tensor([m + d // 2]),), (a * math.sin(angle) + b * math.cos(angle))[None])
    return out


@pytest.mark.parametrize("stack, offset, rotated", [("encoder", 0, True), ("decoder", 2, True),
                                                    ("encoder", 0, False), ("decoder", 2, False)])
def test_rope_matches_loop(stack, offset, rotated):
    """rotated: the layer turned q and k (as with a cache), or attend does it (a whole sequence)."""
    layer = scheme("rope", rope={"base": 100.0}).self_attention(stack, 0)
    q, k, v = qkv(4, 4 + offset)
    mask = causal_mask(4, 4 + offset, offset) if stack == "decoder" else None
    rq, rk = (layer.rotate(q, offset), layer.rotate(k, 0)) if rotated else (q, k)  # queries at offset.., keys from 0

    def logit(b, h, i, j):
        return dot(rotate_loop(q[b, h, i], i + offset, 100.0), rotate_loop(k[b, h, j], j, 100.0)) / math.sqrt(D)

    actual = layer.attend(rq, rk, v, attn_mask=mask, offset=offset, dropout_p=0.0, rotated=rotated)
    expected = loop_attention(q, k, v, logit, mask)
    torch.testing.assert_close(actual, expected)
    for a, e in zip(torch.autograd.grad(actual.square().sum(), [q, k, v]),
                    torch.autograd.grad(expected.square().sum(), [q, k, v])):
        torch.testing.assert_close(a, e)


def test_rope_logits_depend_only_on_the_distance():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 8, dtype=F64, generator=gen)
    logits = [dot(rotate(q[None], torch.tensor([i])), rotate(k[None], torch.tensor([i - 3]))) for i in (3, 10, 500)]
    torch.testing.assert_close(logits[1], logits[0])
    torch.testing.assert_close(logits[2], logits[0])


# ------------------------------------------------------------------------------------------------------------------
# Transformer-XL
# ------------------------------------------------------------------------------------------------------------------


def sinusoid_loop(distance: float, dim: int) -> torch.Tensor:
    return torch.tensor([math.sin(distance / 10000 ** (m / dim)) if m % 2 == 0 else
                         math.cos(distance / 10000 ** ((m - 1) / dim)) for m in range(dim)], dtype=F64)


@pytest.mark.parametrize("stack, offset, clip", [("encoder", 0, None), ("encoder", 0, 2), ("decoder", 3, None),
                                                 ("decoder", 0, 1)])
def test_xl_matches_loop(stack, offset, clip):
    positions = scheme("xl", xl={"clip": clip})
    layer = positions.self_attention(stack, 0).double()
    biases = positions.encoder_biases if stack == "encoder" else positions.decoder_biases
    u, pos_bias, w_r = biases.u, biases.v, layer.proj.weight
    q, k, v = qkv(5, 5 + offset)
    mask = causal_mask(5, 5 + offset, offset) if stack == "decoder" else None

    def logit(b, h, i, j):
        distance = i + offset - j  # Dai et al.'s i - j
        if clip is not None:
            distance = max(-clip, min(clip, distance))
        position = (w_r @ sinusoid_loop(distance, H * D)).view(H, D)[h]  # W_R R_{i-j}, head h
        a_c = dot(q[b, h, i] + u[h], k[b, h, j])  # (a) + (c)
        b_d = dot(q[b, h, i] + pos_bias[h], position)  # (b) + (d)
        return (a_c + b_d) / math.sqrt(D)

    check(layer, q, k, v, logit, offset, mask, [u, pos_bias, w_r])


def test_xl_biases_shared_by_the_stack_or_per_layer():
    shared = scheme("xl")
    assert shared.self_attention("decoder", 0)._shared[0] is shared.decoder_biases
    per_layer = scheme("xl", xl={"per_layer_biases": True})
    assert per_layer.encoder_biases is None and per_layer.self_attention("encoder", 0).biases.u.shape == (H, D)


# ------------------------------------------------------------------------------------------------------------------
# The schemes without attention terms
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("positions", ["none", "absolute"])
def test_schemes_without_attention_terms_are_content_only(positions):
    layer = scheme(positions).self_attention("encoder", 0)
    q, k, v = qkv(4, 4)
    check(layer, q, k, v, lambda b, h, i, j: dot(q[b, h, i], k[b, h, j]) / math.sqrt(D), 0, None)
