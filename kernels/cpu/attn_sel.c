/* attn_sel.c - selected attention: query t of head h attends to the tokens
 * <= t of the selection blocks its KV group chose (sel_idx, shared by all
 * heads of the group). Block j covers [j*l', (j+1)*l'); entries < 0 are
 * padding. The current block is always selected, so every row sees t
 * itself; a row given no block at all gets o = 0, lse = -INFINITY. */
#include <tgmath.h>
#include "real.h"
#include "cpu_ops.h"

static real dot(const real *a, const real *b, int n) {
    real acc = 0;
    for (int c = 0; c < n; c++) acc += a[c] * b[c];
    return acc;
}

/* The tokens of block j visible at t: [*first, *end), empty for padding. */
static void blockTokens(int j, int t, int l_sel, int *first, int *end) {
    *first = j < 0 ? 0 : j * l_sel;
    *end = j < 0 ? 0 : ((j + 1) * l_sel < t + 1 ? (j + 1) * l_sel : t + 1);
}

/* s_u = scale q_t.k_u over the selected tokens u; lse = log sum_u exp(s_u);
 * o_t = sum_u exp(s_u - lse) v_u (max-subtracted, two passes). */
void FN(nsaCpuSelAttnForward)(real *o, real *lse, const real *q, const real *k, const real *v,
                              const int32_t *sel_idx, const NsaAttnDims *dims) {
    int B = dims->B, S = dims->S, H = dims->H, G = dims->G, dk = dims->d_k, dv = dims->d_v;
    int heads_per_group = H / G;
    int slots = nsaNumSelSlots(dims->n_sel);
    real scale = (real)1 / sqrt((real)dk);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < S; t++) {
            for (int h = 0; h < H; h++) {
                size_t row = ((size_t)b * S + t) * H + h;
                int g = h / heads_per_group;
                const int32_t *sel = sel_idx + (((size_t)b * S + t) * G + g) * slots;
                const real *qt = q + row * dk;
                real *ot = o + row * dv;
                for (int c = 0; c < dv; c++) ot[c] = 0;
                real max_score = -INFINITY;
                for (int n = 0; n < slots; n++) {
                    int first, end;
                    blockTokens(sel[n], t, dims->sel_len, &first, &end);
                    for (int u = first; u < end; u++) {
                        real s = scale * dot(qt, k + (((size_t)b * S + u) * G + g) * dk, dk);
                        if (s > max_score) max_score = s;
                    }
                }
                if (max_score == -INFINITY) {
                    lse[row] = -INFINITY;
                    continue;
                }
                real sum = 0;
                for (int n = 0; n < slots; n++) {
                    int first, end;
                    blockTokens(sel[n], t, dims->sel_len, &first, &end);
                    for (int u = first; u < end; u++) {
                        size_t tok = ((size_t)b * S + u) * G + g;
                        real w = exp(scale * dot(qt, k + tok * dk, dk) - max_score);
                        sum += w;
                        for (int c = 0; c < dv; c++) ot[c] += w * v[tok * dv + c];
                    }
                }
                for (int c = 0; c < dv; c++) ot[c] /= sum;
                lse[row] = max_score + log(sum);
            }
        }
    }
}

/* With p_u = exp(s_u - lse), D = dout.o:  ds_u = p_u (dout.v_u - D);
 * dq += scale sum_u ds_u k_u;  dk_u += scale ds_u q;  dv_u += p_u dout. */
void FN(nsaCpuSelAttnBackward)(real *dq, real *dk, real *dv, const real *dout, const real *q,
                               const real *k, const real *v, const int32_t *sel_idx,
                               const real *o, const real *lse, const NsaAttnDims *dims) {
    int B = dims->B, S = dims->S, H = dims->H, G = dims->G, d_k = dims->d_k, d_v = dims->d_v;
    int heads_per_group = H / G;
    int slots = nsaNumSelSlots(dims->n_sel);
    real scale = (real)1 / sqrt((real)d_k);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < S; t++) {
            for (int h = 0; h < H; h++) {
                size_t row = ((size_t)b * S + t) * H + h;
                if (lse[row] == -INFINITY) continue;
                int g = h / heads_per_group;
                const int32_t *sel = sel_idx + (((size_t)b * S + t) * G + g) * slots;
                const real *qt = q + row * d_k;
                const real *dout_t = dout + row * d_v;
                real *dqt = dq + row * d_k;
                real D = dot(dout_t, o + row * d_v, d_v);
                for (int n = 0; n < slots; n++) {
                    int first, end;
                    blockTokens(sel[n], t, dims->sel_len, &first, &end);
                    for (int u = first; u < end; u++) {
                        size_t tok = ((size_t)b * S + u) * G + g;
                        const real *ku = k + tok * d_k;
                        real p = exp(scale * dot(qt, ku, d_k) - lse[row]);
                        real ds = p * (dot(dout_t, v + tok * d_v, d_v) - D);
                        for (int c = 0; c < d_k; c++) {
                            dqt[c] += scale * ds * ku[c];
                            dk[tok * d_k + c] += scale * ds * qt[c];
                        }
                        for (int c = 0; c < d_v; c++) dv[tok * d_v + c] += p * dout_t[c];
                    }
                }
            }
        }
    }
}
