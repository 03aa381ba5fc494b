/* decode.c - the CPU reference decoder step (see decode.h): new tokens
 * through every layer, reading and extending NSA's caches.
 *
 * Per layer, for all rows at once (the reference ops of kernels/cpu):
 *   xn = RMSNorm(x); q, k^c = RoPE(xn W^T) at each row's position; v^c = xn W^T;
 *   g = sigmoid(xn Wgate^T)
 * then row by row, in order:
 *   append k^sel, v^sel at the row's position, k^win, v^win into the ring,
 *   k^cmp, v^cmp into the raw ring; when the position is i*d + l - 1, pool
 *   block i (the ring's l rows in token order, phi avg or mlp) into kc, vc;
 *   o_cmp = softmax over the visible blocks (n_t = floor((t-l+1)/d) + 1);
 *   per group: scores s_j from that softmax, the forced blocks and the top
 *   complete blocks (attn_select.c's rule), o_sel over their tokens <= t;
 *   o_win over [max(0, t-w+1), t]; y = sum_c g_c o_c
 * then x += y Wo^T and the MLP, and at the end logits = RMSNorm(x) lm_head^T.
 * Every sum runs in the order the full forward (model.c and the attn_*.c
 * ops) uses, so the logits agree with it to rounding - in practice to the
 * last bit. */
#include <string.h>
#include <tgmath.h>
#include "real.h"
#include "cpu_ops.h"
#include "decode.h"
#include "../nsa_cpu_pool.h"

static real dot(const real *a, const real *b, int n) {
    real acc = 0;
    for (int c = 0; c < n; c++) acc += a[c] * b[c];
    return acc;
}

/* ---- weights ----------------------------------------------------------- */

static int isLinearWeight(const NsaLayout *lay, int i) {
    if (i == lay->lm_head) return 1;
    for (int l = 0; l < lay->n_layers; l++) {
        const NsaLayerIndex *li = &lay->layers[l];
        if (i == li->wq || i == li->wk_cmp || i == li->wv_cmp || i == li->wk_sel ||
            i == li->wv_sel || i == li->wk_win || i == li->wv_win || i == li->w_gate ||
            i == li->wo || i == li->w_fc || i == li->w_up || i == li->w_proj)
            return 1;
    }
    return 0;
}

/* Linear weights [out][in] are stored [in][out]; everything else as is. */
void FN(nsaCpuDecodeSetTensor)(NsaCpuDecoder *dec, int i, const float *src, const double *src64) {
    const NsaTensorInfo *ti = &dec->layout->entries[i].info;
    real *dst = (real *)dec->arena + dec->weights + ti->offset;
    if (isLinearWeight(dec->layout, i)) {
        const size_t out = (size_t)ti->shape[0], in = (size_t)ti->shape[1];
        for (size_t o = 0; o < out; o++)
            for (size_t c = 0; c < in; c++)
                dst[c * out + o] = src64 ? (real)src64[o * in + c] : (real)src[o * in + c];
    } else {
        for (size_t j = 0; j < ti->numel; j++) dst[j] = src64 ? (real)src64[j] : (real)src[j];
    }
}

/* ---- the three branches for one row ------------------------------------ */

/* Compressed attention of one row at position t over the slot's first
 * n_vis pooled blocks: o [H][dv], lse [H] (-INFINITY when none is visible),
 * the arithmetic of nsaCpuCmpAttnForward. */
static void cmpRow(const NsaCpuDecoder *dec, real *o, real *lse, const real *q, const real *kc,
                   const real *vc, int n_vis) {
    const int H = dec->cfg.n_heads, G = dec->cfg.n_kv_groups, dk = dec->cfg.d_k;
    const int dv = dec->cfg.d_v, hpg = H / G;
    const real scale = (real)1 / sqrt((real)dk);
    for (int h = 0; h < H; h++) {
        const int g = h / hpg;
        const real *qt = q + (size_t)h * dk;
        real *ot = o + (size_t)h * dv;
        for (int c = 0; c < dv; c++) ot[c] = 0;
        if (n_vis == 0) {
            lse[h] = -INFINITY;
            continue;
        }
        real max_score = -INFINITY;
        for (int i = 0; i < n_vis; i++) {
            real s = scale * dot(qt, kc + ((size_t)i * G + g) * dk, dk);
            if (s > max_score) max_score = s;
        }
        real sum = 0;
        for (int i = 0; i < n_vis; i++) {
            size_t blk = (size_t)i * G + g;
            real w = exp(scale * dot(qt, kc + blk * dk, dk) - max_score);
            sum += w;
            const real *vi = vc + blk * dv;
            for (int c = 0; c < dv; c++) ot[c] += w * vi[c];
        }
        for (int c = 0; c < dv; c++) ot[c] /= sum;
        lse[h] = max_score + log(sum);
    }
}

