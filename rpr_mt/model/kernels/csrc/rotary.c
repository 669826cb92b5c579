/* Rotary position embeddings (Su et al.) for float32 CPU, half-split layout: the pair (m, m + d/2) of row l turns by
   the angle of (l, m),

     out[m]         = x[m] cos[l, m] - sign * x[m + d/2] sin[l, m]
     out[m + d/2]   = x[m + d/2] cos[l, m] + sign * x[m] sin[l, m]

   with sign = +1 for the rotation and -1 for its inverse (the backward pass). One pass over x instead of the four
   torch kernels of two multiplies and two multiply-adds, each a pass over a strided half of x. x and the output may
   be strided (the queries and keys are views of the fused projection; the output is stored head-major, the layout
   the attention kernels read); their rows are contiguous, as are the cos/sin tables [L, d/2]. Rows are
   independent: OpenMP splits them across threads. */

#include <stdint.h>

typedef struct {
    int64_t batch, heads, len, dim;
    int64_t stride_b, stride_h, stride_l;  /* of x, in elements; the last dim is contiguous */
    const float *x;
    const float *cos, *sin;                /* [len, dim / 2] */
    float *out;                            /* [batch, heads, len, dim] */
    float sign;
    int64_t out_stride_b, out_stride_h, out_stride_l;  /* of out, in elements; the last dim is contiguous */
} rotary_args;

void rotary(const rotary_args *a) {
    const int64_t half = a->dim / 2;
    const float sign = a->sign;
    /* Loops, not one loop over rows: index arithmetic per row (three 64-bit divisions) cost more than the row's
       32 pairs. x and out may be the same tensor (in place): each pair is read before it is written. */
#pragma omp parallel for collapse(3) schedule(static)
    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t h = 0; h < a->heads; h++)
            for (int64_t l = 0; l < a->len; l++) {
                const float *x = a->x + b * a->stride_b + h * a->stride_h + l * a->stride_l;
                float *o = a->out + b * a->out_stride_b + h * a->out_stride_h + l * a->out_stride_l;
                const float *restrict c = a->cos + l * half, *restrict s = a->sin + l * half;
                for (int64_t m = 0; m < half; m++) {
                    const float x1 = x[m], x2 = x[m + half], ss = sign * s[m];
                    o[m] = x1 * c[m] - x2 * ss;
                    o[m + half] = x2 * c[m] + x1 * ss;
                }
            }
}
