"""The fused Triton kernels of relation-aware attention (``impl="triton"``) against the float64 loop reference:
outputs and the gradients of q, k, v, both tables and the bias, for every option (per-head and shared tables, K
only, V only, K+V, content only, padding, causal with an offset, cached decoding, dead rows, a full random mask,
k = 0 and k beyond the longest distance, every broadcast shape of the bias, seeded and explicit dropout).

Without a GPU the kernels run in Triton's interpreter on the CPU, in float64, so the comparison is exact to
rounding (1e-9); on a CUDA machine without TRITON_INTERPRET they run on the GPU in float32 (1e-4). Shapes are tiny
(B, H <= 2, L <= 22, d <= 16, k <= 4) with 16 x 16 tiles in the interpreter, so that every case still spans several
tiles of each kind: all in bucket 0, all in bucket 2k, and tiles that cross the band.

    TRITON_INTERPRET=1 python -m pytest -m triton tests/model/kernels/test_triton_shaw.py
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported (conftest.py does it first)
pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[triton]')")

from rpr_mt.model.kernels import relative_attention, triton_shaw  # noqa: E402
from rpr_mt.errors import UserError  # noqa: E402
from rpr_mt.model.masks import as_4d, revive_dead_rows  # noqa: E402

from ..reference import reference_attention  # noqa: E402
from ..test_attention import make_inputs, make_mask  # noqa: E402

pytestmark = pytest.mark.triton

if not (triton_shaw.interpreting() or torch.cuda.is_available()):
    pytest.skip("no CUDA device and TRITON_INTERPRET is not 1: the kernels cannot run", allow_module_level=True)

F64 = torch.float64
INTERPRETED = triton_shaw.interpreting()
DEVICE = "cpu" if INTERPRETED else "cuda"
DTYPE = F64 if INTERPRETED else torch.float32
TOL = 1e-9 if INTERPRETED else 1e-4
NAMES = ["out", "q", "k", "v", "rel_k", "rel_v", "bias"]


def to_run(tensors):
    """The kernels' copies of float64 CPU leaves: on the run device and dtype, requiring grad."""
    return [None if t is None else t.detach().to(DEVICE, DTYPE).requires_grad_() for t in tensors]


def output_grad(shape):
    gen = torch.Generator().manual_seed(7)
    return torch.randn(shape, dtype=F64, generator=gen)


def with_grads(out, leaves):
    """[out, d out/d leaf for each leaf that is not None], the output gradient fixed by the shape."""
    live = [t for t in leaves if t is not None]
    grad_out = output_grad(out.shape).to(out.device, out.dtype)
    return [out.detach()] + list(torch.autograd.grad(out, live, grad_out))


def check(actual, expected, names, tol=TOL):
    assert len(actual) == len(expected)
    for name, a, e in zip(names, actual, expected):
        torch.testing.assert_close(a.double().cpu(), e, atol=tol, rtol=tol, msg=lambda m: f"{name}: {m}")


def reference(inputs, clip, mask, offset, bias=None, keep=None, dropout_p=0.0):
    out = reference_attention(*inputs, clip or 0, mask, offset, keep, dropout_p, bias=bias)
    return with_grads(out, [*inputs, bias])


def names_of(inputs, bias=None):
    return [n for n, t in zip(NAMES, [0, *inputs, bias]) if t is not None]


# (B, H, Lq, Lk, d, clip, offset, mask, per-head tables, key table, value table)
CASES = {
    "k1-padding-head-KV": (1, 2, 20, 20, 4, 1, 0, "padding", True, True, True),  # all three kinds of tile
    "k2-causal-shared-KV": (2, 1, 20, 20, 4, 2, 0, "causal", False, True, True),
    "k3-nomask-head-K-d16": (1, 2, 18, 18, 16, 3, 0, None, True, True, False),
    "k3-causal+padding-head-V": (1, 2, 18, 18, 8, 3, 0, "causal+padding", True, False, True),
    "k2-deadrow-shared-K": (2, 1, 17, 17, 4, 2, 0, "dead", False, True, False),
    "k2-deadrow-head-V": (2, 1, 17, 17, 4, 2, 0, "dead", True, False, True),
    "cached-3-queries-offset18": (1, 2, 3, 21, 4, 2, 18, "causal", True, True, True),
    "cached-1-query-offset19": (1, 2, 1, 20, 4, 3, 19, "padding", False, True, True),
    "Lq>Lk": (1, 2, 22, 9, 4, 4, 0, None, True, True, True),
    "k0": (1, 2, 16, 20, 4, 0, 0, "padding", True, True, True),
    "random-full-mask": (1, 2, 20, 20, 4, 2, 0, "random", True, True, True),
    "k40-beyond-every-distance": (1, 2, 12, 12, 4, 40, 0, "causal", True, True, True),  # 23 buckets used, 32 wide
    "content-only": (1, 2, 20, 20, 8, None, 0, "padding", True, False, False),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_matches_reference(case):
    batch, heads, q_len, k_len, dim, clip, offset, mask_kind, per_head, use_key, use_value = CASES[case]
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip or 0, per_head, use_key, use_value)
    mask = make_mask(mask_kind, batch, heads, q_len, k_len, offset)
    expected = reference(inputs, clip, mask, offset)
    run = to_run(inputs)
    out = relative_attention(*run, clip=clip, attn_mask=None if mask is None else mask.to(DEVICE), offset=offset,
                             impl="triton")
    assert out.dtype == DTYPE and out.shape == (batch, heads, q_len, dim)
    check(with_grads(out, run), expected, names_of(inputs))
    if mask_kind == "dead":
        assert out[-1, 0, 1].abs().max() == 0


