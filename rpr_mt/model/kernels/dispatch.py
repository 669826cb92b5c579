"""The attention entry points and the one policy that picks how each call is computed.

``relative_attention`` is relation-aware attention (Shaw, Uszkoreit & Vaswani 2018, eqs. (3)-(4)) with optional
key and value tables; ``content_attention`` is the same call without tables. Both take a boolean mask (True = may
attend) and an optional float logit bias (what T5, ALiBi and Transformer-XL add before the softmax).

Implementations (``impl``):

* ``"native"``: C row kernels (``native.py``); float32 on CPU with a C compiler, also under bf16 autocast (the
  activations are cast up: ``_float32_on_cpu``). The CPU default: faster than "fused" with tables, and in training
  faster than SDPA without them, whose CPU kernels fall back to an unfused path with attention dropout (figures:
  docs/benchmarks.md, "CPU: relative attention, forward + backward" and "Attention without position terms").
* ``"fused"``: the same chunked algorithm as one pure-torch autograd Function (``torch_chunked.py``).
* ``"gather"``: plain autograd compositions (``gather.py``), the readable reference; the least overhead for a few
  queries (incremental decoding), and for content attention on short sentences in training.
* ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention``, for content attention where no gradient is
  needed, or off the CPU.
* ``"triton"``: fused FlashAttention-style Triton kernels with both relative terms inside the online softmax
  (``triton_shaw.py``; CUDA, or the CPU under ``TRITON_INTERPRET=1``). The default for relative attention with 8+
  queries in bfloat16 on an NVIDIA GPU of compute capability 8.0 or newer with Triton >= 3.2 (``_triton_runs``):
  there the base model trains faster and in less memory than on the torch path ("fused"), and Shaw K+V attention
  forward+backward takes a fraction of its time (figures: docs/benchmarks.md, "GPU": "Attention, forward +
  backward" and "Training throughput and peak memory"; ``scripts/gpu_check.sh`` checks the kernels on a GPU).
  float32 and float16 stay on "fused" (the kernels are measured in bf16 only), as does everything where the kernels
  cannot run, and ``RPR_MT_TRITON=0`` turns the default off.

``choose_impl`` is the whole policy; nothing else decides.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from rpr_mt.model.dropout import drop_rate, keep_mask
from rpr_mt.model.kernels import native
from rpr_mt.model.kernels.gather import relative_attention_gather
from rpr_mt.model.kernels.geometry import relative_position_index
from rpr_mt.model.kernels.rotary import rotate
from rpr_mt.model.kernels.torch_chunked import ChunkedRelativeAttention
from rpr_mt.model.kernels.triton_launch import version_tuple
from rpr_mt.model.masks import PreparedMask, as_4d, mask_bias, revive_dead_rows

__all__ = ["IMPLEMENTATIONS", "choose_impl", "content_attention", "relative_attention"]

IMPLEMENTATIONS = ("auto", "native", "fused", "gather", "sdpa", "triton")

# Byte budget of one chunk buffer of the chunked paths. On CPU the few chunk buffers (scores, gradient, scratch and
# the chunk's q/k/v copies) should stay in the last-level cache; accelerators prefer few large kernels.
_CPU_CHUNK_BYTES = 8 << 20
_ACCEL_CHUNK_BYTES = 1 << 30
# The chunked paths save the probabilities for the backward pass up to this size and recompute them above it. On
# the CPU saving is the faster of the two at every size measured (a fresh tensor's page faults cost less than the
# recomputation); recomputation bounds the memory instead.
_SAVE_PROBS_MAX_BYTES = 1 << 30
# Below this many queries (incremental decoding) relative attention uses the gather path: the chunked paths'
# copies of the keys and values would cost more than the attention itself.
_CHUNKED_MIN_QUERIES = 8
# Below this many (query, key) pairs per matrix, content attention in training without the native kernels is
# fastest as a plain composition on CPU (it beat SDPA forward+backward there).
_CPU_MATMUL_MAX_PAIRS = 64 * 64


def choose_impl(q: Tensor, k_len: int, *, tables: bool, needs_grad: bool) -> str:
    """The implementation for a call with queries like ``q`` [B, H, Lq, d] (already in the compute dtype), ``k_len``
    keys, with or without relative tables, and whether a gradient is needed (see the module docstring)."""
    q_len = q.shape[2]
    native_ok = native.available(q)
    if tables:
        if q_len < _CHUNKED_MIN_QUERIES:
            return "gather"
        if native_ok:
            return "native"
        return "triton" if _triton_runs(q) else "fused"
    if needs_grad and native_ok and k_len > 0:
        return "native"
    if needs_grad and q.device.type == "cpu" and q_len * k_len <= _CPU_MATMUL_MAX_PAIRS:
        return "gather"
    return "sdpa"


# Triton before 3.2 is below the version the kernels were written for (pyproject's [triton] extra).
_TRITON_MIN_VERSION = (3, 2)


def _triton_runs(q: Tensor) -> bool:
    """Whether the default policy may put relative attention on the Triton kernels for queries like ``q``: bfloat16
    (the measured precision) on an NVIDIA GPU (not ROCm) of compute capability 8.0 or newer, Triton >= 3.2 importable,
    and ``RPR_MT_TRITON`` not "0". The module is imported on the first such call only: it imports triton, which the
    CPU path never needs, and any failure to import it means the torch path."""
    if q.device.type != "cuda" or q.dtype != torch.bfloat16 or os.environ.get("RPR_MT_TRITON") == "0":
        return False
    return _triton_ready(q.device.index)


@functools.lru_cache(maxsize=None)
def _triton_ready(device_index: int | None) -> bool:
    """The part of ``_triton_runs`` that cannot change while a process runs, decided once per device (it is asked
    on every attention call)."""
    if torch.version.hip is not None or torch.cuda.get_device_capability(device_index) < (8, 0):
        return False
    try:
        from rpr_mt.model.kernels import triton_shaw
    except Exception:  # a broken triton install must not stop training: the torch path computes the same thing
        return False
    if triton_shaw.triton is None or version_tuple(triton_shaw.triton.__version__) < _TRITON_MIN_VERSION:
        return False
    return not triton_shaw.interpreting()  # the interpreter runs CPU tensors only (triton_shaw.unavailable_reason)


def _float32_on_cpu(device_type: str, dtype: torch.dtype) -> bool:
    """Whether a CPU call under low-precision autocast computes its attention in float32 on the C kernels instead.
    The attention's matrix products are a small share of an update (d_head columns), and on the CPU the float32
    kernels are faster than the bfloat16 torch path ("fused"), whose casts and chunk copies cost more than its
    arithmetic saves: a bf16 model trains faster with float32 attention than with "fused" bf16 attention
    (benchmarks/bench_train.py; figures: docs/benchmarks.md, "bf16 on a CPU with bfloat16 instructions"). Float32 is
    also the more accurate choice; the projections around the attention stay in bfloat16."""
    return (device_type == "cpu" and dtype in (torch.bfloat16, torch.float16) and torch.is_autocast_enabled("cpu")
            and native.built())


def _cast(t: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """``t`` in ``dtype`` (None stays None); no call into torch when it already is (a GPU training step makes a
    dozen such calls per attention layer, each a few microseconds of host time)."""
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _needs_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _fits_saved_probs(q: Tensor, k_len: int) -> bool:
    """Whether the [B, H, Lq, Lk] probabilities are small enough to keep for the backward pass."""
    return q.shape[0] * q.shape[1] * q.shape[2] * k_len * q.element_size() <= _SAVE_PROBS_MAX_BYTES


def _bias_4d(bias: Tensor | None, shape: tuple[int, int, int, int], dtype: torch.dtype) -> Tensor | None:
    if bias is None:
        return None
    if not bias.is_floating_point() or bias.dim() > 4:
        raise ValueError(f"bias must be a float tensor of at most 4 dims, got {bias.dtype} {tuple(bias.shape)}")
    bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    try:
        torch.broadcast_shapes(bias.shape, shape)
    except RuntimeError:
        raise ValueError(f"bias {tuple(bias.shape)} does not broadcast to [B, H, Lq, Lk] = {list(shape)}") from None
    return _cast(bias, dtype)


def relative_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rel_k: Tensor | None,
    rel_v: Tensor | None,
    *,
    clip: int | None,
    attn_mask: Tensor | PreparedMask | None = None,
    bias: Tensor | None = None,
    bucket_bias: Tensor | None = None,
    rotary: tuple[Tensor, Tensor] | None = None,
    offset: int = 0,
    dropout_p: float = 0.0,
    impl: str = "auto",
    chunk_bytes: int | None = None,
    save_probs: bool | None = None,
) -> Tensor:
    """Relation-aware scaled dot-product attention, Shaw et al. (2018) equations (3)-(4), with optional biases.

        e_ij = q_i . (k_j + rel_k[r_ij]) / sqrt(d) + bias_ij + bucket_bias[r_ij],
        z_i = sum_j softmax_j(e_ij) (v_j + rel_v[r_ij]),   r_ij = clip(j - (i + offset), -clip, clip) + clip.

    Args:
        q: [B, H, Lq, d] queries.
        k, v: [B, H, Lk, d] keys and values.
        rel_k, rel_v: relative tables, each None (term off), [2*clip+1, d] shared by all heads, or
            [H, 2*clip+1, d] per head. Separate tables: rel_v is never tied to rel_k.
        clip: maximum relative distance k >= 0 (ignored, may be None, when both tables are None).
        attn_mask: boolean, broadcastable to [B, H, Lq, Lk], True = may attend, or the same made once for many
            calls by ``masks.prepare_mask``. Rows with no allowed key give zeros (and zero gradients).
        bias: float, broadcastable to [B, H, Lq, Lk]: added to the scaled logits (differentiable).
        bucket_bias: float [2*clip+1] or [H, 2*clip+1]: added to the scaled logit of each pair by its bucket r_ij
            (differentiable), a term of the distance alone such as Transformer-XL's v . W_R R. With rel_k on the
            native path it is added to the [Lq, 2*clip+1] table products before they are placed (O(L) work);
            elsewhere it is spread into ``bias``.
        rotary: cos and sin [P, d/2] of rotary angles (RoPE) for positions 0 .. P - 1, P >= max(offset + Lq, Lk):
            q and k are turned by the angles of their positions before the product (half-split layout, as
            ``kernels.rotary.rotate``), differentiably. The native path turns its head-major copies of q and k and
            turns the gradients back chunk by chunk; elsewhere q and k are rotated first.
        offset: absolute position of the first query; queries sit at offset .. offset + Lq - 1 and keys at
            0 .. Lk - 1 (cached decoding).
        dropout_p: dropout on the attention probabilities (pass 0 in eval).
        impl: "auto" (``choose_impl``), or one of "native", "fused", "gather", "sdpa" (content only).
        chunk_bytes: native and fused: byte budget of one chunk buffer (default 8 MiB on CPU, to stay in cache;
            1 GiB on accelerators).
        save_probs: native and fused: keep the [B, H, Lq, Lk] probabilities for the backward pass (True), or
            recompute them there chunk by chunk (False; FlashAttention style, O(chunk) extra memory, but slower).
            Default: save up to 1 GiB per call when a gradient is needed, else nothing.

    Returns:
        [B, H, Lq, d]. Under autocast the computation runs in the autocast dtype (like matmul); the softmax of a
        low-precision row is accumulated in float32 by torch's kernels. The exception: with impl="auto" on a CPU
        with the C kernels, it runs in float32 there and returns float32 (``_float32_on_cpu``).
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [B, H, L, d], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"impl must be one of {', '.join(map(repr, IMPLEMENTATIONS))}, got {impl!r}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    batch, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    tables = rel_k is not None or rel_v is not None
    if tables or bucket_bias is not None:
        if clip is None or clip < 0:
            raise ValueError(f"clip must be an int >= 0 when a relative table or bucket_bias is given, got {clip}")
        expected_bias = [(2 * clip + 1,), (heads, 2 * clip + 1)]
        if bucket_bias is not None and (not bucket_bias.is_floating_point() or tuple(bucket_bias.shape) not in expected_bias):
            raise ValueError(f"bucket_bias must be a float [2*clip+1] or [H, 2*clip+1] = {expected_bias}, "
                             f"got {bucket_bias.dtype} {tuple(bucket_bias.shape)}")
    if tables:
        for name, table in (("rel_k", rel_k), ("rel_v", rel_v)):
            expected = [(2 * clip + 1, dim), (heads, 2 * clip + 1, dim)]
            if table is not None and tuple(table.shape) not in expected:
                raise ValueError(f"{name} must be [2*clip+1, d] or [H, 2*clip+1, d] = {expected}, got {tuple(table.shape)}")
        if impl == "sdpa":
            raise ValueError("impl='sdpa' computes content attention only (no relative tables)")
    elif bucket_bias is None:
        clip = 0
    if rotary is not None:
        expected_rows = max(offset + q_len, k_len)
        if len(rotary) != 2 or any(t.dim() != 2 or t.shape[0] < expected_rows or t.shape[1] * 2 != dim for t in rotary):
            raise ValueError(f"rotary must be (cos, sin), each [P >= {expected_rows}, d/2 = {dim // 2}], got "
                             f"{[tuple(t.shape) for t in rotary]}")
    if k_len == 0:  # nothing to attend to: every row is dead
        return q.new_zeros(q.shape)
    # Distances j - (i + offset) lie in [-(offset + Lq - 1), Lk - 1 - offset]. Buckets beyond the longest one are
    # never read, so a clip k above it equals that distance on the table's middle rows (the unused rows get zero
    # gradients either way). The paper's k = 64 and 256 on ~30-token sentences then do 2L-1 table products, not 2k+1.
    reach = max(offset + q_len - 1, k_len - 1 - offset)
    if (tables or bucket_bias is not None) and clip > reach:
        middle = slice(clip - reach, clip + reach + 1)
        rel_k = None if rel_k is None else rel_k[..., middle, :]
        rel_v = None if rel_v is None else rel_v[..., middle, :]
        bucket_bias = None if bucket_bias is None else bucket_bias[..., middle]
        clip = reach

    device_type = q.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else q.dtype
    if impl == "auto" and _float32_on_cpu(device_type, dtype):
        dtype = torch.float32
    q, k, v, bucket_bias = (_cast(t, dtype) for t in (q, k, v, bucket_bias))
    bias = _bias_4d(bias, (batch, heads, q_len, k_len), dtype)
    needs_grad = _needs_grad(q, k, v, rel_k, rel_v, bias, bucket_bias)
    if impl == "auto":
        impl = choose_impl(q, k_len, tables=tables, needs_grad=needs_grad)
    elif impl == "native" and not native.available(q):
        raise ValueError(f"impl='native' needs float32 CPU tensors and a C compiler (got {dtype} on {q.device})")
    if impl != "triton":
        rel_k, rel_v = _cast(rel_k, dtype), _cast(rel_v, dtype)
    # else the kernels read the tables in their own dtype (float32 parameters under bf16 autocast) and round them
    # to the compute dtype on chip, as the cast would, and their float32 gradients need no cast back: four
    # fewer kernels and two fewer autograd nodes per call, and gradients not rounded to bfloat16
    angles = None
    if rotary is not None:
        cos, sin = (t.to(dtype) for t in rotary)
        angles = (cos[offset:offset + q_len].contiguous(), sin[offset:offset + q_len].contiguous(),
                  cos[:k_len].contiguous(), sin[:k_len].contiguous())
        if impl != "native":  # only the native Function rotates inside
            q, k = rotate(q, *angles[:2]), rotate(k, *angles[2:])
            angles = None
    if bucket_bias is not None and not (impl == "native" and rel_k is not None):
        spread = bucket_bias[..., relative_position_index(q_len, k_len, clip, offset, q.device)]  # [H?, Lq, Lk]
        bias = _bias_4d(spread if bias is None else bias + spread, (batch, heads, q_len, k_len), dtype)
        bucket_bias = None

    mask, dead = None, None
    if isinstance(attn_mask, PreparedMask):  # prepared once for all the layers of a stack
        mask, dead = attn_mask.allowed, attn_mask.dead
    elif attn_mask is not None:
        mask, dead = revive_dead_rows(as_4d(attn_mask.to(q.device)))
    if impl == "sdpa":
        return _sdpa(q, k, v, bias, mask, dead, dropout_p)
    if impl == "triton":  # imported here: triton is optional; dropout is drawn inside its kernels from a seed
        from rpr_mt.model.kernels.triton_shaw import triton_relative_attention

        with torch.autocast(device_type, enabled=False):
            return triton_relative_attention(q, k, v, rel_k, rel_v, bias, mask, dead, clip, offset, dropout_p)
    keep = None
    if dropout_p > 0:
        keep, dropout_p = keep_mask((batch, heads, q_len, k_len), dropout_p, q.device), drop_rate(dropout_p, q.device)

    with torch.autocast(device_type, enabled=False):
        if impl == "gather":
            return relative_attention_gather(q, k, v, rel_k, rel_v, bias, mask, dead, keep, clip, offset, dropout_p)
        if chunk_bytes is None:
            chunk_bytes = _CPU_CHUNK_BYTES if device_type == "cpu" else _ACCEL_CHUNK_BYTES
        if save_probs is None:
            # inference (translation) keeps nothing for a backward pass
            save_probs = needs_grad and _fits_saved_probs(q, k_len)
        function = native.NativeRelativeAttention if impl == "native" else ChunkedRelativeAttention
        extra = () if impl != "native" else (bucket_bias, angles)  # only the native Function takes these (above)
        return function.apply(
            q, k, v, rel_k, rel_v, bias, mask, dead, keep, clip, offset, dropout_p, chunk_bytes, save_probs, *extra
        )


