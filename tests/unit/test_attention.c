/* test_attention.c - the CPU reference of the NSA attention op.
 *
 * These tests hold the oracle to the math of proto/model.md ("The three
 * branches") with code written independently of it: brute-force attention
 * under an explicit token mask, overlap counts by counting tokens, selection
 * by sorting. Then the identities (each branch degenerates to full causal
 * attention), causality, rows that see nothing, finite-difference gradients
 * in double for every op and input, and the public fp32 op against the double
 * chain.
 * Every case draws fresh inputs from a seeded RNG; measured errors are
 * printed as "# ..." lines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "nsa.h"
#include "nsa_rng.h"
#include "testutil.h"

/* ---- shapes ---------------------------------------------------------------- */

/* The paper's l, d, l' and w are cmp_len, cmp_stride, sel_len and window.
 * No S is a multiple of l, d, l' or w unless that is the point. */
static const NsaAttnDims kShapes[] = {
    /* general: 2 heads per group */
    {.B = 2, .S = 13, .H = 4, .G = 2, .d_k = 6, .d_v = 5, .cmp_len = 4, .cmp_stride = 2,
     .sel_len = 4, .n_sel = 3, .window = 5},
    /* G = 1, n_sel < 3, d_k < d_v */
    {.B = 1, .S = 11, .H = 3, .G = 1, .d_k = 4, .d_v = 7, .cmp_len = 4, .cmp_stride = 2,
     .sel_len = 6, .n_sel = 2, .window = 3},
    /* G = H, d = l */
    {.B = 1, .S = 10, .H = 2, .G = 2, .d_k = 5, .d_v = 3, .cmp_len = 3, .cmp_stride = 3,
     .sel_len = 6, .n_sel = 4, .window = 4},
    /* S < l: no compressed block */
    {.B = 2, .S = 3, .H = 2, .G = 1, .d_k = 4, .d_v = 4, .cmp_len = 4, .cmp_stride = 2,
     .sel_len = 4, .n_sel = 2, .window = 2},
    /* S = 1 */
    {.B = 1, .S = 1, .H = 2, .G = 2, .d_k = 3, .d_v = 2, .cmp_len = 2, .cmp_stride = 1,
     .sel_len = 2, .n_sel = 1, .window = 1},
    /* a real top-k among several blocks */
    {.B = 1, .S = 45, .H = 4, .G = 2, .d_k = 8, .d_v = 6, .cmp_len = 8, .cmp_stride = 4,
     .sel_len = 8, .n_sel = 5, .window = 9},
};
#define N_SHAPES (sizeof(kShapes) / sizeof(kShapes[0]))

static const char *shapeName(const NsaAttnDims *d) {
    static char buf[160];
    snprintf(buf, sizeof(buf), "B%d S%d H%d G%d dk%d dv%d l%d d%d l'%d n%d w%d", d->B, d->S, d->H,
             d->G, d->d_k, d->d_v, d->cmp_len, d->cmp_stride, d->sel_len, d->n_sel, d->window);
    return buf;
}

/* ---- one problem: every tensor an op of this file reads, in double --------- */

typedef struct Problem {
    NsaAttnDims dims;
    int Nc, Ns, slots;
    size_t n_q, n_k, n_v, n_rows, n_kc, n_vc, n_sel;
    /* inputs of the whole op, rounded to float so the fp32 op sees them exactly */
    double *q, *k_cmp, *v_cmp, *k_sel, *v_sel, *k_win, *v_win, *gates;
    /* direct inputs of single ops */
    double *kc, *vc;                  /* pooled blocks for the compressed op */
    double *o_cmp_in, *o_sel_in, *o_win_in;  /* branch outputs for the gate op */
    double *pos, *w1, *w2;            /* phi = mlp parameters over d_k */
    int32_t *sel_fixed;               /* a selection for the selected-attention op */
    /* upstream gradients: random weights of the scalar losses */
    double *dout, *dpool;
} Problem;

/* Results of the double chain (the public op's recipe in double). */
typedef struct Chain {
    double *kc, *vc, *o_cmp, *o_sel, *o_win, *lse_cmp, *lse_sel, *lse_win, *out;
    int32_t *sel_idx;
} Chain;

static double *roundedFill(NsaRng *rng, size_t n, double lo, double hi) {
    double *x = testAlloc(n, sizeof(double));
    testFillF64(rng, x, n, lo, hi);
    for (size_t i = 0; i < n; i++) x[i] = (float)x[i];
    return x;
}

static uint64_t g_case_seed = 1;  /* advanced per problem: every case gets fresh inputs */

static Problem *problemCreate(const NsaAttnDims *dims) {
    Problem *p = testAlloc(1, sizeof(Problem));
    NsaRng rng;
    nsaRngSeed(&rng, 20250601, g_case_seed++);
    p->dims = *dims;
    p->Nc = nsaNumCmpBlocks(dims->S, dims->cmp_len, dims->cmp_stride);
    p->Ns = nsaNumSelBlocks(dims->S, dims->sel_len);
    p->slots = nsaNumSelSlots(dims->n_sel);
    size_t tokens = (size_t)dims->B * dims->S;
    p->n_rows = tokens * dims->H;
    p->n_q = p->n_rows * dims->d_k;
    p->n_k = tokens * dims->G * dims->d_k;
    p->n_v = tokens * dims->G * dims->d_v;
    p->n_kc = (size_t)dims->B * p->Nc * dims->G * dims->d_k;
    p->n_vc = (size_t)dims->B * p->Nc * dims->G * dims->d_v;
    p->n_sel = tokens * dims->G * p->slots;
    p->q = roundedFill(&rng, p->n_q, -1, 1);
    p->k_cmp = roundedFill(&rng, p->n_k, -1, 1);
    p->v_cmp = roundedFill(&rng, p->n_v, -1, 1);
    p->k_sel = roundedFill(&rng, p->n_k, -1, 1);
    p->v_sel = roundedFill(&rng, p->n_v, -1, 1);
    p->k_win = roundedFill(&rng, p->n_k, -1, 1);
    p->v_win = roundedFill(&rng, p->n_v, -1, 1);
    p->gates = roundedFill(&rng, p->n_rows * 3, 0.05, 0.95);
    p->kc = roundedFill(&rng, p->n_kc, -1, 1);
    p->vc = roundedFill(&rng, p->n_vc, -1, 1);
    p->o_cmp_in = roundedFill(&rng, p->n_rows * dims->d_v, -1, 1);
    p->o_sel_in = roundedFill(&rng, p->n_rows * dims->d_v, -1, 1);
    p->o_win_in = roundedFill(&rng, p->n_rows * dims->d_v, -1, 1);
    size_t l = (size_t)dims->cmp_len, dk = (size_t)dims->d_k;
    p->pos = roundedFill(&rng, l * dk, -0.5, 0.5);
    p->w1 = roundedFill(&rng, dk * l * dk, -0.3, 0.3);
    p->w2 = roundedFill(&rng, dk * dk, -0.5, 0.5);
    p->dout = roundedFill(&rng, p->n_rows * dims->d_v, -1, 1);
    p->dpool = roundedFill(&rng, p->n_kc, -1, 1);
    /* a valid-looking selection that differs per group: forced blocks plus
     * random extra ones, ascending, -1 padded */
    p->sel_fixed = testAlloc(p->n_sel, sizeof(int32_t));
    unsigned char *taken = testAlloc((size_t)p->Ns, 1);
    for (size_t row = 0; row < tokens * dims->G; row++) {
        int t = (int)((row / dims->G) % dims->S);
        int cur = t / dims->sel_len;
        memset(taken, 0, (size_t)p->Ns);
        taken[0] = taken[cur] = 1;
        if (cur > 0) taken[cur - 1] = 1;
        for (int j = 0; j <= cur; j++)
            if (nsaRngUniform(&rng) < 0.4) taken[j] = 1;
        int k = 0;
        for (int j = 0; j < p->Ns && k < p->slots; j++)
            if (taken[j]) p->sel_fixed[row * p->slots + k++] = j;
        while (k < p->slots) p->sel_fixed[row * p->slots + k++] = -1;
    }
    free(taken);
    return p;
}

static void problemFree(Problem *p) {
    double *arrays[] = {p->q,        p->k_cmp,    p->v_cmp,    p->k_sel, p->v_sel, p->k_win,
                        p->v_win,    p->gates,    p->kc,       p->vc,    p->o_cmp_in,
                        p->o_sel_in, p->o_win_in, p->pos,      p->w1,    p->w2,    p->dout,
                        p->dpool};
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++) free(arrays[i]);
    free(p->sel_fixed);
    free(p);
}

static Chain *chainCreate(const Problem *p) {
    Chain *c = testAlloc(1, sizeof(Chain));
    size_t ov = p->n_rows * p->dims.d_v;
    c->kc = testAlloc(p->n_kc, sizeof(double));
    c->vc = testAlloc(p->n_vc, sizeof(double));
    c->o_cmp = testAlloc(ov, sizeof(double));
    c->o_sel = testAlloc(ov, sizeof(double));
    c->o_win = testAlloc(ov, sizeof(double));
    c->out = testAlloc(ov, sizeof(double));
    c->lse_cmp = testAlloc(p->n_rows, sizeof(double));
    c->lse_sel = testAlloc(p->n_rows, sizeof(double));
    c->lse_win = testAlloc(p->n_rows, sizeof(double));
    c->sel_idx = testAlloc(p->n_sel, sizeof(int32_t));
    return c;
}

