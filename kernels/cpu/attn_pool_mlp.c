/* attn_pool_mlp.c - compressed-block pooling with phi = mlp (the paper's
 * learnable compression with an intra-block position encoding).
 *
 * For block i of group g, X_i is the l x dim slice x[i*d .. i*d+l)[g][:] and
 * u_i = vec(X_i + P) its flattened (row j, column c -> j*dim + c) input:
 *   h_i      = W1 u_i                       W1 [dim][l*dim]   (hidden, saved)
 *   pooled_i = mean_j X_ij + W2 silu(h_i)   W2 [dim][dim]
 * The mean is a residual path: with W2 = 0 this is phi = avg, which is how
 * the model starts it "close to avg". P, W1 and W2 are shared by all groups
 * of a layer, so their gradients sum over batch, blocks and groups. */
#include <tgmath.h>
#include "real.h"
#include "cpu_ops.h"

static real sigmoid(real z) { return (real)1 / ((real)1 + exp(-z)); }

/* silu(z) = z sigmoid(z) */
static real silu(real z) { return z * sigmoid(z); }

/* silu'(z) = sigmoid(z) (1 + z (1 - sigmoid(z))) */
static real siluGrad(real z) {
    real s = sigmoid(z);
    return s * ((real)1 + z * ((real)1 - s));
}

void FN(nsaCpuPoolMlpForward)(real *pooled, real *hidden, const real *x, const real *pos,
                              const real *w1, const real *w2, int B, int S, int G, int dim,
                              int cmp_len, int cmp_stride) {
    int Nc = nsaNumCmpBlocks(S, cmp_len, cmp_stride);
    size_t in_len = (size_t)cmp_len * dim;
    real inv_len = (real)1 / (real)cmp_len;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < Nc; i++) {
            for (int g = 0; g < G; g++) {
                size_t blk = ((size_t)b * Nc + i) * G + g;
                size_t tok0 = (size_t)b * S + (size_t)i * cmp_stride;
                real *out = pooled + blk * dim;
                real *hid = hidden + blk * dim;
                for (int e = 0; e < dim; e++) {
                    const real *w1_row = w1 + (size_t)e * in_len;
                    real acc = 0;
                    for (int j = 0; j < cmp_len; j++) {
                        const real *xj = x + ((tok0 + j) * G + g) * dim;
                        for (int c = 0; c < dim; c++)
                            acc += w1_row[(size_t)j * dim + c] * (xj[c] + pos[(size_t)j * dim + c]);
                    }
                    hid[e] = acc;
                }
                for (int c = 0; c < dim; c++) {
                    real sum = 0;
                    for (int j = 0; j < cmp_len; j++) sum += x[((tok0 + j) * G + g) * dim + c];
                    real mlp = 0;
                    for (int e = 0; e < dim; e++) mlp += w2[(size_t)c * dim + e] * silu(hid[e]);
                    out[c] = sum * inv_len + mlp;
                }
            }
        }
    }
}

/* With dp = dpooled_i and dh_e = silu'(h_e) sum_c W2[c][e] dp[c]:
 *   dX_ij += dp / l + (W1^T dh)[j*dim + :];   dP += (W1^T dh) reshaped;
 *   dW2   += dp silu(h)^T;                    dW1 += dh u^T. */
void FN(nsaCpuPoolMlpBackward)(real *dx, real *dpos, real *dw1, real *dw2, const real *dpooled,
                               const real *hidden, const real *x, const real *pos,
                               const real *w1, const real *w2, int B, int S, int G, int dim,
                               int cmp_len, int cmp_stride) {
    int Nc = nsaNumCmpBlocks(S, cmp_len, cmp_stride);
    size_t in_len = (size_t)cmp_len * dim;
    real inv_len = (real)1 / (real)cmp_len;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < Nc; i++) {
            for (int g = 0; g < G; g++) {
                size_t blk = ((size_t)b * Nc + i) * G + g;
                const real *dp = dpooled + blk * dim;
                const real *hid = hidden + blk * dim;
                size_t tok0 = (size_t)b * S + (size_t)i * cmp_stride;
                /* the mean path */
                for (int j = 0; j < cmp_len; j++) {
                    real *dxj = dx + ((tok0 + j) * G + g) * dim;
                    for (int c = 0; c < dim; c++) dxj[c] += dp[c] * inv_len;
                }
                /* the MLP path, one hidden unit e at a time: no scratch needed */
                for (int e = 0; e < dim; e++) {
                    real dact = 0;
                    for (int c = 0; c < dim; c++) {
                        dw2[(size_t)c * dim + e] += dp[c] * silu(hid[e]);
                        dact += w2[(size_t)c * dim + e] * dp[c];
                    }
                    real dh = dact * siluGrad(hid[e]);
                    const real *w1_row = w1 + (size_t)e * in_len;
                    real *dw1_row = dw1 + (size_t)e * in_len;
                    for (int j = 0; j < cmp_len; j++) {
                        const real *xj = x + ((tok0 + j) * G + g) * dim;
                        real *dxj = dx + ((tok0 + j) * G + g) * dim;
                        for (int c = 0; c < dim; c++) {
                            size_t k = (size_t)j * dim + c;
                            dw1_row[k] += dh * (xj[c] + pos[k]);
                            dxj[c] += w1_row[k] * dh;
                            dpos[k] += w1_row[k] * dh;
                        }
                    }
                }
            }
        }
    }
}
