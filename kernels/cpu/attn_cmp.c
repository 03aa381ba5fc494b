/* attn_cmp.c - compressed attention: query t attends to the pooled blocks
 * (kc, vc) that lie entirely in its past.
 *
 * Block i covers tokens [i*d, i*d + l) and is visible at t when
 * i*d + l - 1 <= t. Visible blocks form a prefix 0..n_t-1 of the Nc blocks.
 * Rows before the first block completes (t < l - 1) see nothing: their
 * output is 0, their lse -INFINITY and they pass no gradient. */
#include <tgmath.h>
#include "real.h"
#include "cpu_ops.h"

/* n_t = floor((t - l + 1)/d) + 1 for t >= l - 1, else 0 (never above Nc,
 * since t <= S - 1). */
static int visibleCmpBlocks(int t, int cmp_len, int cmp_stride) {
    return t < cmp_len - 1 ? 0 : (t - cmp_len + 1) / cmp_stride + 1;
}

static real dot(const real *a, const real *b, int n) {
    real acc = 0;
    for (int c = 0; c < n; c++) acc += a[c] * b[c];
    return acc;
}

/* s_i = scale q_t.kc_i over visible i;  lse = log sum_i exp(s_i);
 * o_t = sum_i exp(s_i - lse) vc_i. Max-subtracted, two passes over the
 * blocks (the scores are recomputed instead of stored: no scratch). */
void FN(nsaCpuCmpAttnForward)(real *o, real *lse, const real *q, const real *kc, const real *vc,
                              const NsaAttnDims *dims) {
    int B = dims->B, S = dims->S, H = dims->H, G = dims->G, dk = dims->d_k, dv = dims->d_v;
    int Nc = nsaNumCmpBlocks(S, dims->cmp_len, dims->cmp_stride);
    int heads_per_group = H / G;
    real scale = (real)1 / sqrt((real)dk);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < S; t++) {
            int n_vis = visibleCmpBlocks(t, dims->cmp_len, dims->cmp_stride);
            for (int h = 0; h < H; h++) {
                size_t row = ((size_t)b * S + t) * H + h;
                int g = h / heads_per_group;
                const real *qt = q + row * dk;
                real *ot = o + row * dv;
                for (int c = 0; c < dv; c++) ot[c] = 0;
                if (n_vis == 0) {
                    lse[row] = -INFINITY;
                    continue;
                }
                real max_score = -INFINITY;
                for (int i = 0; i < n_vis; i++) {
                    real s = scale * dot(qt, kc + (((size_t)b * Nc + i) * G + g) * dk, dk);
                    if (s > max_score) max_score = s;
                }
                real sum = 0;
                for (int i = 0; i < n_vis; i++) {
                    size_t blk = ((size_t)b * Nc + i) * G + g;
                    real w = exp(scale * dot(qt, kc + blk * dk, dk) - max_score);
                    sum += w;
                    const real *vi = vc + blk * dv;
                    for (int c = 0; c < dv; c++) ot[c] += w * vi[c];
                }
                for (int c = 0; c < dv; c++) ot[c] /= sum;
                lse[row] = max_score + log(sum);
            }
        }
    }
}

/* With p_i = exp(s_i - lse), dp_i = dout.vc_i and D = dout.o = sum_i p_i dp_i:
 *   ds_i = p_i (dp_i - D);  dq += scale sum_i ds_i kc_i;
 *   dkc_i += scale ds_i q;  dvc_i += p_i dout. */
void FN(nsaCpuCmpAttnBackward)(real *dq, real *dkc, real *dvc, const real *dout, const real *q,
                               const real *kc, const real *vc, const real *o, const real *lse,
                               const NsaAttnDims *dims) {
    int B = dims->B, S = dims->S, H = dims->H, G = dims->G, dk = dims->d_k, dv = dims->d_v;
    int Nc = nsaNumCmpBlocks(S, dims->cmp_len, dims->cmp_stride);
    int heads_per_group = H / G;
    real scale = (real)1 / sqrt((real)dk);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < S; t++) {
            int n_vis = visibleCmpBlocks(t, dims->cmp_len, dims->cmp_stride);
            for (int h = 0; h < H; h++) {
                if (n_vis == 0) continue;
                size_t row = ((size_t)b * S + t) * H + h;
                int g = h / heads_per_group;
                const real *qt = q + row * dk;
                const real *dout_t = dout + row * dv;
                real *dqt = dq + row * dk;
                real D = dot(dout_t, o + row * dv, dv);
                for (int i = 0; i < n_vis; i++) {
                    size_t blk = ((size_t)b * Nc + i) * G + g;
                    const real *ki = kc + blk * dk;
                    real p = exp(scale * dot(qt, ki, dk) - lse[row]);
                    real ds = p * (dot(dout_t, vc + blk * dv, dv) - D);
                    real *dki = dkc + blk * dk;
                    real *dvi = dvc + blk * dv;
                    for (int c = 0; c < dk; c++) {
                        dqt[c] += scale * ds * ki[c];
                        dki[c] += scale * ds * qt[c];
                    }
                    for (int c = 0; c < dv; c++) dvi[c] += p * dout_t[c];
                }
            }
        }
    }
}