@pytest.mark.parametrize("shared", ["key", "value"])
def test_one_table_shared_and_the_other_per_head(shared):
    """Each table's gradient goes to its own head rows: a shared key table beside per-head value tables (and the
    reverse) once summed the per-head table's gradient over the heads as if it were shared."""
    batch, heads, length, dim, clip = 2, 2, 20, 8, 3
    q, k, v, rel_k, rel_v = make_inputs(batch, heads, length, length, dim, clip, True, True, True, seed=3)
    if shared == "key":
        rel_k = rel_k[0].detach().clone().requires_grad_()
    else:
        rel_v = rel_v[0].detach().clone().requires_grad_()
    inputs = (q, k, v, rel_k, rel_v)
    mask = make_mask("padding", batch, heads, length, length, 0)
    expected = reference(inputs, clip, mask, 0)
    run = to_run(inputs)
    out = relative_attention(*run, clip=clip, attn_mask=mask.to(DEVICE), impl="triton")
    check(with_grads(out, run), expected, names_of(inputs))


@pytest.mark.parametrize("blocks", [(32, 16), (16, 32)], ids=["BM32-BN16", "BM16-BN32"])
def test_rectangular_tiles(blocks):
    """Tiles with BM != BN: the band's tile kinds and the interior buckets do not assume square tiles."""
    batch, heads, q_len, k_len, dim, clip, offset = 1, 2, 20, 23, 4, 2, 3
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip, True, True, True, seed=2)
    mask = make_mask("causal", batch, heads, q_len, k_len, offset)
    expected = reference(inputs, clip, mask, offset)
    run = to_run(inputs)
    out = triton_shaw.triton_relative_attention(*run, None, as_4d(mask.to(DEVICE)), None, clip, offset, 0.0,
                                                blocks=triton_shaw.Blocks(*blocks, 1, 1))
    check(with_grads(out, run), expected, names_of(inputs))


# per-kernel tiles that differ in shape: forward, dK/dV, dQ (and its preprocess)
MIXED_TILES = triton_shaw.Tiles(triton_shaw.Blocks(32, 16, 1, 1), triton_shaw.Blocks(16, 32, 1, 1),
                                triton_shaw.Blocks(16, 16, 1, 1))  # every grid-setting size differs from the others
MIXED_CASES = ["k1-padding-head-KV", "k2-causal-shared-KV", "k2-deadrow-shared-K", "cached-3-queries-offset18"]


@pytest.mark.parametrize("case", MIXED_CASES, ids=MIXED_CASES)
def test_per_kernel_tiles(case):
    """Each kernel with its own tile shape (the buffers they pass on, q w^K^T, fold(P), delta and dO w^V^T, are laid
    out by rows, whatever the tiles): the same values as the reference."""
    batch, heads, q_len, k_len, dim, clip, offset, mask_kind, per_head, use_key, use_value = CASES[case]
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip or 0, per_head, use_key, use_value)
    mask = make_mask(mask_kind, batch, heads, q_len, k_len, offset)
    expected = reference(inputs, clip, mask, offset)
    run = to_run(inputs)
    full, dead = (None, None) if mask is None else revive_dead_rows(as_4d(mask.to(DEVICE)))
    out = triton_shaw.triton_relative_attention(*run, None, full, dead, clip, offset, 0.0, blocks=MIXED_TILES)
    check(with_grads(out, run), expected, names_of(inputs))


