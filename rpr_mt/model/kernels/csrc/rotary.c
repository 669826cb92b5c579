/* Rotary position embeddings (Su et al.) for float32 CPU, half-split layout: the pair (m, m + d/2) of row l turns by
   the angle of (l, m),

     out[m]         = x[m] cos[l, m] - sign * x[m + d/2] sin[l, m]
     out[m + d/2]   = x[m + d/2] cos[l, m] + sign * x[m] sin[l, m]

   with sign = +1 for the rotation and -1 for its inverse (the backward pass). One pass over x instead of the four
   torch kernels of two multiplies and two multiply-adds, each a pass over a strided half of x. x may be a strided
   view (the queries and keys are views of the fused projection); its rows are contiguous, the output and the
   cos/sin tables [L, d/2] are contiguous. Rows are independent: OpenMP splits them across threads. */

#include <stdint.h>

typedef struct {
    int64_t batch, heads, len, dim;
    int64_t stride_b, stride_h, stride_l;  /* of x, in elements; the last dim is contiguous */
    const float *x;
    const float *cos, *sin;                /* [len, dim / 2] */
    float *out;                            /* [batch, heads, len, dim], contiguous */
    float sign;
} rotary_args;

void rotary(const rotary_args *a) {
    const int64_t half = a->dim / 2, rows = a->batch * a->heads * a->len;
    const float sign = a->sign;
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        const int64_t l = row % a->len, bh = row / a->len, h = bh % a->heads, b = bh / a->heads;
        const float *restrict x = a->x + b * a->stride_b + h * a->stride_h + l * a->stride_l;
        const float *restrict c = a->cos + l * half, *restrict s = a->sin + l * half;
        float *restrict o = a->out + row * a->dim;
        for (int64_t m = 0; m < half; m++) {
            const float x1 = x[m], x2 = x[m + half], ss = sign * s[m];
            o[m] = x1 * c[m] - x2 * ss;
            o[m + half] = x2 * c[m] + x1 * ss;
        }
    }
}
