"""Relation-aware attention (Shaw et al., 2018) against a loop-based float64 reference, plus module behaviour."""

from __future__ import annotations

import itertools

import pytest
import torch

from rpr_mt.model.attention import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    fold,
    place,
    relative_attention,
)
from rpr_mt.model.dropout import drop_rate, keep_mask
from rpr_mt.model.masks import as_4d, prepare_mask
from rpr_mt.model.positions.shaw import ShawTables, relative_position_index

from .reference import reference_attention

F64 = torch.float64


def make_inputs(batch, heads, q_len, k_len, dim, clip, per_head, use_key, use_value, dtype=F64, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, dtype=dtype, generator=gen).requires_grad_()

    table = (heads, 2 * clip + 1, dim) if per_head else (2 * clip + 1, dim)
    return (
        rand(batch, heads, q_len, dim),
        rand(batch, heads, k_len, dim),
        rand(batch, heads, k_len, dim),
        rand(*table) if use_key else None,
        rand(*table) if use_value else None,
    )


def make_mask(kind, batch, heads, q_len, k_len, offset, seed=0):
    gen = torch.Generator().manual_seed(seed + 1)
    if kind is None:
        return None
    if kind == "causal":
        return causal_mask(q_len, k_len, offset)
    padding = torch.ones(batch, 1, 1, k_len, dtype=torch.bool)
    padding[0, ..., k_len - 2 :] = False  # key padding: the last two keys of row 0
    if kind == "padding":
        return padding
    if kind == "causal+padding":
        return causal_mask(q_len, k_len, offset) & padding
    if kind == "dead":  # padding plus one query row with nothing to attend to
        mask = padding.expand(batch, heads, q_len, k_len).clone()
        mask[-1, 0, 1] = False
        return mask
    if kind == "random":  # a full [B, H, Lq, Lk] mask, large enough to be converted chunk by chunk
        return torch.rand(batch, heads, q_len, k_len, generator=gen) < 0.6
    raise ValueError(kind)


def grads(out, inputs, seed=0):
    gen = torch.Generator().manual_seed(seed + 2)
    grad_out = torch.randn(out.shape, dtype=out.dtype, generator=gen)
    live = [t for t in inputs if t is not None]
    return [out.detach()] + list(torch.autograd.grad(out, live, grad_out))


# (batch, heads, Lq, Lk, d, clip, offset, mask)
CASES = [
    (2, 2, 5, 5, 4, 0, 0, None),  # k = 0: one vector
    (2, 2, 5, 5, 4, 1, 0, "padding"),
    (2, 2, 6, 6, 4, 3, 0, "causal"),
    (2, 2, 6, 6, 3, 3, 0, "causal+padding"),
    (1, 3, 4, 4, 3, 8, 0, None),  # clip >= length: nothing is clipped (runs on the table's middle rows)
    (1, 2, 1, 6, 4, 64, 5, "padding"),  # clip far above the longest distance, one cached query
    (2, 2, 6, 3, 4, 9, 0, "causal"),  # ... with Lq > Lk
    (2, 2, 3, 7, 4, 2, 4, "causal"),  # cached decoding: 3 new queries at positions 4..6
    (1, 2, 1, 6, 4, 3, 5, "padding"),  # one new query
    (2, 1, 4, 6, 4, 1, 0, None),  # Lq < Lk
    (2, 2, 6, 3, 4, 2, 0, None),  # Lq > Lk
    (2, 2, 5, 5, 8, 2, 0, "dead"),  # a fully masked row gives zeros; d > Lk
    (3, 2, 9, 9, 2, 2, 0, "random"),  # a full mask, converted chunk by chunk
    (2, 2, 4, 13, 3, 2, 9, "causal+padding"),  # interior diagonals: band rows and an edge row, with offset
]
CELLS = [  # (per_head, use_key, use_value)
    (per_head, use_key, use_value)
    for per_head, use_key, use_value in itertools.product((True, False), repeat=3)
    if use_key or use_value
]


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: f"{'head' if c[0] else 'shared'}-K{int(c[1])}V{int(c[2])}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}H{c[1]}q{c[2]}k{c[3]}c{c[5]}o{c[6]}-{c[7]}")
def test_matches_reference(case, cell):
    batch, heads, q_len, k_len, dim, clip, offset, mask_kind = case
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip, *cell)
    mask = make_mask(mask_kind, batch, heads, q_len, k_len, offset)
    expected = grads(reference_attention(*inputs, clip, mask, offset), inputs)
    runs = {
        "gather": dict(impl="gather"),
        "fused-saved": dict(impl="fused", save_probs=True),
        "fused-recomputed": dict(impl="fused", save_probs=False),
        # chunks of one [Lq, Lk] matrix (splitting the batch of a head), and of all batch rows of one head
        "fused-1-matrix-chunks": dict(impl="fused", chunk_bytes=1, save_probs=False),
        "fused-head-chunks": dict(impl="fused", chunk_bytes=batch * q_len * k_len * 8, save_probs=True),
        "auto": dict(),
    }
    for name, kwargs in runs.items():
        out = relative_attention(*inputs, clip=clip, attn_mask=mask, offset=offset, **kwargs)
        actual = grads(out, inputs)
        for what, a, e in zip(["out", "q", "k", "v", "rel_k", "rel_v"], actual, expected):
            torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6, msg=lambda m: f"{name} {what}: {m}")
    if mask_kind == "dead":
        assert out[-1, 0, 1].abs().max() == 0


