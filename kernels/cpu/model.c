/* model.c - the whole NSA transformer, forward and backward, on the CPU.
 *
 * Pre-norm blocks over a residual stream x [N = B*S][C]:
 *   xn = RMSNorm(x);  q = RoPE(xn Wq^T);  k^c = RoPE(xn Wk_c^T);  v^c = xn Wv_c^T
 *   kc, vc = phi(k^cmp), phi(v^cmp)  (keys rotated before pooling)
 *   g = sigmoid(xn Wgate^T)  [N][H][3];  o_c = the three attention branches
 *   x += Wo (sum_c g_c o_c)
 *   x += Wproj act(RMSNorm(x) Wfc^T)   (act = SiLU, or SwiGLU with Wup)
 * logits = RMSNorm(x) lm_head^T; per-token cross-entropy in double.
 * All buffers were planned by nsaCpuModelAlloc (nsa_cpu_plan.c); nothing here
 * allocates (nsaCpuSelectBlocks keeps its O(l'-blocks) row scratch on the
 * stack and fails only past 65536 selection blocks: the forward's one error).
 * The attention ops are kernels/cpu/attn_*.c.
 *
 * Parallel regions (cm->pool): linear layers split rows (and, for dW,
 * output rows); the attention branches split sequences, calling each op with
 * B = 1 on that sequence's slice (every layout is batch-major). Each output
 * element is computed by one part in a fixed order, so the results are
 * bit-identical for any thread count. */
#include "real.h"
#include "cpu_ops.h"
#include "cpu_model.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static inline void zeroReal(real *p, size_t n) { memset(p, 0, n * sizeof(real)); }

static NsaAttnDims attnDims(const NsaCpuModel *cm, int B, int S) {
    const NsaModelConfig *c = &cm->cfg;
    NsaAttnDims d = {B, S, c->n_heads, c->n_kv_groups, c->d_k, c->d_v,
                     c->cmp_len, c->cmp_stride, c->sel_len, c->n_sel, c->window};
    return d;
}

/* ---- linear layers over the pool ------------------------------------------ */

/* One product y (+)= a b split by rows of y over the parts. */
typedef struct MatmulJob {
    real *y;
    const real *a, *b;
    size_t rows;
    int K, M, accumulate;
} MatmulJob;

static void matmulPart(const MatmulJob *j, int part, int parts) {
    const size_t lo = j->rows * part / parts, hi = j->rows * (part + 1) / parts;
    FN(nsaCpuMatmul)(j->y + lo * j->M, j->a + lo * j->K, j->b, hi - lo, j->K, j->M, j->accumulate);
}

static void matmulTask(void *ctx, int part, int parts) { matmulPart(ctx, part, parts); }

/* The two products of a linear backward in one region. */
typedef struct BackwardJob {
    MatmulJob dx, dw;
} BackwardJob;

static void backwardTask(void *ctx, int part, int parts) {
    const BackwardJob *j = ctx;
    if (j->dx.y) matmulPart(&j->dx, part, parts);
    matmulPart(&j->dw, part, parts);
}

/* y = x W^T = x (W^T): W [out][in] is transposed into the workspace first. */
static void linearForward(NsaCpuModel *cm, real *y, const real *x, const real *w, size_t N, int in,
                          int out) {
    real *wt = (real *)cm->scratch + cm->sc.wt;
    FN(nsaCpuTranspose)(wt, w, out, in);
    MatmulJob j = {.y = y, .a = x, .b = wt, .rows = N, .K = in, .M = out, .accumulate = 0};
    nsaCpuPoolRun(cm->pool, matmulTask, &j);
}

/* dx += dy W (dx NULL: skipped);  dW += (dy^T) x with dy transposed into the
 * workspace. */
