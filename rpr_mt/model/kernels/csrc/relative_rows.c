/* Row kernels of relation-aware attention (Shaw, Uszkoreit & Vaswani 2018, equations (3)-(4)) for float32 CPU.

   The matrix products stay in torch (MKL): the content logits s_j = q_i . k_j, the bucket logits a_r = q_i . w^K_r,
   dO . v_j and dO . w^V_r. What lies between them is per row and memory bound, and these kernels do it in one pass
   over each row instead of a dozen torch kernels:

     forward:  x_j = s_j + a[r_j]; p = softmax over allowed j; pd = p * keep * scale (dropout); f = fold(pd)
     backward: t_j = (g_j + b[r_j]) * keep_j * scale; delta = sum_j p_j t_j; ds_j = p_j (t_j - delta);
               fd = fold(ds)

   with r_j = clip(j - (i + offset), -k, k) + k for row i, place(a)_j = a[r_j] and fold(x)_r = sum_{j: r_j = r} x_j.
   Per row the buckets split the keys into three runs: j <= qi - k (bucket 0), the interior qi - k < j < qi + k
   (bucket j - qi + k) and j >= qi + k (bucket 2k), where qi = i + offset; for k = 0 every key is in bucket 0.

   An optional float bias (T5, ALiBi, Transformer-XL's content bias) is added to the logits before the softmax; its
   gradient is ds, reduced by the caller. Masked keys are skipped (probability exactly 0) rather than given a large
   negative logit. The caller guarantees that every row has at least one allowed key. An output row may alias an
   input row (p over s, ds over g): the bucket values are copied first. Rows are independent: OpenMP splits them
   across threads, over three nested loops (head, batch row, query) rather than one loop over rows whose indices
   cost three 64-bit divisions a row.

   Compiled with -ffast-math -fno-finite-math-only (c_library.py beside csrc/): infinities and NaN keep their IEEE
   meaning, so a -inf bias gives probability 0 and a NaN logit makes its row NaN, as torch.softmax does (tested). glibc
   declares its vector expf (libmvec) only under __FAST_MATH__, which -fno-finite-math-only turns off, so it is
   declared here: libmvec's variants handle infinities and NaN. Without finite-math-only GCC will not vectorize a
   max reduction (fmaxf or x > m ? x : m: NaN operands make the order matter), so the row max says `omp simd
   reduction(max)`: vmaxps keeps the running max when p[j] is NaN, as the scalar loop does, and the NaN reaches the
   row through expf(p[j] - max) either way. */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__FAST_MATH__)
__attribute__((__simd__("notinbranch"))) float expf(float);
#endif

/* A [n, rows, cols] operand of a chunk of n = heads x batch matrices (matrix m is head m / batch, batch row
   m % batch). For per-matrix operands stride_h and stride_b are set so that m_offset = h * stride_h + b *
   stride_b; a NULL pointer means "absent". Columns are contiguous. */
typedef struct {
    void *ptr;
    int64_t stride_h, stride_b, stride_row;
} operand;

typedef struct {
    int64_t heads, batch, q_len, k_len, clip, offset;
    float keep_scale;
    operand s;     /* float: content logits (Lk columns)                                    */
    operand a;     /* float: bucket logits (2k+1 columns), or NULL                          */
    operand mask;  /* uint8: 1 = may attend, or NULL                                        */
    operand keep;  /* uint8: dropout keep mask, or NULL                                     */
    operand bias;  /* float: additive logit bias (Lk columns), or NULL                      */
    operand p;     /* float out: probabilities, undropped (may alias s)                     */
    operand pd;    /* float out: dropped probabilities p * keep * scale, or NULL            */
    operand f;     /* float out: fold of the dropped (or, without dropout, plain) probabilities, or NULL */
} forward_args;