static void chainFree(Chain *c) {
    free(c->kc);
    free(c->vc);
    free(c->o_cmp);
    free(c->o_sel);
    free(c->o_win);
    free(c->out);
    free(c->lse_cmp);
    free(c->lse_sel);
    free(c->lse_win);
    free(c->sel_idx);
    free(c);
}

/* The public op's recipe with the F64 ops. */
static void chainForward(const Problem *p, Chain *c) {
    const NsaAttnDims *d = &p->dims;
    nsaCpuPoolAvgForwardF64(c->kc, p->k_cmp, d->B, d->S, d->G, d->d_k, d->cmp_len, d->cmp_stride);
    nsaCpuPoolAvgForwardF64(c->vc, p->v_cmp, d->B, d->S, d->G, d->d_v, d->cmp_len, d->cmp_stride);
    nsaCpuCmpAttnForwardF64(c->o_cmp, c->lse_cmp, p->q, c->kc, c->vc, d);
    assert_int_equal(nsaCpuSelectBlocksF64(c->sel_idx, NULL, p->q, c->kc, c->lse_cmp, d), 0);
    nsaCpuSelAttnForwardF64(c->o_sel, c->lse_sel, p->q, p->k_sel, p->v_sel, c->sel_idx, d);
    nsaCpuWinAttnForwardF64(c->o_win, c->lse_win, p->q, p->k_win, p->v_win, d);
    nsaCpuGateCombineForwardF64(c->out, p->gates, c->o_cmp, c->o_sel, c->o_win, d);
}

typedef struct ChainGrads {
    double *dq, *dk_cmp, *dv_cmp, *dk_sel, *dv_sel, *dk_win, *dv_win, *dgates;
} ChainGrads;

static ChainGrads chainGradsCreate(const Problem *p) {
    ChainGrads g = {
        testAlloc(p->n_q, sizeof(double)),  testAlloc(p->n_k, sizeof(double)),
        testAlloc(p->n_v, sizeof(double)),  testAlloc(p->n_k, sizeof(double)),
        testAlloc(p->n_v, sizeof(double)),  testAlloc(p->n_k, sizeof(double)),
        testAlloc(p->n_v, sizeof(double)),  testAlloc(p->n_rows * 3, sizeof(double)),
    };
    return g;
}

static void chainGradsFree(ChainGrads *g) {
    free(g->dq);
    free(g->dk_cmp);
    free(g->dv_cmp);
    free(g->dk_sel);
    free(g->dv_sel);
    free(g->dk_win);
    free(g->dv_win);
    free(g->dgates);
}

/* Gradients of sum(dout * out) through the chain (after chainForward). */
static void chainBackward(const Problem *p, const Chain *c, ChainGrads *g) {
    const NsaAttnDims *d = &p->dims;
    size_t ov = p->n_rows * d->d_v;
    double *do_cmp = testAlloc(ov, sizeof(double));
    double *do_sel = testAlloc(ov, sizeof(double));
    double *do_win = testAlloc(ov, sizeof(double));
    double *dkc = testAlloc(p->n_kc, sizeof(double));
    double *dvc = testAlloc(p->n_vc, sizeof(double));
    nsaCpuGateCombineBackwardF64(g->dgates, do_cmp, do_sel, do_win, p->dout, p->gates, c->o_cmp,
                                 c->o_sel, c->o_win, d);
    nsaCpuWinAttnBackwardF64(g->dq, g->dk_win, g->dv_win, do_win, p->q, p->k_win, p->v_win,
                             c->o_win, c->lse_win, d);
    nsaCpuSelAttnBackwardF64(g->dq, g->dk_sel, g->dv_sel, do_sel, p->q, p->k_sel, p->v_sel,
                             c->sel_idx, c->o_sel, c->lse_sel, d);
    nsaCpuCmpAttnBackwardF64(g->dq, dkc, dvc, do_cmp, p->q, c->kc, c->vc, c->o_cmp, c->lse_cmp, d);
    nsaCpuPoolAvgBackwardF64(g->dk_cmp, dkc, d->B, d->S, d->G, d->d_k, d->cmp_len, d->cmp_stride);
    nsaCpuPoolAvgBackwardF64(g->dv_cmp, dvc, d->B, d->S, d->G, d->d_v, d->cmp_len, d->cmp_stride);
    free(do_cmp);
    free(do_sel);
    free(do_win);
    free(dkc);
    free(dvc);
}

/* One attention output and its log-sum-exp for every query row of a problem. */
typedef struct AttnOut {
    double *o, *lse;
} AttnOut;

static AttnOut attnOutCreate(const Problem *p) {
    AttnOut a = {testAlloc(p->n_rows * p->dims.d_v, sizeof(double)), testAlloc(p->n_rows, sizeof(double))};
    return a;
}

static void attnOutFree(AttnOut *a) {
    free(a->o);
    free(a->lse);
}

/* ---- brute force ------------------------------------------------------------ */

/* Which keys u query row (b, t, group g) may see. */
typedef int (*TokenMask)(const void *ctx, const NsaAttnDims *d, int b, int t, int g, int u);

static int maskCausal(const void *ctx, const NsaAttnDims *d, int b, int t, int g, int u) {
    return u <= t;
}

static int maskWindow(const void *ctx, const NsaAttnDims *d, int b, int t, int g, int u) {
    return u <= t && u >= t - d->window + 1;
}

/* ctx: sel_idx [B][S][G][slots] */
static int maskSelected(const void *ctx, const NsaAttnDims *d, int b, int t, int g, int u) {
    const int32_t *sel = ctx;
    int slots = nsaNumSelSlots(d->n_sel);
    const int32_t *row = sel + (((size_t)b * d->S + t) * d->G + g) * slots;
    if (u > t) return 0;
    for (int n = 0; n < slots; n++)
        if (row[n] >= 0 && u / d->sel_len == row[n]) return 1;
    return 0;
}

/* o[b][t][h] = softmax over the allowed u of q.k_u / sqrt(d_k), times v_u;
 * o = 0 and lse = -inf when nothing is allowed. k, v are [B][S][G][.]. */
static void bruteAttention(double *o, double *lse, const double *q, const double *k,
                           const double *v, const NsaAttnDims *d, TokenMask mask,
                           const void *ctx) {
    double *s = testAlloc((size_t)d->S, sizeof(double));
    double scale = 1.0 / sqrt((double)d->d_k);
    for (int b = 0; b < d->B; b++)
        for (int t = 0; t < d->S; t++)
            for (int h = 0; h < d->H; h++) {
                int g = h / (d->H / d->G);
                size_t row = ((size_t)b * d->S + t) * d->H + h;
                double m = -INFINITY;
                for (int u = 0; u < d->S; u++) {
                    s[u] = -INFINITY;
                    if (!mask(ctx, d, b, t, g, u)) continue;
                    double acc = 0;
                    for (int c = 0; c < d->d_k; c++)
                        acc += q[row * d->d_k + c] * k[(((size_t)b * d->S + u) * d->G + g) * d->d_k + c];
                    s[u] = scale * acc;
                    if (s[u] > m) m = s[u];
                }
                for (int c = 0; c < d->d_v; c++) o[row * d->d_v + c] = 0;
                if (m == -INFINITY) {
                    if (lse) lse[row] = -INFINITY;
                    continue;
                }
                double z = 0;
                for (int u = 0; u < d->S; u++) z += exp(s[u] - m);
                for (int u = 0; u < d->S; u++) {
                    double w = exp(s[u] - m) / z;
                    for (int c = 0; c < d->d_v; c++)
                        o[row * d->d_v + c] += w * v[(((size_t)b * d->S + u) * d->G + g) * d->d_v + c];
                }
                if (lse) lse[row] = m + log(z);
            }
    free(s);
}

/* s[b][t][g][j] = sum over the group's heads and the visible compressed blocks
 * i of (tokens of block i inside selection block j, counted one by one) / l
 * times the compressed softmax p_i, computed here from scratch. */
static void bruteScores(double *scores, const double *q, const double *kc, const NsaAttnDims *d) {
    int Nc = nsaNumCmpBlocks(d->S, d->cmp_len, d->cmp_stride);
    int Ns = nsaNumSelBlocks(d->S, d->sel_len);
    double *p = testAlloc((size_t)Nc, sizeof(double));
    double scale = 1.0 / sqrt((double)d->d_k);
    for (int b = 0; b < d->B; b++)
        for (int t = 0; t < d->S; t++)
            for (int g = 0; g < d->G; g++) {
                double *srow = scores + (((size_t)b * d->S + t) * d->G + g) * Ns;
                for (int j = 0; j < Ns; j++) srow[j] = 0;
                for (int h = g * (d->H / d->G); h < (g + 1) * (d->H / d->G); h++) {
                    size_t row = ((size_t)b * d->S + t) * d->H + h;
                    double m = -INFINITY, z = 0;
                    for (int i = 0; i < Nc; i++) {
                        p[i] = -INFINITY;
                        if (i * d->cmp_stride + d->cmp_len - 1 > t) continue;
                        double acc = 0;
                        for (int c = 0; c < d->d_k; c++)
                            acc += q[row * d->d_k + c] * kc[(((size_t)b * Nc + i) * d->G + g) * d->d_k + c];
                        p[i] = scale * acc;
                        if (p[i] > m) m = p[i];
                    }
                    if (m == -INFINITY) continue;
                    for (int i = 0; i < Nc; i++) z += exp(p[i] - m);
                    for (int i = 0; i < Nc; i++) {
                        double pi = exp(p[i] - m) / z;
                        for (int j = 0; j < Ns; j++) {
                            int count = 0;
                            for (int u = i * d->cmp_stride; u < i * d->cmp_stride + d->cmp_len; u++)
                                count += u / d->sel_len == j;
                            srow[j] += (double)count / d->cmp_len * pi;
                        }
                    }
                }
            }
    free(p);
}