static void linearBackward(NsaCpuModel *cm, real *dx, real *dw, const real *dy, const real *x,
                           const real *w, size_t N, int in, int out) {
    real *dyt = (real *)cm->scratch + cm->sc.dyt;
    FN(nsaCpuTranspose)(dyt, dy, N, out);
    BackwardJob j = {
        .dx = {.y = dx, .a = dy, .b = w, .rows = N, .K = out, .M = in, .accumulate = 1},
        .dw = {.y = dw, .a = dyt, .b = x, .rows = (size_t)out, .K = (int)N, .M = in,
               .accumulate = 1},
    };
    nsaCpuPoolRun(cm->pool, backwardTask, &j);
}

/* ---- the attention branches, one sequence slice per part ----------------- */

typedef struct AttnJob {
    NsaCpuModel *cm;
    const NsaCpuLayerActs *la;
    int32_t *sel_idx;
    int B, S, Nc;
    atomic_int failed;   /* a part whose selection could not get its scratch */
} AttnJob;

/* Element offsets of sequence b inside the batch-major buffers. */
typedef struct SeqOffsets {
    size_t q, k, v, kc, vc, o, lse, gates, sel;
} SeqOffsets;

static SeqOffsets seqOffsets(const NsaCpuModel *cm, int b, int S, int Nc) {
    const NsaModelConfig *c = &cm->cfg;
    const size_t H = c->n_heads, G = c->n_kv_groups, dk = c->d_k, dv = c->d_v;
    const size_t t0 = (size_t)b * S, blk0 = (size_t)b * Nc;
    SeqOffsets s = {t0 * H * dk, t0 * G * dk, t0 * G * dv, blk0 * G * dk, blk0 * G * dv,
                    t0 * H * dv, t0 * H,      t0 * H * 3,  t0 * G * nsaNumSelSlots(c->n_sel)};
    return s;
}

static void attnForwardTask(void *ctx, int part, int parts) {
    AttnJob *j = ctx;
    NsaCpuModel *cm = j->cm;
    const NsaCpuLayerActs *la = j->la;
    real *a = (real *)cm->acts;
    const NsaAttnDims dims = attnDims(cm, 1, j->S);
    for (int b = j->B * part / parts; b < j->B * (part + 1) / parts; b++) {
        const SeqOffsets s = seqOffsets(cm, b, j->S, j->Nc);
        const real *q = a + la->q + s.q, *kc = a + la->kc + s.kc, *vc = a + la->vc + s.vc;
        int32_t *sel_idx = j->sel_idx + s.sel;
        FN(nsaCpuCmpAttnForward)(a + la->o[0] + s.o, a + la->lse[0] + s.lse, q, kc, vc, &dims);
        if (FN(nsaCpuSelectBlocks)(sel_idx, NULL, q, kc, a + la->lse[0] + s.lse, &dims)) {
            atomic_store(&j->failed, 1);
            return;
        }
        FN(nsaCpuSelAttnForward)(a + la->o[1] + s.o, a + la->lse[1] + s.lse, q,
                                 a + la->k[1] + s.k, a + la->v[1] + s.v, sel_idx, &dims);
        FN(nsaCpuWinAttnForward)(a + la->o[2] + s.o, a + la->lse[2] + s.lse, q,
                                 a + la->k[2] + s.k, a + la->v[2] + s.v, &dims);
        FN(nsaCpuGateCombineForward)(a + la->y_attn + s.o, a + la->gates + s.gates,
                                     a + la->o[0] + s.o, a + la->o[1] + s.o, a + la->o[2] + s.o,
                                     &dims);
    }
}

/* From dy_attn: the gradients of the gates, q, the raw sel/win keys and
 * values, and the pooled compressed keys and values (all zeroed by the
 * caller; the ops add). */