typedef struct {
    int64_t heads, batch, q_len, k_len, clip, offset;
    float keep_scale;
    operand g;     /* float: dO . v_j (Lk columns)                                         */
    operand b;     /* float: dO . w^V_r (2k+1 columns), or NULL                             */
    operand p;     /* float: saved probabilities (undropped)                                */
    operand keep;  /* uint8 or NULL                                                         */
    operand ds;    /* float out: gradient of the logits (may alias g)                       */
    operand fd;    /* float out: fold(ds), or NULL (may alias b)                            */
    operand pd;    /* float out: dropped probabilities p * keep * scale, or NULL            */
} backward_args;

static inline char *row_ptr(const operand *o, int64_t h, int64_t b, int64_t i, size_t elem) {
    return (char *)o->ptr + (h * o->stride_h + b * o->stride_b + i * o->stride_row) * (int64_t)elem;
}

/* Key runs of one row: [0, lo) bucket 0, [lo, hi) interior, [hi, Lk) bucket 2k. */
static inline void runs(int64_t qi, int64_t clip, int64_t k_len, int64_t *lo, int64_t *hi) {
    int64_t l = qi - clip + 1, u = qi + clip;
    *lo = l < 0 ? 0 : (l > k_len ? k_len : l);
    *hi = u < 0 ? 0 : (u > k_len ? k_len : u);
    if (*hi < *lo) *hi = *lo;
}

/* x[j] += place(a)[j] */
static inline void place_add(float *restrict x, const float *restrict a, int64_t qi, int64_t clip, int64_t k_len) {
    if (clip == 0) {
        const float a0 = a[0];
        for (int64_t j = 0; j < k_len; j++) x[j] += a0;
        return;
    }
    int64_t lo, hi;
    runs(qi, clip, k_len, &lo, &hi);
    const float a0 = a[0], a2k = a[2 * clip];
    const float *ab = a + clip - qi; /* ab[j] = a[j - qi + k] */
    for (int64_t j = 0; j < lo; j++) x[j] += a0;
    for (int64_t j = lo; j < hi; j++) x[j] += ab[j];
    for (int64_t j = hi; j < k_len; j++) x[j] += a2k;
}

/* out[r] = fold(x)[r] for r = 0 .. 2k */
static inline void fold_row(float *restrict out, const float *restrict x, int64_t qi, int64_t clip, int64_t k_len) {
    float sum = 0.0f;
    if (clip == 0) {
        for (int64_t j = 0; j < k_len; j++) sum += x[j];
        out[0] = sum;
        return;
    }
    int64_t lo, hi;
    runs(qi, clip, k_len, &lo, &hi);
    for (int64_t j = 0; j < lo; j++) sum += x[j];
    out[0] = sum;
    for (int64_t r = 1; r < 2 * clip; r++) {
        int64_t j = qi - clip + r;
        out[r] = (j >= lo && j < hi) ? x[j] : 0.0f;
    }
    sum = 0.0f;
    for (int64_t j = hi; j < k_len; j++) sum += x[j];
    out[2 * clip] = sum;
}