typedef struct Candidate {
    double score;
    int block;
} Candidate;

static int candidateOrder(const void *a, const void *b) {
    const Candidate *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->block - y->block;
}

/* The selection rule by sorting: forced blocks, then the complete other
 * blocks sorted by (score descending, block ascending). */
static void bruteSelect(int32_t *sel, const double *scores, const NsaAttnDims *d) {
    int Ns = nsaNumSelBlocks(d->S, d->sel_len), slots = nsaNumSelSlots(d->n_sel);
    Candidate *cand = testAlloc((size_t)Ns, sizeof(Candidate));
    int *chosen = testAlloc((size_t)Ns, sizeof(int));
    for (int b = 0; b < d->B; b++)
        for (int t = 0; t < d->S; t++)
            for (int g = 0; g < d->G; g++) {
                size_t row = ((size_t)b * d->S + t) * d->G + g;
                int cur = t / d->sel_len, n_chosen = 0, n_cand = 0;
                memset(chosen, 0, (size_t)Ns * sizeof(int));
                for (int j = 0; j < Ns; j++) {
                    if (j == 0 || j == cur || j == cur - 1) {
                        chosen[j] = 1;
                        n_chosen++;
                    } else if ((j + 1) * d->sel_len - 1 <= t) {
                        cand[n_cand].score = scores[row * Ns + j];
                        cand[n_cand++].block = j;
                    }
                }
                qsort(cand, (size_t)n_cand, sizeof(Candidate), candidateOrder);
                for (int n = 0; n < n_cand && n_chosen < d->n_sel; n++, n_chosen++)
                    chosen[cand[n].block] = 1;
                int k = 0;
                for (int j = 0; j < Ns; j++)
                    if (chosen[j]) sel[row * slots + k++] = j;
                while (k < slots) sel[row * slots + k++] = -1;
            }
    free(cand);
    free(chosen);
}

/* ---- finite differences ------------------------------------------------------ */

typedef double (*LossFn)(void *ctx);

static double dotF64(const double *a, const double *b, size_t n) {
    double acc = 0;
    for (size_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* Central differences of loss over the n inputs x (restored afterwards). */
static void finiteDifferences(double *fd, LossFn loss, void *ctx, double *x, size_t n) {
    const double h = 1e-6;
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + h;
        double up = loss(ctx);
        x[i] = saved - h;
        double down = loss(ctx);
        x[i] = saved;
        fd[i] = (up - down) / (2 * h);
    }
}

#define GRAD_TOL 1e-5
#define ZERO_GRAD_NORM 1e-12  /* below: a gradient that is 0 in exact math */
#define FD_NOISE_NORM 1e-6    /* rounding noise of finite differences of a constant */

/* Fails unless ||g_fd - g|| / ||g|| < GRAD_TOL. A gradient that is zero in
 * exact math (a one-token softmax, no visible block) can come out as
 * rounding noise; there both norms must be tiny instead. */
static void checkGrad(const char *op, const char *input, const NsaAttnDims *d, LossFn loss,
                      void *ctx, double *x, size_t n, const double *grad) {
    double *fd = testAlloc(n, sizeof(double));
    finiteDifferences(fd, loss, ctx, x, n);
    double err = testRelErrF64(fd, grad, n);
    double g_norm = sqrt(dotF64(grad, grad, n)), fd_norm = sqrt(dotF64(fd, fd, n));
    free(fd);
    if (g_norm < ZERO_GRAD_NORM) {
        printf("# grad %-9s %-7s %-46s n=%-5zu zero: |g| %.1e |g_fd| %.1e\n", op, input,
               shapeName(d), n, g_norm, fd_norm);
        if (!(fd_norm < FD_NOISE_NORM))
            fail_msg("%s: d/d%s is %.3e but finite differences give %.3e on %s", op, input,
                     g_norm, fd_norm, shapeName(d));
        return;
    }
    printf("# grad %-9s %-7s %-46s n=%-5zu rel err %.2e\n", op, input, shapeName(d), n, err);
    if (!(err < GRAD_TOL))
        fail_msg("%s: d/d%s relative error %.3e >= %.0e on %s", op, input, err, GRAD_TOL,
                 shapeName(d));
}

/* ---- expectations ------------------------------------------------------------ */

/* Asserts that got equals want to 1e-12 relative, output and lse. */
static void expectSameAttn(const AttnOut *got, const AttnOut *want, const Problem *p) {
    assert_true(testRelErrF64(got->o, want->o, p->n_rows * p->dims.d_v) < 1e-12);
    assert_true(testRelErrF64(got->lse, want->lse, p->n_rows) < 1e-12);
}

/* Asserts that a branch's output o and lse (over keys k and values v at
 * shape d) are full causal attention to 1e-12 relative; prints the error
 * as "# <what> vs full causal". */
static void expectFullCausal(const char *what, const Problem *p, const NsaAttnDims *d, const double *o,
                             const double *lse, const double *k, const double *v) {
    AttnOut want = attnOutCreate(p);
    bruteAttention(want.o, want.lse, p->q, k, v, d, maskCausal, NULL);
    double err = testRelErrF64(o, want.o, p->n_rows * d->d_v);
    printf("# %s vs full causal, %s: rel err %.2e\n", what, shapeName(d), err);
    assert_true(err < 1e-12);
    assert_true(testRelErrF64(lse, want.lse, p->n_rows) < 1e-12);
    attnOutFree(&want);
}

/* ---- tests: sizes and validation -------------------------------------------- */

static void test_block_counts(void **state) {
    assert_int_equal(nsaNumCmpBlocks(31, 32, 16), 0);
    assert_int_equal(nsaNumCmpBlocks(32, 32, 16), 1);
    assert_int_equal(nsaNumCmpBlocks(47, 32, 16), 1);
    assert_int_equal(nsaNumCmpBlocks(48, 32, 16), 2);
    assert_int_equal(nsaNumCmpBlocks(13, 4, 2), 5);
    assert_int_equal(nsaNumCmpBlocks(5, 1, 1), 5);
    assert_int_equal(nsaNumSelBlocks(1, 64), 1);
    assert_int_equal(nsaNumSelBlocks(64, 64), 1);
    assert_int_equal(nsaNumSelBlocks(65, 64), 2);
    assert_int_equal(nsaNumSelBlocks(13, 1), 13);
    assert_int_equal(nsaNumSelSlots(1), 3);
    assert_int_equal(nsaNumSelSlots(3), 3);
    assert_int_equal(nsaNumSelSlots(16), 16);
}

static void expectInvalid(NsaAttnDims d, const char *needle) {
    NsaError err = {{0}};
    assert_int_equal(nsaAttnDimsValidate(&d, &err), -1);
    if (!strstr(err.message, needle))
        fail_msg("message \"%s\" does not name \"%s\"", err.message, needle);
}

static void test_dims_validation(void **state) {
    NsaAttnDims good = kShapes[0];
    NsaError err = {{0}};
    for (size_t s = 0; s < N_SHAPES; s++) assert_int_equal(nsaAttnDimsValidate(&kShapes[s], &err), 0);
    NsaAttnDims d = good;
    d.S = 0;
    expectInvalid(d, "S = 0");
    d = good;
    d.G = 3;
    expectInvalid(d, "G = 3");
    d = good;
    d.d_v = -1;
    expectInvalid(d, "d_v = -1");
    d = good;
    d.cmp_stride = 3;
    expectInvalid(d, "cmp_stride = 3");
    d = good;
    d.sel_len = 5;
    expectInvalid(d, "sel_len (5)");
    d = good;
    d.window = 0;
    expectInvalid(d, "window = 0");
    d = good;
    d.n_sel = 0;
    expectInvalid(d, "n_sel = 0");
    assert_int_equal(nsaAttnDimsValidate(NULL, &err), -1);
}

/* ---- tests: identities ------------------------------------------------------- */

static void test_window_identity(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++) {
        Problem *p = problemCreate(&kShapes[s]);
        NsaAttnDims d = p->dims;
        AttnOut got = attnOutCreate(p), want = attnOutCreate(p);
        /* the op's own window against the brute-force mask */
        nsaCpuWinAttnForwardF64(got.o, got.lse, p->q, p->k_win, p->v_win, &d);
        bruteAttention(want.o, want.lse, p->q, p->k_win, p->v_win, &d, maskWindow, NULL);
        expectSameAttn(&got, &want, p);
        /* w >= S is full causal attention */
        for (int w = d.S; w <= d.S + 2; w += 2) {
            d.window = w;
            nsaCpuWinAttnForwardF64(got.o, got.lse, p->q, p->k_win, p->v_win, &d);
            char what[32];
            snprintf(what, sizeof what, "window w=%d", w);
            expectFullCausal(what, p, &d, got.o, got.lse, p->k_win, p->v_win);
        }
        attnOutFree(&got);
        attnOutFree(&want);
        problemFree(p);
    }
}

