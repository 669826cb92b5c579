"""The C-kernel path of relation-aware attention against the float64 loop reference, and how the kernel is built."""

from __future__ import annotations

import warnings

import pytest
import torch

from rpr_mt.model.kernels import c_library
from rpr_mt.model.kernels import native as native_attention
from rpr_mt.model.attention import causal_mask, relative_attention
from rpr_mt.model.dropout import drop_rate, keep_mask

from .reference import reference_attention
from .test_attention import CASES, CELLS, grads, make_inputs, make_mask

F32 = torch.float32


@pytest.fixture(scope="module", autouse=True)
def kernel_library():
    if c_library._compiler() is None:
        pytest.skip("no C compiler on this machine: the native path cannot be built (the fused path is used)")
    assert c_library.load("relative_rows") is not None, "a C compiler is present but the kernel did not build"


def as_f32(inputs):
    return [None if t is None else t.detach().to(F32).requires_grad_() for t in inputs]


def grads_f32(out, inputs):
    """``grads`` with the same output gradient as its float64 call (drawn in float64, then rounded)."""
    gen = torch.Generator().manual_seed(2)
    grad_out = torch.randn(out.shape, dtype=torch.float64, generator=gen).to(out.dtype)
    live = [t for t in inputs if t is not None]
    return [out.detach()] + list(torch.autograd.grad(out, live, grad_out))


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: f"{'head' if c[0] else 'shared'}-K{int(c[1])}V{int(c[2])}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}H{c[1]}q{c[2]}k{c[3]}c{c[5]}o{c[6]}-{c[7]}")
def test_matches_reference(case, cell, monkeypatch):
    batch, heads, q_len, k_len, dim, clip, offset, mask_kind = case
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip, *cell)
    mask = make_mask(mask_kind, batch, heads, q_len, k_len, offset)
    expected = grads(reference_attention(*inputs, clip, mask, offset), inputs)
    runs = {
        "saved": dict(save_probs=True),
        "recomputed": dict(save_probs=False),
        "1-matrix-chunks": dict(chunk_bytes=1, save_probs=False),
        "head-chunks": dict(chunk_bytes=batch * q_len * k_len * 4, save_probs=True),
        "chunk-copies": dict(chunk_bytes=1, save_probs=True),  # q, k, v copied chunk by chunk, not whole
    }
    for name, kwargs in runs.items():
        monkeypatch.setattr(native_attention, "_WHOLE_COPY_MAX_BYTES", 0 if name == "chunk-copies" else 256 << 20)
        low = as_f32(inputs)
        out = relative_attention(*low, clip=clip, attn_mask=mask, offset=offset, impl="native", **kwargs)
        actual = grads_f32(out, low)
        for what, a, e in zip(["out", "q", "k", "v", "rel_k", "rel_v"], actual, expected):
            torch.testing.assert_close(a.double(), e, atol=2e-5, rtol=2e-5, msg=lambda m: f"{name} {what}: {m}")
    if mask_kind == "dead":
        assert out[-1, 0, 1].abs().max() == 0


@pytest.mark.parametrize("save_probs", [True, False])
@pytest.mark.parametrize("cell", [(True, True, True), (False, True, False), (True, False, True)])
def test_dropout_matches_reference(save_probs, cell):
    batch, heads, q_len, k_len, dim, clip, p = 2, 2, 9, 9, 4, 2, 0.3
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip, *cell)
    mask = causal_mask(q_len, k_len)
    low = as_f32(inputs)
    torch.manual_seed(123)
    out = relative_attention(
        *low, clip=clip, attn_mask=mask, dropout_p=p, impl="native", chunk_bytes=1, save_probs=save_probs
    )
    torch.manual_seed(123)  # relative_attention draws its keep mask first thing from the global generator
    keep = keep_mask((batch, heads, q_len, k_len), p)
    assert 0 < keep.sum() < keep.numel()
    expected = grads(reference_attention(*inputs, clip, mask, 0, keep, drop_rate(p)), inputs)
    for a, e in zip(grads_f32(out, low), expected):
        torch.testing.assert_close(a.double(), e, atol=2e-5, rtol=2e-5)


def test_auto_uses_native_for_float32_cpu_and_fused_otherwise(monkeypatch):
    used = []
    for cls in (native_attention.NativeRelativeAttention, relative_attention.__globals__["ChunkedRelativeAttention"]):
        original = cls.apply
        monkeypatch.setattr(cls, "apply", lambda *a, _o=original, _n=cls.__name__: used.append(_n) or _o(*a))
    inputs = make_inputs(2, 2, 8, 8, 4, 2, True, True, True, dtype=F32)
    relative_attention(*inputs, clip=2)
    relative_attention(*make_inputs(2, 2, 8, 8, 4, 2, True, True, True), clip=2)  # float64
    relative_attention(*make_inputs(2, 2, 3, 8, 4, 2, True, True, True, dtype=F32), clip=2, offset=5)  # decoding
    assert used == ["NativeRelativeAttention", "ChunkedRelativeAttention"]


