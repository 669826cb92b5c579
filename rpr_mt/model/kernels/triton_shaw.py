"""Relation-aware attention (Shaw, Uszkoreit & Vaswani 2018) as fused Triton kernels, forward and backward, in the
style of FlashAttention-2: the [Lq, Lk] scores and probabilities live only in on-chip tiles.

    e_ij = (q_i . k_j + q_i . w^K[r_ij]) / sqrt(d) + bias_ij      z_i = sum_j softmax_j(e_ij) (v_j + w^V[r_ij])
    r_ij = clip(j - (i + offset), -k, k) + k

The bucket geometry of ``geometry.py``, tile by tile. A tile of queries m0.. and keys n0.. whose distances
j - (i + offset) are all <= -k reads one bucket (0) per row, one whose distances are all >= k another (2k); only the
tiles that cross the band of width 2k + 1 around the diagonal need the per-element bucket r_ij.

* Key term: each forward program first computes A = q w^K^T [BM, 2k+1] for its rows (one small tl.dot) and
  writes it to a [.., Lq, 2k+1] buffer that the backward pass reuses. In a tile the term is A[i, 0] or A[i, 2k]
  broadcast along the row, or, in band tiles, A[i, r_ij] through a gathered load of the row (L1-resident).
* Value term: sum_j P_ij w^V[r_ij] = fold(P)_i w^V, fold(P)[i, r] = sum_{j: r_ij = r} P_ij. The two end buckets
  are row sums accumulated next to P v in the online softmax (rescaled by the same factor): the whole row of a
  one-bucket tile, a masked row sum in a band tile. An interior bucket t = 1 .. 2k-1 of row i holds the single key
  j = i + offset - k + t, so the band tile stores that pair's logit once into the fold buffer, and after the loop
  (a barrier) the program reads its rows back and turns them into probabilities with the final max and sum. No
  register gather: tl.gather's warp-shuffle lowering of that fold spilled registers on sm_90. The program ends
  with fold(P) w^V (one [BM, 2k+1] x [2k+1, d] tl.dot) and keeps fold(P) for the table's gradient.
* Backward (FlashAttention-2, probabilities recomputed from the saved log-sum-exp): a preprocess kernel computes
  delta_i = dO_i . O_i and G = dO w^V^T; dP = dO v^T + place(G), dS = P (dP - delta); one kernel per key block
  for dK and dV, one per query block for dQ (with fold(dS) w^K, fold(dS) built like fold(P)), the bias gradient,
  and each block's share of the table gradients, fold(dS)^T q / sqrt(d) and fold(P)^T dO, added atomically into
  [H, 2k+1, d] (one [2k+1, d] for shared tables). Nothing runs in torch but allocations, zero-fills and casts.
  ``RPR_MT_TRITON_BACKWARD=serial`` runs the pass after the preprocess as one program per (batch, head) instead
  (``_shaw_bwd_serial``): every tile computed once for dK, dV, dQ and fold(dS) together, dQ and fold(dS) added in
  float32 buffers of that program, then dQ and the table gradients per query block (``backward_variant``).
  (Floating-point atomic adds, here and for a broadcast bias's gradient, make those gradients not bitwise
  reproducible on a GPU.)

Extra memory is O(B H Lq (2k+1)): the bucket products and folds, the log-sum-exp and delta. Nothing of size Lq x Lk
is stored, except the bias's own gradient when a bias of that size needs one.

Options: per-head ([H, 2k+1, d]) or shared ([2k+1, d]) tables, K only, V only, both or neither (content attention),
a boolean mask broadcastable to [B, H, Lq, Lk] (padding, causal, anything), a float logit bias broadcastable to
[B, H, Lq, Lk] with its gradient (T5, ALiBi, Transformer-XL), the query offset of cached decoding, and attention
dropout: the keep mask is drawn inside the kernels from a seed (Philox, ``tl.rand``) and redrawn in the backward pass,
so no [B, H, Lq, Lk] mask is stored; ``dropout_keep_mask`` reproduces it, and an explicit keep mask can be passed
instead (tests). Rows with no allowed key (dead rows) give zeros and zero gradients, as everywhere in rpr-mt.

Triton is optional (``pip install 'triton>=3.2'``): this module imports without it, and ``dispatch`` imports it
only for ``impl="triton"`` or where its default policy may pick these kernels (bfloat16 relative attention on an
sm_80+ NVIDIA GPU; ``dispatch._triton_runs``). On a CPU the kernels run in Triton's interpreter
(``TRITON_INTERPRET=1``, set before Triton is imported), which is how the tests check them against the float64
reference without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from typing import NamedTuple

import torch
from torch import Tensor

from rpr_mt.errors import UserError
from rpr_mt.model.kernels.triton_launch import Launcher, direct_launch_supported

try:
    import triton
    import triton.language as tl
except ImportError:  # optional dependency: the module must import without it
    triton = None
    tl = None

__all__ = [
    "Blocks",
    "Tiles",
    "TilesError",
    "TritonShawAttention",
    "as_tiles",
    "available",
    "backward_variant",
    "compiled_variants",
    "draw_seed",
    "dropout_keep_mask",
    "format_tiles",
    "parse_tiles",
    "triton_relative_attention",
    "unavailable_reason",
]

LOG2E = 1.4426950408889634


class Blocks(NamedTuple):
    """Tile sizes and launch settings (powers of two, >= 16: tl.dot's minimum on GPUs)."""

    m: int = 64  # queries per tile
    n: int = 64  # keys per tile
    warps: int = 4
    stages: int = 2


class Tiles(NamedTuple):
    """Launch settings of each kernel (``benchmarks/tune_gpu_attention.py`` times them kernel by kernel). The
    defaults are one Blocks for all: tiles chosen per kernel make the attention calls of a benchmark faster but
    base-model training slower (docs/benchmarks.md, "GPU")."""

    forward: Blocks = Blocks()
    dkdv: Blocks = Blocks()  # BN keys per program, BM queries per loop step; also the serial backward's tiles
    dq: Blocks = Blocks()  # also the rows of the preprocess kernel


def as_tiles(blocks: Blocks | Tiles | None) -> Tiles:
    """One Blocks for every kernel, or a Tiles as given; None: the interpreter's tiles, or on a GPU those of
    ``RPR_MT_TRITON_TILES`` when it is set (``parse_tiles``; for tuning on a new GPU), else ``Tiles()``."""
    if blocks is None:
        if interpreting():
            return _INTERPRETER_TILES
        return parse_tiles(os.environ.get("RPR_MT_TRITON_TILES", ""))
    if isinstance(blocks, Tiles):
        return blocks
    return Tiles(blocks, blocks, blocks)


class TilesError(UserError, ValueError):
    """A malformed RPR_MT_TRITON_TILES (the CLI reports it as one line, like any input error)."""


@functools.lru_cache(maxsize=8)
def parse_tiles(spec: str) -> Tiles:
    """Tiles from "fwd=BM,BN,warps,stages;dkdv=...;dq=..." (any subset; the rest default; "" gives ``Tiles()``), as
    ``benchmarks/tune_gpu_attention.py`` prints them."""
    fields = Tiles()._asdict()
    names = {"fwd": "forward", "forward": "forward", "dkdv": "dkdv", "dq": "dq"}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        key, _, value = (x.strip() for x in part.partition("="))
        if key not in names:
            raise TilesError(f"RPR_MT_TRITON_TILES: unknown part {key!r} in {spec!r} (fwd, dkdv, dq)")
        try:
            numbers = [int(x) for x in value.split(",")]
        except ValueError:
            numbers = []
        if len(numbers) != 4:
            raise TilesError(f"RPR_MT_TRITON_TILES: {key}={value!r} is not BM,BN,warps,stages (four integers)")
        blocks = Blocks(*numbers)
        if (min(blocks.m, blocks.n) < 16 or blocks.warps < 1 or blocks.stages < 1
                or any(x & (x - 1) for x in (blocks.m, blocks.n, blocks.warps))):
            raise TilesError(f"RPR_MT_TRITON_TILES: {key}={value!r}: BM, BN >= 16, warps >= 1, stages >= 1, and BM, "
                             "BN, warps powers of two")
        fields[names[key]] = blocks
    return Tiles(**fields)


def format_tiles(tiles: Tiles) -> str:
    """The ``parse_tiles`` form of ``tiles``."""
    def blocks(b: Blocks) -> str:
        return ",".join(str(x) for x in b)

    return f"fwd={blocks(tiles.forward)};dkdv={blocks(tiles.dkdv)};dq={blocks(tiles.dq)}"


BACKWARDS = ("split", "serial")


def backward_variant() -> str:
    """The backward kernels, from ``RPR_MT_TRITON_BACKWARD`` (default "split"): "split" is a dK/dV kernel per key
    block and a dQ kernel per query block, each recomputing the tiles (B H (Lk / BN + Lq / BM) programs); "serial" is
    one program per (batch, head) that computes every tile once (``_shaw_bwd_serial``: fewer programs, no second
    recomputation, one launch less). Which is faster depends on the GPU and the shapes: measured by
    ``benchmarks/bench_gpu_train.py --schemes relative-triton relative-triton-serial``."""
    name = os.environ.get("RPR_MT_TRITON_BACKWARD", "") or "split"
    if name not in BACKWARDS:
        raise TilesError(f"RPR_MT_TRITON_BACKWARD: {name!r} is not one of {', '.join(BACKWARDS)}")
    return name


# Interpreter runs use the smallest legal tiles, so that tiny test shapes still span several tiles of each kind.
_INTERPRETER_BLOCKS = Blocks(16, 16, 1, 1)
_INTERPRETER_TILES = Tiles(_INTERPRETER_BLOCKS, _INTERPRETER_BLOCKS, _INTERPRETER_BLOCKS)


def interpreting() -> bool:
    """Whether Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1 when Triton was imported)."""
    if triton is None:
        return False
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # older Triton
        return os.environ.get("TRITON_INTERPRET", "0") == "1"


def unavailable_reason(q: Tensor) -> str | None:
    """None when the kernels can run on tensors like ``q``, else why not."""
    if triton is None:
        return "impl='triton' needs the triton package (pip install 'triton>=3.2')"
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return f"impl='triton' computes in float16, bfloat16, float32 (or float64 in the interpreter), got {q.dtype}"
    if interpreting():
        if q.device.type != "cpu":
            return f"the Triton interpreter (TRITON_INTERPRET=1) runs on CPU tensors, got {q.device}"
        return None
    if q.device.type != "cuda":
        return (f"impl='triton' runs on CUDA tensors, got {q.device} (set TRITON_INTERPRET=1 before importing triton "
                "to run the kernels on the CPU in Triton's interpreter)")
    if q.dtype == torch.float64:
        return "impl='triton' computes in float16, bfloat16 or float32 on a GPU (float64 only in the interpreter)"
    return None


def available(q: Tensor) -> bool:
    return unavailable_reason(q) is None


def draw_seed() -> int:
    """The dropout seed of one call, from torch's global CPU generator (so torch.manual_seed and checkpointed RNG
    states govern it, and drawing it costs no device synchronisation)."""
    return int(torch.randint(0, 2**30, (), dtype=torch.int64))


def _next_pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, (n - 1).bit_length()))