static void test_selection_identity(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++) {
        NsaAttnDims d = kShapes[s];
        d.sel_len = 1;
        d.cmp_stride = 1;
        d.n_sel = d.S + (int)s % 2;  /* n_sel = S and n_sel > S */
        Problem *p = problemCreate(&d);
        Chain *c = chainCreate(p);
        chainForward(p, c);
        /* every token <= t is selected, in order, the rest is padding */
        for (size_t row = 0; row < p->n_sel / p->slots; row++) {
            int t = (int)((row / d.G) % d.S);
            for (int n = 0; n < p->slots; n++)
                assert_int_equal(c->sel_idx[row * p->slots + n], n <= t ? n : -1);
        }
        char what[48];
        snprintf(what, sizeof what, "selection l'=1 n_sel=%d", d.n_sel);
        expectFullCausal(what, p, &d, c->o_sel, c->lse_sel, p->k_sel, p->v_sel);
        chainFree(c);
        problemFree(p);
    }
}

static void test_compressed_identity(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++) {
        NsaAttnDims d = kShapes[s];
        d.cmp_len = d.cmp_stride = 1;
        Problem *p = problemCreate(&d);
        Chain *c = chainCreate(p);
        chainForward(p, c);
        assert_int_equal(p->Nc, d.S);
        assert_memory_equal(c->kc, p->k_cmp, p->n_k * sizeof(double));  /* mean of one token */
        expectFullCausal("compressed l=d=1", p, &d, c->o_cmp, c->lse_cmp, p->k_cmp, p->v_cmp);
        chainFree(c);
        problemFree(p);
    }
}

/* Compressed attention at general l, d against brute force over pooled
 * blocks: block i is visible at t iff i*d + l - 1 <= t. */
static int maskCmpVisible(const void *ctx, const NsaAttnDims *d, int b, int t, int g, int i) {
    return i * d->cmp_stride + d->cmp_len - 1 <= t;
}

static void test_compressed_bruteforce(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++) {
        Problem *p = problemCreate(&kShapes[s]);
        NsaAttnDims d = p->dims;
        AttnOut got = attnOutCreate(p), want = attnOutCreate(p);
        nsaCpuCmpAttnForwardF64(got.o, got.lse, p->q, p->kc, p->vc, &d);
        for (int b = 0; b < d.B; b++)
            for (int t = 0; t < d.S; t++)
                for (int h = 0; h < d.H; h++) {
                    size_t row = ((size_t)b * d.S + t) * d.H + h;
                    int g = h / (d.H / d.G);
                    double m = -INFINITY, z = 0, scale = 1 / sqrt((double)d.d_k);
                    double sc[64];
                    assert_true(p->Nc <= 64);
                    for (int i = 0; i < p->Nc; i++) {
                        sc[i] = -INFINITY;
                        if (!maskCmpVisible(NULL, &d, b, t, g, i)) continue;
                        sc[i] = scale * dotF64(p->q + row * d.d_k,
                                               p->kc + (((size_t)b * p->Nc + i) * d.G + g) * d.d_k,
                                               (size_t)d.d_k);
                        if (sc[i] > m) m = sc[i];
                    }
                    for (int c = 0; c < d.d_v; c++) want.o[row * d.d_v + c] = 0;
                    want.lse[row] = -INFINITY;
                    if (m == -INFINITY) continue;
                    for (int i = 0; i < p->Nc; i++) z += exp(sc[i] - m);
                    for (int i = 0; i < p->Nc; i++)
                        for (int c = 0; c < d.d_v; c++)
                            want.o[row * d.d_v + c] += exp(sc[i] - m) / z *
                                p->vc[(((size_t)b * p->Nc + i) * d.G + g) * d.d_v + c];
                    want.lse[row] = m + log(z);
                }
        assert_true(testRelErrF64(got.o, want.o, p->n_rows * d.d_v) < 1e-12);
        for (size_t r = 0; r < p->n_rows; r++) {
            if (isinf(want.lse[r])) assert_true(isinf(got.lse[r]) && got.lse[r] < 0);
            else assert_true(fabs(got.lse[r] - want.lse[r]) < 1e-12);
        }
        attnOutFree(&got);
        attnOutFree(&want);
        problemFree(p);
    }
}

static void test_selected_attention_mask(void **state) {
    /* selected attention over a given selection, head by head, against the
     * brute-force mask built from the group's row: all heads of a group
     * share the group's blocks */
    for (size_t s = 0; s < N_SHAPES; s++) {
        Problem *p = problemCreate(&kShapes[s]);
        NsaAttnDims d = p->dims;
        AttnOut got = attnOutCreate(p), want = attnOutCreate(p);
        nsaCpuSelAttnForwardF64(got.o, got.lse, p->q, p->k_sel, p->v_sel, p->sel_fixed, &d);
        bruteAttention(want.o, want.lse, p->q, p->k_sel, p->v_sel, &d, maskSelected, p->sel_fixed);
        expectSameAttn(&got, &want, p);
        attnOutFree(&got);
        attnOutFree(&want);
        problemFree(p);
    }
}

/* ---- tests: selection --------------------------------------------------------- */

/* The selection is checked on every shape of kShapes and on these: d not
 * dividing l' and l > l' as well (the op itself takes any positive sizes,
 * and the overlap fractions are then not all 0 or 1). */
static const NsaAttnDims kSelectExtraShapes[] = {
    /* d does not divide l or l' */
    {.B = 1, .S = 29, .H = 2, .G = 1, .d_k = 4, .d_v = 4, .cmp_len = 5, .cmp_stride = 3,
     .sel_len = 4, .n_sel = 6, .window = 4},
    /* l > l': a block spans three */
    {.B = 2, .S = 30, .H = 6, .G = 3, .d_k = 3, .d_v = 4, .cmp_len = 8, .cmp_stride = 2,
     .sel_len = 3, .n_sel = 4, .window = 6},
};
#define N_SELECT_EXTRA (sizeof(kSelectExtraShapes) / sizeof(kSelectExtraShapes[0]))

/* The compressed forward and the block selection from its lse: o and lse,
 * the group block scores [B][S][G][Ns] and the selected blocks
 * [B][S][G][slots]. */
typedef struct Selected {
    AttnOut cmp;
    double *scores;
    size_t n_scores;
    int32_t *sel;
} Selected;

static Selected selectedCreate(const Problem *p) {
    Selected s = {.cmp = attnOutCreate(p),
                  .n_scores = (size_t)p->dims.B * p->dims.S * p->dims.G * p->Ns,
                  .sel = testAlloc(p->n_sel, sizeof(int32_t))};
    s.scores = testAlloc(s.n_scores, sizeof(double));
    return s;
}

static void selectedFree(Selected *s) {
    attnOutFree(&s->cmp);
    free(s->scores);
    free(s->sel);
}

/* Runs both over queries q of shape d and the problem's pooled blocks;
 * scores receives the block scores (NULL: the selection goes without). */
static void selectedRun(Selected *s, const Problem *p, const double *q, const NsaAttnDims *d,
                        double *scores) {
    nsaCpuCmpAttnForwardF64(s->cmp.o, s->cmp.lse, q, p->kc, p->vc, d);
    assert_int_equal(nsaCpuSelectBlocksF64(s->sel, scores, q, p->kc, s->cmp.lse, d), 0);
}

static void test_select_scores_bruteforce(void **state) {
    for (size_t s = 0; s < N_SHAPES + N_SELECT_EXTRA; s++) {
        Problem *p = problemCreate(s < N_SHAPES ? &kShapes[s] : &kSelectExtraShapes[s - N_SHAPES]);
        NsaAttnDims d = p->dims;
        Selected got = selectedCreate(p);
        double *want = testAlloc(got.n_scores, sizeof(double));
        int32_t *sel2 = testAlloc(p->n_sel, sizeof(int32_t));
        int32_t *want_sel = testAlloc(p->n_sel, sizeof(int32_t));
        selectedRun(&got, p, p->q, &d, got.scores);
        bruteScores(want, p->q, p->kc, &d);
        double err = testRelErrF64(got.scores, want, got.n_scores);
        printf("# selection scores vs brute force, %s: rel err %.2e\n", shapeName(&d), err);
        assert_true(err < 1e-12);
        /* the rule applied to the op's own scores: no rounding can flip a tie */
        bruteSelect(want_sel, got.scores, &d);
        assert_memory_equal(got.sel, want_sel, p->n_sel * sizeof(int32_t));
        /* scores are optional and do not change the choice */
        assert_int_equal(nsaCpuSelectBlocksF64(sel2, NULL, p->q, p->kc, got.cmp.lse, &d), 0);
        assert_memory_equal(got.sel, sel2, p->n_sel * sizeof(int32_t));
        selectedFree(&got);
        free(want);
        free(sel2);
        free(want_sel);
        problemFree(p);
    }
}