void relative_rows_forward(const forward_args *args) {
    const forward_args x = *args;
    const int64_t n_buckets = 2 * x.clip + 1;
#pragma omp parallel
    {
        float *buckets = x.a.ptr ? malloc(sizeof(float) * n_buckets) : NULL;
#pragma omp for collapse(3) schedule(static)
        for (int64_t h = 0; h < x.heads; h++)
        for (int64_t b = 0; b < x.batch; b++)
        for (int64_t i = 0; i < x.q_len; i++) {
            const int64_t qi = i + x.offset, n = x.k_len;
            const float *s = (const float *)row_ptr(&x.s, h, b, i, sizeof(float));
            float *p = (float *)row_ptr(&x.p, h, b, i, sizeof(float));
            const uint8_t *mask = x.mask.ptr ? (const uint8_t *)row_ptr(&x.mask, h, b, i, 1) : NULL;
            if (p != s) memmove(p, s, sizeof(float) * n);
            if (buckets) {
                memcpy(buckets, row_ptr(&x.a, h, b, i, sizeof(float)), sizeof(float) * n_buckets);
                place_add(p, buckets, qi, x.clip, n);
            }
            if (x.bias.ptr) {
                const float *bias = (const float *)row_ptr(&x.bias, h, b, i, sizeof(float));
                for (int64_t j = 0; j < n; j++) p[j] += bias[j];
            }
            float max = -FLT_MAX, sum = 0.0f;
            if (mask) {
#pragma omp simd reduction(max : max)
                for (int64_t j = 0; j < n; j++) {
                    const float v = mask[j] ? p[j] : -FLT_MAX;
                    max = v > max ? v : max;
                }
                for (int64_t j = 0; j < n; j++) {
                    float e = mask[j] ? expf(p[j] - max) : 0.0f;
                    p[j] = e;
                    sum += e;
                }
            } else {
#pragma omp simd reduction(max : max)
                for (int64_t j = 0; j < n; j++) max = p[j] > max ? p[j] : max;
                for (int64_t j = 0; j < n; j++) {
                    float e = expf(p[j] - max);
                    p[j] = e;
                    sum += e;
                }
            }
            const float inv = 1.0f / sum;
            for (int64_t j = 0; j < n; j++) p[j] *= inv;
            const float *used = p;
            if (x.keep.ptr) {
                const uint8_t *keep = (const uint8_t *)row_ptr(&x.keep, h, b, i, 1);
                float *pd = (float *)row_ptr(&x.pd, h, b, i, sizeof(float));
                for (int64_t j = 0; j < n; j++) pd[j] = keep[j] ? p[j] * x.keep_scale : 0.0f;
                used = pd;
            }
            if (x.f.ptr) fold_row((float *)row_ptr(&x.f, h, b, i, sizeof(float)), used, qi, x.clip, n);
        }
        free(buckets);
    }
}

void relative_rows_backward(const backward_args *args) {
    const backward_args x = *args;
    const int64_t n_buckets = 2 * x.clip + 1;
#pragma omp parallel
    {
        float *buckets = x.b.ptr ? malloc(sizeof(float) * n_buckets) : NULL;
#pragma omp for collapse(3) schedule(static)
        for (int64_t h = 0; h < x.heads; h++)
        for (int64_t b = 0; b < x.batch; b++)
        for (int64_t i = 0; i < x.q_len; i++) {
            const int64_t qi = i + x.offset, n = x.k_len;
            const float *g = (const float *)row_ptr(&x.g, h, b, i, sizeof(float));
            const float *p = (const float *)row_ptr(&x.p, h, b, i, sizeof(float));
            float *ds = (float *)row_ptr(&x.ds, h, b, i, sizeof(float));
            const uint8_t *keep = x.keep.ptr ? (const uint8_t *)row_ptr(&x.keep, h, b, i, 1) : NULL;
            if (ds != g) memmove(ds, g, sizeof(float) * n);
            if (buckets) {
                memcpy(buckets, row_ptr(&x.b, h, b, i, sizeof(float)), sizeof(float) * n_buckets);
                place_add(ds, buckets, qi, x.clip, n);
            }
            if (keep)
                for (int64_t j = 0; j < n; j++) ds[j] = keep[j] ? ds[j] * x.keep_scale : 0.0f;
            float delta = 0.0f;
            for (int64_t j = 0; j < n; j++) delta += p[j] * ds[j];
            for (int64_t j = 0; j < n; j++) ds[j] = p[j] * (ds[j] - delta);
            if (x.fd.ptr) {
                float *fd = (float *)row_ptr(&x.fd, h, b, i, sizeof(float));
                if (x.clip == 0)
                    fd[0] = 0.0f; /* exactly: a row of dS sums to 0 (softmax is shift invariant) */
                else
                    fold_row(fd, ds, qi, x.clip, n);
            }
            if (x.pd.ptr) {
                float *pd = (float *)row_ptr(&x.pd, h, b, i, sizeof(float));
                for (int64_t j = 0; j < n; j++) pd[j] = keep[j] ? p[j] * x.keep_scale : 0.0f;
            }
        }
        free(buckets);
    }
}