# ----------------------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------------------

# Integer arguments that change with the batch's lengths or from call to call. Triton specializes an integer argument on
# == 1 and on divisibility by 16 and compiles a kernel variant per combination it meets: a trainer meeting lengths
# 20-100 and a dropout seed per call (divisible by 16 one call in 16) compiled new variants well into its first
# epoch. Not specializing them costs the divisibility hints of mask-row loads; unit strides along d and keys stay
# specialized.
_UNSPECIALIZED = ("Lq", "Lk", "offset", "clip", "seed", "sb_b", "sb_h", "sb_m", "sm_b", "sm_h", "sm_m", "sp_b", "sp_h",
                  "sp_m", "sx_b", "sx_h", "sd_b", "sd_h", "sd_m")


def _jit_kernel(fn):
    """triton.jit without specialization on the arguments of ``_UNSPECIALIZED`` that ``fn`` takes."""
    names = [name for name in inspect.signature(fn).parameters if name in _UNSPECIALIZED]
    return triton.jit(do_not_specialize=names)(fn)


if triton is not None:

    @triton.jit
    def _keep(seed, pid_bh, rm, cols, Lk, drop_p):
        """Dropout keep mask at rows rm [BM] and key columns cols ([BM, N] or [1, N]): Philox uniforms keyed by
        (seed + batch*heads index) at counter i * Lk + j, so any tile or any gathered set of pairs draws the same."""
        return tl.rand(seed + pid_bh, rm[:, None] * Lk + cols) >= drop_p

    @triton.jit
    def _program(L, H, BLOCK: tl.constexpr):
        """(block, batch*heads index, batch, head) of this program on a 1-d grid of cdiv(L, BLOCK) * B * H programs:
        the blocks of one (batch, head) are neighbours, so they share its keys and values in L2, and the grid has
        no 65,535 limit on B * H. Batch and head are int64 (offsets like b * H * Lq * Lk exceed int32)."""
        blocks = tl.cdiv(L, BLOCK)
        pid = tl.program_id(0)
        pid_bh = pid // blocks
        return pid % blocks, pid_bh, (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)

    @triton.jit
    def _live(Dead, b, h, rm, row_ok, sx_b, sx_h, sx_m, HAS_DEAD: tl.constexpr):
        """[BM] True for the rows that have an allowed key; dead rows output zeros and pass no gradient."""
        if HAS_DEAD:
            live = tl.load(Dead + b * sx_b + h * sx_h + rm * sx_m, mask=row_ok, other=0) == 0
        else:
            live = rm >= 0
        return live

    @triton.jit
    def _tile_kind(m0, n0, offset, clip, BM: tl.constexpr, BN: tl.constexpr):
        """0: every pair of the tile in bucket 0 (distances j - (i + offset) all <= -k, or k = 0); 1: all in bucket
        2k (distances >= k); 2: the tile crosses the band."""
        lo_d = n0 - (m0 + BM - 1) - offset
        hi_d = n0 + BN - 1 - m0 - offset
        kind = 2
        if (hi_d <= -clip) | (clip == 0):
            kind = 0
        elif lo_d >= clip:
            kind = 1
        return kind

    @triton.jit
    def _place(rows, row_ok, rm, rn, kind, offset, clip, BM: tl.constexpr, BN: tl.constexpr):
        """[BM, BN] tile of place(A)[i, j] = A[i, r_ij]; ``rows`` [BM] points at the rows of A [.., Lq, NB]."""
        if kind == 0:
            out = tl.broadcast_to(tl.load(rows, mask=row_ok, other=0.0)[:, None], (BM, BN))
        elif kind == 1:
            out = tl.broadcast_to(tl.load(rows + 2 * clip, mask=row_ok, other=0.0)[:, None], (BM, BN))
        else:  # a gathered load of each row's buckets (a few hundred bytes a row, in cache)
            delta = rn[None, :] - rm[:, None] - offset
            bucket = tl.minimum(tl.maximum(delta, -clip), clip) + clip
            out = tl.load(rows[:, None] + bucket, mask=row_ok[:, None], other=0.0)
        return out

    @triton.jit
    def _fold_tile(x, keep_value, rows, row_ok, col_ok, rm, rn, kind, offset, clip):
        """The fold of a tile x [BM, BN]: returns its row sums over bucket 0 and over bucket 2k, and stores
        ``keep_value`` of the interior pairs (-k < j - (i + offset) < k, one key per row and bucket) at
        rows[i] + r_ij, each (i, r) exactly once over all tiles of a row block."""
        if kind == 0:
            low = tl.sum(x, 1)
            high = tl.zeros_like(low)
        elif kind == 1:
            high = tl.sum(x, 1)
            low = tl.zeros_like(high)
        else:
            delta = rn[None, :] - rm[:, None] - offset
            low = tl.sum(tl.where(delta <= -clip, x, 0.0), 1)
            high = tl.sum(tl.where(delta >= clip, x, 0.0), 1)
            inner = (delta > -clip) & (delta < clip) & row_ok[:, None] & col_ok[None, :]
            tl.store(rows[:, None] + (delta + clip), keep_value, mask=inner)
        return low, high

    @triton.jit
    def _with_ends(interior, low, high, rb, clip):
        """A fold [BM, NB] from its interior buckets and the row sums of its two end buckets (bucket 0 first: with
        k = 0 buckets 0 and 2k are one, and it holds the row's whole sum, ``low``)."""
        return tl.where(rb[None, :] == 0, low[:, None], tl.where(rb[None, :] == 2 * clip, high[:, None], interior))

    @triton.jit
    def _logits(q, k, QA, Bias, Mask, row_ok, col_ok, rm, rn, kind, b, h, offset, clip, S,
                sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n,
                HAS_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, ROWS: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr):
        """[BM, BN] logits in log2 units, -inf where masked or beyond Lk: (q k^T + place(q w^K^T)) * scale * log2(e)
        + bias * log2(e). ROWS (bit 0: the bias, bit 1: the mask) says which vary along the queries; the others
        (padding masks, per-key biases) are read once per key tile as a row."""
        s = tl.dot(q, tl.trans(k), input_precision=PREC).to(ACC)
        if HAS_K:
            s += _place(QA + rm * NB, row_ok, rm, rn, kind, offset, clip, BM, BN)
        s = s * tl.load(S)  # scale * log2(e), in the accumulator's precision
        both = row_ok[:, None] & col_ok[None, :]
        if HAS_BIAS:
            if ROWS % 2 == 1:
                bias = tl.load(Bias + b * sb_b + h * sb_h + rm[:, None] * sb_m + rn[None, :] * sb_n, mask=both,
                               other=0.0)
            else:
                bias = tl.load(Bias + b * sb_b + h * sb_h + rn[None, :] * sb_n, mask=col_ok[None, :], other=0.0)
            s += bias.to(ACC) * tl.load(S + 1)  # log2(e)
        allowed = col_ok[None, :]
        if HAS_MASK:
            if ROWS // 2 == 1:
                allowed = allowed & (tl.load(Mask + b * sm_b + h * sm_h + rm[:, None] * sm_m + rn[None, :] * sm_n,
                                             mask=both, other=0) != 0)
            else:
                allowed = allowed & (tl.load(Mask + b * sm_b + h * sm_h + rn[None, :] * sm_n, mask=col_ok[None, :],
                                             other=0) != 0)
        return tl.where(allowed, s, float("-inf"))

    @_jit_kernel
    def _shaw_fwd(
        Q, K, V, AK, AV, Bias, Mask, Keep, Dead, O, LSE, QA, FOLD,
        sq_b, sq_h, sq_m, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, so_b, so_h, so_m, so_d,
        sa_h, sa_r, sa_d, st_h, st_r, st_d, sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n, sp_b, sp_h, sp_m, sp_n,
        sx_b, sx_h, sx_m,
        H, Lq, Lk, D, offset, clip, S, drop_p, seed,
        HAS_K: tl.constexpr, HAS_V: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
        HAS_DEAD: tl.constexpr, ROWS: tl.constexpr, DROPOUT: tl.constexpr, STORE_FOLD: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, NB: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
        TDT: tl.constexpr, TPREC: tl.constexpr,
    ):
        """Output and log-sum-exp of one query block. With the key table it first writes q w^K^T of its rows into
        QA (read back by the band tiles, and kept for the backward pass); with the value table, FOLD collects the
        interior logits (-inf where a bucket has no key) and then holds fold(P) for the table's gradient."""
        pid_m, pid_bh, b, h = _program(Lq, H, BM)
        m0 = pid_m * BM
        rm = m0 + tl.arange(0, BM)
        rd = tl.arange(0, BD)
        rb = tl.arange(0, NB)
        row_ok = rm < Lq
        d_ok = rd < D
        buckets = rb[:, None] <= 2 * clip
        q = tl.load(Q + b * sq_b + h * sq_h + rm[:, None] * sq_m + rd[None, :] * sq_d,
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        QA += pid_bh.to(tl.int64) * Lq * NB
        fold_rows = FOLD + pid_bh.to(tl.int64) * Lq * NB + rm * NB
        K += b * sk_b + h * sk_h
        V += b * sv_b + h * sv_h
        if HAS_K:  # A = q w^K^T for this block's rows, fp32 products of the input type
            table = tl.load(AK + h * sa_h + rb[:, None] * sa_r + rd[None, :] * sa_d, mask=buckets & d_ok[None, :],
                            other=0.0)
            qa = tl.dot(q, tl.trans(table.to(q.dtype)), input_precision=PREC).to(ACC)
            tl.store(QA + rm[:, None] * NB + rb[None, :], qa, mask=row_ok[:, None])
        if HAS_V:
            tl.store(fold_rows[:, None] + rb[None, :], tl.full([BM, NB], float("-inf"), ACC), mask=row_ok[:, None])
        if HAS_K or HAS_V:
            tl.debug_barrier()  # the band tiles read rows of QA written by other threads; FOLD is filled first

        m_i = tl.full([BM], float("-inf"), ACC)
        l_i = tl.zeros([BM], ACC)
        low = tl.zeros([BM], ACC)  # fold(P) into bucket 0 and bucket 2k, rescaled like acc
        high = tl.zeros([BM], ACC)
        acc = tl.zeros([BM, BD], ACC)
        for n0 in range(0, Lk, BN):
            rn = n0 + tl.arange(0, BN)
            col_ok = rn < Lk
            kind = _tile_kind(m0, n0, offset, clip, BM, BN)
            k = tl.load(K + rn[:, None] * sk_n + rd[None, :] * sk_d, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            s = _logits(q, k, QA, Bias, Mask, row_ok, col_ok, rm, rn, kind, b, h, offset, clip, S,
                        sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n, HAS_K, HAS_BIAS, HAS_MASK, ROWS, BM, BN, NB,
                        ACC, PREC)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row masked so far: keep exp2 finite
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if DROPOUT == 1:
                p = tl.where(_keep(seed, pid_bh, rm, rn[None, :], Lk, drop_p), p, 0.0)
            elif DROPOUT == 2:
                kept = tl.load(Keep + b * sp_b + h * sp_h + rm[:, None] * sp_m + rn[None, :] * sp_n,
                               mask=row_ok[:, None] & col_ok[None, :], other=0)
                p = tl.where(kept != 0, p, 0.0)
            v = tl.load(V + rn[:, None] * sv_n + rd[None, :] * sv_d, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC).to(ACC)
            if HAS_V:
                low_t, high_t = _fold_tile(p, s, fold_rows, row_ok, col_ok, rm, rn, kind, offset, clip)
                low = low * alpha + low_t
                high = high * alpha + high_t
            m_i = m_new

        l_i = tl.where(row_ok, l_i, 1.0)  # rows past Lq (never stored) saw nothing; every other row has a key
        inv = tl.load(S + 3) / l_i  # 1 / (1 - p_drop) / l
        out = acc * inv[:, None]
        if HAS_V:
            # interior buckets: P from the stored logits with the final max and sum; -inf (never written) gives 0
            tl.debug_barrier()  # the interior logits were stored by other threads of this program
            fold_ptrs = fold_rows[:, None] + rb[None, :]
            logits = tl.load(fold_ptrs, mask=row_ok[:, None], other=float("-inf"), cache_modifier=".cg")
            m_fin = tl.where(m_i == float("-inf"), 0.0, m_i)
            inner = tl.exp2(logits - m_fin[:, None])
            key = rm[:, None] + offset - clip + rb[None, :]  # the key of interior bucket t: j = i + offset - k + t
            if DROPOUT == 1:
                inner = tl.where(_keep(seed, pid_bh, rm, key, Lk, drop_p), inner, 0.0)
            elif DROPOUT == 2:
                key_ok = row_ok[:, None] & (key >= 0) & (key < Lk)
                kept = tl.load(Keep + b * sp_b + h * sp_h + rm[:, None] * sp_m + key * sp_n, mask=key_ok, other=0)
                inner = tl.where(kept != 0, inner, 0.0)
            fold = _with_ends(inner, low, high, rb, clip)
            fold = fold * inv[:, None]
            table = tl.load(AV + h * st_h + rb[:, None] * st_r + rd[None, :] * st_d, mask=buckets & d_ok[None, :],
                            other=0.0)
            out += tl.dot(fold.to(TDT), table.to(TDT), input_precision=TPREC).to(ACC)
            if STORE_FOLD:
                tl.debug_barrier()  # every thread has read its logits before fold(P) overwrites them
                tl.store(fold_ptrs, fold, mask=row_ok[:, None])
        live = _live(Dead, b, h, rm, row_ok, sx_b, sx_h, sx_m, HAS_DEAD)
        out = tl.where(live[:, None], out, 0.0)
        tl.store(O + b * so_b + h * so_h + rm[:, None] * so_m + rd[None, :] * so_d,
                 out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        tl.store(LSE + pid_bh.to(tl.int64) * Lq + rm, m_i + tl.log2(l_i), mask=row_ok)

    @_jit_kernel
    def _shaw_bwd_pre(
        O, DO, AV, Dead, DELTA, G,
        so_b, so_h, so_m, so_d, sg_b, sg_h, sg_m, sg_d, st_h, st_r, st_d, sx_b, sx_h, sx_m,
        H, Lq, D, clip,
        HAS_V: tl.constexpr, HAS_DEAD: tl.constexpr,
        BM: tl.constexpr, BD: tl.constexpr, NB: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
    ):
        """delta_i = dO_i . O_i (FlashAttention's sum_j P_ij dP_ij, value term and dropout included) and, with the
        value table, G = dO w^V^T [.., Lq, NB] (the value term's part of dP); dead rows get no gradient."""
        pid_m, pid_bh, b, h = _program(Lq, H, BM)
        rm = pid_m * BM + tl.arange(0, BM)
        rd = tl.arange(0, BD)
        rb = tl.arange(0, NB)
        row_ok = rm < Lq
        d_ok = rd < D
        both = row_ok[:, None] & d_ok[None, :]
        o = tl.load(O + b * so_b + h * so_h + rm[:, None] * so_m + rd[None, :] * so_d, mask=both, other=0.0)
        do = tl.load(DO + b * sg_b + h * sg_h + rm[:, None] * sg_m + rd[None, :] * sg_d, mask=both, other=0.0)
        do = tl.where(_live(Dead, b, h, rm, row_ok, sx_b, sx_h, sx_m, HAS_DEAD)[:, None], do, 0.0)
        tl.store(DELTA + pid_bh.to(tl.int64) * Lq + rm, tl.sum(o.to(ACC) * do.to(ACC), 1), mask=row_ok)
        if HAS_V:
            table = tl.load(AV + h * st_h + rb[:, None] * st_r + rd[None, :] * st_d,
                            mask=(rb[:, None] <= 2 * clip) & d_ok[None, :], other=0.0)
            g = tl.dot(do, tl.trans(table.to(do.dtype)), input_precision=PREC).to(ACC)
            tl.store(G + pid_bh.to(tl.int64) * Lq * NB + rm[:, None] * NB + rb[None, :], g, mask=row_ok[:, None])

    @triton.jit
    def _grad_logits(q, k, v, do, lse, delta, QA, G, Bias, Mask, Keep, row_ok, col_ok, rm, rn, kind, b, h, pid_bh,
                     Lk, offset, clip, S, drop_p, seed,
                     sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n, sp_b, sp_h, sp_m, sp_n,
                     HAS_K: tl.constexpr, HAS_V: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
                     ROWS: tl.constexpr, DROPOUT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr,
                     ACC: tl.constexpr, PREC: tl.constexpr):
        """(dropped P, dS) of a tile: the recomputed probabilities that reach the output (kept and scaled), and the
        gradient of the logits dS = P (dP - delta), dP = (dO v^T + place(dO w^V^T)) * keep / (1 - p_drop)."""
        s = _logits(q, k, QA, Bias, Mask, row_ok, col_ok, rm, rn, kind, b, h, offset, clip, S,
                    sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n, HAS_K, HAS_BIAS, HAS_MASK, ROWS, BM, BN, NB, ACC,
                    PREC)
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PREC).to(ACC)
        if HAS_V:
            dp += _place(G + rm * NB, row_ok, rm, rn, kind, offset, clip, BM, BN)
        drop_scale = tl.load(S + 3)
        if DROPOUT == 1:
            kept = _keep(seed, pid_bh, rm, rn[None, :], Lk, drop_p)
            pd = tl.where(kept, p * drop_scale, 0.0)
            dp = tl.where(kept, dp * drop_scale, 0.0)
        elif DROPOUT == 2:
            kept = tl.load(Keep + b * sp_b + h * sp_h + rm[:, None] * sp_m + rn[None, :] * sp_n,
                           mask=row_ok[:, None] & col_ok[None, :], other=0) != 0
            pd = tl.where(kept, p * drop_scale, 0.0)
            dp = tl.where(kept, dp * drop_scale, 0.0)
        else:
            pd = p
        ds = p * (dp - delta[:, None])
        return pd, ds

    @triton.jit
    def _query_tile(Q, DO, LSE, DELTA, QA, G, Bias, Mask, Keep, Dead, k, v, m0, n0, rn, col_ok, rd, d_ok, b, h, pid_bh,
                    Lq, Lk, offset, clip, S, drop_p, seed, sq_m, sq_d, sg_m, sg_d,
                    sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n, sp_b, sp_h, sp_m, sp_n, sx_b, sx_h, sx_m,
                    HAS_K: tl.constexpr, HAS_V: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
                    HAS_DEAD: tl.constexpr, ROWS: tl.constexpr, DROPOUT: tl.constexpr, BM: tl.constexpr,
                    BN: tl.constexpr, NB: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr):
        """The query block m0.. against a key block's k, v (Q, DO, LSE, DELTA, QA, G already at this (batch, head)):
        its rows, q and dO (zero on dead rows), and the tile's (dropped P, dS) of ``_grad_logits``."""
        rm = m0 + tl.arange(0, BM)
        row_ok = rm < Lq
        kind = _tile_kind(m0, n0, offset, clip, BM, BN)
        q_mask = row_ok[:, None] & d_ok[None, :]
        q = tl.load(Q + rm[:, None] * sq_m + rd[None, :] * sq_d, mask=q_mask, other=0.0)
        do = tl.load(DO + rm[:, None] * sg_m + rd[None, :] * sg_d, mask=q_mask, other=0.0)
        do = tl.where(_live(Dead, b, h, rm, row_ok, sx_b, sx_h, sx_m, HAS_DEAD)[:, None], do, 0.0)
        lse = tl.load(LSE + rm, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + rm, mask=row_ok, other=0.0)
        pd, ds = _grad_logits(q, k, v, do, lse, delta, QA, G, Bias, Mask, Keep, row_ok, col_ok, rm, rn, kind,
                              b, h, pid_bh, Lk, offset, clip, S, drop_p, seed,
                              sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n, sp_b, sp_h, sp_m, sp_n,
                              HAS_K, HAS_V, HAS_BIAS, HAS_MASK, ROWS, DROPOUT, BM, BN, NB, ACC, PREC)
        return rm, row_ok, kind, q_mask, q, do, pd, ds

    @triton.jit
    def _add_bias_grad(DBIAS, ds, rm, rn, row_ok, col_ok, sd_m, sd_n, BIAS_GRAD: tl.constexpr, ROW_BC: tl.constexpr,
                       COL_BC: tl.constexpr):
        """A tile's share of the bias gradient (DBIAS at this (batch, head)): BIAS_GRAD 1 stores dS (a bias of full
        shape: each element is one tile's), 2 adds it atomically into a bias broadcast over some dims (ROW_BC: over
        queries, COL_BC: over keys; those are summed in the tile first)."""
        if BIAS_GRAD == 1:
            tl.store(DBIAS + rm[:, None] * sd_m + rn[None, :] * sd_n, ds, mask=row_ok[:, None] & col_ok[None, :])
        elif BIAS_GRAD == 2:
            ds_ok = tl.where(row_ok[:, None] & col_ok[None, :], ds, 0.0)
            if ROW_BC and COL_BC:
                tl.atomic_add(DBIAS, tl.sum(tl.sum(ds_ok, 1), 0))
            elif ROW_BC:
                tl.atomic_add(DBIAS + rn * sd_n, tl.sum(ds_ok, 0), mask=col_ok)
            elif COL_BC:
                tl.atomic_add(DBIAS + rm * sd_m, tl.sum(ds_ok, 1), mask=row_ok)
            else:
                tl.atomic_add(DBIAS + rm[:, None] * sd_m + rn[None, :] * sd_n, ds_ok,
                              mask=row_ok[:, None] & col_ok[None, :])

    @_jit_kernel
    def _shaw_bwd_dkdv(
        Q, K, V, DO, QA, G, LSE, DELTA, Bias, Mask, Keep, Dead, DK, DV,
        sq_b, sq_h, sq_m, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, sg_b, sg_h, sg_m, sg_d,
        sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n, sp_b, sp_h, sp_m, sp_n, sx_b, sx_h, sx_m,
        H, Lq, Lk, D, offset, clip, S, drop_p, seed,
        HAS_K: tl.constexpr, HAS_V: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
        HAS_DEAD: tl.constexpr, ROWS: tl.constexpr, DROPOUT: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, NB: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
    ):
        """dK and dV of one key block: a loop over all query blocks."""
        pid_n, pid_bh, b, h = _program(Lk, H, BN)
        n0 = pid_n * BN
        rn = n0 + tl.arange(0, BN)
        rd = tl.arange(0, BD)
        col_ok = rn < Lk
        d_ok = rd < D
        kv_mask = col_ok[:, None] & d_ok[None, :]
        k = tl.load(K + b * sk_b + h * sk_h + rn[:, None] * sk_n + rd[None, :] * sk_d, mask=kv_mask, other=0.0)
        v = tl.load(V + b * sv_b + h * sv_h + rn[:, None] * sv_n + rd[None, :] * sv_d, mask=kv_mask, other=0.0)
        Q += b * sq_b + h * sq_h
        DO += b * sg_b + h * sg_h
        QA += pid_bh.to(tl.int64) * Lq * NB
        G += pid_bh.to(tl.int64) * Lq * NB
        LSE += pid_bh.to(tl.int64) * Lq
        DELTA += pid_bh.to(tl.int64) * Lq
        dk = tl.zeros([BN, BD], ACC)
        dv = tl.zeros([BN, BD], ACC)
        for m0 in range(0, Lq, BM):
            rm, row_ok, kind, q_mask, q, do, pd, ds = _query_tile(
                Q, DO, LSE, DELTA, QA, G, Bias, Mask, Keep, Dead, k, v, m0, n0, rn, col_ok, rd, d_ok, b, h, pid_bh,
                Lq, Lk, offset, clip, S, drop_p, seed, sq_m, sq_d, sg_m, sg_d,
                sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n, sp_b, sp_h, sp_m, sp_n, sx_b, sx_h, sx_m,
                HAS_K, HAS_V, HAS_BIAS, HAS_MASK, HAS_DEAD, ROWS, DROPOUT, BM, BN, NB, ACC, PREC)
            dv += tl.dot(tl.trans(pd.to(do.dtype)), do, input_precision=PREC).to(ACC)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC).to(ACC)
        out = rn[:, None] * D + rd[None, :]  # DK, DV: contiguous [B, H, Lk, D]
        tl.store(DK + pid_bh.to(tl.int64) * Lk * D + out, (dk * tl.load(S + 2)).to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + pid_bh.to(tl.int64) * Lk * D + out, dv.to(DV.dtype.element_ty), mask=kv_mask)

    @_jit_kernel
    def _shaw_bwd_dq(
        Q, K, V, DO, QA, G, LSE, DELTA, AK, FOLD, Bias, Mask, Keep, Dead, DQ, FDS, DBIAS, DAK, DAV,
        sq_b, sq_h, sq_m, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, sg_b, sg_h, sg_m, sg_d,
        sa_h, sa_r, sa_d, sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n, sp_b, sp_h, sp_m, sp_n, sx_b, sx_h, sx_m,
        sd_b, sd_h, sd_m, sd_n, swk_h, swv_h,
        H, Lq, Lk, D, offset, clip, S, drop_p, seed,
        HAS_K: tl.constexpr, HAS_V: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
        HAS_DEAD: tl.constexpr, ROWS: tl.constexpr, DROPOUT: tl.constexpr,
        BIAS_GRAD: tl.constexpr, ROW_BC: tl.constexpr, COL_BC: tl.constexpr, GRAD_K: tl.constexpr, GRAD_V: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, NB: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
        TDT: tl.constexpr, TPREC: tl.constexpr,
    ):
        """dQ of one query block (a loop over all key blocks), its share of both tables' gradients, and the bias
        gradient. fold(dS) goes through FDS like fold(P) through FOLD in the forward pass.

        Table gradients: fold(dS)^T q * scale and fold(P)^T dO of the block, atomically added into DAK, DAV
        ([H or 1, 2k+1, D], head strides swk_h, swv_h: 0 for a shared table). BIAS_GRAD: 0 none, 1 a plain store
        (bias of full shape), 2 atomic adds into a bias broadcast over some dims (ROW_BC: over queries, COL_BC: over
        keys; those are summed in the tile first)."""
        pid_m, pid_bh, b, h = _program(Lq, H, BM)
        m0 = pid_m * BM
        rm = m0 + tl.arange(0, BM)
        rd = tl.arange(0, BD)
        rb = tl.arange(0, NB)
        row_ok = rm < Lq
        d_ok = rd < D
        q_mask = row_ok[:, None] & d_ok[None, :]
        table_mask = (rb[:, None] <= 2 * clip) & d_ok[None, :]
        q = tl.load(Q + b * sq_b + h * sq_h + rm[:, None] * sq_m + rd[None, :] * sq_d, mask=q_mask, other=0.0)
        do = tl.load(DO + b * sg_b + h * sg_h + rm[:, None] * sg_m + rd[None, :] * sg_d, mask=q_mask, other=0.0)
        do = tl.where(_live(Dead, b, h, rm, row_ok, sx_b, sx_h, sx_m, HAS_DEAD)[:, None], do, 0.0)
        lse = tl.load(LSE + pid_bh.to(tl.int64) * Lq + rm, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + pid_bh.to(tl.int64) * Lq + rm, mask=row_ok, other=0.0)
        QA += pid_bh.to(tl.int64) * Lq * NB
        G += pid_bh.to(tl.int64) * Lq * NB
        fds_rows = FDS + pid_bh.to(tl.int64) * Lq * NB + rm * NB
        K += b * sk_b + h * sk_h
        V += b * sv_b + h * sv_h
        DBIAS += b * sd_b + h * sd_h
        if HAS_K:
            tl.store(fds_rows[:, None] + rb[None, :], tl.zeros([BM, NB], ACC), mask=row_ok[:, None])
            tl.debug_barrier()  # zeros first: the loop's interior stores come from other threads
        dq = tl.zeros([BM, BD], ACC)
        low = tl.zeros([BM], ACC)  # fold(dS) into bucket 0 and bucket 2k
        high = tl.zeros([BM], ACC)
        for n0 in range(0, Lk, BN):
            rn = n0 + tl.arange(0, BN)
            col_ok = rn < Lk
            kind = _tile_kind(m0, n0, offset, clip, BM, BN)
            kv_mask = col_ok[:, None] & d_ok[None, :]
            k = tl.load(K + rn[:, None] * sk_n + rd[None, :] * sk_d, mask=kv_mask, other=0.0)
            v = tl.load(V + rn[:, None] * sv_n + rd[None, :] * sv_d, mask=kv_mask, other=0.0)
            pd, ds = _grad_logits(q, k, v, do, lse, delta, QA, G, Bias, Mask, Keep, row_ok, col_ok, rm, rn, kind,
                                  b, h, pid_bh, Lk, offset, clip, S, drop_p, seed,
                                  sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n, sp_b, sp_h, sp_m, sp_n,
                                  HAS_K, HAS_V, HAS_BIAS, HAS_MASK, ROWS, DROPOUT, BM, BN, NB, ACC, PREC)
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC).to(ACC)
            if HAS_K:
                low_t, high_t = _fold_tile(ds, ds, fds_rows, row_ok, col_ok, rm, rn, kind, offset, clip)
                low += low_t
                high += high_t
            _add_bias_grad(DBIAS, ds, rm, rn, row_ok, col_ok, sd_m, sd_n, BIAS_GRAD, ROW_BC, COL_BC)
        scale = tl.load(S + 2)
        grads = rb[:, None] * D + rd[None, :]  # offsets into a head's [2k+1, D] rows of DAK, DAV
        if HAS_K:
            tl.debug_barrier()  # the interior of fold(dS) was stored by other threads of this program
            fds = tl.load(fds_rows[:, None] + rb[None, :], mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
            fds = _with_ends(fds, low, high, rb, clip)
            table = tl.load(AK + h * sa_h + rb[:, None] * sa_r + rd[None, :] * sa_d, mask=table_mask, other=0.0)
            dq += tl.dot(fds.to(TDT), table.to(TDT), input_precision=TPREC).to(ACC)
            if GRAD_K:
                part = tl.dot(tl.trans(fds.to(TDT)), q.to(TDT), input_precision=TPREC).to(ACC)
                tl.atomic_add(DAK + h * swk_h + grads, part * scale, mask=table_mask)
        if HAS_V and GRAD_V:
            fold = tl.load(FOLD + pid_bh.to(tl.int64) * Lq * NB + rm[:, None] * NB + rb[None, :],
                           mask=row_ok[:, None], other=0.0)
            part = tl.dot(tl.trans(fold.to(TDT)), do.to(TDT), input_precision=TPREC).to(ACC)
            tl.atomic_add(DAV + h * swv_h + grads, part, mask=table_mask)
        tl.store(DQ + pid_bh.to(tl.int64) * Lq * D + rm[:, None] * D + rd[None, :],
                 (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)

    @_jit_kernel
    def _shaw_bwd_serial(
        Q, K, V, DO, QA, G, LSE, DELTA, AK, FOLD, Bias, Mask, Keep, Dead, DK, DV, DQ, DQACC, FDS, EDGES, DBIAS, DAK,
        DAV,
        sq_b, sq_h, sq_m, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, sg_b, sg_h, sg_m, sg_d,
        sa_h, sa_r, sa_d, sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n, sp_b, sp_h, sp_m, sp_n, sx_b, sx_h, sx_m,
        sd_b, sd_h, sd_m, sd_n, swk_h, swv_h,
        H, Lq, Lk, D, offset, clip, S, drop_p, seed,
        HAS_K: tl.constexpr, HAS_V: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
        HAS_DEAD: tl.constexpr, ROWS: tl.constexpr, DROPOUT: tl.constexpr,
        BIAS_GRAD: tl.constexpr, ROW_BC: tl.constexpr, COL_BC: tl.constexpr, GRAD_K: tl.constexpr, GRAD_V: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, NB: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
        TDT: tl.constexpr, TPREC: tl.constexpr,
    ):
        """The whole backward pass of one (batch, head) after the preprocess kernel, in one program: dK and dV of each
        key block, and in the same tiles dS k and fold(dS) for dQ, added into float32 buffers (DQACC, FDS and EDGES
        for fold(dS)'s two end buckets) that only this program touches, so no atomics and no second recomputation of
        the tiles; then, per query block, dQ with fold(dS) w^K, and the tables' gradients summed over the whole
        sequence before one atomic add per (batch, head). Arguments as ``_shaw_bwd_dkdv`` and ``_shaw_bwd_dq``.

        The first key block stores into the buffers, the later ones add (no zero-fill). The query blocks of one key
        block touch disjoint rows; a barrier after each key block orders its writes before the next one's reads,
        which other threads may make."""
        pid_bh = tl.program_id(0)
        b = (pid_bh // H).to(tl.int64)
        h = (pid_bh % H).to(tl.int64)
        rd = tl.arange(0, BD)
        rb = tl.arange(0, NB)
        d_ok = rd < D
        Q += b * sq_b + h * sq_h
        K += b * sk_b + h * sk_h
        V += b * sv_b + h * sv_h
        DO += b * sg_b + h * sg_h
        QA += pid_bh.to(tl.int64) * Lq * NB
        G += pid_bh.to(tl.int64) * Lq * NB
        LSE += pid_bh.to(tl.int64) * Lq
        DELTA += pid_bh.to(tl.int64) * Lq
        DQACC += pid_bh.to(tl.int64) * Lq * D
        FDS += pid_bh.to(tl.int64) * Lq * NB
        EDGES += pid_bh.to(tl.int64) * Lq * 2
        DBIAS += b * sd_b + h * sd_h
        for n0 in range(0, Lk, BN):
            rn = n0 + tl.arange(0, BN)
            col_ok = rn < Lk
            kv_mask = col_ok[:, None] & d_ok[None, :]
            k = tl.load(K + rn[:, None] * sk_n + rd[None, :] * sk_d, mask=kv_mask, other=0.0)
            v = tl.load(V + rn[:, None] * sv_n + rd[None, :] * sv_d, mask=kv_mask, other=0.0)
            dk = tl.zeros([BN, BD], ACC)
            dv = tl.zeros([BN, BD], ACC)
            for m0 in range(0, Lq, BM):
                rm, row_ok, kind, q_mask, q, do, pd, ds = _query_tile(
                    Q, DO, LSE, DELTA, QA, G, Bias, Mask, Keep, Dead, k, v, m0, n0, rn, col_ok, rd, d_ok, b, h,
                    pid_bh, Lq, Lk, offset, clip, S, drop_p, seed, sq_m, sq_d, sg_m, sg_d,
                    sb_b, sb_h, sb_m, sb_n, sm_b, sm_h, sm_m, sm_n, sp_b, sp_h, sp_m, sp_n, sx_b, sx_h, sx_m,
                    HAS_K, HAS_V, HAS_BIAS, HAS_MASK, HAS_DEAD, ROWS, DROPOUT, BM, BN, NB, ACC, PREC)
                dv += tl.dot(tl.trans(pd.to(do.dtype)), do, input_precision=PREC).to(ACC)
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC).to(ACC)
                dq = tl.dot(ds.to(k.dtype), k, input_precision=PREC).to(ACC)
                dq_ptrs = DQACC + rm[:, None] * D + rd[None, :]
                if n0 > 0:
                    dq += tl.load(dq_ptrs, mask=q_mask, other=0.0)
                tl.store(dq_ptrs, dq, mask=q_mask)
                if HAS_K:
                    fds_rows = FDS + rm * NB
                    if n0 == 0:  # interior buckets never stored (keys beyond Lk) must read as 0
                        tl.store(fds_rows[:, None] + rb[None, :], tl.zeros([BM, NB], ACC), mask=row_ok[:, None])
                        tl.debug_barrier()
                    low, high = _fold_tile(ds, ds, fds_rows, row_ok, col_ok, rm, rn, kind, offset, clip)
                    if n0 > 0:
                        low += tl.load(EDGES + rm * 2, mask=row_ok, other=0.0)
                        high += tl.load(EDGES + rm * 2 + 1, mask=row_ok, other=0.0)
                    tl.store(EDGES + rm * 2, low, mask=row_ok)
                    tl.store(EDGES + rm * 2 + 1, high, mask=row_ok)
                _add_bias_grad(DBIAS, ds, rm, rn, row_ok, col_ok, sd_m, sd_n, BIAS_GRAD, ROW_BC, COL_BC)
            # the steps above touch disjoint rows; the next key block (or the epilogue) reads them back, maybe in
            # other threads
            tl.debug_barrier()
            out = rn[:, None] * D + rd[None, :]  # DK, DV: contiguous [B, H, Lk, D]
            tl.store(DK + pid_bh.to(tl.int64) * Lk * D + out, (dk * tl.load(S + 2)).to(DK.dtype.element_ty),
                     mask=kv_mask)
            tl.store(DV + pid_bh.to(tl.int64) * Lk * D + out, dv.to(DV.dtype.element_ty), mask=kv_mask)

        scale = tl.load(S + 2)
        table_mask = (rb[:, None] <= 2 * clip) & d_ok[None, :]
        grad_k = tl.zeros([NB, BD], ACC)
        grad_v = tl.zeros([NB, BD], ACC)
        for m0 in range(0, Lq, BM):
            rm = m0 + tl.arange(0, BM)
            row_ok = rm < Lq
            q_mask = row_ok[:, None] & d_ok[None, :]
            dq = tl.load(DQACC + rm[:, None] * D + rd[None, :], mask=q_mask, other=0.0, cache_modifier=".cg")
            if HAS_K:  # (.cg, as the split kernels read their scratch back: written by this program's threads)
                fds = tl.load(FDS + rm[:, None] * NB + rb[None, :], mask=row_ok[:, None], other=0.0,
                              cache_modifier=".cg")
                low = tl.load(EDGES + rm * 2, mask=row_ok, other=0.0, cache_modifier=".cg")
                high = tl.load(EDGES + rm * 2 + 1, mask=row_ok, other=0.0, cache_modifier=".cg")
                fds = _with_ends(fds, low, high, rb, clip)
                table = tl.load(AK + h * sa_h + rb[:, None] * sa_r + rd[None, :] * sa_d, mask=table_mask, other=0.0)
                dq += tl.dot(fds.to(TDT), table.to(TDT), input_precision=TPREC).to(ACC)
                if GRAD_K:
                    q = tl.load(Q + rm[:, None] * sq_m + rd[None, :] * sq_d, mask=q_mask, other=0.0)
                    grad_k += tl.dot(tl.trans(fds.to(TDT)), q.to(TDT), input_precision=TPREC).to(ACC)
            if HAS_V and GRAD_V:
                fold = tl.load(FOLD + pid_bh.to(tl.int64) * Lq * NB + rm[:, None] * NB + rb[None, :],
                               mask=row_ok[:, None], other=0.0)
                do = tl.load(DO + rm[:, None] * sg_m + rd[None, :] * sg_d, mask=q_mask, other=0.0)
                do = tl.where(_live(Dead, b, h, rm, row_ok, sx_b, sx_h, sx_m, HAS_DEAD)[:, None], do, 0.0)
                grad_v += tl.dot(tl.trans(fold.to(TDT)), do.to(TDT), input_precision=TPREC).to(ACC)
            tl.store(DQ + pid_bh.to(tl.int64) * Lq * D + rm[:, None] * D + rd[None, :],
                     (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)
        grads = rb[:, None] * D + rd[None, :]
        if HAS_K and GRAD_K:
            tl.atomic_add(DAK + h * swk_h + grads, grad_k * scale, mask=table_mask)
        if HAS_V and GRAD_V:
            tl.atomic_add(DAV + h * swv_h + grads, grad_v, mask=table_mask)

    @triton.jit
    def _keep_mask_kernel(OUT, H, Lq, Lk, drop_p, seed, BM: tl.constexpr, BN: tl.constexpr):
        """The keep mask the attention kernels draw with this seed, written out (tests, debugging)."""
        pid_bh = tl.program_id(0)
        rm = tl.program_id(1) * BM + tl.arange(0, BM)
        rn = tl.program_id(2) * BN + tl.arange(0, BN)
        kept = _keep(seed, pid_bh, rm, rn[None, :], Lk, drop_p)
        tl.store(OUT + pid_bh.to(tl.int64) * Lq * Lk + rm[:, None] * Lk + rn[None, :], kept.to(tl.int8),
                 mask=(rm[:, None] < Lq) & (rn[None, :] < Lk))


# ----------------------------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------------------------


_LAUNCHERS: dict[int, Launcher] = {}


def _launch(kernel, grid: tuple[int, ...]):
    """``kernel[grid]`` through its ``Launcher`` (one per kernel object): a repeated launch skips Triton's binding of
    the ~50 arguments (``triton_launch``)."""
    launcher = _LAUNCHERS.get(id(kernel))
    if launcher is None or launcher.kernel is not kernel:
        launcher = _LAUNCHERS[id(kernel)] = Launcher(kernel, direct_launch_supported(triton))
    return launcher[grid]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulators, softmax statistics and bucket tensors: float32, or float64 for float64 inputs (interpreter)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _tl_acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


def _allow_tf32() -> bool:
    return torch.backends.cuda.matmul.allow_tf32


def _precision(dtype: torch.dtype | str) -> str:
    """tl.dot's input precision for float32 inputs: TF32 where torch allows it for matmuls, else 3xTF32 (float32's
    accuracy on tensor cores); 16-bit and float64 inputs ignore it."""
    if _DTYPE_NAMES.get(dtype, dtype) == "fp32":
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "tf32x3"
    return "ieee"


@functools.lru_cache(maxsize=None)
def _dtype_constants(dtype: torch.dtype, allow_tf32: bool) -> dict:
    """The launch constants that follow from the input dtype (ACC, PREC, TDT, TPREC), built once per dtype and TF32
    setting (``allow_tf32``: torch.backends.cuda.matmul.allow_tf32, read by ``_precision``)."""
    return dict(ACC=_tl_acc(dtype), PREC=_precision(dtype), **_table_dot(dtype))


def _table_dot(dtype: torch.dtype | str) -> dict:
    """How the kernels multiply a fold [BM, 2k+1] by a table (and transposed folds by q, dO): in the 16-bit input
    type on tensor cores (as P v is), in float32 with the precision of ``_precision``, in float64 in the
    interpreter."""
    name = _DTYPE_NAMES.get(dtype, dtype)
    types = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32, "fp64": tl.float64}
    return dict(TDT=types[name], TPREC=_precision(name))


def _strides4(t: Tensor | None) -> tuple[int, ...]:
    """Strides of a 4-d ``t`` as the kernels index it broadcast to [B, H, Lq, Lk]: 0 along its size-1 dims (where
    broadcasting gives 0, and where a stride is never used but would be one more value to specialize on); zeros when
    ``t`` is None."""
    if t is None:
        return (0, 0, 0, 0)
    return tuple(0 if size == 1 else stride for size, stride in zip(t.shape, t.stride()))


def _rows(bias: Tensor | None, mask: Tensor | None) -> int:
    """The kernels' ROWS flags: bit 0 when the bias varies along the queries, bit 1 when the mask does."""
    return int(bias is not None and bias.shape[2] > 1) + 2 * int(mask is not None and mask.shape[2] > 1)


def _table_strides(table: Tensor | None) -> tuple[int, int, int]:
    """(head, bucket, dim) strides of a [2k+1, d] (head stride 0: shared) or [H, 2k+1, d] table."""
    if table is None:
        return (0, 0, 0)
    if table.dim() == 2:
        return (0, table.stride(0), table.stride(1))
    return tuple(table.stride())  # type: ignore[return-value]


def _scalars(dim: int, dropout_p: float, acc: torch.dtype, device: torch.device) -> Tensor:
    """The kernels' float constants as a tensor in the accumulator's precision (a float argument would be rounded
    to float32): scale * log2(e), log2(e), scale = d^-1/2, and the kept probabilities' factor 1 / (1 - p)."""
    key = (dim, dropout_p, acc, device)
    if key not in _SCALARS:
        scale = dim**-0.5
        _SCALARS[key] = torch.tensor([scale * LOG2E, LOG2E, scale, 1.0 / (1.0 - dropout_p)], dtype=acc).to(device)
    return _SCALARS[key]


_SCALARS: dict[tuple, Tensor] = {}


def _table_grad_buffers(
    tables: tuple[Tensor | None, Tensor | None], needed: tuple[bool, bool], acc: torch.dtype
) -> list[Tensor | None]:
    """Zeroed [H or 1, 2k+1, d] accumulators of the tables' gradients (the kernels add into them atomically), None
    for a table that is absent or needs none; one allocation and one fill for both. Contiguous and of the table's
    shape: the gradient is returned as it is (no copy), in float32."""
    heads = [0 if t is None or not need else (1 if t.dim() == 2 else t.shape[0]) for t, need in zip(tables, needed)]
    if not any(heads):
        return [None, None]
    device = next(t.device for t in tables if t is not None)
    rows, dim = next(t.shape[-2:] for t in tables if t is not None)
    parts = torch.zeros(sum(heads), rows, dim, dtype=acc, device=device).split(heads)
    return [part if rows else None for part, rows in zip(parts, heads)]


def _table_grad(buffer: Tensor | None, table: Tensor | None) -> Tensor | None:
    if buffer is None or table is None:
        return None
    return (buffer[0] if table.dim() == 2 else buffer).to(table.dtype)


class TritonShawAttention(torch.autograd.Function):
    """The fused kernels as an autograd Function. Inputs as for ``fused.ChunkedRelativeAttention`` (validated, cast
    and dead-row-revived by ``dispatch.relative_attention``), with dropout given as a seed or an explicit keep
    mask. Nothing runs in torch but allocations, zero-fills and casts: the table products, the folds, delta and the
    table gradients are all inside the kernels."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        q: Tensor,  # [B, H, Lq, d], any strides
        k: Tensor,  # [B, H, Lk, d]
        v: Tensor,
        rel_k: Tensor | None,  # [2c+1, d] or [H, 2c+1, d]
        rel_v: Tensor | None,
        bias: Tensor | None,  # float, 4-d, broadcastable to [B, H, Lq, Lk]
        mask: Tensor | None,  # bool, 4-d, broadcastable to [B, H, Lq, Lk], no fully masked row
        dead: Tensor | None,  # bool, 4-d, broadcastable to [B, H, Lq, 1]: rows to zero
        keep: Tensor | None,  # bool, broadcastable to [B, H, Lq, Lk]: an explicit dropout keep mask, or None
        clip: int,
        offset: int,
        dropout_p: float,
        seed: int | None,  # dropout drawn in the kernels (when dropout_p > 0 and keep is None)
        blocks: Blocks | Tiles | None,
    ) -> Tensor:
        batch, heads, q_len, dim = q.shape
        k_len = k.shape[2]
        if clip < 0:
            raise ValueError(f"clip must be >= 0, got {clip}")
        if dropout_p > 0 and keep is None and seed is None:
            raise ValueError("dropout needs a seed or a keep mask")
        acc = _acc_dtype(q.dtype)
        tiles = as_tiles(blocks)
        if any(ctx.needs_input_grad):
            backward_variant()  # a bad RPR_MT_TRITON_BACKWARD stops the first forward pass, not its backward
        blocks = tiles.forward
        nb = _next_pow2(2 * clip + 1)
        mask_u8 = None if mask is None else mask.view(torch.uint8)
        dead_u8 = None if dead is None else dead.view(torch.uint8)
        keep_u8 = None if keep is None or dropout_p == 0 else keep.view(torch.uint8)
        dropout = 0 if dropout_p == 0 else (2 if keep_u8 is not None else 1)
        scalars = _scalars(dim, dropout_p, acc, q.device)

        empty = functools.partial(torch.empty, dtype=acc, device=q.device)
        qa = None if rel_k is None else empty(batch, heads, q_len, nb)  # q w^K^T, written by the kernel
        folded = None if rel_v is None else empty(batch, heads, q_len, nb)  # fold(P), written by the kernel
        # the output laid out as [B, Lq, H, d]: MultiHeadAttention's merge of the heads is then a free view
        out = torch.empty(batch, q_len, heads, dim, dtype=q.dtype, device=q.device).transpose(1, 2)
        lse = empty(batch, heads, q_len)
        dummy = lse
        _launch(_shaw_fwd, (triton.cdiv(q_len, blocks.m) * batch * heads,))(
            q, k, v, *(dummy if t is None else t for t in (rel_k, rel_v, bias, mask_u8, keep_u8, dead_u8)), out, lse,
            dummy if qa is None else qa, dummy if folded is None else folded,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(), *_table_strides(rel_k), *_table_strides(rel_v),
            *_strides4(bias), *_strides4(mask_u8), *_strides4(keep_u8), *_strides4(dead_u8)[:3],
            heads, q_len, k_len, dim, offset, clip, scalars, float(dropout_p), seed or 0,
            HAS_K=rel_k is not None, HAS_V=rel_v is not None, HAS_BIAS=bias is not None, HAS_MASK=mask is not None,
            HAS_DEAD=dead is not None, ROWS=_rows(bias, mask), DROPOUT=dropout, STORE_FOLD=ctx.needs_input_grad[4],
            BM=blocks.m, BN=blocks.n, BD=_next_pow2(dim), NB=nb, **_dtype_constants(q.dtype, _allow_tf32()),
            num_warps=blocks.warps, num_stages=blocks.stages,
        )
        ctx.save_for_backward(q, k, v, rel_k, rel_v, bias, mask_u8, dead_u8, keep_u8, out, lse, qa, folded)
        ctx.config = (clip, offset, dropout_p, seed, tiles, dropout, scalars)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, rel_k, rel_v, bias, mask_u8, dead_u8, keep_u8, out, lse, qa, folded = ctx.saved_tensors
        clip, offset, dropout_p, seed, tiles, dropout, scalars = ctx.config
        batch, heads, q_len, dim = q.shape
        k_len = k.shape[2]
        acc = _acc_dtype(q.dtype)
        nb, bd = _next_pow2(2 * clip + 1), _next_pow2(dim)
        full = (batch, heads, q_len, k_len)
        if grad_out.dtype != q.dtype:
            grad_out = grad_out.to(q.dtype)
        empty = functools.partial(torch.empty, dtype=acc, device=q.device)
        delta = empty(batch, heads, q_len)
        g = None if rel_v is None else empty(batch, heads, q_len, nb)  # dO w^V^T
        fds = None if rel_k is None else empty(batch, heads, q_len, nb)  # fold(dS), scratch of the dQ kernel
        grad_q = torch.empty(batch, heads, q_len, dim, dtype=q.dtype, device=q.device)
        grad_k = torch.empty(batch, heads, k_len, dim, dtype=k.dtype, device=q.device)
        grad_v = torch.empty_like(grad_k)
        grad_rel_k, grad_rel_v = _table_grad_buffers((rel_k, rel_v), ctx.needs_input_grad[3:5], acc)
        bias_grad, row_bc, col_bc, grad_bias = 0, False, False, None
        if bias is not None and ctx.needs_input_grad[5]:
            broadcast = [bias.shape[i] == 1 and full[i] > 1 for i in range(4)]
            row_bc, col_bc = broadcast[2], broadcast[3]
            bias_grad = 2 if any(broadcast) else 1
            grad_bias = torch.zeros(bias.shape, dtype=acc, device=q.device)
        dummy = lse
        qa_, g_, bias_, mask_, keep_, dead_ = (dummy if t is None else t for t in (qa, g, bias, mask_u8, keep_u8,
                                                                                    dead_u8))
        dead_strides = _strides4(dead_u8)[:3]
        constants = _dtype_constants(q.dtype, _allow_tf32())
        common = dict(HAS_V=rel_v is not None, HAS_DEAD=dead_u8 is not None, BD=bd, NB=nb, ACC=constants["ACC"],
                      PREC=constants["PREC"])
        blocks = tiles.dq
        launch = dict(BM=blocks.m, num_warps=blocks.warps, num_stages=blocks.stages)
        serial = backward_variant() == "serial"
        _launch(_shaw_bwd_pre, (triton.cdiv(q_len, blocks.m) * batch * heads,))(
            out, grad_out, dummy if rel_v is None else rel_v, dead_, delta, g_,
            *out.stride(), *grad_out.stride(), *_table_strides(rel_v), *dead_strides, heads, q_len, dim, clip,
            **common, **launch,
        )
        common.update(HAS_K=rel_k is not None, HAS_BIAS=bias is not None, HAS_MASK=mask_u8 is not None,
                      ROWS=_rows(bias, mask_u8), DROPOUT=dropout)
        kv_blocks = tiles.dkdv
        masks = (*_strides4(bias), *_strides4(mask_u8), *_strides4(keep_u8), *dead_strides)
        scalars_ = (heads, q_len, k_len, dim, offset, clip, scalars, float(dropout_p), seed or 0)
        table_heads = tuple(0 if g is None or g.shape[0] == 1 else g.stride(0) for g in (grad_rel_k, grad_rel_v))
        grad_flags = dict(BIAS_GRAD=bias_grad, ROW_BC=row_bc, COL_BC=col_bc, GRAD_K=grad_rel_k is not None,
                          GRAD_V=grad_rel_v is not None, TDT=constants["TDT"], TPREC=constants["TPREC"])
        if serial:  # dQ in float32 (added over key blocks), fold(dS)'s end buckets beside its interior
            dq_acc = empty(batch, heads, q_len, dim)
            edges = dummy if rel_k is None else empty(batch, heads, q_len, 2)
            _launch(_shaw_bwd_serial, (batch * heads,))(
                q, k, v, grad_out, qa_, g_, lse, delta, dummy if rel_k is None else rel_k,
                dummy if folded is None else folded, bias_, mask_, keep_, dead_, grad_k, grad_v, grad_q, dq_acc,
                dummy if fds is None else fds, edges, dummy if grad_bias is None else grad_bias,
                *(dummy if t is None else t for t in (grad_rel_k, grad_rel_v)),
                *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *_table_strides(rel_k), *masks,
                *_strides4(grad_bias), *table_heads, *scalars_, **common, **grad_flags,
                BM=kv_blocks.m, BN=kv_blocks.n, num_warps=kv_blocks.warps, num_stages=kv_blocks.stages,
            )
            return _backward_result(grad_q, grad_k, grad_v, grad_rel_k, grad_rel_v, grad_bias, rel_k, rel_v, bias)
        _launch(_shaw_bwd_dkdv, (triton.cdiv(k_len, kv_blocks.n) * batch * heads,))(
            q, k, v, grad_out, qa_, g_, lse, delta, bias_, mask_, keep_, dead_, grad_k, grad_v,
            *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *masks, *scalars_, **common,
            BM=kv_blocks.m, BN=kv_blocks.n, num_warps=kv_blocks.warps, num_stages=kv_blocks.stages,
        )
        _launch(_shaw_bwd_dq, (triton.cdiv(q_len, blocks.m) * batch * heads,))(
            q, k, v, grad_out, qa_, g_, lse, delta, dummy if rel_k is None else rel_k,
            dummy if folded is None else folded, bias_, mask_, keep_, dead_, grad_q, dummy if fds is None else fds,
            dummy if grad_bias is None else grad_bias, *(dummy if t is None else t for t in (grad_rel_k, grad_rel_v)),
            *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *_table_strides(rel_k), *masks,
            *_strides4(grad_bias), *table_heads, *scalars_, **common, **grad_flags, BN=blocks.n, **launch,
        )
        return _backward_result(grad_q, grad_k, grad_v, grad_rel_k, grad_rel_v, grad_bias, rel_k, rel_v, bias)


def _backward_result(grad_q, grad_k, grad_v, grad_rel_k, grad_rel_v, grad_bias, rel_k, rel_v, bias) -> tuple:
    """``TritonShawAttention.backward``'s return value: the gradients in their inputs' dtypes, None for the rest."""
    if grad_bias is not None:
        grad_bias = grad_bias.to(bias.dtype)
    return (grad_q, grad_k, grad_v, _table_grad(grad_rel_k, rel_k), _table_grad(grad_rel_v, rel_v),
            grad_bias) + (None,) * 8


def triton_relative_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rel_k: Tensor | None,
    rel_v: Tensor | None,
    bias: Tensor | None,
    mask: Tensor | None,
    dead: Tensor | None,
    clip: int,
    offset: int,
    dropout_p: float,
    *,
    keep: Tensor | None = None,
    seed: int | None = None,
    blocks: Blocks | Tiles | None = None,
) -> Tensor:
    """The kernels behind ``relative_attention(..., impl="triton")`` (arguments as ``dispatch`` prepares them: one
    dtype, a 4-d bias, a 4-d dead-row-revived mask). Dropout draws its seed with ``draw_seed`` unless ``seed`` or an
    explicit ``keep`` mask is given."""
    reason = unavailable_reason(q)
    if reason is not None:
        raise ValueError(reason)
    if q.shape[2] == 0 or k.shape[2] == 0:  # no queries, or nothing to attend to
        return q.new_zeros(q.shape).requires_grad_(q.requires_grad)
    if dropout_p > 0 and keep is None and seed is None:
        seed = draw_seed()
    # Triton launches on the current CUDA device: tensors on another GPU of this process would be read through the
    # wrong device's stream (Triton's own kernel[grid] does the same). The backward runs on autograd's thread for the
    # tensors' device, so it needs no guard.
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        return TritonShawAttention.apply(
            q, k, v, rel_k, rel_v, bias, mask, dead, keep, clip, offset, dropout_p, seed, blocks
        )


def compiled_variants() -> int | None:
    """How many variants of the attention kernels this process has compiled (one per combination of
    constexprs and specializations met, over all devices); None in the interpreter, without Triton, or where this
    Triton keeps its caches differently. Benchmarks use it to see compilations inside a timed region."""
    if triton is None or interpreting():
        return None
    total = 0
    for kernel in (_shaw_fwd, _shaw_bwd_pre, _shaw_bwd_dkdv, _shaw_bwd_dq, _shaw_bwd_serial):
        caches = getattr(kernel, "device_caches", None)
        if not isinstance(caches, dict):
            return None
        for entry in caches.values():  # (kernel cache, ...) per device in Triton 3.x
            if not isinstance(entry, tuple) or not entry or not isinstance(entry[0], dict):
                return None
            total += len(entry[0])
    return total


def dropout_keep_mask(seed: int, shape: tuple[int, int, int, int], p: float, device: torch.device | str) -> Tensor:
    """The boolean keep mask [B, H, Lq, Lk] that the kernels draw for ``seed`` and drop rate ``p``."""
    if triton is None:
        raise ValueError(unavailable_reason(torch.empty(0)))
    batch, heads, q_len, k_len = shape
    out = torch.empty(shape, dtype=torch.int8, device=device)
    grid = (batch * heads, triton.cdiv(q_len, 32), triton.cdiv(k_len, 32))
    _keep_mask_kernel[grid](out, heads, q_len, k_len, float(p), seed, BM=32, BN=32)
    return out.bool()


# ----------------------------------------------------------------------------------------------------------------------
# Ahead-of-time compilation (no GPU needed): does every kernel lower to a cubin for a given GPU?
# ----------------------------------------------------------------------------------------------------------------------

# float32 buffers: accumulators, bucket products, folds
_BUCKET_POINTERS = {"QA", "G", "LSE", "DELTA", "FOLD", "FDS", "DQACC", "EDGES", "DBIAS", "DAK", "DAV", "S"}
_BYTE_POINTERS = {"Mask", "Keep", "Dead"}


def compile_for(
    arch: int = 90, dtype: str = "bf16", blocks: Blocks | None = None, dim: int = 64, clip: int = 16,
    table_dtype: str = "fp32", **flags
) -> dict[str, dict]:
    """Compile the attention kernels (both backward variants) for CUDA compute capability ``arch`` (90: H100)
    without a GPU, as ``triton.compile`` does it at the first launch, and return per kernel the size of its cubin
    and, where the bundled ``cuobjdump`` can read it, registers per thread and stack (spill) bytes; ``shared`` is the
    dynamic shared memory in bytes. ``table_dtype``: the tables' (float32: the model's parameters, read as they are
    under autocast). ``flags`` set the constexpr options (HAS_K, HAS_V, HAS_BIAS, HAS_MASK, DROPOUT, BIAS_GRAD, ...;
    default: K+V, a mask, seeded dropout). Needs Triton without the interpreter (TRITON_INTERPRET unset)."""
    import re
    import subprocess
    from pathlib import Path

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if interpreting():
        raise RuntimeError("compile_for needs TRITON_INTERPRET unset (the interpreter does not compile)")
    blocks = blocks or Blocks()
    constants = dict(HAS_K=True, HAS_V=True, HAS_BIAS=False, HAS_MASK=True, HAS_DEAD=True, ROWS=3, DROPOUT=1,
                     STORE_FOLD=True, BIAS_GRAD=0, ROW_BC=False, COL_BC=False, GRAD_K=True, GRAD_V=True,
                     BM=blocks.m, BN=blocks.n, BD=_next_pow2(dim), NB=_next_pow2(2 * clip + 1), ACC=tl.float32,
                     PREC=_precision(dtype), **_table_dot(dtype))
    constants.update(flags)
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    report = {}
    for kernel in (_shaw_fwd, _shaw_bwd_pre, _shaw_bwd_dkdv, _shaw_bwd_dq, _shaw_bwd_serial):
        signature, constexprs, attrs = {}, {}, {}
        for index, name in enumerate(kernel.arg_names):
            if kernel.params[index].is_constexpr:
                signature[name] = "constexpr"
                constexprs[name] = constants[name]
                continue
            # what the JIT specialises at a launch with the benchmark's tensors: unit strides along d and keys
            # become constants, 16-aligned pointers and multiples of 16 carry a divisibility hint (not the
            # arguments of _UNSPECIALIZED)
            if name.endswith(("_d", "_n")) and name.startswith(("s",)) and name not in ("sk_n", "sv_n"):
                signature[name] = "constexpr"
                constexprs[name] = 1
                continue
            if name != "drop_p" and name not in _UNSPECIALIZED:
                attrs[(index,)] = [["tt.divisibility", 16]]
            if name in ("AK", "AV"):
                signature[name] = f"*{table_dtype}"
            elif name in _BUCKET_POINTERS:
                signature[name] = "*fp32"
            elif name in _BYTE_POINTERS:
                signature[name] = "*u8"
            elif name[0].isupper() and name not in ("H", "Lq", "Lk", "D"):  # the rest are pointers
                signature[name] = f"*{dtype}"
            else:
                signature[name] = "fp32" if name == "drop_p" else "i32"
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": blocks.warps, "num_stages": blocks.stages})
        cubin = compiled.asm["cubin"]
        entry: dict = {"cubin_bytes": len(cubin), "shared": getattr(compiled.metadata, "shared", None)}
        if cuobjdump.is_file():
            import tempfile

            with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
                handle.write(cubin)
                handle.flush()
                usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", handle.name], capture_output=True,
                                       text=True).stdout
            for key, pattern in (("registers", r"REG:(\d+)"), ("stack", r"STACK:(\d+)")):
                found = re.search(pattern, usage)
                if found:
                    entry[key] = int(found.group(1))
        report[kernel.__name__ if hasattr(kernel, "__name__") else kernel.fn.__name__] = entry
    return report