static void test_select_forced_blocks(void **state) {
    for (int n_sel = 1; n_sel <= 4; n_sel++) {
        NsaAttnDims d = {.B = 2, .S = 23, .H = 4, .G = 2, .d_k = 4, .d_v = 4, .cmp_len = 4,
                         .cmp_stride = 2, .sel_len = 4, .n_sel = n_sel, .window = 3};
        Problem *p = problemCreate(&d);
        Selected got = selectedCreate(p);
        selectedRun(&got, p, p->q, &d, NULL);
        for (size_t row = 0; row < p->n_sel / p->slots; row++) {
            int t = (int)((row / d.G) % d.S), cur = t / d.sel_len;
            const int32_t *r = got.sel + row * p->slots;
            int n_forced = cur == 0 ? 1 : cur == 1 ? 2 : 3;
            int n_candidates = 0;  /* complete blocks that are not forced */
            for (int j = 1; j < cur - 1; j++) n_candidates += (j + 1) * d.sel_len - 1 <= t;
            int extra = n_sel - n_forced < 0 ? 0 : n_sel - n_forced;
            int expect_count = n_forced + (extra < n_candidates ? extra : n_candidates);
            int count = 0, has0 = 0, has_cur = 0, has_prev = cur == 0;
            for (int n = 0; n < p->slots; n++) {
                if (r[n] < 0) {
                    for (int m = n; m < p->slots; m++) assert_int_equal(r[m], -1);
                    break;
                }
                if (n > 0) assert_true(r[n] > r[n - 1]);
                assert_true(r[n] <= cur);
                has0 |= r[n] == 0;
                has_cur |= r[n] == cur;
                has_prev |= r[n] == cur - 1;
                count++;
            }
            assert_true(has0 && has_cur && has_prev);
            assert_int_equal(count, expect_count);
        }
        selectedFree(&got);
        problemFree(p);
    }
}

/* Sets every row of q to zero: all compressed scores tie, so p is uniform. */
static void test_select_ties(void **state) {
    /* l = d = l': block j's score is (heads of the group) * p_j, the same
     * value for every visible block; and l > l' with nothing visible yet,
     * where every score is exactly 0. */
    const NsaAttnDims shapes[] = {
        {.B = 1, .S = 20, .H = 2, .G = 1, .d_k = 4, .d_v = 3, .cmp_len = 2, .cmp_stride = 2,
         .sel_len = 2, .n_sel = 5, .window = 4},
        {.B = 2, .S = 17, .H = 4, .G = 2, .d_k = 3, .d_v = 3, .cmp_len = 3, .cmp_stride = 3,
         .sel_len = 3, .n_sel = 4, .window = 2},
        {.B = 1, .S = 8, .H = 2, .G = 1, .d_k = 4, .d_v = 3, .cmp_len = 8, .cmp_stride = 1,
         .sel_len = 1, .n_sel = 5, .window = 4},
    };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        const NsaAttnDims *d = &shapes[s];
        Problem *p = problemCreate(d);
        memset(p->q, 0, p->n_q * sizeof(double));
        Selected got = selectedCreate(p);
        const double *scores = got.scores;
        selectedRun(&got, p, p->q, d, got.scores);
        int rows_with_ties = 0;
        for (size_t row = 0; row < p->n_sel / p->slots; row++) {
            int t = (int)((row / d->G) % d->S), cur = t / d->sel_len;
            /* expected: forced, then the lowest complete other blocks */
            int32_t want[16];
            int k = 0, first_candidate = -1;
            for (int j = 0; j < p->Ns; j++) {
                int forced = j == 0 || j == cur || j == cur - 1;
                if (forced) want[k++] = j;
                if (forced || (j + 1) * d->sel_len - 1 > t) continue;
                if (first_candidate < 0) first_candidate = j;
                /* an exact tie among all candidates */
                assert_true(scores[row * p->Ns + j] == scores[row * p->Ns + first_candidate]);
                rows_with_ties += j != first_candidate;
            }
            int n_extra = d->n_sel - k;
            for (int j = 1; j < p->Ns && n_extra > 0; j++) {
                int forced = j == cur || j == cur - 1;
                if (!forced && (j + 1) * d->sel_len - 1 <= t) {
                    want[k++] = j;
                    n_extra--;
                }
            }
            /* sort ascending (small k) */
            for (int a = 1; a < k; a++)
                for (int b = a; b > 0 && want[b] < want[b - 1]; b--) {
                    int32_t tmp = want[b];
                    want[b] = want[b - 1];
                    want[b - 1] = tmp;
                }
            while (k < p->slots) want[k++] = -1;
            assert_memory_equal(got.sel + row * p->slots, want, (size_t)p->slots * sizeof(int32_t));
        }
        assert_true(rows_with_ties > 0);
        selectedFree(&got);
        problemFree(p);
    }
}

/* A group's block scores are the sum of its heads' scores: each head run
 * alone (as a one-head group) scores its share, and the shares add up. */
static void test_select_group_sum(void **state) {
    const NsaAttnDims shapes[] = {
        {.B = 2, .S = 40, .H = 4, .G = 2, .d_k = 4, .d_v = 3, .cmp_len = 4, .cmp_stride = 4,
         .sel_len = 4, .n_sel = 4, .window = 4},
        {.B = 1, .S = 33, .H = 6, .G = 2, .d_k = 5, .d_v = 3, .cmp_len = 8, .cmp_stride = 4,
         .sel_len = 8, .n_sel = 5, .window = 4},
    };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        const NsaAttnDims *d = &shapes[s];
        Problem *p = problemCreate(d);
        int per_group = d->H / d->G;
        Selected got = selectedCreate(p);
        const size_t n_scores = got.n_scores;
        double *head_scores = testAlloc(n_scores, sizeof(double));
        double *sum = testAlloc(n_scores, sizeof(double));
        selectedRun(&got, p, p->q, d, got.scores);
        NsaAttnDims one = *d;
        one.H = d->G;  /* one head per group */
        size_t one_rows = (size_t)d->B * d->S * d->G;
        double *q1 = testAlloc(one_rows * d->d_k, sizeof(double));
        for (int m = 0; m < per_group; m++) {
            for (size_t r = 0; r < one_rows; r++) {  /* r = token * G + g */
                size_t src = (r / d->G) * d->H + (r % d->G) * per_group + m;
                memcpy(q1 + r * d->d_k, p->q + src * d->d_k, (size_t)d->d_k * sizeof(double));
            }
            selectedRun(&got, p, q1, &one, head_scores);
            for (size_t i = 0; i < n_scores; i++) sum[i] += head_scores[i];
        }
        double err = testRelErrF64(sum, got.scores, n_scores);
        printf("# group score = sum of its heads' scores, %s: rel err %.2e\n", shapeName(d), err);
        assert_true(err < 1e-12);
        selectedFree(&got);
        free(head_scores);
        free(sum);
        free(q1);
        problemFree(p);
    }
}

/* ---- the public fp32 op ------------------------------------------------------ */

/* fp32 copies of a problem's op inputs and room for everything the op returns. */
typedef struct PublicRun {
    float *in[8], *grad[8];
    size_t sizes[8];
    float *dout, *out, *lse;
    int32_t *sel;
} PublicRun;

static void publicRunInit(PublicRun *r, const Problem *p) {
    const double *src[8] = {p->q, p->k_cmp, p->v_cmp, p->k_sel, p->v_sel, p->k_win, p->v_win, p->gates};
    size_t sizes[8] = {p->n_q, p->n_k, p->n_v, p->n_k, p->n_v, p->n_k, p->n_v, p->n_rows * 3};
    size_t ov = p->n_rows * p->dims.d_v;
    for (int i = 0; i < 8; i++) {
        r->sizes[i] = sizes[i];
        r->in[i] = testAlloc(sizes[i], sizeof(float));
        r->grad[i] = testAlloc(sizes[i], sizeof(float));
        for (size_t e = 0; e < sizes[i]; e++) r->grad[i][e] = NAN;  /* the op must overwrite */
        for (size_t e = 0; e < sizes[i]; e++) r->in[i][e] = (float)src[i][e];
    }
    r->dout = testAlloc(ov, sizeof(float));
    for (size_t e = 0; e < ov; e++) r->dout[e] = (float)p->dout[e];
    r->out = testAlloc(ov, sizeof(float));
    r->lse = testAlloc(p->n_rows, sizeof(float));
    r->sel = testAlloc(p->n_sel, sizeof(int32_t));
}

static void publicRunFree(PublicRun *r) {
    for (int i = 0; i < 8; i++) {
        free(r->in[i]);
        free(r->grad[i]);
    }
    free(r->dout);
    free(r->out);
    free(r->lse);
    free(r->sel);
}

/* The op's arguments over the run's buffers. */
static NsaAttnInputs publicInputs(const PublicRun *r) {
    NsaAttnInputs in = {.q = r->in[0], .k_cmp = r->in[1], .v_cmp = r->in[2], .k_sel = r->in[3],
                        .v_sel = r->in[4], .k_win = r->in[5], .v_win = r->in[6], .gates = r->in[7]};
    return in;
}

static NsaAttnGrads publicGrads(const PublicRun *r) {
    NsaAttnGrads gr = {.dq = r->grad[0], .dk_cmp = r->grad[1], .dv_cmp = r->grad[2],
                       .dk_sel = r->grad[3], .dv_sel = r->grad[4], .dk_win = r->grad[5],
                       .dv_win = r->grad[6], .dgates = r->grad[7]};
    return gr;
}

static void publicRun(PublicRun *r, const NsaAttnDims *d) {
    NsaAttnInputs in = publicInputs(r);
    NsaAttnGrads gr = publicGrads(r);
    NsaError err = {{0}};
    if (nsaAttnForwardCpu(d, &in, r->out, r->sel, r->lse, &err) != 0) fail_msg("forward: %s", err.message);
    if (nsaAttnBackwardCpu(d, &in, r->dout, &gr, &err) != 0) fail_msg("backward: %s", err.message);
}