@pytest.mark.parametrize("impl", ["fused-saved", "fused-recomputed", "gather"])
def test_dropout_matches_reference(impl):
    batch, heads, q_len, k_len, dim, clip, p = 2, 2, 5, 5, 4, 2, 0.3
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip, True, True, True)
    mask = causal_mask(q_len, k_len)
    torch.manual_seed(123)
    kwargs = {"impl": "gather"} if impl == "gather" else {"impl": "fused", "save_probs": impl == "fused-saved"}
    out = relative_attention(*inputs, clip=clip, attn_mask=mask, dropout_p=p, chunk_bytes=1, **kwargs)
    # relative_attention draws its keep mask first thing from the global generator: replay it.
    torch.manual_seed(123)
    keep = keep_mask((batch, heads, q_len, k_len), p)
    assert 0 < keep.sum() < keep.numel()
    expected = grads(reference_attention(*inputs, clip, mask, 0, keep, drop_rate(p)), inputs)
    for a, e in zip(grads(out, inputs), expected):
        torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6)


def test_gradcheck_fused_function():
    inputs = make_inputs(1, 2, 3, 4, 2, 1, True, True, True, seed=3)
    mask = torch.tensor([[True, True, False, False], [False, False, False, False], [True, True, True, False]])

    for save_probs in (True, False):

        def fn(*xs):
            return relative_attention(
                *xs, clip=1, attn_mask=mask, offset=1, impl="fused", chunk_bytes=1, save_probs=save_probs
            )

        assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7)
    shared = make_inputs(2, 1, 3, 3, 2, 2, False, True, True, seed=4)
    assert torch.autograd.gradcheck(lambda *xs: relative_attention(*xs, clip=2, impl="fused"), shared)


def test_place_and_fold_are_adjoint_and_match_gather_scatter():
    gen = torch.Generator().manual_seed(0)
    cases = [(5, 5, 2, 0), (3, 8, 3, 5), (4, 2, 4, 0), (6, 6, 0, 0), (1, 9, 1, 8), (40, 40, 5, 0), (10, 30, 4, 20)]
    cases += [(33, 33, 16, 0), (20, 7, 1, 0), (7, 20, 3, 0)]
    for q_len, k_len, clip, offset in cases:
        buckets = torch.randn(2, 3, q_len, 2 * clip + 1, dtype=F64, generator=gen)
        x = torch.randn(2, 3, q_len, k_len, dtype=F64, generator=gen)
        index = relative_position_index(q_len, k_len, clip, offset).expand(2, 3, q_len, k_len)
        placed = place(buckets, k_len, clip, offset)
        folded = fold(x, clip, offset)
        torch.testing.assert_close(placed, torch.gather(buckets, -1, index))
        torch.testing.assert_close(folded, torch.zeros_like(buckets).scatter_add(-1, index, x))
        torch.testing.assert_close((placed * x).sum(), (buckets * folded).sum())  # <place A, X> = <A, fold X>


@pytest.mark.parametrize("mask_kind", [None, "padding", "dead"])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_content_only_attention(mask_kind, requires_grad):
    for q_len, k_len in [(4, 6), (70, 70)]:  # small: matmul path when training; larger: SDPA
        q, k, v, _, _ = make_inputs(2, 2, q_len, k_len, 8, 0, False, False, False, dtype=torch.float32)
        mask = make_mask(mask_kind, 2, 2, q_len, k_len, 0)
        q, k, v = (t.detach().requires_grad_(requires_grad) for t in (q, k, v))
        out = relative_attention(q, k, v, None, None, clip=None, attn_mask=mask)
        scores = q @ k.transpose(-1, -2) / 8**0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        expected = torch.nan_to_num(torch.softmax(scores, -1)) @ v
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        if requires_grad:
            out.sum().backward()
            assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_out_of_place_softmax_branch(monkeypatch):
    """The non-CPU branch of the fused path's softmax (a temporary copied back) gives the same results."""
    import rpr_mt.model.kernels.torch_chunked as fused

    monkeypatch.setattr(fused, "_softmax_", lambda s: s.copy_(torch.softmax(s, -1)))
    inputs = make_inputs(2, 2, 6, 6, 4, 2, True, True, True)
    mask = make_mask("dead", 2, 2, 6, 6, 0)
    expected = grads(reference_attention(*inputs, 2, mask), inputs)
    for save_probs in (True, False):
        out = relative_attention(*inputs, clip=2, attn_mask=mask, impl="fused", save_probs=save_probs)
        for a, e in zip(grads(out, inputs), expected):
            torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6)