static void attnBackwardTask(void *ctx, int part, int parts) {
    AttnJob *j = ctx;
    NsaCpuModel *cm = j->cm;
    const NsaCpuLayerActs *la = j->la;
    const NsaCpuScratch *sc = &cm->sc;
    const real *a = (const real *)cm->acts;
    real *w = (real *)cm->scratch;
    const NsaAttnDims dims = attnDims(cm, 1, j->S);
    for (int b = j->B * part / parts; b < j->B * (part + 1) / parts; b++) {
        const SeqOffsets s = seqOffsets(cm, b, j->S, j->Nc);
        const real *q = a + la->q + s.q;
        real *dq = w + sc->dq + s.q;
        FN(nsaCpuGateCombineBackward)(w + sc->dgates + s.gates, w + sc->d_o[0] + s.o,
                                      w + sc->d_o[1] + s.o, w + sc->d_o[2] + s.o,
                                      w + sc->dy_attn + s.o, a + la->gates + s.gates,
                                      a + la->o[0] + s.o, a + la->o[1] + s.o, a + la->o[2] + s.o,
                                      &dims);
        FN(nsaCpuWinAttnBackward)(dq, w + sc->dk[2] + s.k, w + sc->dv[2] + s.v,
                                  w + sc->d_o[2] + s.o, q, a + la->k[2] + s.k, a + la->v[2] + s.v,
                                  a + la->o[2] + s.o, a + la->lse[2] + s.lse, &dims);
        FN(nsaCpuSelAttnBackward)(dq, w + sc->dk[1] + s.k, w + sc->dv[1] + s.v,
                                  w + sc->d_o[1] + s.o, q, a + la->k[1] + s.k, a + la->v[1] + s.v,
                                  j->sel_idx + s.sel, a + la->o[1] + s.o, a + la->lse[1] + s.lse,
                                  &dims);
        FN(nsaCpuCmpAttnBackward)(dq, w + sc->dkc + s.kc, w + sc->dvc + s.vc, w + sc->d_o[0] + s.o,
                                  q, a + la->kc + s.kc, a + la->vc + s.vc, a + la->o[0] + s.o,
                                  a + la->lse[0] + s.lse, &dims);
    }
}

/* ---- forward ---------------------------------------------------------------- */