def test_long_rows_and_large_clip_match_fused():
    """Rows longer than a vector register many times over, clip beyond the length, a key-padding mask."""
    for length, clip in [(70, 16), (33, 64)]:
        inputs = make_inputs(2, 3, length, length, 8, clip, True, True, True, dtype=F32)
        mask = make_mask("causal+padding", 2, 3, length, length, 0)
        results = []
        for impl in ("native", "fused"):
            fresh = as_f32(inputs)
            results.append(grads(relative_attention(*fresh, clip=clip, attn_mask=mask, impl=impl), fresh))
        for a, e in zip(*results):
            torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4)


def test_native_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("RPR_MT_NATIVE", "0")
    c_library.load.cache_clear()
    try:
        assert c_library.load("relative_rows") is None
        q = torch.zeros(1, 1, 8, 4)
        assert not native_attention.available(q)
        with pytest.raises(ValueError, match="native"):
            relative_attention(*make_inputs(1, 1, 8, 8, 4, 1, True, True, True, dtype=F32), clip=1, impl="native")
    finally:
        c_library.load.cache_clear()


def test_build_is_cached_and_a_failed_build_falls_back(monkeypatch, tmp_path):
    monkeypatch.setenv("RPR_MT_CACHE_DIR", str(tmp_path))
    first = c_library.build("relative_rows")
    assert first.parent == tmp_path and first.exists()
    mtime = first.stat().st_mtime_ns
    assert c_library.build("relative_rows") == first and first.stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary files left behind

    broken = tmp_path / "csrc"
    broken.mkdir()
    (broken / "relative_rows.c").write_text("this is not C\n")
    monkeypatch.setattr(c_library, "SOURCE_DIR", broken)
    c_library.load.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert c_library.load("relative_rows") is None
        assert any("unavailable" in str(w.message) for w in caught)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, "csrc"])
    finally:
        c_library.load.cache_clear()


def test_backward_twice_with_retain_graph():
    """The backward pass reuses the forward's chunk copies: a second backward must still see them intact."""
    inputs = as_f32(make_inputs(2, 2, 9, 9, 4, 2, True, True, True))
    out = relative_attention(*inputs, clip=2, attn_mask=causal_mask(9, 9), impl="native")
    first = torch.autograd.grad(out.square().sum(), inputs, retain_graph=True)
    second = torch.autograd.grad(out.square().sum(), inputs)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_unwritable_cache_builds_into_the_temporary_directory(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache directory should be: mkdir fails
    monkeypatch.setenv("RPR_MT_CACHE_DIR", str(blocked / "cache"))
    monkeypatch.setattr(c_library.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    built = c_library.build("relative_rows")
    assert built.parent.parent == tmp_path / "tmp" and built.exists()


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_content_only_training_attention_runs_native_and_matches_reference(p, monkeypatch):
    """Without relative tables, training attention on CPU also runs the row kernels (faster than SDPA there)."""
    used = []
    original = native_attention.NativeRelativeAttention.apply
    monkeypatch.setattr(native_attention.NativeRelativeAttention, "apply", lambda *a: used.append(1) or original(*a))
    batch, heads, q_len, k_len, dim = 2, 2, 7, 9, 4
    inputs = make_inputs(batch, heads, q_len, k_len, dim, 0, True, False, False)
    mask = make_mask("dead", batch, heads, q_len, k_len, 0)
    low = as_f32(inputs)
    torch.manual_seed(7)
    out = relative_attention(*low, clip=None, attn_mask=mask, dropout_p=p)
    assert used == [1]
    keep = None
    if p > 0:
        torch.manual_seed(7)  # the keep mask is the first draw from the global generator
        keep = keep_mask((batch, heads, q_len, k_len), p)
    expected = grads(reference_attention(*inputs, 0, mask, 0, keep, drop_rate(p) if p else 0.0), inputs)
    for a, e in zip(grads_f32(out, low), expected):
        torch.testing.assert_close(a.double(), e, atol=2e-5, rtol=2e-5)
    assert out[-1, 0, 1].abs().max() == 0  # the dead row
    with torch.no_grad():  # inference keeps SDPA
        relative_attention(*low, clip=None, attn_mask=mask)
    assert used == [1]
