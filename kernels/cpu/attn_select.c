/* attn_select.c - choosing the selection blocks of each (query, KV group).
 *
 * Selection block j covers tokens [j*l', (j+1)*l'). Its score at t reuses the
 * compressed softmax of every head of the group (no new softmax):
 *   p_i = exp(scale q_t.kc_i - lse_t)            visible compressed blocks i
 *   s_j = sum_{h in group} sum_i M_ij p_i,      M_ij = |block i n block j| / l
 * The selected set always holds block 0, the current block floor(t/l') and the
 * previous one (where it exists); then the complete blocks ((j+1)*l'-1 <= t)
 * with the highest s_j join, ties to the lower j (also when every score is 0),
 * until it has n_sel blocks or no candidate is left. The forced blocks stay
 * even when n_sel < 3, which is why a row has nsaNumSelSlots(n_sel) entries.
 * Selection is a discrete choice: it has no backward. */
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>
#include "real.h"
#include "cpu_ops.h"

static int visibleCmpBlocks(int t, int cmp_len, int cmp_stride) {
    return t < cmp_len - 1 ? 0 : (t - cmp_len + 1) / cmp_stride + 1;
}

static real dot(const real *a, const real *b, int n) {
    real acc = 0;
    for (int c = 0; c < n; c++) acc += a[c] * b[c];
    return acc;
}

/* scores[j] = s_j of one (b, t, g) row, for all Ns selection blocks. A
 * visible compressed block ends at or before t, so blocks after the current
 * one score 0. */
static void scoreRow(real *scores, int Ns, const real *q, const real *kc, const real *lse,
                     const NsaAttnDims *dims, int b, int t, int g) {
    int S = dims->S, H = dims->H, G = dims->G, dk = dims->d_k;
    int l = dims->cmp_len, d = dims->cmp_stride, l_sel = dims->sel_len;
    int Nc = nsaNumCmpBlocks(S, l, d);
    int heads_per_group = H / G;
    int n_vis = visibleCmpBlocks(t, l, d);
    real scale = (real)1 / sqrt((real)dk);
    for (int j = 0; j < Ns; j++) scores[j] = 0;
    for (int h = g * heads_per_group; h < (g + 1) * heads_per_group; h++) {
        size_t row = ((size_t)b * S + t) * H + h;
        for (int i = 0; i < n_vis; i++) {
            real p = exp(scale * dot(q + row * dk, kc + (((size_t)b * Nc + i) * G + g) * dk, dk)
                         - lse[row]);
            int first = i * d, end = i * d + l;  /* tokens [first, end) */
            for (int j = first / l_sel; j <= (end - 1) / l_sel; j++) {
                int lo = first > j * l_sel ? first : j * l_sel;
                int hi = end < (j + 1) * l_sel ? end : (j + 1) * l_sel;
                scores[j] += (real)(hi - lo) / (real)l * p;
            }
        }
    }
}

/* Marks block j as taken; returns 1 if it was not taken before. */
static int takeBlock(unsigned char *taken, int j) {
    if (taken[j]) return 0;
    taken[j] = 1;
    return 1;
}

/* Fills one sel_idx row (slots entries) from the row's scores. */
static void selectRow(int32_t *sel, int slots, unsigned char *taken, const real *scores, int Ns,
                      int t, int l_sel, int n_sel) {
    memset(taken, 0, (size_t)Ns);
    int current = t / l_sel;
    int count = takeBlock(taken, 0);
    count += takeBlock(taken, current);
    if (current >= 1) count += takeBlock(taken, current - 1);
    int n_complete = (t + 1) / l_sel;  /* blocks j with (j+1)*l' - 1 <= t */
    while (count < n_sel) {
        int best = -1;
        for (int j = 0; j < n_complete; j++)  /* ascending + strict '>': ties go low */
            if (!taken[j] && (best < 0 || scores[j] > scores[best])) best = j;
        if (best < 0) break;
        taken[best] = 1;
        count++;
    }
    int k = 0;
    for (int j = 0; j < Ns; j++)
        if (taken[j]) sel[k++] = j;
    while (k < slots) sel[k++] = -1;
}

#define NSA_CPU_SELECT_MAX_BLOCKS 65536

int FN(nsaCpuSelectBlocks)(int32_t *sel_idx, real *scores, const real *q, const real *kc,
                           const real *lse, const NsaAttnDims *dims) {
    int B = dims->B, S = dims->S, G = dims->G;
    int Ns = nsaNumSelBlocks(S, dims->sel_len);
    int slots = nsaNumSelSlots(dims->n_sel);
    /* Per-row scratch lives on the stack, so the training step allocates
     * nothing here; 2^16 selection blocks (S = 4M at l' = 64) bound it. */
    if (Ns > NSA_CPU_SELECT_MAX_BLOCKS) return -1;
    int scratch = Ns > 0 ? Ns : 1;
    unsigned char taken[scratch];
    real row_scores[scores ? 1 : scratch];
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < S; t++) {
            for (int g = 0; g < G; g++) {
                size_t row = ((size_t)b * S + t) * G + g;
                real *s = scores ? scores + row * Ns : row_scores;
                scoreRow(s, Ns, q, kc, lse, dims, b, t, g);
                selectRow(sel_idx + row * slots, slots, taken, s, Ns, t, dims->sel_len,
                          dims->n_sel);
            }
        }
    }
    return 0;
}