def test_saved_tensors_survive_retain_graph():
    inputs = make_inputs(2, 2, 5, 5, 4, 2, True, True, True)
    out = relative_attention(*inputs, clip=2, attn_mask=causal_mask(5, 5))
    first = torch.autograd.grad(out.sum(), inputs, retain_graph=True)
    second = torch.autograd.grad(out.sum(), inputs)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_validation():
    q, k, v, rk, rv = make_inputs(1, 2, 3, 3, 4, 1, True, True, True)
    with pytest.raises(ValueError):
        relative_attention(q, k, v, rk, rv, clip=2)  # tables are for clip = 1
    with pytest.raises(ValueError):
        relative_attention(q, k, v, rk, rv, clip=1, impl="magic")
    with pytest.raises(TypeError):
        relative_attention(q, k, v, rk, rv, clip=1, attn_mask=torch.ones(3, 3))
    with pytest.raises(ValueError):
        MultiHeadAttention(10, 3)


@pytest.mark.parametrize("impl", ["native", "fused", "gather"])
@pytest.mark.parametrize("mask_kind", ["padding", "dead", "causal"])
def test_a_prepared_mask_gives_what_the_mask_gives(impl, mask_kind):
    """prepare_mask does once, for every layer of a stack, what each call did with a boolean mask (4-d, dead rows
    revived); its rows are selected as the batch's are (beam search)."""
    dtype = torch.float32 if impl == "native" else F64
    inputs = make_inputs(2, 2, 6, 6, 4, 2, True, True, True, dtype=dtype)
    mask = make_mask(mask_kind, 2, 2, 6, 6, 0)
    prepared = prepare_mask(mask, live=mask_kind == "causal")
    assert (prepared.dead is not None) == (mask_kind == "dead")
    expected = grads(relative_attention(*inputs, clip=2, attn_mask=mask, impl=impl), inputs)
    actual = grads(relative_attention(*inputs, clip=2, attn_mask=prepared, impl=impl), inputs)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=0, rtol=0)
    index = torch.tensor([1, 1, 0])
    selected = prepared.index_select(index)
    rows = as_4d(mask).shape[0] > 1
    assert torch.equal(selected.allowed, prepare_mask(as_4d(mask)[index] if rows else mask).allowed)