def test_frozen_tables():
    """Tables that need no gradient (frozen, or inference under autograd for q only): the kernels skip the table
    gradients and keeping fold(P); q, k, v still match."""
    batch, heads, q_len, k_len, dim, clip = 1, 2, 18, 18, 4, 2
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip, True, True, True, seed=9)
    mask = make_mask("causal", batch, heads, q_len, k_len, 0)
    expected = reference(inputs, clip, mask, 0)[:4]  # out and the gradients of q, k, v
    run = to_run(inputs[:3]) + [t.detach().to(DEVICE, DTYPE) for t in inputs[3:]]
    out = relative_attention(*run, clip=clip, attn_mask=mask.to(DEVICE), impl="triton")
    check(with_grads(out, run[:3]), expected, NAMES[:4])


BIAS_SHAPES = {  # -> how the kernel reduces the bias gradient
    "per-head [H,Lq,Lk]": lambda b, h, q, k: (h, q, k),  # summed over the batch: atomic adds of tiles
    "per-key [B,H,1,Lk]": lambda b, h, q, k: (b, h, 1, k),  # summed over queries in the tile first
    "per-query [B,H,Lq,1]": lambda b, h, q, k: (b, h, q, 1),  # summed over keys in the tile first
    "full [B,H,Lq,Lk]": lambda b, h, q, k: (b, h, q, k),  # plain stores
}


@pytest.mark.parametrize("shape", list(BIAS_SHAPES), ids=list(BIAS_SHAPES))
def test_bias_matches_reference(shape):
    batch, heads, q_len, k_len, dim, clip, offset = 2, 1, 17, 19, 4, 2, 2
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip, True, True, True, seed=1)
    gen = torch.Generator().manual_seed(3)
    bias = (torch.randn(BIAS_SHAPES[shape](batch, heads, q_len, k_len), dtype=F64, generator=gen) * 2).requires_grad_()
    mask = make_mask("dead", batch, heads, q_len, k_len, offset)
    expected = reference(inputs, clip, mask, offset, bias)
    run = to_run([*inputs, bias])
    out = relative_attention(*run[:5], clip=clip, attn_mask=mask.to(DEVICE), offset=offset, bias=run[5],
                             impl="triton")
    check(with_grads(out, run), expected, names_of(inputs, bias))


def test_seeded_dropout_matches_reference_with_the_replayed_mask():
    """relative_attention draws the kernels' dropout seed from torch's generator; replaying the seed and drawing
    the mask with ``dropout_keep_mask`` gives the keep mask the kernels used in the forward and backward pass."""
    batch, heads, q_len, k_len, dim, clip, p = 1, 2, 20, 20, 4, 2, 0.5
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip, True, True, True, seed=4)
    mask = make_mask("causal", batch, heads, q_len, k_len, 0)
    run = to_run(inputs)
    torch.manual_seed(123)
    out = relative_attention(*run, clip=clip, attn_mask=mask.to(DEVICE), dropout_p=p, impl="triton")
    actual = with_grads(out, run)
    torch.manual_seed(123)
    keep = triton_shaw.dropout_keep_mask(triton_shaw.draw_seed(), (batch, heads, q_len, k_len), p, DEVICE).cpu()
    assert 0.3 < keep.float().mean() < 0.7
    check(actual, reference(inputs, clip, mask, 0, keep=keep, dropout_p=p), names_of(inputs))


def test_explicit_keep_mask_matches_reference():
    batch, heads, q_len, k_len, dim, clip, p = 2, 1, 18, 18, 4, 3, 0.3
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip, False, True, True, seed=5)
    mask = make_mask("padding", batch, heads, q_len, k_len, 0)
    keep = torch.rand(batch, heads, q_len, k_len, generator=torch.Generator().manual_seed(6)) >= p
    run = to_run(inputs)
    out = triton_shaw.triton_relative_attention(*run, None, as_4d(mask.to(DEVICE)), None, clip, 0, p,
                                                keep=keep.to(DEVICE))
    check(with_grads(out, run), reference(inputs, clip, mask, 0, keep=keep, dropout_p=p), names_of(inputs))


def test_dropout_mask_is_reproducible_and_drops_at_the_rate():
    shape = (2, 2, 32, 50)
    first = triton_shaw.dropout_keep_mask(11, shape, 0.25, DEVICE)
    assert torch.equal(first, triton_shaw.dropout_keep_mask(11, shape, 0.25, DEVICE))
    assert not torch.equal(first, triton_shaw.dropout_keep_mask(12, shape, 0.25, DEVICE))
    assert not torch.equal(first[0, 0], first[0, 1])  # every (batch, head) matrix draws its own
    assert abs(first.float().mean().item() - 0.75) < 0.03  # 6,400 draws: 5.5 standard deviations