/* The selected blocks of group g at t into sel (slots entries, ascending,
 * -1 padded): the scores and the rule of attn_select.c. */
static void selectRow(const NsaCpuDecoder *dec, int32_t *sel, const real *q, const real *kc,
                      const real *lse, int n_vis, int t, int g) {
    const NsaModelConfig *c = &dec->cfg;
    const int H = c->n_heads, G = c->n_kv_groups, dk = c->d_k, hpg = H / G;
    const int l = c->cmp_len, d = c->cmp_stride, l_sel = c->sel_len;
    const int slots = nsaNumSelSlots(c->n_sel);
    const int Ns = t / l_sel + 1;  /* blocks up to the current one; later ones score 0 */
    real *scores = (real *)dec->arena + dec->scores;
    unsigned char *taken = dec->taken;
    const real scale = (real)1 / sqrt((real)dk);
    for (int j = 0; j < Ns; j++) scores[j] = 0;
    for (int h = g * hpg; h < (g + 1) * hpg; h++) {
        for (int i = 0; i < n_vis; i++) {
            real p = exp(scale * dot(q + (size_t)h * dk, kc + ((size_t)i * G + g) * dk, dk) -
                         lse[h]);
            int first = i * d, end = i * d + l;
            for (int j = first / l_sel; j <= (end - 1) / l_sel; j++) {
                int lo = first > j * l_sel ? first : j * l_sel;
                int hi = end < (j + 1) * l_sel ? end : (j + 1) * l_sel;
                scores[j] += (real)(hi - lo) / (real)l * p;
            }
        }
    }
    memset(taken, 0, (size_t)Ns);
    const int current = t / l_sel;
    int count = 0;
    const int forced[3] = {0, current, current - 1};
    for (int f = 0; f < 3; f++)
        if (forced[f] >= 0 && !taken[forced[f]]) {
            taken[forced[f]] = 1;
            count++;
        }
    const int n_complete = (t + 1) / l_sel;
    while (count < c->n_sel) {
        int best = -1;
        for (int j = 0; j < n_complete; j++)
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

/* Softmax attention of one head over a run of keys given by a position
 * list: o = sum_u exp(s_u - max) v_u / sum, the two passes of attn_sel.c
 * and attn_win.c. `rowOf` maps position u to its cache row. */
typedef struct KeyRun {
    const real *k, *v;   /* cache rows [..][G][dk], [..][G][dv] */
    int ring;            /* 0: row u; else row u % ring */
} KeyRun;

static size_t cacheRow(const KeyRun *kr, int u) {
    return kr->ring ? (size_t)(u % kr->ring) : (size_t)u;
}

/* Selected attention of head h (group g) at t over the blocks in sel. */
static void selHead(const NsaCpuDecoder *dec, real *o, const real *qt, const KeyRun *kr,
                    const int32_t *sel, int t, int g) {
    const int G = dec->cfg.n_kv_groups, dk = dec->cfg.d_k, dv = dec->cfg.d_v;
    const int l_sel = dec->cfg.sel_len, slots = nsaNumSelSlots(dec->cfg.n_sel);
    const real scale = (real)1 / sqrt((real)dk);
    for (int c = 0; c < dv; c++) o[c] = 0;
    real max_score = -INFINITY;
    for (int n = 0; n < slots; n++) {
        if (sel[n] < 0) continue;
        int first = sel[n] * l_sel, end = (sel[n] + 1) * l_sel < t + 1 ? (sel[n] + 1) * l_sel : t + 1;
        for (int u = first; u < end; u++) {
            real s = scale * dot(qt, kr->k + (cacheRow(kr, u) * G + g) * dk, dk);
            if (s > max_score) max_score = s;
        }
    }
    if (max_score == -INFINITY) return;
    real sum = 0;
    for (int n = 0; n < slots; n++) {
        if (sel[n] < 0) continue;
        int first = sel[n] * l_sel, end = (sel[n] + 1) * l_sel < t + 1 ? (sel[n] + 1) * l_sel : t + 1;
        for (int u = first; u < end; u++) {
            size_t row = cacheRow(kr, u) * G + g;
            real w = exp(scale * dot(qt, kr->k + row * dk, dk) - max_score);
            sum += w;
            for (int c = 0; c < dv; c++) o[c] += w * kr->v[row * dv + c];
        }
    }
    for (int c = 0; c < dv; c++) o[c] /= sum;
}

/* Window attention of head h (group g) at t over [max(0, t-w+1), t]. */
static void winHead(const NsaCpuDecoder *dec, real *o, const real *qt, const KeyRun *kr, int t,
                    int g) {
    const int G = dec->cfg.n_kv_groups, dk = dec->cfg.d_k, dv = dec->cfg.d_v;
    const int first = t - dec->cfg.window + 1 > 0 ? t - dec->cfg.window + 1 : 0;
    const real scale = (real)1 / sqrt((real)dk);
    real max_score = -INFINITY;
    for (int u = first; u <= t; u++) {
        real s = scale * dot(qt, kr->k + (cacheRow(kr, u) * G + g) * dk, dk);
        if (s > max_score) max_score = s;
    }
    for (int c = 0; c < dv; c++) o[c] = 0;
    real sum = 0;
    for (int u = first; u <= t; u++) {
        size_t row = cacheRow(kr, u) * G + g;
        real w = exp(scale * dot(qt, kr->k + row * dk, dk) - max_score);
        sum += w;
        for (int c = 0; c < dv; c++) o[c] += w * kr->v[row * dv + c];
    }
    for (int c = 0; c < dv; c++) o[c] /= sum;
}

/* ---- one row's attention in one layer ----------------------------------- */

static void copyRows(real *dst, const real *src, size_t n) { memcpy(dst, src, n * sizeof(real)); }

/* Appends row r's keys and values to its slot's caches, pools a block when
 * one completes, then runs the three branches and the gate combine into
 * y[r]. */
static void attendRow(NsaCpuDecoder *dec, int layer, int r) {
    const NsaModelConfig *c = &dec->cfg;
    const NsaLayout *lay = dec->layout;
    const NsaLayerIndex *li = &lay->layers[layer];
    const NsaCpuDecodeLayer *cl = &dec->layers[layer];
    real *a = (real *)dec->arena;
    const real *wts = a + dec->weights;
    const int H = c->n_heads, G = c->n_kv_groups, dk = c->d_k, dv = c->d_v;
    const int l = c->cmp_len, d = c->cmp_stride, hpg = H / G;
    const size_t gk = (size_t)G * dk, gv = (size_t)G * dv;
    const int s = dec->row_slot[r], t = dec->row_pos[r];

    real *k_sel = a + cl->k_sel + s * dec->slot_sel_k, *v_sel = a + cl->v_sel + s * dec->slot_sel_v;
    real *k_win = a + cl->k_win + s * dec->slot_win_k, *v_win = a + cl->v_win + s * dec->slot_win_v;
    real *k_raw = a + cl->k_raw + s * dec->slot_raw_k, *v_raw = a + cl->v_raw + s * dec->slot_raw_v;
    real *kc = a + cl->kc + s * dec->slot_kc, *vc = a + cl->vc + s * dec->slot_vc;

    /* append */
    copyRows(k_sel + (size_t)t * gk, a + dec->k[1] + r * gk, gk);
    copyRows(v_sel + (size_t)t * gv, a + dec->v[1] + r * gv, gv);
    copyRows(k_win + (size_t)(t % dec->window_rows) * gk, a + dec->k[2] + r * gk, gk);
    copyRows(v_win + (size_t)(t % dec->window_rows) * gv, a + dec->v[2] + r * gv, gv);
    copyRows(k_raw + (size_t)(t % l) * gk, a + dec->k[0] + r * gk, gk);
    copyRows(v_raw + (size_t)(t % l) * gv, a + dec->v[0] + r * gv, gv);

    /* a compressed block ends here: tokens [t-l+1, t], in order */
    if (t >= l - 1 && (t - l + 1) % d == 0) {
        const int blk = (t - l + 1) / d;
        real *bk = a + dec->block_k, *bv = a + dec->block_v;
        for (int j = 0; j < l; j++) {
            const int u = t - l + 1 + j;
            copyRows(bk + (size_t)j * gk, k_raw + (size_t)(u % l) * gk, gk);
            copyRows(bv + (size_t)j * gv, v_raw + (size_t)(u % l) * gv, gv);
        }
        real *ok = kc + (size_t)blk * gk, *ov = vc + (size_t)blk * gv;
        if (c->phi == NSA_PHI_MLP) {
            real *hid = a + dec->hidden;
#define W(idx) (wts + lay->entries[(idx)].info.offset)
            FN(nsaCpuPoolMlpForward)(ok, hid, bk, W(li->phi_k_pos), W(li->phi_k_w1),
                                     W(li->phi_k_w2), 1, l, G, dk, l, d);
            FN(nsaCpuPoolMlpForward)(ov, hid, bv, W(li->phi_v_pos), W(li->phi_v_w1),
                                     W(li->phi_v_w2), 1, l, G, dv, l, d);
#undef W
        } else {
            FN(nsaCpuPoolAvgForward)(ok, bk, 1, l, G, dk, l, d);
            FN(nsaCpuPoolAvgForward)(ov, bv, 1, l, G, dv, l, d);
        }
    }

    /* the branches */
    const int n_vis = t < l - 1 ? 0 : (t - l + 1) / d + 1;
    const real *q = a + dec->q + (size_t)r * H * dk;
    real *o_cmp = a + dec->o[0] + (size_t)r * H * dv, *o_sel = a + dec->o[1] + (size_t)r * H * dv;
    real *o_win = a + dec->o[2] + (size_t)r * H * dv;
    real *lse = a + dec->lse_cmp + (size_t)r * H;
    cmpRow(dec, o_cmp, lse, q, kc, vc, n_vis);
    const KeyRun sel_run = {.k = k_sel, .v = v_sel, .ring = 0};
    const KeyRun win_run = {.k = k_win, .v = v_win, .ring = dec->window_rows};
    for (int g = 0; g < G; g++) {
        selectRow(dec, dec->sel, q, kc, lse, n_vis, t, g);
        for (int h = g * hpg; h < (g + 1) * hpg; h++) {
            selHead(dec, o_sel + (size_t)h * dv, q + (size_t)h * dk, &sel_run, dec->sel, t, g);
            winHead(dec, o_win + (size_t)h * dv, q + (size_t)h * dk, &win_run, t, g);
        }
    }
    const NsaAttnDims one = {.B = 1, .S = 1, .H = H, .G = G, .d_k = dk, .d_v = dv};
    FN(nsaCpuGateCombineForward)(a + dec->y + (size_t)r * H * dv,
                                 a + dec->gates + (size_t)r * H * 3, o_cmp, o_sel, o_win, &one);
}

/* ---- the step ------------------------------------------------------------ */

typedef struct ProductJob {
    real *y;
    const real *x, *wt;
    int rows, in, out;
} ProductJob;

/* A part's columns of the product: whole blocks of 8, the rest to the last. */
static void productTask(void *ctx, int part, int parts) {
    const ProductJob *j = ctx;
    const int blocks = j->out / 8;
    const int lo = blocks * part / parts * 8;
    const int hi = part == parts - 1 ? j->out : blocks * (part + 1) / parts * 8;
    FN(nsaCpuMatmulCols)(j->y, j->x, j->wt, (size_t)j->rows, j->in, j->out, lo, hi, 0);
}

/* y[rows][out] = x[rows][in] W^T with W stored transposed ([in][out]), the
 * output columns split over the decoder's threads (a step has one row a
 * slot: the rows are too few to split). */
static void linearRows(const NsaCpuDecoder *dec, real *y, const real *x, const real *wt, int rows,
                       int in, int out) {
    ProductJob j = {y, x, wt, rows, in, out};
    nsaCpuPoolRun(dec->pool, productTask, &j);
}

/* cos, sin at the row's position: the values nsaCpuRopeTable gives. */
static void ropeRow(real *cs, int t, int dim, double base) {
    const int half = dim / 2;
    for (int i = 0; i < half; i++) {
        double theta = pow(base, -2.0 * i / dim);
        double angle = (double)t * theta;
        cs[2 * i] = (real)cos(angle);
        cs[2 * i + 1] = (real)sin(angle);
    }
}

void FN(nsaCpuDecodeRows)(NsaCpuDecoder *dec, const int32_t *tokens, int rows) {
    const NsaModelConfig *c = &dec->cfg;
    const NsaLayout *lay = dec->layout;
    real *a = (real *)dec->arena;
    const real *wts = a + dec->weights;
    const int C = c->dim, V = c->vocab_size, H = c->n_heads, G = c->n_kv_groups;
    const int dk = c->d_k, dv = c->d_v, F = nsaLayoutMlpHidden(c), L = c->n_layers;
    const size_t R = (size_t)rows;
#define W(idx) (wts + lay->entries[(idx)].info.offset)
#define S(off) (a + (off))
    real *x = S(dec->x), *xn = S(dec->xn), *rstd = S(dec->rstd), *q = S(dec->q);
    real *gates = S(dec->gates), *proj = S(dec->proj), *mid = S(dec->mid);
    real *rope = S(dec->rope);

    for (int r = 0; r < rows; r++)
        ropeRow(rope + (size_t)r * dk, dec->row_pos[r], dk, c->rope_base);
    FN(nsaCpuEmbedForward)(x, W(lay->tok_emb), tokens, R, C);
    for (int i = 0; i < L; i++) {
        const NsaLayerIndex *li = &lay->layers[i];
        const int wk[3] = {li->wk_cmp, li->wk_sel, li->wk_win};
        const int wv[3] = {li->wv_cmp, li->wv_sel, li->wv_win};

        FN(nsaCpuRmsNormForward)(xn, rstd, x, W(li->attn_norm), R, C, c->norm_eps);
        linearRows(dec, q, xn, W(li->wq), rows, C, H * dk);
        for (int r = 0; r < rows; r++)
            FN(nsaCpuRopeForward)(q + (size_t)r * H * dk, rope + (size_t)r * dk, 1, 1, H, dk);
        for (int b = 0; b < 3; b++) {
            real *k = S(dec->k[b]);
            linearRows(dec, k, xn, W(wk[b]), rows, C, G * dk);
            for (int r = 0; r < rows; r++)
                FN(nsaCpuRopeForward)(k + (size_t)r * G * dk, rope + (size_t)r * dk, 1, 1, G, dk);
            linearRows(dec, S(dec->v[b]), xn, W(wv[b]), rows, C, G * dv);
        }
        linearRows(dec, gates, xn, W(li->w_gate), rows, C, 3 * H);
        FN(nsaCpuSigmoidForward)(gates, gates, R * 3 * H);
        for (int r = 0; r < rows; r++) attendRow(dec, i, r);
        linearRows(dec, proj, S(dec->y), W(li->wo), rows, H * dv, C);
        for (size_t j = 0; j < R * C; j++) mid[j] = x[j] + proj[j];

        real *fc = S(dec->fc), *act = S(dec->act);
        FN(nsaCpuRmsNormForward)(xn, rstd, mid, W(li->mlp_norm), R, C, c->norm_eps);
        linearRows(dec, fc, xn, W(li->w_fc), rows, C, F);
        if (c->mlp == NSA_MLP_SWIGLU) {
            linearRows(dec, S(dec->up), xn, W(li->w_up), rows, C, F);
            FN(nsaCpuSwigluForward)(act, fc, S(dec->up), R * F);
        } else {
            FN(nsaCpuSiluForward)(act, fc, R * F);
        }
        linearRows(dec, proj, act, W(li->w_proj), rows, F, C);
        for (size_t j = 0; j < R * C; j++) x[j] = mid[j] + proj[j];
    }
    FN(nsaCpuRmsNormForward)(xn, rstd, x, W(lay->final_norm), R, C, c->norm_eps);
    linearRows(dec, S(dec->logits), xn, W(lay->lm_head), rows, C, V);
#undef W
#undef S
}