static const char *kInputNames[8] = {"q", "k_cmp", "v_cmp", "k_sel", "v_sel", "k_win", "v_win", "gates"};

/* ---- tests: gradients by finite differences (F64) ---------------------------- */

static double lossPoolAvg(void *ctx) {
    Problem *p = ctx;
    const NsaAttnDims *d = &p->dims;
    double *pooled = testAlloc(p->n_kc, sizeof(double));
    nsaCpuPoolAvgForwardF64(pooled, p->k_cmp, d->B, d->S, d->G, d->d_k, d->cmp_len, d->cmp_stride);
    double loss = dotF64(pooled, p->dpool, p->n_kc);
    free(pooled);
    return loss;
}

static void test_grad_pool_avg(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++) {
        Problem *p = problemCreate(&kShapes[s]);
        const NsaAttnDims *d = &p->dims;
        double *dx = testAlloc(p->n_k, sizeof(double));
        nsaCpuPoolAvgBackwardF64(dx, p->dpool, d->B, d->S, d->G, d->d_k, d->cmp_len, d->cmp_stride);
        checkGrad("pool_avg", "x", d, lossPoolAvg, p, p->k_cmp, p->n_k, dx);
        free(dx);
        problemFree(p);
    }
}

static double lossPoolMlp(void *ctx) {
    Problem *p = ctx;
    const NsaAttnDims *d = &p->dims;
    double *pooled = testAlloc(p->n_kc, sizeof(double)), *hidden = testAlloc(p->n_kc, sizeof(double));
    nsaCpuPoolMlpForwardF64(pooled, hidden, p->k_cmp, p->pos, p->w1, p->w2, d->B, d->S, d->G,
                            d->d_k, d->cmp_len, d->cmp_stride);
    double loss = dotF64(pooled, p->dpool, p->n_kc);
    free(pooled);
    free(hidden);
    return loss;
}

static void test_pool_mlp_forward(void **state) {
    /* against the formula written out, and W2 = 0 is phi = avg */
    for (size_t s = 0; s < N_SHAPES; s++) {
        Problem *p = problemCreate(&kShapes[s]);
        const NsaAttnDims *d = &p->dims;
        int dim = d->d_k, l = d->cmp_len;
        double *pooled = testAlloc(p->n_kc, sizeof(double)), *hidden = testAlloc(p->n_kc, sizeof(double));
        double *want = testAlloc(p->n_kc, sizeof(double));
        nsaCpuPoolMlpForwardF64(pooled, hidden, p->k_cmp, p->pos, p->w1, p->w2, d->B, d->S, d->G,
                                dim, l, d->cmp_stride);
        double hid[64];
        assert_true(dim <= 64);
        for (int b = 0; b < d->B; b++)
            for (int i = 0; i < p->Nc; i++)
                for (int g = 0; g < d->G; g++) {
                    size_t blk = ((size_t)b * p->Nc + i) * d->G + g;
                    for (int e = 0; e < dim; e++) {
                        hid[e] = 0;
                        for (int k = 0; k < l * dim; k++) {
                            int j = k / dim, c = k % dim;
                            double xv = p->k_cmp[(((size_t)b * d->S + i * d->cmp_stride + j) * d->G + g) * dim + c];
                            hid[e] += p->w1[(size_t)e * l * dim + k] * (xv + p->pos[k]);
                        }
                        assert_true(fabs(hidden[blk * dim + e] - hid[e]) < 1e-12);
                    }
                    for (int c = 0; c < dim; c++) {
                        double mean = 0, mlp = 0;
                        for (int j = 0; j < l; j++)
                            mean += p->k_cmp[(((size_t)b * d->S + i * d->cmp_stride + j) * d->G + g) * dim + c] / l;
                        for (int e = 0; e < dim; e++) mlp += p->w2[c * dim + e] * hid[e] / (1 + exp(-hid[e]));
                        want[blk * dim + c] = mean + mlp;
                    }
                }
        assert_true(testRelErrF64(pooled, want, p->n_kc) < 1e-12);
        memset(p->w2, 0, (size_t)dim * dim * sizeof(double));
        nsaCpuPoolMlpForwardF64(pooled, hidden, p->k_cmp, p->pos, p->w1, p->w2, d->B, d->S, d->G,
                                dim, l, d->cmp_stride);
        nsaCpuPoolAvgForwardF64(want, p->k_cmp, d->B, d->S, d->G, dim, l, d->cmp_stride);
        assert_true(testRelErrF64(pooled, want, p->n_kc) < 1e-14);
        free(pooled);
        free(hidden);
        free(want);
        problemFree(p);
    }
}

static void test_grad_pool_mlp(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++) {
        Problem *p = problemCreate(&kShapes[s]);
        const NsaAttnDims *d = &p->dims;
        int dim = d->d_k, l = d->cmp_len;
        size_t n_pos = (size_t)l * dim, n_w1 = (size_t)dim * l * dim, n_w2 = (size_t)dim * dim;
        double *pooled = testAlloc(p->n_kc, sizeof(double)), *hidden = testAlloc(p->n_kc, sizeof(double));
        double *dx = testAlloc(p->n_k, sizeof(double)), *dpos = testAlloc(n_pos, sizeof(double));
        double *dw1 = testAlloc(n_w1, sizeof(double)), *dw2 = testAlloc(n_w2, sizeof(double));
        nsaCpuPoolMlpForwardF64(pooled, hidden, p->k_cmp, p->pos, p->w1, p->w2, d->B, d->S, d->G,
                                dim, l, d->cmp_stride);
        nsaCpuPoolMlpBackwardF64(dx, dpos, dw1, dw2, p->dpool, hidden, p->k_cmp, p->pos, p->w1,
                                 p->w2, d->B, d->S, d->G, dim, l, d->cmp_stride);
        checkGrad("pool_mlp", "x", d, lossPoolMlp, p, p->k_cmp, p->n_k, dx);
        if (p->Nc > 0) {  /* with no block the parameters are unused */
            checkGrad("pool_mlp", "pos", d, lossPoolMlp, p, p->pos, n_pos, dpos);
            checkGrad("pool_mlp", "w1", d, lossPoolMlp, p, p->w1, n_w1, dw1);
            checkGrad("pool_mlp", "w2", d, lossPoolMlp, p, p->w2, n_w2, dw2);
        } else {
            for (size_t i = 0; i < n_pos; i++) assert_true(dpos[i] == 0.0);
            for (size_t i = 0; i < n_w1; i++) assert_true(dw1[i] == 0.0);
            for (size_t i = 0; i < n_w2; i++) assert_true(dw2[i] == 0.0);
        }
        free(pooled);
        free(hidden);
        free(dx);
        free(dpos);
        free(dw1);
        free(dw2);
        problemFree(p);
    }
}

/* One attention branch as its gradient check drives it: forward and
 * backward in double on the problem's own keys and values for it. */
typedef struct BranchOps {
    const char *name, *k_name, *v_name;
    void (*kv)(Problem *p, double **k, size_t *nk, double **v, size_t *nv);
    void (*forward)(Problem *p, double *o, double *lse);
    void (*backward)(Problem *p, double *dq, double *dk, double *dv, const double *o, const double *lse);
} BranchOps;

static void cmpKv(Problem *p, double **k, size_t *nk, double **v, size_t *nv) {
    *k = p->kc, *nk = p->n_kc, *v = p->vc, *nv = p->n_vc;
}
static void cmpForward(Problem *p, double *o, double *lse) {
    nsaCpuCmpAttnForwardF64(o, lse, p->q, p->kc, p->vc, &p->dims);
}
static void cmpBackward(Problem *p, double *dq, double *dk, double *dv, const double *o, const double *lse) {
    nsaCpuCmpAttnBackwardF64(dq, dk, dv, p->dout, p->q, p->kc, p->vc, o, lse, &p->dims);
}
static void selKv(Problem *p, double **k, size_t *nk, double **v, size_t *nv) {
    *k = p->k_sel, *nk = p->n_k, *v = p->v_sel, *nv = p->n_v;
}
static void selForward(Problem *p, double *o, double *lse) {
    nsaCpuSelAttnForwardF64(o, lse, p->q, p->k_sel, p->v_sel, p->sel_fixed, &p->dims);
}
static void selBackward(Problem *p, double *dq, double *dk, double *dv, const double *o, const double *lse) {
    nsaCpuSelAttnBackwardF64(dq, dk, dv, p->dout, p->q, p->k_sel, p->v_sel, p->sel_fixed, o, lse,
                             &p->dims);
}
static void winKv(Problem *p, double **k, size_t *nk, double **v, size_t *nv) {
    *k = p->k_win, *nk = p->n_k, *v = p->v_win, *nv = p->n_v;
}
static void winForward(Problem *p, double *o, double *lse) {
    nsaCpuWinAttnForwardF64(o, lse, p->q, p->k_win, p->v_win, &p->dims);
}
static void winBackward(Problem *p, double *dq, double *dk, double *dv, const double *o, const double *lse) {
    nsaCpuWinAttnBackwardF64(dq, dk, dv, p->dout, p->q, p->k_win, p->v_win, o, lse, &p->dims);
}

static const BranchOps kCmpOps = {.name = "cmp", .k_name = "kc", .v_name = "vc", .kv = cmpKv,
                                  .forward = cmpForward, .backward = cmpBackward};