@pytest.mark.skipif(not INTERPRETED, reason="float32 on the CPU: the interpreter")
def test_float32_close_to_float64_reference():
    batch, heads, q_len, k_len, dim, clip, offset = 1, 2, 19, 19, 8, 2, 0
    inputs = make_inputs(batch, heads, q_len, k_len, dim, clip, True, True, True, seed=8)
    mask = make_mask("causal+padding", batch, heads, q_len, k_len, offset)
    low = [t.detach().float().requires_grad_() for t in inputs]
    out = relative_attention(*low, clip=clip, attn_mask=mask, impl="triton")
    assert out.dtype == torch.float32
    check(with_grads(out, low), reference(inputs, clip, mask, offset), names_of(inputs), tol=2e-5)


def test_tables_of_a_wider_dtype_are_read_as_they_are_and_get_gradients_of_their_dtype():
    """As under bf16 autocast (float32 tables, bfloat16 activations), here float64 tables with float32 q, k, v: the
    kernels round the tables on chip and return their gradients in the tables' dtype, with no cast (and no cast's
    autograd node) between the parameters and the kernels."""
    batch, heads, length, dim, clip = 1, 2, 19, 8, 2
    inputs = make_inputs(batch, heads, length, length, dim, clip, True, True, True, seed=9)
    mask = make_mask("padding", batch, heads, length, length, 0)
    run = [t.detach().to(DEVICE, torch.float32 if i < 3 else F64).requires_grad_() for i, t in enumerate(inputs)]
    out = relative_attention(*run, clip=clip, attn_mask=mask.to(DEVICE), impl="triton")
    assert out.dtype == torch.float32
    feeding = {type(fn).__name__ for fn, _ in out.grad_fn.next_functions if fn is not None}
    assert "ToCopyBackward0" not in feeding
    result = with_grads(out, run)
    assert [t.dtype for t in result[4:]] == [F64, F64]
    check(result, reference(inputs, clip, mask, 0), names_of(inputs), tol=2e-5)


def test_unavailable_is_a_clear_error(monkeypatch):
    q, k, v, rk, rv = make_inputs(1, 1, 4, 4, 4, 1, True, True, True)
    if INTERPRETED:  # the interpreter takes CPU tensors only; a meta tensor stands for a device tensor
        with pytest.raises(ValueError, match="interpreter"):
            triton_shaw.triton_relative_attention(*(t.to("meta") for t in (q, k, v, rk, rv)), None, None, None,
                                                  1, 0, 0.0)
    monkeypatch.setattr(triton_shaw, "triton", None)
    with pytest.raises(ValueError, match=r"needs the triton package \(pip install 'triton>=3.2'\)"):
        relative_attention(q, k, v, rk, rv, clip=1, impl="triton")


def test_tiles_parse_from_their_printed_form(monkeypatch):
    """RPR_MT_TRITON_TILES (what benchmarks/tune_gpu_attention.py prints) sets the GPU default; bad values say
    which part is wrong; the interpreter keeps its 16 x 16 tiles."""
    tiles = triton_shaw.parse_tiles("fwd=128,64,8,2; dq=32,64,4,3")
    assert tiles == triton_shaw.Tiles(forward=triton_shaw.Blocks(128, 64, 8, 2), dq=triton_shaw.Blocks(32, 64, 4, 3))
    assert triton_shaw.parse_tiles(triton_shaw.format_tiles(tiles)) == tiles
    assert triton_shaw.parse_tiles("") == triton_shaw.Tiles()
    for bad, message in [("fwd=64,48,4,2", "powers of two"), ("fwd=8,16,1,1", ">= 16"), ("dk=64,64,4,2", "unknown"),
                         ("dq=a,b", "BM,BN,warps,stages"), ("fwd=64,64,3,2", "powers of two"),
                         ("fwd=64,64", "four integers"), ("dkdv=64,64,0,2", "warps >= 1"),
                         ("dq=64,64,4,0", "stages >= 1")]:
        with pytest.raises(triton_shaw.TilesError, match=message):  # a UserError: the CLI prints one line
            triton_shaw.parse_tiles(bad)
    assert issubclass(triton_shaw.TilesError, ValueError) and issubclass(triton_shaw.TilesError, UserError)
    monkeypatch.setenv("RPR_MT_TRITON_TILES", "dq=32,64,4,3")
    if INTERPRETED:
        assert triton_shaw.as_tiles(None) == triton_shaw._INTERPRETER_TILES
    monkeypatch.setattr(triton_shaw, "interpreting", lambda: False)
    assert triton_shaw.as_tiles(None).dq == triton_shaw.Blocks(32, 64, 4, 3)
    monkeypatch.delenv("RPR_MT_TRITON_TILES")
    assert triton_shaw.as_tiles(None) == triton_shaw.Tiles()