int FN(nsaCpuModelForward)(NsaCpuModel *cm, const int32_t *tokens, const int32_t *targets, int B,
                           int S, double *loss_sum, size_t *count, NsaError *err) {
    const NsaModelConfig *cfg = &cm->cfg;
    const NsaLayout *lay = cm->layout;
    real *params = (real *)cm->params, *acts = (real *)cm->acts, *scr = (real *)cm->scratch;
    const size_t N = (size_t)B * S;
    const int C = cfg->dim, V = cfg->vocab_size, H = cfg->n_heads, G = cfg->n_kv_groups;
    const int dk = cfg->d_k, dv = cfg->d_v, F = nsaLayoutMlpHidden(cfg), L = cfg->n_layers;
    const int l = cfg->cmp_len, d = cfg->cmp_stride;
#define PARAM(idx) (params + lay->entries[(idx)].info.offset)
#define ACT(off) (acts + (off))

    if (!cm->rope_ready) {
        FN(nsaCpuRopeTable)(scr + cm->rope, cm->max_seq, dk, cfg->rope_base);
        cm->rope_ready = 1;
    }
    const real *rope = scr + cm->rope;
    real *proj = scr + cm->sc.proj;
    memcpy(cm->tokens, tokens, N * sizeof(int32_t));
    memcpy(cm->targets, targets, N * sizeof(int32_t));
    cm->B = B;
    cm->S = S;

    FN(nsaCpuEmbedForward)(ACT(cm->layer_acts[0].res), PARAM(lay->tok_emb), tokens, N, C);
    for (int i = 0; i < L; i++) {
        const NsaCpuLayerActs *la = &cm->layer_acts[i];
        const NsaLayerIndex *li = &lay->layers[i];
        const real *x = ACT(la->res);
        real *out = ACT(i + 1 < L ? cm->layer_acts[i + 1].res : cm->final_res);
        real *xn = ACT(la->attn_xn), *q = ACT(la->q);
        const int wk[3] = {li->wk_cmp, li->wk_sel, li->wk_win};
        const int wv[3] = {li->wv_cmp, li->wv_sel, li->wv_win};

        /* attention: projections, RoPE, pooling, gates */
        FN(nsaCpuRmsNormForward)(xn, ACT(la->attn_rstd), x, PARAM(li->attn_norm), N, C,
                                 cfg->norm_eps);
        linearForward(cm, q, xn, PARAM(li->wq), N, C, H * dk);
        FN(nsaCpuRopeForward)(q, rope, B, S, H, dk);
        for (int c = 0; c < 3; c++) {
            linearForward(cm, ACT(la->k[c]), xn, PARAM(wk[c]), N, C, G * dk);
            FN(nsaCpuRopeForward)(ACT(la->k[c]), rope, B, S, G, dk);
            linearForward(cm, ACT(la->v[c]), xn, PARAM(wv[c]), N, C, G * dv);
        }
        if (cfg->phi == NSA_PHI_MLP) {
            FN(nsaCpuPoolMlpForward)(ACT(la->kc), ACT(la->hk), ACT(la->k[0]), PARAM(li->phi_k_pos),
                                     PARAM(li->phi_k_w1), PARAM(li->phi_k_w2), B, S, G, dk, l, d);
            FN(nsaCpuPoolMlpForward)(ACT(la->vc), ACT(la->hv), ACT(la->v[0]), PARAM(li->phi_v_pos),
                                     PARAM(li->phi_v_w1), PARAM(li->phi_v_w2), B, S, G, dv, l, d);
        } else {
            FN(nsaCpuPoolAvgForward)(ACT(la->kc), ACT(la->k[0]), B, S, G, dk, l, d);
            FN(nsaCpuPoolAvgForward)(ACT(la->vc), ACT(la->v[0]), B, S, G, dv, l, d);
        }
        real *gates = ACT(la->gates);
        linearForward(cm, gates, xn, PARAM(li->w_gate), N, C, 3 * H);
        FN(nsaCpuSigmoidForward)(gates, gates, N * 3 * H);

        /* the three branches and their gated sum */
        AttnJob job = {.cm = cm, .la = la, .B = B, .S = S, .Nc = nsaNumCmpBlocks(S, l, d),
                       .sel_idx = cm->sel_idx + (size_t)i * N * G * nsaNumSelSlots(cfg->n_sel)};
        atomic_init(&job.failed, 0);
        nsaCpuPoolRun(cm->pool, attnForwardTask, &job);
        if (atomic_load(&job.failed)) {
            nsaErrorf(err, "nsa: layer %d: block selection ran out of memory for its scratch", i);
            return -1;
        }
        linearForward(cm, proj, ACT(la->y_attn), PARAM(li->wo), N, H * dv, C);
        real *mid = ACT(la->res_mid);
        for (size_t j = 0; j < N * C; j++) mid[j] = x[j] + proj[j];

        /* MLP */
        real *mxn = ACT(la->mlp_xn), *fc = ACT(la->fc), *act = ACT(la->act);
        FN(nsaCpuRmsNormForward)(mxn, ACT(la->mlp_rstd), mid, PARAM(li->mlp_norm), N, C,
                                 cfg->norm_eps);
        linearForward(cm, fc, mxn, PARAM(li->w_fc), N, C, F);
        if (cfg->mlp == NSA_MLP_SWIGLU) {
            linearForward(cm, ACT(la->up), mxn, PARAM(li->w_up), N, C, F);
            FN(nsaCpuSwigluForward)(act, fc, ACT(la->up), N * F);
        } else {
            FN(nsaCpuSiluForward)(act, fc, N * F);
        }
        linearForward(cm, proj, act, PARAM(li->w_proj), N, F, C);
        for (size_t j = 0; j < N * C; j++) out[j] = mid[j] + proj[j];
    }
    FN(nsaCpuRmsNormForward)(ACT(cm->final_xn), ACT(cm->final_rstd), ACT(cm->final_res),
                             PARAM(lay->final_norm), N, C, cfg->norm_eps);
    linearForward(cm, ACT(cm->logits), ACT(cm->final_xn), PARAM(lay->lm_head), N, C, V);
    *loss_sum = FN(nsaCpuCrossEntropyForward)(ACT(cm->ce_lse), ACT(cm->logits), targets, N, V,
                                              count);
    cm->n_counted = *count;
    return 0;
}

/* ---- backward --------------------------------------------------------------- */