static const BranchOps kSelOps = {.name = "sel", .k_name = "k", .v_name = "v", .kv = selKv,
                                  .forward = selForward, .backward = selBackward};
static const BranchOps kWinOps = {.name = "win", .k_name = "k", .v_name = "v", .kv = winKv,
                                  .forward = winForward, .backward = winBackward};

/* A branch's forward and backward on a problem: its output (which starts
 * as NaN: the forward must write every row) and the gradients of q and of
 * its keys k and values v. */
typedef struct BranchRun {
    AttnOut out;
    double *k, *v, *dq, *dk, *dv;
    size_t nk, nv;
} BranchRun;

static void branchRun(BranchRun *r, const BranchOps *ops, Problem *p) {
    ops->kv(p, &r->k, &r->nk, &r->v, &r->nv);
    r->out = attnOutCreate(p);
    for (size_t i = 0; i < p->n_rows * p->dims.d_v; i++) r->out.o[i] = NAN;
    r->dq = testAlloc(p->n_q, sizeof(double));
    r->dk = testAlloc(r->nk, sizeof(double));
    r->dv = testAlloc(r->nv, sizeof(double));
    ops->forward(p, r->out.o, r->out.lse);
    ops->backward(p, r->dq, r->dk, r->dv, r->out.o, r->out.lse);
}

static void branchRunFree(BranchRun *r) {
    attnOutFree(&r->out);
    free(r->dq);
    free(r->dk);
    free(r->dv);
}

typedef struct BranchCase {
    Problem *p;
    const BranchOps *ops;
} BranchCase;

/* The scalar loss sum(o * dout) of the branch's forward. */
static double lossBranch(void *ctx) {
    BranchCase *c = ctx;
    AttnOut out = attnOutCreate(c->p);
    c->ops->forward(c->p, out.o, out.lse);
    double loss = dotF64(out.o, c->p->dout, c->p->n_rows * c->p->dims.d_v);
    attnOutFree(&out);
    return loss;
}

/* Every input gradient of the branch against central differences, on every
 * shape. When no key is ever visible (no compressed block yet) the
 * gradient must be exactly zero instead. */
static void checkBranchGrads(const BranchOps *ops) {
    for (size_t s = 0; s < N_SHAPES; s++) {
        Problem *p = problemCreate(&kShapes[s]);
        const NsaAttnDims *d = &p->dims;
        BranchRun r;
        branchRun(&r, ops, p);
        BranchCase c = {.p = p, .ops = ops};
        if (r.nk > 0) {
            checkGrad(ops->name, "q", d, lossBranch, &c, p->q, p->n_q, r.dq);
            checkGrad(ops->name, ops->k_name, d, lossBranch, &c, r.k, r.nk, r.dk);
            checkGrad(ops->name, ops->v_name, d, lossBranch, &c, r.v, r.nv, r.dv);
        } else { /* nothing is ever visible: the gradient is exactly zero */
            for (size_t i = 0; i < p->n_q; i++) assert_true(r.dq[i] == 0.0);
        }
        branchRunFree(&r);
        problemFree(p);
    }
}

static void test_grad_cmp(void **state) { checkBranchGrads(&kCmpOps); }
static void test_grad_sel(void **state) { checkBranchGrads(&kSelOps); }
static void test_grad_win(void **state) { checkBranchGrads(&kWinOps); }

/* ---- tests: rows that see nothing ------------------------------------------- */

static void test_nothing_visible(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++) {
        Problem *p = problemCreate(&kShapes[s]);
        NsaAttnDims d = p->dims;
        size_t ov = p->n_rows * d.d_v;
        BranchRun cmp;
        branchRun(&cmp, &kCmpOps, p);
        int blind_rows = 0;
        for (size_t row = 0; row < p->n_rows; row++) {
            int t = (int)((row / d.H) % d.S);
            if (t >= d.cmp_len - 1) continue;
            blind_rows++;
            assert_true(isinf(cmp.out.lse[row]) && cmp.out.lse[row] < 0);
            for (int c = 0; c < d.d_v; c++) assert_true(cmp.out.o[row * d.d_v + c] == 0.0);
            for (int c = 0; c < d.d_k; c++) assert_true(cmp.dq[row * d.d_k + c] == 0.0);
        }
        assert_true(blind_rows > 0);
        assert_true(testAllFiniteF64(cmp.out.o, ov) && testAllFiniteF64(cmp.dq, p->n_q));
        assert_true(testAllFiniteF64(cmp.dk, p->n_kc) && testAllFiniteF64(cmp.dv, p->n_vc));

        /* the public op: no NaN anywhere, the cmp gate of blind rows gets 0 */
        PublicRun r;
        publicRunInit(&r, p);
        publicRun(&r, &d);
        assert_true(testAllFiniteF32(r.out, ov));
        for (int i = 0; i < 8; i++) assert_true(testAllFiniteF32(r.grad[i], r.sizes[i]));
        for (size_t row = 0; row < p->n_rows; row++)
            if ((int)((row / d.H) % d.S) < d.cmp_len - 1) {
                assert_true(isinf(r.lse[row]) && r.lse[row] < 0);
                assert_true(r.grad[7][row * 3 + 0] == 0.0f);
            }
        if (p->Nc == 0) {  /* S < l: no block, so no gradient reaches k_cmp or v_cmp */
            for (size_t e = 0; e < p->n_k; e++) assert_true(r.grad[1][e] == 0.0f);
            for (size_t e = 0; e < p->n_v; e++) assert_true(r.grad[2][e] == 0.0f);
        }
        publicRunFree(&r);
        branchRunFree(&cmp);
        problemFree(p);
    }
}

static double lossGate(void *ctx) {
    Problem *p = ctx;
    size_t ov = p->n_rows * p->dims.d_v;
    double *y = testAlloc(ov, sizeof(double));
    nsaCpuGateCombineForwardF64(y, p->gates, p->o_cmp_in, p->o_sel_in, p->o_win_in, &p->dims);
    double loss = dotF64(y, p->dout, ov);
    free(y);
    return loss;
}

static void test_grad_gate(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++) {
        Problem *p = problemCreate(&kShapes[s]);
        const NsaAttnDims *d = &p->dims;
        size_t ov = p->n_rows * d->d_v;
        double *dg = testAlloc(p->n_rows * 3, sizeof(double));
        double *dc = testAlloc(ov, sizeof(double)), *ds = testAlloc(ov, sizeof(double));
        double *dw = testAlloc(ov, sizeof(double));
        nsaCpuGateCombineBackwardF64(dg, dc, ds, dw, p->dout, p->gates, p->o_cmp_in, p->o_sel_in,
                                     p->o_win_in, d);
        checkGrad("gate", "gates", d, lossGate, p, p->gates, p->n_rows * 3, dg);
        checkGrad("gate", "o_cmp", d, lossGate, p, p->o_cmp_in, ov, dc);
        checkGrad("gate", "o_sel", d, lossGate, p, p->o_sel_in, ov, ds);
        checkGrad("gate", "o_win", d, lossGate, p, p->o_win_in, ov, dw);
        free(dg);
        free(dc);
        free(ds);
        free(dw);
        problemFree(p);
    }
}

/* The whole op in double; the selection must not move under the +-h
 * perturbations (it is piecewise constant), which the loss checks. */
typedef struct WholeCase {
    Problem *p;
    Chain *c;
    const int32_t *base_sel;
    int sel_moved;
} WholeCase;

static double lossWhole(void *ctx) {
    WholeCase *w = ctx;
    chainForward(w->p, w->c);
    if (memcmp(w->c->sel_idx, w->base_sel, w->p->n_sel * sizeof(int32_t)) != 0) w->sel_moved = 1;
    return dotF64(w->c->out, w->p->dout, w->p->n_rows * w->p->dims.d_v);
}

static void test_grad_whole_op(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++) {
        Problem *p = problemCreate(&kShapes[s]);
        const NsaAttnDims *d = &p->dims;
        Chain *c = chainCreate(p), *scratch = chainCreate(p);
        ChainGrads g = chainGradsCreate(p);
        chainForward(p, c);
        chainBackward(p, c, &g);
        WholeCase w = {.p = p, .c = scratch, .base_sel = c->sel_idx, .sel_moved = 0};
        checkGrad("whole_op", "q", d, lossWhole, &w, p->q, p->n_q, g.dq);
        checkGrad("whole_op", "k_cmp", d, lossWhole, &w, p->k_cmp, p->n_k, g.dk_cmp);
        checkGrad("whole_op", "v_cmp", d, lossWhole, &w, p->v_cmp, p->n_v, g.dv_cmp);
        checkGrad("whole_op", "k_sel", d, lossWhole, &w, p->k_sel, p->n_k, g.dk_sel);
        checkGrad("whole_op", "v_sel", d, lossWhole, &w, p->v_sel, p->n_v, g.dv_sel);
        checkGrad("whole_op", "k_win", d, lossWhole, &w, p->k_win, p->n_k, g.dk_win);
        checkGrad("whole_op", "v_win", d, lossWhole, &w, p->v_win, p->n_v, g.dv_win);
        checkGrad("whole_op", "gates", d, lossWhole, &w, p->gates, p->n_rows * 3, g.dgates);
        if (w.sel_moved) fail_msg("the selection moved under a 1e-6 perturbation on %s", shapeName(d));
        chainGradsFree(&g);
        chainFree(c);
        chainFree(scratch);
        problemFree(p);
    }
}

