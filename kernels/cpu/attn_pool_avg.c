/* attn_pool_avg.c - compressed-block pooling with phi = avg.
 *
 * Compressed block i covers tokens [i*d, i*d + l); there are
 * Nc = nsaNumCmpBlocks(S, l, d) of them (0 when S < l), so every block lies
 * inside the sequence. Each KV group is pooled on its own. */
#include "real.h"
#include "cpu_ops.h"

/* pooled[b][i][g][:] = (1/l) sum_{j<l} x[b][i*d + j][g][:] */
void FN(nsaCpuPoolAvgForward)(real *pooled, const real *x, int B, int S, int G, int dim,
                              int cmp_len, int cmp_stride) {
    int Nc = nsaNumCmpBlocks(S, cmp_len, cmp_stride);
    real inv_len = (real)1 / (real)cmp_len;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < Nc; i++) {
            for (int g = 0; g < G; g++) {
                real *out = pooled + (((size_t)b * Nc + i) * G + g) * dim;
                for (int c = 0; c < dim; c++) out[c] = 0;
                for (int j = 0; j < cmp_len; j++) {
                    const real *src = x + (((size_t)b * S + (size_t)i * cmp_stride + j) * G + g) * dim;
                    for (int c = 0; c < dim; c++) out[c] += src[c];
                }
                for (int c = 0; c < dim; c++) out[c] *= inv_len;
            }
        }
    }
}

/* dx[b][i*d + j][g][:] += dpooled[b][i][g][:] / l  (blocks overlap when d < l,
 * so a token collects from every block that contains it) */
void FN(nsaCpuPoolAvgBackward)(real *dx, const real *dpooled, int B, int S, int G, int dim,
                               int cmp_len, int cmp_stride) {
    int Nc = nsaNumCmpBlocks(S, cmp_len, cmp_stride);
    real inv_len = (real)1 / (real)cmp_len;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < Nc; i++) {
            for (int g = 0; g < G; g++) {
                const real *dout = dpooled + (((size_t)b * Nc + i) * G + g) * dim;
                for (int j = 0; j < cmp_len; j++) {
                    real *dst = dx + (((size_t)b * S + (size_t)i * cmp_stride + j) * G + g) * dim;
                    for (int c = 0; c < dim; c++) dst[c] += dout[c] * inv_len;
                }
            }
        }
    }
}