def test_causal_mask():
    assert causal_mask(3, 3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert causal_mask(2, 5, offset=3).tolist() == [[True, True, True, True, False], [True] * 5]


# ---------------------------------------------------------------------------------------------------------------------
# MultiHeadAttention
# ---------------------------------------------------------------------------------------------------------------------


def make_layer(clip=2, seed=0, **kwargs):
    torch.manual_seed(seed)
    positions = None if clip is None else ShawTables(4, 4, clip, **kwargs)  # None: content-only
    return MultiHeadAttention(16, 4, dropout=0.1, positions=positions).eval()


def test_module_parameters():
    tables = make_layer(clip=3).positions
    assert tables.rel_k.shape == (4, 7, 4) and tables.rel_v.shape == (4, 7, 4)
    assert tables.rel_k.data_ptr() != tables.rel_v.data_ptr()  # separate tables, never tied
    shared = make_layer(clip=3, share_across_heads=True, use_value=False).positions
    assert shared.rel_k.shape == (7, 4) and shared.rel_v is None
    assert make_layer(clip=None).positions is None
    names = {name for name, _ in make_layer(clip=1, use_key=False).named_parameters()}
    assert "positions.rel_v" in names and "positions.rel_k" not in names


@pytest.mark.parametrize("step", [1, 3])
@pytest.mark.parametrize("share", [False, True])
def test_cached_decoding_matches_full_forward(step, share):
    layer = make_layer(clip=2, share_across_heads=share)
    x = torch.randn(3, 10, 16)
    full = layer(x, attn_mask=causal_mask(10, 10))
    cache = KVCache()
    pieces = []
    for start in range(0, 10, step):
        chunk = x[:, start : start + step]
        n = chunk.size(1)
        mask = None if n == 1 else causal_mask(n, start + n, offset=start)
        pieces.append(layer(chunk, attn_mask=mask, cache=cache))
        assert cache.length == start + n and cache.query_offset == start + n
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


def test_cross_attention_cache_and_reorder():
    layer = make_layer(clip=None)
    memory = torch.randn(3, 7, 16)
    memory_mask = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    memory_mask[1, ..., 5:] = False
    queries = torch.randn(3, 4, 16)
    full = layer(queries, memory, attn_mask=memory_mask)
    cache = KVCache()
    first = layer(queries[:, :2], memory, attn_mask=memory_mask, cache=cache)
    assert cache.static and cache.length == 7
    again = layer(queries[:, 2:3], memory, attn_mask=memory_mask, cache=cache)  # memory passed again: ignored
    last = layer(queries[:, 3:], None, attn_mask=memory_mask, cache=cache)  # or not passed at all
    torch.testing.assert_close(torch.cat([first, again, last], 1), full, atol=1e-5, rtol=1e-5)

    index = torch.tensor([2, 2, 0])
    k_before = cache.k.clone()
    assert cache.reorder(index) is cache
    torch.testing.assert_close(cache.k, k_before[index])
    out = layer(queries[index, 3:], None, attn_mask=memory_mask[index], cache=cache)
    torch.testing.assert_close(out, full[index, 3:], atol=1e-5, rtol=1e-5)


def test_self_attention_cache_reorder_continues_decoding():
    layer = make_layer(clip=3)
    x = torch.randn(3, 6, 16)
    index = torch.tensor([1, 0, 0])
    full = layer(x[index], attn_mask=causal_mask(6, 6))
    cache = KVCache()
    layer(x[:, :4], attn_mask=causal_mask(4, 4), cache=cache)
    cache.reorder(index)
    out = layer(x[index, 4:], attn_mask=causal_mask(2, 6, offset=4), cache=cache)
    torch.testing.assert_close(out, full[:, 4:], atol=1e-5, rtol=1e-5)


def test_clip_zero_is_permutation_equivariant():
    layer = make_layer(clip=0)
    x = torch.randn(2, 8, 16)
    perm = torch.randperm(8)
    torch.testing.assert_close(layer(x[:, perm]), layer(x)[:, perm], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["fused", "gather"])
def test_relative_only_is_translation_invariant(impl, monkeypatch):
    layer = make_layer(clip=3)
    x = torch.randn(2, 7, 16)
    padded = torch.cat([torch.randn(2, 4, 16) * 5, x], dim=1)  # 4 garbage tokens of LEFT padding
    mask = torch.ones(2, 1, 1, 11, dtype=torch.bool)
    mask[..., :4] = False  # padding is masked out as keys
    import rpr_mt.model.positions.shaw as shaw

    original = shaw.relative_attention
    monkeypatch.setattr(shaw, "relative_attention", lambda *a, **kw: original(*a, impl=impl, **kw))
    torch.testing.assert_close(layer(padded, attn_mask=mask)[:, 4:], layer(x), atol=1e-5, rtol=1e-5)


def test_bf16_autocast_close_to_fp32_and_finite():
    layer = make_layer(clip=2).train()
    layer.dropout = 0.0
    x = torch.randn(2, 9, 16, requires_grad=True)
    mask = torch.ones(2, 1, 9, 9, dtype=torch.bool)
    mask[1, 0, 3] = False  # a fully masked query row
    reference = layer(x, attn_mask=mask)
    ref_grads = torch.autograd.grad(reference.square().sum(), [x, layer.positions.rel_k, layer.positions.rel_v])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x, attn_mask=mask)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    low_grads = torch.autograd.grad(out.float().square().sum(), [x, layer.positions.rel_k, layer.positions.rel_v])
    torch.testing.assert_close(out.float(), reference, atol=5e-2, rtol=5e-2)
    for a, e in zip(low_grads, ref_grads):
        assert torch.isfinite(a).all()
        assert (a - e).norm() <= 0.05 * e.norm() + 1e-3
    assert out[1, 3].abs().max() == 0


def test_training_dropout_changes_output_and_backprops():
    layer = make_layer(clip=2).train()
    x = torch.randn(2, 6, 16, requires_grad=True)
    torch.manual_seed(1)
    a = layer(x)
    torch.manual_seed(2)
    b = layer(x)
    assert not torch.allclose(a, b)
    (a.sum() + b.sum()).backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.positions.rel_v.grad).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_autocast_matches_cpu(dtype):
    inputs = make_inputs(2, 2, 33, 33, 8, 4, True, True, True, dtype=torch.float32)
    mask = make_mask("dead", 2, 2, 33, 33, 0)
    expected = grads(relative_attention(*inputs, clip=4, attn_mask=mask), inputs)
    cuda_inputs = [t.detach().cuda().requires_grad_() for t in inputs]
    with torch.autocast("cuda", dtype=dtype):
        out = relative_attention(*cuda_inputs, clip=4, attn_mask=mask.cuda())
    actual = grads(out.float(), cuda_inputs)
    for a, e in zip(actual, expected):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.float().cpu(), e, atol=5e-2, rtol=5e-2)