/* ---- tests: the public fp32 op ------------------------------------------------- */

static void test_public_vs_f64(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++) {
        Problem *p = problemCreate(&kShapes[s]);
        const NsaAttnDims *d = &p->dims;
        size_t ov = p->n_rows * d->d_v;
        Chain *c = chainCreate(p);
        ChainGrads g = chainGradsCreate(p);
        chainForward(p, c);
        chainBackward(p, c, &g);
        PublicRun r;
        publicRunInit(&r, p);
        publicRun(&r, d);
        assert_memory_equal(r.sel, c->sel_idx, p->n_sel * sizeof(int32_t));
        double err = testRelErrF32(r.out, c->out, ov);
        if (!(err < 1e-5)) fail_msg("out: fp32 vs F64 relative error %.3e on %s", err, shapeName(d));
        for (size_t row = 0; row < p->n_rows; row++) {
            if (isinf(c->lse_cmp[row])) assert_true(isinf(r.lse[row]) && r.lse[row] < 0);
            else assert_true(fabs(r.lse[row] - c->lse_cmp[row]) < 1e-5 * (1 + fabs(c->lse_cmp[row])));
        }
        const double *want[8] = {g.dq, g.dk_cmp, g.dv_cmp, g.dk_sel, g.dv_sel, g.dk_win, g.dv_win, g.dgates};
        double worst = 0;
        for (int i = 0; i < 8; i++) {
            double e = testRelErrF32(r.grad[i], want[i], r.sizes[i]);
            if (e > worst || isnan(e)) worst = e;
            if (!(e < 1e-5) && !(p->Nc == 0 && (i == 1 || i == 2) && e == 0))
                fail_msg("d%s: fp32 vs F64 relative error %.3e on %s", kInputNames[i], e, shapeName(d));
        }
        printf("# public fp32 vs F64, %s: out %.2e, worst gradient %.2e\n", shapeName(d), err, worst);
        publicRunFree(&r);
        chainGradsFree(&g);
        chainFree(c);
        problemFree(p);
    }
}

/* One-hot gates through the public op reduce it to one branch; with the
 * branch's identity sizes that is full causal attention. */
static void test_public_identities(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++) {
        for (int branch = 0; branch < 3; branch++) {
            NsaAttnDims d = kShapes[s];
            if (branch == 0) d.cmp_len = d.cmp_stride = 1;
            if (branch == 1) {
                d.sel_len = d.cmp_stride = 1;
                d.n_sel = d.S;
            }
            if (branch == 2) d.window = d.S;
            Problem *p = problemCreate(&d);
            for (size_t row = 0; row < p->n_rows; row++)
                for (int c = 0; c < 3; c++) p->gates[row * 3 + c] = c == branch;
            const double *k = branch == 0 ? p->k_cmp : branch == 1 ? p->k_sel : p->k_win;
            const double *v = branch == 0 ? p->v_cmp : branch == 1 ? p->v_sel : p->v_win;
            size_t ov = p->n_rows * d.d_v;
            double *want = testAlloc(ov, sizeof(double));
            bruteAttention(want, NULL, p->q, k, v, &d, maskCausal, NULL);
            PublicRun r;
            publicRunInit(&r, p);
            publicRun(&r, &d);
            double err = testRelErrF32(r.out, want, ov);
            if (!(err < 1e-5))
                fail_msg("branch %d alone vs full causal: %.3e on %s", branch, err, shapeName(&d));
            publicRunFree(&r);
            free(want);
            problemFree(p);
        }
    }
}

static void test_public_rejects_bad_input(void **state) {
    Problem *p = problemCreate(&kShapes[0]);
    PublicRun r;
    publicRunInit(&r, p);
    NsaAttnDims d = p->dims;
    NsaAttnInputs in = publicInputs(&r);
    NsaAttnGrads gr = publicGrads(&r);
    NsaError err = {{0}};
    in.v_sel = NULL;
    assert_int_equal(nsaAttnForwardCpu(&d, &in, r.out, NULL, NULL, &err), -1);
    assert_non_null(strstr(err.message, "v_sel"));
    in.v_sel = r.in[4];
    assert_int_equal(nsaAttnForwardCpu(&d, &in, NULL, NULL, NULL, &err), -1);
    assert_non_null(strstr(err.message, "out"));
    gr.dgates = NULL;
    assert_int_equal(nsaAttnBackwardCpu(&d, &in, r.dout, &gr, &err), -1);
    assert_non_null(strstr(err.message, "dgates"));
    gr.dgates = r.grad[7];
    d.H = 5;
    assert_int_equal(nsaAttnBackwardCpu(&d, &in, r.dout, &gr, &err), -1);
    assert_non_null(strstr(err.message, "H (5)"));
    d = p->dims;
    assert_int_equal(nsaAttnForwardCpu(&d, &in, r.out, NULL, NULL, NULL), 0);  /* err is optional */
    publicRunFree(&r);
    problemFree(p);
}

/* ---- tests: causality ----------------------------------------------------------- */

/* Changing every input at positions > cut leaves the forward outputs at
 * <= cut and, for a loss that reads only outputs <= cut, the gradients of
 * the inputs at <= cut bit-identical. */
static void test_causality(void **state) {
    NsaRng rng;
    nsaRngSeed(&rng, 77, 0);
    for (size_t s = 0; s < N_SHAPES; s++) {
        const NsaAttnDims *d = &kShapes[s];
        int cuts[3] = {0, d->S / 2, d->S - 2};
        for (int ci = 0; ci < 3; ci++) {
            int cut = cuts[ci];
            if (cut < 0) continue;
            Problem *p = problemCreate(d);
            PublicRun a, b;
            publicRunInit(&a, p);
            /* the loss reads outputs <= cut only */
            for (size_t e = 0; e < p->n_rows * d->d_v; e++)
                if ((int)((e / ((size_t)d->H * d->d_v)) % d->S) > cut) a.dout[e] = 0;
            publicRunInit(&b, p);
            memcpy(b.dout, a.dout, p->n_rows * d->d_v * sizeof(float));
            for (int i = 0; i < 8; i++) {
                size_t per_token = a.sizes[i] / ((size_t)d->B * d->S);
                for (size_t e = 0; e < a.sizes[i]; e++)
                    if ((int)((e / per_token) % d->S) > cut)
                        b.in[i][e] = (float)(i == 7 ? nsaRngUniform(&rng) : 4 * nsaRngUniform(&rng) - 2);
            }
            publicRun(&a, d);
            publicRun(&b, d);
            int changed_after = 0;
            for (int bi = 0; bi < d->B; bi++) {
                size_t t0 = (size_t)bi * d->S, n_keep = (size_t)cut + 1;
                size_t hv = (size_t)d->H * d->d_v, gs = (size_t)d->G * p->slots;
                assert_memory_equal(a.out + t0 * hv, b.out + t0 * hv, n_keep * hv * sizeof(float));
                assert_memory_equal(a.lse + t0 * d->H, b.lse + t0 * d->H, n_keep * d->H * sizeof(float));
                assert_memory_equal(a.sel + t0 * gs, b.sel + t0 * gs, n_keep * gs * sizeof(int32_t));
                for (int i = 0; i < 8; i++) {
                    size_t per_token = a.sizes[i] / ((size_t)d->B * d->S);
                    if (memcmp(a.grad[i] + t0 * per_token, b.grad[i] + t0 * per_token,
                               n_keep * per_token * sizeof(float)) != 0)
                        fail_msg("d%s at positions <= %d changed with inputs after it on %s",
                                 kInputNames[i], cut, shapeName(d));
                }
                if (cut + 1 < d->S &&
                    memcmp(a.out + (t0 + n_keep) * hv, b.out + (t0 + n_keep) * hv,
                           (size_t)(d->S - cut - 1) * hv * sizeof(float)) != 0)
                    changed_after = 1;
            }
            /* the perturbation did reach the positions after the cut */
            if (cut + 1 < d->S) assert_true(changed_after);
            publicRunFree(&a);
            publicRunFree(&b);
            problemFree(p);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_counts),
        cmocka_unit_test(test_dims_validation),
        cmocka_unit_test(test_window_identity),
        cmocka_unit_test(test_selection_identity),
        cmocka_unit_test(test_compressed_identity),
        cmocka_unit_test(test_compressed_bruteforce),
        cmocka_unit_test(test_selected_attention_mask),
        cmocka_unit_test(test_select_scores_bruteforce),
        cmocka_unit_test(test_select_forced_blocks),
        cmocka_unit_test(test_select_ties),
        cmocka_unit_test(test_select_group_sum),
        cmocka_unit_test(test_nothing_visible),
        cmocka_unit_test(test_pool_mlp_forward),
        cmocka_unit_test(test_grad_pool_avg),
        cmocka_unit_test(test_grad_pool_mlp),
        cmocka_unit_test(test_grad_cmp),
        cmocka_unit_test(test_grad_sel),
        cmocka_unit_test(test_grad_win),
        cmocka_unit_test(test_grad_gate),
        cmocka_unit_test(test_grad_whole_op),
        cmocka_unit_test(test_public_vs_f64),
        cmocka_unit_test(test_public_identities),
        cmocka_unit_test(test_public_rejects_bad_input),
        cmocka_unit_test(test_causality),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