void FN(nsaCpuModelBackward)(NsaCpuModel *cm, double scale, NsaCpuBucketHook hook, void *ctx) {
    const NsaModelConfig *cfg = &cm->cfg;
    const NsaLayout *lay = cm->layout;
    real *params = (real *)cm->params, *grads = (real *)cm->grads;
    real *acts = (real *)cm->acts, *scr = (real *)cm->scratch;
    const int B = cm->B, S = cm->S;
    const size_t N = (size_t)B * S;
    const int C = cfg->dim, V = cfg->vocab_size, H = cfg->n_heads, G = cfg->n_kv_groups;
    const int dk = cfg->d_k, dv = cfg->d_v, F = nsaLayoutMlpHidden(cfg), L = cfg->n_layers;
    const int l = cfg->cmp_len, d = cfg->cmp_stride, Nc = nsaNumCmpBlocks(S, l, d);
    const NsaCpuScratch *sc = &cm->sc;
    const real *rope = scr + cm->rope;
#define GRAD(idx) (grads + lay->entries[(idx)].info.offset)
#define SCR(off) (scr + (off))
    real *dres = SCR(sc->dres), *dxn = SCR(sc->dxn), *dlogits = SCR(sc->dlogits);

    /* head and final norm */
    FN(nsaCpuCrossEntropyBackward)(dlogits, ACT(cm->logits), ACT(cm->ce_lse), cm->targets, N, V,
                                   scale);
    zeroReal(dxn, N * C);
    linearBackward(cm, dxn, GRAD(lay->lm_head), dlogits, ACT(cm->final_xn), PARAM(lay->lm_head), N,
                   C, V);
    zeroReal(dres, N * C);
    FN(nsaCpuRmsNormBackward)(dres, GRAD(lay->final_norm), dxn, ACT(cm->final_res),
                              PARAM(lay->final_norm), ACT(cm->final_rstd), N, C);
    if (hook) hook(ctx, NSA_BUCKET_HEAD(L));

    for (int i = L - 1; i >= 0; i--) {
        const NsaCpuLayerActs *la = &cm->layer_acts[i];
        const NsaLayerIndex *li = &lay->layers[i];
        const int wk[3] = {li->wk_cmp, li->wk_sel, li->wk_win};
        const int wv[3] = {li->wv_cmp, li->wv_sel, li->wv_win};

        /* MLP: dres holds d loss / d(layer output) */
        real *dact = SCR(sc->dact), *dfc = SCR(sc->dfc);
        zeroReal(dact, N * F);
        linearBackward(cm, dact, GRAD(li->w_proj), dres, ACT(la->act), PARAM(li->w_proj), N, F, C);
        zeroReal(dfc, N * F);
        zeroReal(dxn, N * C);
        if (cfg->mlp == NSA_MLP_SWIGLU) {
            real *dup = SCR(sc->dup);
            zeroReal(dup, N * F);
            FN(nsaCpuSwigluBackward)(dfc, dup, dact, ACT(la->fc), ACT(la->up), N * F);
            linearBackward(cm, dxn, GRAD(li->w_up), dup, ACT(la->mlp_xn), PARAM(li->w_up), N, C,
                           F);
        } else {
            FN(nsaCpuSiluBackward)(dfc, dact, ACT(la->fc), N * F);
        }
        linearBackward(cm, dxn, GRAD(li->w_fc), dfc, ACT(la->mlp_xn), PARAM(li->w_fc), N, C, F);
        /* residual: dres passes through and gains the norm's share */
        FN(nsaCpuRmsNormBackward)(dres, GRAD(li->mlp_norm), dxn, ACT(la->res_mid),
                                  PARAM(li->mlp_norm), ACT(la->mlp_rstd), N, C);

        /* attention: dres now holds d loss / d(res_mid) */
        real *dq = SCR(sc->dq), *dkc = SCR(sc->dkc), *dvc = SCR(sc->dvc);
        real *dk_c[3], *dv_c[3];
        zeroReal(SCR(sc->dy_attn), N * H * dv);
        linearBackward(cm, SCR(sc->dy_attn), GRAD(li->wo), dres, ACT(la->y_attn), PARAM(li->wo), N,
                       H * dv, C);
        zeroReal(SCR(sc->dgates), N * H * 3);
        zeroReal(dq, N * H * dk);
        zeroReal(dkc, (size_t)B * Nc * G * dk);
        zeroReal(dvc, (size_t)B * Nc * G * dv);
        for (int c = 0; c < 3; c++) {
            dk_c[c] = SCR(sc->dk[c]);
            dv_c[c] = SCR(sc->dv[c]);
            zeroReal(SCR(sc->d_o[c]), N * H * dv);
            zeroReal(dk_c[c], N * G * dk);
            zeroReal(dv_c[c], N * G * dv);
        }
        AttnJob job = {.cm = cm, .la = la, .B = B, .S = S, .Nc = Nc,
                       .sel_idx = cm->sel_idx + (size_t)i * N * G * nsaNumSelSlots(cfg->n_sel)};
        atomic_init(&job.failed, 0);
        nsaCpuPoolRun(cm->pool, attnBackwardTask, &job);

        /* phi's parameters are shared by every block: pooled serially */
        if (cfg->phi == NSA_PHI_MLP) {
            FN(nsaCpuPoolMlpBackward)(dk_c[0], GRAD(li->phi_k_pos), GRAD(li->phi_k_w1),
                                      GRAD(li->phi_k_w2), dkc, ACT(la->hk), ACT(la->k[0]),
                                      PARAM(li->phi_k_pos), PARAM(li->phi_k_w1),
                                      PARAM(li->phi_k_w2), B, S, G, dk, l, d);
            FN(nsaCpuPoolMlpBackward)(dv_c[0], GRAD(li->phi_v_pos), GRAD(li->phi_v_w1),
                                      GRAD(li->phi_v_w2), dvc, ACT(la->hv), ACT(la->v[0]),
                                      PARAM(li->phi_v_pos), PARAM(li->phi_v_w1),
                                      PARAM(li->phi_v_w2), B, S, G, dv, l, d);
        } else {
            FN(nsaCpuPoolAvgBackward)(dk_c[0], dkc, B, S, G, dk, l, d);
            FN(nsaCpuPoolAvgBackward)(dv_c[0], dvc, B, S, G, dv, l, d);
        }
        FN(nsaCpuRopeBackward)(dq, rope, B, S, H, dk);
        real *dgl = SCR(sc->dgate_logits);
        zeroReal(dgl, N * H * 3);
        FN(nsaCpuSigmoidBackward)(dgl, SCR(sc->dgates), ACT(la->gates), N * H * 3);

        const real *xn = ACT(la->attn_xn);
        zeroReal(dxn, N * C);
        linearBackward(cm, dxn, GRAD(li->wq), dq, xn, PARAM(li->wq), N, C, H * dk);
        for (int c = 0; c < 3; c++) {
            FN(nsaCpuRopeBackward)(dk_c[c], rope, B, S, G, dk);
            linearBackward(cm, dxn, GRAD(wk[c]), dk_c[c], xn, PARAM(wk[c]), N, C, G * dk);
            linearBackward(cm, dxn, GRAD(wv[c]), dv_c[c], xn, PARAM(wv[c]), N, C, G * dv);
        }
        linearBackward(cm, dxn, GRAD(li->w_gate), dgl, xn, PARAM(li->w_gate), N, C, 3 * H);
        FN(nsaCpuRmsNormBackward)(dres, GRAD(li->attn_norm), dxn, ACT(la->res),
                                  PARAM(li->attn_norm), ACT(la->attn_rstd), N, C);
        if (hook) hook(ctx, NSA_BUCKET_LAYER(i));
    }
    FN(nsaCpuEmbedBackward)(GRAD(lay->tok_emb), dres, cm->tokens, N, C);
    if (hook) hook(ctx, NSA_BUCKET_EMBED);
#undef GRAD
#undef SCR
#undef PARAM
#undef ACT
}