# RPR_MT_TRITON_BACKWARD=serial: one program per (batch, head) for the whole backward pass (_shaw_bwd_serial)
def serial(monkeypatch):
    monkeypatch.setenv("RPR_MT_TRITON_BACKWARD", "serial")


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_serial_backward_matches_reference(case, monkeypatch):
    serial(monkeypatch)
    test_matches_reference(case)


@pytest.mark.parametrize("shape", list(BIAS_SHAPES), ids=list(BIAS_SHAPES))
def test_serial_backward_bias_matches_reference(shape, monkeypatch):
    serial(monkeypatch)
    test_bias_matches_reference(shape)


@pytest.mark.parametrize("blocks", [(32, 16), (16, 32)], ids=["BM32-BN16", "BM16-BN32"])
def test_serial_backward_rectangular_tiles(blocks, monkeypatch):
    """Several key blocks add into the float32 buffers of dQ and fold(dS) (BN 16 of 23 keys: two), BM != BN."""
    serial(monkeypatch)
    test_rectangular_tiles(blocks)


def test_serial_backward_dropout_shared_table_and_frozen_tables(monkeypatch):
    serial(monkeypatch)
    test_seeded_dropout_matches_reference_with_the_replayed_mask()
    test_explicit_keep_mask_matches_reference()
    test_one_table_shared_and_the_other_per_head("key")
    test_frozen_tables()


def test_the_backward_variant_is_the_one_asked_for(monkeypatch):
    """Each variant launches its own kernels (the tests above would pass on the split kernels too if the setting
    were ignored), and a bad value is one clear error."""
    launched = []
    launch = triton_shaw._launch

    def spy(kernel, grid):
        launched.append(getattr(kernel, "__name__", None) or kernel.fn.__name__)
        return launch(kernel, grid)

    monkeypatch.setattr(triton_shaw, "_launch", spy)
    inputs = to_run(make_inputs(1, 2, 18, 18, 4, 2, True, True, True, seed=2))
    for variant, kernels in [("split", ["_shaw_fwd", "_shaw_bwd_pre", "_shaw_bwd_dkdv", "_shaw_bwd_dq"]),
                             ("serial", ["_shaw_fwd", "_shaw_bwd_pre", "_shaw_bwd_serial"])]:
        monkeypatch.setenv("RPR_MT_TRITON_BACKWARD", variant)
        launched.clear()
        relative_attention(*inputs, clip=2, impl="triton").sum().backward()
        assert launched == kernels, variant
    monkeypatch.setenv("RPR_MT_TRITON_BACKWARD", "fused")
    launched.clear()
    with pytest.raises(triton_shaw.TilesError, match="RPR_MT_TRITON_BACKWARD: 'fused' is not one of split, serial"):
        relative_attention(*inputs, clip=2, impl="triton")  # the forward pass already: before any work is lost
    assert launched == []


UNSPECIALIZED_REPORT = """
import json
from rpr_mt.model.kernels import triton_shaw as t
kernels = (t._shaw_fwd, t._shaw_bwd_pre, t._shaw_bwd_dkdv, t._shaw_bwd_dq, t._shaw_bwd_serial)
print(json.dumps({k.fn.__name__: {p.name: bool(p.do_not_specialize) for p in k.params if not p.is_constexpr}
                  for k in kernels}))
"""


def test_the_compiled_kernels_do_not_specialize_on_lengths_seeds_or_length_strides():
    """What the JIT sees outside the interpreter (a subprocess without TRITON_INTERPRET): every name of
    _UNSPECIALIZED is an argument of some kernel (a misspelt name would silently specialize again), and it is not
    specialized wherever it appears, while the unit strides along d stay specialized. The effect itself, one
    compilation for all lengths and seeds, is tests/model/kernels/test_gpu.py's (8 variants against 31 in 200
    trainer-like calls on an H100, docs/benchmarks.md)."""
    import json
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", UNSPECIALIZED_REPORT], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    for name in triton_shaw._UNSPECIALIZED:
        seen = [flags[name] for flags in report.values() if name in flags]
        assert seen and all(seen), name
    for flags in report.values():
        assert not any(flags[name] for name in flags if name.endswith("_d")), flags
        assert flags.get("H") is False and flags.get("D") is False