def content_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Tensor | PreparedMask | None = None,
    bias: Tensor | None = None,
    rotary: tuple[Tensor, Tensor] | None = None,
    offset: int = 0,
    dropout_p: float = 0.0,
    impl: str = "auto",
) -> Tensor:
    """Scaled dot-product attention without relative tables: softmax(q k^T / sqrt(d) + bias, masked) v.
    Arguments as for ``relative_attention``."""
    return relative_attention(
        q, k, v, None, None, clip=None, attn_mask=attn_mask, bias=bias, rotary=rotary, offset=offset,
        dropout_p=dropout_p, impl=impl,
    )


def _sdpa(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None, dead: Tensor | None, dropout_p: float
) -> Tensor:
    """SDPA with the mask, or the bias with the mask folded in (finfo.min where masked: no row is all masked)."""
    attn_mask = mask
    if bias is not None:
        attn_mask = bias if mask is None else bias + mask_bias(mask, bias.dtype)
    with _without_cudnn_attention():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    return out if dead is None else out.masked_fill(dead, 0)


@contextlib.contextmanager
def _without_cudnn_attention() -> Iterator[None]:
    """SDPA without its cuDNN backend (flash, memory-efficient and math stay), the previous setting restored after.

    Torch tries cuDNN attention first on Hopper and newer GPUs, and cuDNN builds an execution plan for every new
    shape. A translation trainer and a beam search meet hundreds of shapes (a new (batch, length) shape nearly every
    update of a first epoch), so with cuDNN the first epoch runs several times slower than the next ones (figures:
    docs/benchmarks.md, "GPU", "The first epoch: kernel variants and cuDNN plans"); flash and memory-efficient
    attention have no per-shape cost. Two flag calls, not ``sdpa_kernel``, which costs more host time a call."""
    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    if enabled:
        torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        if enabled:
            torch.backends.cuda.enable_cudnn_sdp(True)
