/* test_model.c - the CPU reference NSA transformer: parameter layout, init,
 * gradients (finite differences in double), causality, F32 vs F64, the
 * optimizer and its NaN guard, config validation. Tiny shapes throughout so
 * the whole file runs in about a second. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "nsa.h"
#include "nsa_layout.h"
#include "nsa_rng.h"
#include "cpu/cpu_model.h"
#include "cpu/cpu_ops.h"
#include "testutil.h"

enum { TB = 2, TS = 13 };

static NsaModel *makeModel(const NsaModelConfig *cfg, NsaPrecision prec, uint64_t seed) {
    NsaEngineOptions opt = {.device = NSA_DEVICE_CPU,
                            .precision = prec,
                            .max_batch = TB,
                            .max_seq_len = TS,
                            .threads = 1};
    NsaError err = {{0}};
    NsaModel *m = nsaModelCreate(cfg, &opt, &err);
    if (!m) fail_msg("nsaModelCreate: %s", err.message);
    if (nsaModelInit(m, seed, &err)) fail_msg("nsaModelInit: %s", err.message);
    return m;
}

/* Seeded random tokens and next-token targets (targets[t] = tokens[t+1],
 * the last position of each row drawn fresh). */
static void randomBatch(uint64_t seed, int V, int32_t *tokens, int32_t *targets) {
    NsaRng rng;
    nsaRngSeed(&rng, seed, 99);
    int32_t stream[TB][TS + 1];
    for (int b = 0; b < TB; b++)
        for (int t = 0; t <= TS; t++)
            stream[b][t] = (int32_t)nsaRngBelow(&rng, (uint32_t)V);
    for (int b = 0; b < TB; b++)
        for (int t = 0; t < TS; t++) {
            tokens[b * TS + t] = stream[b][t];
            targets[b * TS + t] = stream[b][t + 1];
        }
}

/* A tiny model, initialised from a seed, and one batch for it. */
typedef struct TinyRun {
    NsaModelConfig cfg;
    NsaModel *m;
    int32_t tok[TB * TS], tgt[TB * TS];
} TinyRun;

/* testTinyModelConfig(phi, mlp) at prec initialised from seed, and a batch
 * drawn from seed + 1. The caller frees r->m. */
static void tinyRunMake(TinyRun *r, NsaPhi phi, NsaMlpKind mlp, NsaPrecision prec, uint64_t seed) {
    r->cfg = testTinyModelConfig(phi, mlp);
    r->m = makeModel(&r->cfg, prec, seed);
    randomBatch(seed + 1, r->cfg.vocab_size, r->tok, r->tgt);
}

/* The optimizer settings of the training tests. */
static const NsaOptimConfig kAdamW = {
    .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};

static double lossOf(NsaModel *m, const int32_t *tok, const int32_t *tgt) {
    double loss = 0;
    NsaError err = {{0}};
    if (nsaModelEvalLoss(m, tok, tgt, TB, TS, &loss, &err)) fail_msg("EvalLoss: %s", err.message);
    return loss;
}

static void forwardBackward(NsaModel *m, const int32_t *tok, const int32_t *tgt) {
    NsaError err = {{0}};
    if (nsaModelZeroGrad(m, &err) || nsaModelForwardBackward(m, tok, tgt, TB, TS, 1.0f, &err))
        fail_msg("forward/backward: %s", err.message);
}

/* ---- layout, init, tensors ------------------------------------------------ */

static void test_layout_table(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SWIGLU);
    NsaLayout lay;
    NsaError err = {{0}};
    assert_int_equal(nsaLayoutBuild(&lay, &cfg, &err), 0);
    /* tok_emb + 2 layers x (20 with phi=mlp and SwiGLU) + final_norm + lm_head */
    assert_int_equal(lay.n_tensors, 1 + 2 * 20 + 2);
    assert_string_equal(lay.entries[0].name, "tok_emb");
    assert_string_equal(lay.entries[lay.n_tensors - 1].name, "lm_head");
    int wq = nsaLayoutFind(&lay, "layers.1.wq");
    assert_true(wq > 0);
    assert_int_equal(lay.entries[wq].info.shape[0], 16);
    assert_int_equal(lay.entries[wq].info.shape[1], 8);
    int w1 = nsaLayoutFind(&lay, "layers.0.phi_v.w1");
    assert_int_equal(lay.entries[w1].info.shape[0], 6);
    assert_int_equal(lay.entries[w1].info.shape[1], 24);
    assert_int_equal(nsaLayoutFind(&lay, "layers.2.wq"), -1);
    assert_int_equal(lay.layers[1].w_up, nsaLayoutFind(&lay, "layers.1.w_up"));
    size_t numel = 0, end = 0;
    for (int i = 0; i < lay.n_tensors; i++) {
        const NsaTensorInfo *ti = &lay.entries[i].info;
        assert_int_equal(ti->offset % NSA_LAYOUT_ALIGN, 0);
        assert_true(ti->offset >= end); /* ordered, never overlapping */
        end = ti->offset + ti->numel;
        numel += ti->numel;
        assert_int_equal(ti->weight_decay, ti->ndim == 2 && !strstr(ti->name, ".pos"));
    }
    assert_true(end <= lay.total);
    assert_int_equal(numel, lay.n_params);
    nsaLayoutFree(&lay);

    cfg = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU);
    assert_int_equal(nsaLayoutBuild(&lay, &cfg, &err), 0);
    assert_int_equal(lay.n_tensors, 1 + 2 * 13 + 2);
    assert_int_equal(lay.layers[0].phi_k_w1, -1);
    assert_int_equal(lay.layers[0].w_up, -1);
    nsaLayoutFree(&lay);
}

static void test_init_is_seeded_and_scaled(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SILU);
    NsaModel *a = makeModel(&cfg, NSA_PREC_F32, 1234);
    NsaModel *b = makeModel(&cfg, NSA_PREC_F64, 1234);
    NsaModel *c = makeModel(&cfg, NSA_PREC_F32, 1235);
    const size_t P = nsaModelNumParams(a);
    const float *pa = nsaModelHostArena(a, NSA_ARENA_PARAMS);
    const double *pb = nsaModelHostArena(b, NSA_ARENA_PARAMS);
    const float *pc = nsaModelHostArena(c, NSA_ARENA_PARAMS);
    size_t same_as_other_seed = 0;
    for (size_t j = 0; j < P; j++) {
        assert_true((double)pa[j] == pb[j]); /* F64 starts from the same floats */
        same_as_other_seed += pa[j] == pc[j];
    }
    /* only the ones of the norms and the zero padding agree across seeds */
    int norms = nsaModelFindTensor(a, "final_norm");
    assert_true(same_as_other_seed < P / 2);
    const NsaTensorInfo *ti = nsaModelTensorInfo(a, norms);
    for (size_t j = 0; j < ti->numel; j++)
        assert_true(pa[ti->offset + j] == 1.0f);

    /* standard deviations: 0.02, and 0.02/sqrt(2L) for wo */
    int wq = nsaModelFindTensor(a, "layers.0.wq"), wo = nsaModelFindTensor(a, "layers.1.wo");
    NsaModelConfig big = cfg;
    big.dim = 64;
    big.n_heads = 8;
    big.d_v = 16;
    NsaModel *m = makeModel(&big, NSA_PREC_F32, 5);
    const float *p = nsaModelHostArena(m, NSA_ARENA_PARAMS);
    for (int k = 0; k < 2; k++) {
        const NsaTensorInfo *t = nsaModelTensorInfo(m, k == 0 ? wq : wo);
        double ss = 0;
        for (size_t j = 0; j < t->numel; j++)
            ss += (double)p[t->offset + j] * p[t->offset + j];
        double sd = sqrt(ss / t->numel), want = k == 0 ? 0.02 : 0.02 / sqrt(4.0);
        assert_true(fabs(sd - want) < 0.1 * want);
    }
    /* moments start at zero */
    const float *mv = nsaModelHostArena(m, NSA_ARENA_ADAM_V);
    for (size_t j = 0; j < nsaModelNumParams(m); j++)
        assert_true(mv[j] == 0.0f);
    nsaModelFree(m);
    nsaModelFree(a);
    nsaModelFree(b);
    nsaModelFree(c);
}

static void test_get_set_tensor(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU);
    NsaModel *m = makeModel(&cfg, NSA_PREC_F64, 3);
    NsaError err = {{0}};
    int i = nsaModelFindTensor(m, "layers.0.wv_sel");
    const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
    float *buf = testAlloc(ti->numel, sizeof(float)), *back = testAlloc(ti->numel, sizeof(float));
    for (size_t j = 0; j < ti->numel; j++)
        buf[j] = (float)j * 0.25f - 1.0f;
    assert_int_equal(nsaModelSetTensor(m, NSA_ARENA_ADAM_M, i, buf, &err), 0);
    assert_int_equal(nsaModelGetTensor(m, NSA_ARENA_ADAM_M, i, back, &err), 0);
    assert_memory_equal(buf, back, ti->numel * sizeof(float));
    assert_int_equal(nsaModelGetTensor(m, NSA_ARENA_PARAMS, 999, back, &err), -1);
    assert_non_null(strstr(err.message, "999"));
    assert_int_equal(nsaModelGetTensor(m, (NsaArena)7, i, back, &err), -1);
    assert_non_null(strstr(err.message, "arena"));
    assert_null(nsaModelTensorInfo(m, -1));
    free(buf);
    free(back);
    nsaModelFree(m);
}

/* ---- single layer ops ----------------------------------------------------- */

/* The fast matrix product behind the model against the plain linear
 * definitions, and split by rows against whole. */
static void test_linear_ops(void **state) {
    (void)state;
    enum { N = 7, IN = 13, OUT = 11 };
    NsaRng rng;
    nsaRngSeed(&rng, 3, 3);
    float x[N * IN], w[OUT * IN], wt[IN * OUT], dy[N * OUT], dyt[OUT * N];
    float y1[N * OUT], y2[N * OUT], y3[N * OUT];
    testFillF32(&rng, x, N * IN, -1, 1);
    testFillF32(&rng, w, OUT * IN, -1, 1);
    testFillF32(&rng, dy, N * OUT, -1, 1);
    double want[N * OUT];
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OUT; o++) {
            double acc = 0;
            for (int i = 0; i < IN; i++)
                acc += (double)x[n * IN + i] * w[o * IN + i];
            want[n * OUT + o] = acc;
        }
    nsaCpuLinearForwardF32(y1, x, w, N, IN, OUT);
    nsaCpuTransposeF32(wt, w, OUT, IN);
    assert_true(wt[5 * OUT + 2] == w[2 * IN + 5]);
    nsaCpuMatmulF32(y2, x, wt, N, IN, OUT, 0);
    assert_true(testRelErrF32(y1, want, N * OUT) < 1e-6);
    assert_true(testRelErrF32(y2, want, N * OUT) < 1e-6);
    /* rows 0..4 and 5..6 in two calls: the same bits as one call */
    nsaCpuMatmulF32(y3, x, wt, 5, IN, OUT, 0);
    nsaCpuMatmulF32(y3 + 5 * OUT, x + 5 * IN, wt, N - 5, IN, OUT, 0);
    assert_memory_equal(y2, y3, sizeof(y2));

    /* backward: dx += dy W and dW += dy^T x through the product */
    float dx1[N * IN], dw1[OUT * IN], dx2[N * IN], dw2[OUT * IN];
    for (int i = 0; i < N * IN; i++)
        dx1[i] = dx2[i] = 0.5f;
    for (int i = 0; i < OUT * IN; i++)
        dw1[i] = dw2[i] = -0.25f;
    nsaCpuLinearBackwardF32(dx1, dw1, dy, x, w, N, IN, OUT);
    nsaCpuMatmulF32(dx2, dy, w, N, OUT, IN, 1);
    nsaCpuTransposeF32(dyt, dy, N, OUT);
    nsaCpuMatmulF32(dw2, dyt, x, OUT, N, IN, 1);
    double dx1d[N * IN], dw1d[OUT * IN];
    for (int i = 0; i < N * IN; i++)
        dx1d[i] = dx1[i];
    for (int i = 0; i < OUT * IN; i++)
        dw1d[i] = dw1[i];
    assert_true(testRelErrF32(dx2, dx1d, N * IN) < 1e-6);
    assert_true(testRelErrF32(dw2, dw1d, OUT * IN) < 1e-6);
    double want_dw = -0.25; /* dW[4][6] */
    for (int n = 0; n < N; n++)
        want_dw += (double)dy[n * OUT + 4] * x[n * IN + 6];
    assert_true(fabs(dw2[4 * IN + 6] - want_dw) < 1e-5);
}

/* RoPE keeps norms, turns pair (i, i + d/2) by t theta_i, and its backward
 * undoes the forward. */
static void test_rope_op(void **state) {
    (void)state;
    enum { S = 5, D = 8, HEADS = 2 };
    double table[S * D / 2 * 2], x[S * HEADS * D], keep[S * HEADS * D];
    NsaRng rng;
    nsaRngSeed(&rng, 4, 4);
    testFillF64(&rng, x, S * HEADS * D, -1, 1);
    memcpy(keep, x, sizeof(x));
    nsaCpuRopeTableF64(table, S, D, 10000.0);
    nsaCpuRopeForwardF64(x, table, 1, S, HEADS, D);
    const int t = 3, h = 1, i = 1;
    const double a = t * pow(10000.0, -2.0 * i / D);
    const double *in = keep + (t * HEADS + h) * D, *out = x + (t * HEADS + h) * D;
    assert_true(fabs(out[i] - (in[i] * cos(a) - in[i + D / 2] * sin(a))) < 1e-12);
    assert_true(fabs(out[i + D / 2] - (in[i] * sin(a) + in[i + D / 2] * cos(a))) < 1e-12);
    for (int k = 0; k < D; k++)
        assert_true(x[k] == keep[k]); /* t = 0: no turn */
    nsaCpuRopeBackwardF64(x, table, 1, S, HEADS, D);
    assert_true(testRelErrF64(x, keep, S * HEADS * D) < 1e-14);
}

/* ---- gradients ---------------------------------------------------------- */

/* Central differences of the mean loss against the analytic gradient, every
 * element of every tensor; returns the worst per-tensor relative error. */
static double gradCheck(const NsaModelConfig *config, const char **worst_name) {
    NsaModelConfig cfg = *config;
    NsaModel *m = makeModel(&cfg, NSA_PREC_F64, 42);
    testScrambleWeights(m, 43);
    int32_t tok[TB * TS], tgt[TB * TS];
    randomBatch(44, cfg.vocab_size, tok, tgt);
    tgt[3] = -1; /* an ignored target must not count */
    forwardBackward(m, tok, tgt);

    double *p = nsaModelHostArena(m, NSA_ARENA_PARAMS);
    const double *g = nsaModelHostArena(m, NSA_ARENA_GRADS);
    const double h = 1e-5;
    double worst = 0;
    for (int i = 0; i < nsaModelNumTensors(m); i++) {
        const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
        double *fd = testAlloc(ti->numel, sizeof(double));
        for (size_t j = 0; j < ti->numel; j++) {
            double *x = p + ti->offset + j, keep = *x;
            *x = keep + h;
            double up = lossOf(m, tok, tgt);
            *x = keep - h;
            double down = lossOf(m, tok, tgt);
            *x = keep;
            fd[j] = (up - down) / (2 * h);
        }
        double rel = testRelErrF64(g + ti->offset, fd, ti->numel);
        if (!(rel < 1e-5)) fprintf(stderr, "# %s: relative error %.3g\n", ti->name, rel);
        if (!(rel <= worst)) {
            worst = rel;
            *worst_name = ti->name;
        }
        free(fd);
    }
    static char name[64];
    snprintf(name, sizeof(name), "%s", *worst_name ? *worst_name : "-");
    *worst_name = name;
    nsaModelFree(m);
    return worst;
}

static void checkGradientsOf(const NsaModelConfig *cfg, const char *label) {
    const char *name = NULL;
    double worst = gradCheck(cfg, &name);
    printf("# gradcheck %s: worst per-tensor relative error %.3g (%s)\n", label, worst, name);
    assert_true(worst < 1e-5);
}

static void checkGradients(NsaPhi phi, NsaMlpKind mlp, const char *label) {
    NsaModelConfig cfg = testTinyModelConfig(phi, mlp);
    checkGradientsOf(&cfg, label);
}

/* Short selection blocks so that top-k picks blocks beyond the forced ones
 * (l' = 2: 7 blocks, n_sel = 4), and n_sel = 1 (rows wider than n_sel). */
static void test_gradcheck_selection_variants(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SILU);
    cfg.sel_len = 2;
    cfg.n_sel = 4;
    cfg.window = 3;
    checkGradientsOf(&cfg, "l'=2 n_sel=4 w=3");
    cfg.n_sel = 1;
    cfg.phi = NSA_PHI_AVG;
    checkGradientsOf(&cfg, "l'=2 n_sel=1 w=3");
}

static void test_gradcheck_avg_silu(void **state) {
    (void)state;
    checkGradients(NSA_PHI_AVG, NSA_MLP_SILU, "phi=avg mlp=silu");
}
static void test_gradcheck_avg_swiglu(void **state) {
    (void)state;
    checkGradients(NSA_PHI_AVG, NSA_MLP_SWIGLU, "phi=avg mlp=swiglu");
}
static void test_gradcheck_mlp_silu(void **state) {
    (void)state;
    checkGradients(NSA_PHI_MLP, NSA_MLP_SILU, "phi=mlp mlp=silu");
}
static void test_gradcheck_mlp_swiglu(void **state) {
    (void)state;
    checkGradients(NSA_PHI_MLP, NSA_MLP_SWIGLU, "phi=mlp mlp=swiglu");
}

/* From the real init (not scrambled weights), every tensor learns. */
static void test_every_tensor_gets_gradient(void **state) {
    (void)state;
    for (int variant = 0; variant < 4; variant++) {
        NsaModelConfig cfg = testTinyModelConfig(variant & 1 ? NSA_PHI_MLP : NSA_PHI_AVG,
                                                 variant & 2 ? NSA_MLP_SWIGLU : NSA_MLP_SILU);
        NsaModel *m = makeModel(&cfg, NSA_PREC_F32, 11 + variant);
        int32_t tok[TB * TS], tgt[TB * TS];
        randomBatch(12, cfg.vocab_size, tok, tgt);
        forwardBackward(m, tok, tgt);
        const float *g = nsaModelHostArena(m, NSA_ARENA_GRADS);
        for (int i = 0; i < nsaModelNumTensors(m); i++) {
            const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
            double ss = 0;
            for (size_t j = 0; j < ti->numel; j++)
                ss += (double)g[ti->offset + j] * g[ti->offset + j];
            if (!(ss > 0 && isfinite(ss))) fail_msg("%s: gradient norm^2 %g", ti->name, ss);
        }
        nsaModelFree(m);
    }
}

/* Two half-scaled passes over a batch equal one full pass (accumulation). */
static void test_gradient_accumulation(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SILU);
    NsaModel *m = makeModel(&cfg, NSA_PREC_F64, 8);
    testScrambleWeights(m, 9);
    int32_t tok[TB * TS], tgt[TB * TS];
    randomBatch(10, cfg.vocab_size, tok, tgt);
    NsaError err = {{0}};
    const size_t P = nsaModelNumParams(m);
    forwardBackward(m, tok, tgt);
    double *once = testAlloc(P, sizeof(double));
    memcpy(once, nsaModelHostArena(m, NSA_ARENA_GRADS), P * sizeof(double));
    assert_int_equal(nsaModelZeroGrad(m, &err), 0);
    for (int k = 0; k < 2; k++)
        assert_int_equal(nsaModelForwardBackward(m, tok, tgt, TB, TS, 0.5f, &err), 0);
    assert_true(testRelErrF64(nsaModelHostArena(m, NSA_ARENA_GRADS), once, P) < 1e-12);
    free(once);
    nsaModelFree(m);
}

/* Targets only at positions <= t; tokens after t changed: loss, every
 * gradient and the logits at <= t stay bit-identical. */
static void test_causality(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SWIGLU);
    const int cut = 8;
    NsaModel *m = makeModel(&cfg, NSA_PREC_F32, 21);
    int32_t tok[TB * TS], tgt[TB * TS];
    randomBatch(22, cfg.vocab_size, tok, tgt);
    for (int b = 0; b < TB; b++)
        for (int t = cut + 1; t < TS; t++)
            tgt[b * TS + t] = -1;
    const size_t P = nsaModelNumParams(m), V = cfg.vocab_size;
    NsaCpuModel *cm = nsaModelCpuEngine(m);
    assert_non_null(cm);

    float *grads[2], *logits[2];
    double loss[2];
    for (int run = 0; run < 2; run++) {
        if (run == 1)
            for (int b = 0; b < TB; b++)
                for (int t = cut + 1; t < TS; t++)
                    tok[b * TS + t] = (tok[b * TS + t] + 1 + t) % cfg.vocab_size;
        forwardBackward(m, tok, tgt);
        NsaStepStats st;
        NsaOptimConfig oc = {.lr = 0, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
        NsaError err = {{0}};
        /* lr 0: reads the loss accumulator through StepStats without changing weights */
        assert_int_equal(nsaModelOptimizerStep(m, &oc, 1, &err), 0);
        assert_int_equal(nsaModelStepStats(m, &st, &err), 0);
        loss[run] = st.loss;
        grads[run] = testAlloc(P, sizeof(float));
        memcpy(grads[run], nsaModelHostArena(m, NSA_ARENA_GRADS), P * sizeof(float));
        logits[run] = testAlloc((size_t)TB * TS * V, sizeof(float));
        memcpy(logits[run], (const float *)cm->acts + cm->logits,
               (size_t)TB * TS * V * sizeof(float));
    }
    assert_memory_equal(&loss[0], &loss[1], sizeof(double));
    assert_memory_equal(grads[0], grads[1], P * sizeof(float));
    for (int b = 0; b < TB; b++)
        assert_memory_equal(logits[0] + (size_t)b * TS * V, logits[1] + (size_t)b * TS * V,
                            (size_t)(cut + 1) * V * sizeof(float));
    /* and the perturbation did reach the later logits (the test can fail) */
    assert_true(memcmp(logits[0] + (size_t)(cut + 1) * V, logits[1] + (size_t)(cut + 1) * V,
                       V * sizeof(float)) != 0);
    for (int run = 0; run < 2; run++) {
        free(grads[run]);
        free(logits[run]);
    }
    nsaModelFree(m);
}

/* The F32 engine against the F64 oracle from the same weights. */
static void test_f32_matches_f64(void **state) {
    (void)state;
    for (int variant = 0; variant < 2; variant++) {
        NsaModelConfig cfg = testTinyModelConfig(variant ? NSA_PHI_MLP : NSA_PHI_AVG,
                                                 variant ? NSA_MLP_SWIGLU : NSA_MLP_SILU);
        NsaModel *m64 = makeModel(&cfg, NSA_PREC_F64, 31);
        NsaModel *m32 = makeModel(&cfg, NSA_PREC_F32, 31);
        testScrambleWeights(m64, 32);
        const size_t P = nsaModelNumParams(m64);
        const double *p64 = nsaModelHostArena(m64, NSA_ARENA_PARAMS);
        float *p32 = nsaModelHostArena(m32, NSA_ARENA_PARAMS);
        for (size_t j = 0; j < P; j++)
            p32[j] = (float)p64[j];
        double *p64w = nsaModelHostArena(m64, NSA_ARENA_PARAMS);
        for (size_t j = 0; j < P; j++)
            p64w[j] = p32[j]; /* same rounded weights */
        int32_t tok[TB * TS], tgt[TB * TS];
        randomBatch(33, cfg.vocab_size, tok, tgt);
        double l32 = lossOf(m32, tok, tgt), l64 = lossOf(m64, tok, tgt);
        assert_true(fabs(l32 - l64) / l64 < 1e-5);
        forwardBackward(m64, tok, tgt);
        forwardBackward(m32, tok, tgt);
        const double *g64 = nsaModelHostArena(m64, NSA_ARENA_GRADS);
        const float *g32 = nsaModelHostArena(m32, NSA_ARENA_GRADS);
        double worst = 0;
        for (int i = 0; i < nsaModelNumTensors(m64); i++) {
            const NsaTensorInfo *ti = nsaModelTensorInfo(m64, i);
            double rel = testRelErrF32(g32 + ti->offset, g64 + ti->offset, ti->numel);
            if (!(rel < 1e-5)) fail_msg("%s: f32 vs f64 relative error %g", ti->name, rel);
            if (rel > worst) worst = rel;
        }
        printf("# f32 vs f64 (%s): loss rel %.2g, worst gradient rel %.2g\n",
               variant ? "mlp/swiglu" : "avg/silu", fabs(l32 - l64) / l64, worst);
        nsaModelFree(m64);
        nsaModelFree(m32);
    }
}

/* Worker threads split the work without changing a bit of the results. */
static void test_threads_bit_identical(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SWIGLU);
    int32_t tok[TB * TS], tgt[TB * TS];
    randomBatch(65, cfg.vocab_size, tok, tgt);
    float *grads[3];
    double loss[3];
    size_t P = 0;
    const int threads[3] = {1, 2, 3};
    for (int k = 0; k < 3; k++) {
        NsaEngineOptions opt = {.device = NSA_DEVICE_CPU,
                                .precision = NSA_PREC_F32,
                                .max_batch = TB,
                                .max_seq_len = TS,
                                .threads = threads[k]};
        NsaError err = {{0}};
        NsaModel *m = nsaModelCreate(&cfg, &opt, &err);
        assert_non_null(m);
        assert_int_equal(nsaModelInit(m, 66, &err), 0);
        forwardBackward(m, tok, tgt);
        loss[k] = lossOf(m, tok, tgt);
        P = nsaModelNumParams(m);
        grads[k] = testAlloc(P, sizeof(float));
        memcpy(grads[k], nsaModelHostArena(m, NSA_ARENA_GRADS), P * sizeof(float));
        nsaModelFree(m);
    }
    for (int k = 1; k < 3; k++) {
        assert_memory_equal(&loss[0], &loss[k], sizeof(double));
        assert_memory_equal(grads[0], grads[k], P * sizeof(float));
    }
    for (int k = 0; k < 3; k++)
        free(grads[k]);
}

/* ---- the forward against a naive re-derivation ------------------------------ */

/* y[n][o] = sum_i x[n][i] W[o][i] in double over float weights */
static void refLinear(double *y, const double *x, const float *w, int N, int in, int out) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int i = 0; i < in; i++)
                s += x[n * in + i] * (double)w[o * in + i];
            y[n * out + o] = s;
        }
}

static void refRmsNorm(double *y, const double *x, const float *w, int N, int C, double eps) {
    for (int n = 0; n < N; n++) {
        double ss = 0;
        for (int c = 0; c < C; c++)
            ss += x[n * C + c] * x[n * C + c];
        double r = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++)
            y[n * C + c] = x[n * C + c] * r * w[c];
    }
}

/* Split-halves RoPE written from the contract: pair (i, i + d/2) turns by
 * t * base^(-2i/d); rows are [B*S][heads][d] with t = row % S. */
static void refRope(double *x, int N, int S, int heads, int d, double base) {
    for (int n = 0; n < N; n++)
        for (int h = 0; h < heads; h++) {
            double *v = x + ((size_t)n * heads + h) * d;
            for (int i = 0; i < d / 2; i++) {
                double a = (n % S) * pow(base, -2.0 * i / d);
                double x0 = v[i], x1 = v[i + d / 2];
                v[i] = x0 * cos(a) - x1 * sin(a);
                v[i + d / 2] = x0 * sin(a) + x1 * cos(a);
            }
        }
}

static float *toFloat(const double *x, size_t n) {
    float *f = testAlloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = (float)x[i];
    return f;
}

/* The whole model, phi = avg, from nsa.h's conventions and the public
 * attention op (nsaAttnForwardCpu); returns the mean loss. */
static double referenceLoss(NsaModel *m, const int32_t *tok, const int32_t *tgt) {
    const NsaModelConfig *c = nsaModelGetConfig(m);
    const int N = TB * TS, C = c->dim, H = c->n_heads, G = c->n_kv_groups, dk = c->d_k;
    const int dv = c->d_v, F = c->mlp_hidden, V = c->vocab_size;
    const float *P = nsaModelHostArena(m, NSA_ARENA_PARAMS);
#define W(name) (P + nsaModelTensorInfo(m, nsaModelFindTensor(m, name))->offset)
    char nm[64];
#define LW(i, suffix) (snprintf(nm, sizeof(nm), "layers.%d.%s", i, suffix), W(nm))
    double *x = testAlloc((size_t)N * C, sizeof(double)),
           *xn = testAlloc((size_t)N * C, sizeof(double));
    double *q = testAlloc((size_t)N * H * dk, sizeof(double)), *kv[6],
           *gate = testAlloc((size_t)N * 3 * H, sizeof(double));
    double *y = testAlloc((size_t)N * H * dv, sizeof(double)),
           *tmp = testAlloc((size_t)N * C, sizeof(double));
    double *h1 = testAlloc((size_t)N * F, sizeof(double)),
           *h2 = testAlloc((size_t)N * F, sizeof(double));
    for (int k = 0; k < 6; k++)
        kv[k] = testAlloc((size_t)N * G * (k % 2 ? dv : dk), sizeof(double));
    for (int n = 0; n < N; n++)
        for (int j = 0; j < C; j++)
            x[n * C + j] = W("tok_emb")[tok[n] * C + j];
    const char *kname[3] = {"wk_cmp", "wk_sel", "wk_win"},
               *vname[3] = {"wv_cmp", "wv_sel", "wv_win"};
    for (int i = 0; i < c->n_layers; i++) {
        refRmsNorm(xn, x, LW(i, "attn_norm"), N, C, c->norm_eps);
        refLinear(q, xn, LW(i, "wq"), N, C, H * dk);
        refRope(q, N, TS, H, dk, c->rope_base);
        for (int b = 0; b < 3; b++) {
            refLinear(kv[2 * b], xn, LW(i, kname[b]), N, C, G * dk);
            refRope(kv[2 * b], N, TS, G, dk, c->rope_base);
            refLinear(kv[2 * b + 1], xn, LW(i, vname[b]), N, C, G * dv);
        }
        refLinear(gate, xn, LW(i, "w_gate"), N, C, 3 * H);
        for (int j = 0; j < N * 3 * H; j++)
            gate[j] = 1 / (1 + exp(-gate[j]));
        NsaAttnDims dims = {.B = TB, .S = TS, .H = H, .G = G, .d_k = dk, .d_v = dv,
                            .cmp_len = c->cmp_len, .cmp_stride = c->cmp_stride,
                            .sel_len = c->sel_len, .n_sel = c->n_sel, .window = c->window};
        float *f[8] = {toFloat(q, (size_t)N * H * dk)};
        for (int k = 0; k < 6; k++)
            f[1 + k] = toFloat(kv[k], (size_t)N * G * (k % 2 ? dv : dk));
        f[7] = toFloat(gate, (size_t)N * 3 * H);
        NsaAttnInputs in = {.q = f[0], .k_cmp = f[1], .v_cmp = f[2], .k_sel = f[3], .v_sel = f[4],
                            .k_win = f[5], .v_win = f[6], .gates = f[7]};
        float *out = testAlloc((size_t)N * H * dv, sizeof(float));
        NsaError err = {{0}};
        if (nsaAttnForwardCpu(&dims, &in, out, NULL, NULL, &err)) fail_msg("attn: %s", err.message);
        for (int j = 0; j < N * H * dv; j++)
            y[j] = out[j];
        free(out);
        for (int k = 0; k < 8; k++)
            free(f[k]);
        refLinear(tmp, y, LW(i, "wo"), N, H * dv, C);
        for (int j = 0; j < N * C; j++)
            x[j] += tmp[j];
        refRmsNorm(xn, x, LW(i, "mlp_norm"), N, C, c->norm_eps);
        refLinear(h1, xn, LW(i, "w_fc"), N, C, F);
        if (c->mlp == NSA_MLP_SWIGLU) refLinear(h2, xn, LW(i, "w_up"), N, C, F);
        for (int j = 0; j < N * F; j++) {
            double silu = h1[j] / (1 + exp(-h1[j]));
            h1[j] = c->mlp == NSA_MLP_SWIGLU ? silu * h2[j] : silu;
        }
        refLinear(tmp, h1, LW(i, "w_proj"), N, F, C);
        for (int j = 0; j < N * C; j++)
            x[j] += tmp[j];
    }
    refRmsNorm(xn, x, W("final_norm"), N, C, c->norm_eps);
    double *logits = testAlloc((size_t)N * V, sizeof(double));
    refLinear(logits, xn, W("lm_head"), N, C, V);
    double total = 0;
    int counted = 0;
    for (int n = 0; n < N; n++) {
        if (tgt[n] < 0) continue;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, logits[n * V + v]);
        for (int v = 0; v < V; v++)
            sum += exp(logits[n * V + v] - mx);
        total += mx + log(sum) - logits[n * V + tgt[n]];
        counted++;
    }
#undef LW
#undef W
    free(logits);
    free(x);
    free(xn);
    free(q);
    free(gate);
    free(y);
    free(tmp);
    free(h1);
    free(h2);
    for (int k = 0; k < 6; k++)
        free(kv[k]);
    return total / counted;
}

static void test_forward_matches_reference(void **state) {
    (void)state;
    for (int swiglu = 0; swiglu < 2; swiglu++) {
        NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_AVG, swiglu ? NSA_MLP_SWIGLU : NSA_MLP_SILU);
        NsaModel *m = makeModel(&cfg, NSA_PREC_F32, 70 + swiglu);
        /* larger weights than init, so that every part moves the loss */
        float *p = nsaModelHostArena(m, NSA_ARENA_PARAMS);
        NsaRng rng;
        nsaRngSeed(&rng, 72, 0);
        for (int i = 0; i < nsaModelNumTensors(m); i++) {
            const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
            testFillF32(&rng, p + ti->offset, ti->numel, ti->ndim == 1 ? 0.8 : -0.6,
                        ti->ndim == 1 ? 1.2 : 0.6);
        }
        int32_t tok[TB * TS], tgt[TB * TS];
        randomBatch(73, cfg.vocab_size, tok, tgt);
        tgt[0] = -1;
        double want = referenceLoss(m, tok, tgt), got = lossOf(m, tok, tgt);
        printf("# reference forward (%s): loss %.7f, engine %.7f\n", swiglu ? "swiglu" : "silu",
               want, got);
        assert_true(fabs(got - want) < 1e-5 * want);
        nsaModelFree(m);
    }
}

/* ---- loss and optimizer -------------------------------------------------- */

static void test_initial_loss_is_ln_v(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU);
    cfg.vocab_size = 256;
    NsaModel *m = makeModel(&cfg, NSA_PREC_F32, 77);
    int32_t tok[TB * TS], tgt[TB * TS];
    randomBatch(78, cfg.vocab_size, tok, tgt);
    double loss = lossOf(m, tok, tgt);
    printf("# loss at init %.5f, ln(V) %.5f\n", loss, log(256.0));
    assert_true(fabs(loss - log(256.0)) < 0.05);
    nsaModelFree(m);
}

static void test_adamw_reduces_loss(void **state) {
    (void)state;
    TinyRun r;
    tinyRunMake(&r, NSA_PHI_MLP, NSA_MLP_SWIGLU, NSA_PREC_F32, 55);
    NsaError err = {{0}};
    double first = lossOf(r.m, r.tok, r.tgt);
    NsaStepStats st = {0};
    for (int step = 1; step <= 30; step++) {
        forwardBackward(r.m, r.tok, r.tgt);
        assert_int_equal(nsaModelOptimizerStep(r.m, &kAdamW, step, &err), 0);
        assert_int_equal(nsaModelStepStats(r.m, &st, &err), 0);
        assert_int_equal(st.applied, 1);
        assert_true(st.grad_norm > 0 && isfinite(st.grad_norm));
    }
    double last = lossOf(r.m, r.tok, r.tgt);
    printf("# 30 AdamW steps on one batch: loss %.4f -> %.4f\n", first, last);
    assert_true(last < first - 0.5);
    nsaModelFree(r.m);
}

/* One AdamW step by hand on a single element, checked against the engine. */
static void test_adamw_update_formula(void **state) {
    (void)state;
    TinyRun r;
    tinyRunMake(&r, NSA_PHI_AVG, NSA_MLP_SILU, NSA_PREC_F64, 60);
    forwardBackward(r.m, r.tok, r.tgt);
    const int wq = nsaModelFindTensor(r.m, "layers.0.wq"), nrm = nsaModelFindTensor(r.m, "final_norm");
    const size_t a = nsaModelTensorInfo(r.m, wq)->offset + 3, b = nsaModelTensorInfo(r.m, nrm)->offset;
    double *p = nsaModelHostArena(r.m, NSA_ARENA_PARAMS);
    const double *g = nsaModelHostArena(r.m, NSA_ARENA_GRADS);
    const double pa = p[a], ga = g[a], pb = p[b], gb = g[b];
    double norm = 0;
    for (size_t j = 0; j < nsaModelNumParams(r.m); j++)
        norm += g[j] * g[j];
    norm = sqrt(norm);
    NsaOptimConfig oc = {.lr = 0.1f,
                         .beta1 = 0.9f,
                         .beta2 = 0.95f,
                         .eps = 1e-8f,
                         .weight_decay = 0.5f,
                         .grad_clip = (float)(norm / 2)};
    NsaError err = {{0}};
    assert_int_equal(nsaModelOptimizerStep(r.m, &oc, 1, &err), 0);
    const double clip = (double)oc.grad_clip / norm;
    /* step 1: m/bc1 = g, v/bc2 = g^2, so the update is g/(|g| + eps) */
    const double ca = ga * clip, cb = gb * clip;
    const double want_a =
        pa - (double)oc.lr * (ca / (fabs(ca) + (double)oc.eps) + (double)oc.weight_decay * pa);
    const double want_b = pb - (double)oc.lr * (cb / (fabs(cb) + (double)oc.eps)); /* no decay */
    assert_true(fabs(p[a] - want_a) < 1e-12);
    assert_true(fabs(p[b] - want_b) < 1e-12);
    NsaStepStats st;
    assert_int_equal(nsaModelStepStats(r.m, &st, &err), 0);
    assert_true(fabs(st.grad_norm - norm) < 1e-12 * norm);
    nsaModelFree(r.m);
}

static void checkNanGuard(NsaFault fault) {
    TinyRun r;
    tinyRunMake(&r, NSA_PHI_AVG, NSA_MLP_SILU, NSA_PREC_F32, 90);
    NsaError err = {{0}};
    /* one good step first so the moments are non-zero */
    forwardBackward(r.m, r.tok, r.tgt);
    assert_int_equal(nsaModelOptimizerStep(r.m, &kAdamW, 1, &err), 0);
    const size_t bytes = nsaModelNumParams(r.m) * sizeof(float);
    void *before[3];
    const NsaArena arenas[3] = {NSA_ARENA_PARAMS, NSA_ARENA_ADAM_M, NSA_ARENA_ADAM_V};
    for (int k = 0; k < 3; k++) {
        before[k] = testAlloc(bytes, 1);
        memcpy(before[k], nsaModelHostArena(r.m, arenas[k]), bytes);
    }
    assert_int_equal(nsaModelInjectFault(r.m, fault, &err), 0);
    forwardBackward(r.m, r.tok, r.tgt);
    assert_int_equal(nsaModelOptimizerStep(r.m, &kAdamW, 2, &err), 0);
    NsaStepStats st;
    assert_int_equal(nsaModelStepStats(r.m, &st, &err), 0);
    assert_int_equal(st.applied, 0);
    if (fault == NSA_FAULT_NAN_LOSS) {
        assert_int_equal(st.nonfinite_loss, 1);
        assert_true(isnan(st.loss));
    } else {
        assert_int_equal(st.nonfinite_grad, 1);
        assert_true(isnan(st.grad_norm));
    }
    for (int k = 0; k < 3; k++) {
        assert_memory_equal(before[k], nsaModelHostArena(r.m, arenas[k]), bytes);
        free(before[k]);
    }
    /* the fault fires once: the next step is clean again */
    forwardBackward(r.m, r.tok, r.tgt);
    assert_int_equal(nsaModelOptimizerStep(r.m, &kAdamW, 2, &err), 0);
    assert_int_equal(nsaModelStepStats(r.m, &st, &err), 0);
    assert_int_equal(st.applied, 1);
    nsaModelFree(r.m);
}

static void test_nan_loss_guard(void **state) {
    (void)state;
    checkNanGuard(NSA_FAULT_NAN_LOSS);
}
static void test_nan_grad_guard(void **state) {
    (void)state;
    checkNanGuard(NSA_FAULT_NAN_GRAD);
}

static void test_eval_leaves_gradients(void **state) {
    (void)state;
    TinyRun r;
    tinyRunMake(&r, NSA_PHI_MLP, NSA_MLP_SILU, NSA_PREC_F32, 95);
    forwardBackward(r.m, r.tok, r.tgt);
    const size_t bytes = nsaModelNumParams(r.m) * sizeof(float);
    void *g = testAlloc(bytes, 1);
    memcpy(g, nsaModelHostArena(r.m, NSA_ARENA_GRADS), bytes);
    NsaError err = {{0}};
    NsaOptimConfig oc = {.lr = 0, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
    double loss;
    int32_t tok2[TB * TS], tgt2[TB * TS];
    randomBatch(97, r.cfg.vocab_size, tok2, tgt2);
    assert_int_equal(nsaModelEvalLoss(r.m, tok2, tgt2, TB, TS, &loss, &err), 0);
    assert_memory_equal(g, nsaModelHostArena(r.m, NSA_ARENA_GRADS), bytes);
    /* the step's loss is still the training forward's alone */
    assert_int_equal(nsaModelOptimizerStep(r.m, &oc, 1, &err), 0);
    NsaStepStats st;
    assert_int_equal(nsaModelStepStats(r.m, &st, &err), 0);
    double train_loss = lossOf(r.m, r.tok, r.tgt);
    assert_true(fabs(st.loss - train_loss) < 1e-6);
    /* EvalLoss voided the saved activations */
    assert_int_equal(nsaModelBackward(r.m, &err), -1);
    assert_non_null(strstr(err.message, "Forward"));
    free(g);
    nsaModelFree(r.m);
}

/* ---- bad input ---------------------------------------------------------- */

static void test_bad_batches(void **state) {
    (void)state;
    TinyRun r;
    tinyRunMake(&r, NSA_PHI_AVG, NSA_MLP_SILU, NSA_PREC_F32, 1);
    NsaError err = {{0}};
    r.tok[5] = 11;
    assert_int_equal(nsaModelForward(r.m, r.tok, r.tgt, TB, TS, 1.0f, &err), -1);
    assert_non_null(strstr(err.message, "tokens[5] = 11"));
    r.tok[5] = 0;
    r.tgt[7] = -2;
    assert_int_equal(nsaModelForward(r.m, r.tok, r.tgt, TB, TS, 1.0f, &err), -1);
    assert_non_null(strstr(err.message, "targets[7] = -2"));
    for (int n = 0; n < TB * TS; n++)
        r.tgt[n] = -1;
    assert_int_equal(nsaModelForward(r.m, r.tok, r.tgt, TB, TS, 1.0f, &err), -1);
    assert_non_null(strstr(err.message, "-1"));
    assert_int_equal(nsaModelForward(r.m, r.tok, r.tgt, TB + 1, TS, 1.0f, &err), -1);
    assert_non_null(strstr(err.message, "max_batch"));
    assert_int_equal(nsaModelForward(r.m, r.tok, r.tgt, TB, TS + 1, 1.0f, &err), -1);
    assert_non_null(strstr(err.message, "max_seq_len"));
    assert_int_equal(nsaModelBackward(r.m, &err), -1);
    NsaOptimConfig oc = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
    assert_int_equal(nsaModelOptimizerStep(r.m, &oc, 0, &err), -1);
    assert_non_null(strstr(err.message, "step = 0"));
    oc.beta2 = 1.0f;
    assert_int_equal(nsaModelOptimizerStep(r.m, &oc, 1, &err), -1);
    assert_non_null(strstr(err.message, "beta2 = 1"));
    nsaModelFree(r.m);

    NsaEngineOptions opt = {
        .device = NSA_DEVICE_CPU, .precision = NSA_PREC_BF16, .max_batch = 1, .max_seq_len = 4};
    assert_null(nsaModelCreate(&r.cfg, &opt, &err));
    assert_non_null(strstr(err.message, "bf16"));
}

/* Shorter sequences and batches than planned reuse the same arenas. */
static void test_smaller_batch_than_planned(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SILU);
    NsaModel *big = makeModel(&cfg, NSA_PREC_F64, 4);
    NsaEngineOptions opt = {
        .device = NSA_DEVICE_CPU, .precision = NSA_PREC_F64, .max_batch = 1, .max_seq_len = 7};
    NsaError err = {{0}};
    NsaModel *small = nsaModelCreate(&cfg, &opt, &err);
    assert_non_null(small);
    assert_int_equal(nsaModelInit(small, 4, &err), 0);
    int32_t tok[TB * TS], tgt[TB * TS];
    randomBatch(5, cfg.vocab_size, tok, tgt);
    double a = 0, b = 0;
    assert_int_equal(nsaModelEvalLoss(big, tok, tgt, 1, 7, &a, &err), 0);
    assert_int_equal(nsaModelEvalLoss(small, tok, tgt, 1, 7, &b, &err), 0);
    assert_true(a == b);
    nsaModelFree(big);
    nsaModelFree(small);
}

/* Sequences shorter than a compressed block: no block is visible, the
 * compressed branch is 0 and its projections get exactly zero gradient,
 * while everything else still trains. */
static void test_sequence_shorter_than_block(void **state) {
    (void)state;
    TinyRun r;
    tinyRunMake(&r, NSA_PHI_MLP, NSA_MLP_SILU, NSA_PREC_F64, 14);
    NsaError err = {{0}};
    const int S = r.cfg.cmp_len - 1;
    assert_int_equal(nsaModelZeroGrad(r.m, &err), 0);
    assert_int_equal(nsaModelForwardBackward(r.m, r.tok, r.tgt, TB, S, 1.0f, &err), 0);
    const double *g = nsaModelHostArena(r.m, NSA_ARENA_GRADS);
    for (int i = 0; i < nsaModelNumTensors(r.m); i++) {
        const NsaTensorInfo *ti = nsaModelTensorInfo(r.m, i);
        double ss = 0;
        for (size_t j = 0; j < ti->numel; j++) ss += g[ti->offset + j] * g[ti->offset + j];
        int cmp_only = strstr(ti->name, "wk_cmp") || strstr(ti->name, "wv_cmp") ||
                       strstr(ti->name, "phi_");
        if (cmp_only ? ss != 0 : !(ss > 0)) fail_msg("%s: gradient norm^2 %g", ti->name, ss);
    }
    nsaModelFree(r.m);
}

static void test_memory_report(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU);
    NsaModel *m = makeModel(&cfg, NSA_PREC_F64, 1);
    NsaMemoryReport r;
    assert_int_equal(nsaModelMemoryReport(m, &r), 0);
    assert_int_equal(r.params, nsaModelNumParams(m) * sizeof(double));
    assert_int_equal(r.optimizer, 2 * r.params);
    assert_true(r.activations > 0 && r.workspace > 0);
    assert_int_equal(r.total, r.params + r.grads + r.optimizer + r.activations + r.workspace);
    assert_int_equal(nsaModelMemoryReport(NULL, &r), -1);
    nsaModelFree(m);
}

/* The generator: reproducible per (seed, stream), streams independent, and
 * the draws have the moments they should. */
static void test_rng(void **state) {
    (void)state;
    NsaRng a, b, c;
    nsaRngSeed(&a, 42, 0);
    nsaRngSeed(&b, 42, 0);
    nsaRngSeed(&c, 42, 1);
    int same_stream = 1, other_stream_equal = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = nsaRngNext(&a), y = nsaRngNext(&b), z = nsaRngNext(&c);
        same_stream &= x == y;
        other_stream_equal += x == z;
    }
    assert_true(same_stream);
    assert_int_equal(other_stream_equal, 0);
    const int n = 200000;
    double sum = 0, sum_sq = 0, usum = 0;
    unsigned counts[7] = {0};
    for (int i = 0; i < n; i++) {
        double z = nsaRngNormal(&a);
        sum += z;
        sum_sq += z * z;
        double u = nsaRngUniform(&a);
        assert_true(u >= 0 && u < 1);
        usum += u;
        uint32_t k = nsaRngBelow(&a, 7);
        assert_true(k < 7);
        counts[k]++;
    }
    assert_true(fabs(sum / n) < 0.01);
    assert_true(fabs(sum_sq / n - 1) < 0.02);
    assert_true(fabs(usum / n - 0.5) < 0.005);
    for (int k = 0; k < 7; k++) assert_true(fabs(counts[k] / (double)n - 1.0 / 7) < 0.005);
}

static void expectReject(NsaModelConfig cfg, const char *want1, const char *want2) {
    NsaError err = {{0}};
    assert_int_equal(nsaModelConfigValidate(&cfg, &err), -1);
    if (!strstr(err.message, want1) || (want2 && !strstr(err.message, want2)))
        fail_msg("message '%s' lacks '%s' / '%s'", err.message, want1, want2 ? want2 : "");
}

static void test_config_validate(void **state) {
    (void)state;
    NsaModelConfig good;
    nsaModelConfigDefaults(&good);
    NsaError err = {{0}};
    assert_int_equal(nsaModelConfigValidate(&good, &err), 0);
    NsaModelConfig tiny = testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SWIGLU);
    assert_int_equal(nsaModelConfigValidate(&tiny, &err), 0);
    NsaModelConfig c;
#define BAD(field, value, w1, w2)                                                                  \
    c = good;                                                                                      \
    c.field = value;                                                                               \
    expectReject(c, w1, w2)
    BAD(vocab_size, 0, "vocab_size = 0", "allowed");
    BAD(dim, -3, "dim = -3", "allowed");
    BAD(n_layers, 0, "n_layers = 0", "allowed");
    BAD(n_heads, 0, "n_heads = 0", "allowed");
    BAD(n_kv_groups, 5, "n_kv_groups = 5", "n_heads (12)");
    BAD(d_k, 63, "d_k = 63", "even");
    BAD(d_k, 0, "d_k = 0", "allowed");
    BAD(d_v, 0, "d_v = 0", "allowed");
    BAD(mlp_hidden, -1, "mlp_hidden = -1", "allowed");
    BAD(mlp, (NsaMlpKind)7, "mlp = 7", "allowed");
    BAD(cmp_len, 0, "cmp_len = 0", "allowed");
    BAD(cmp_stride, 0, "cmp_stride = 0", "allowed");
    BAD(cmp_stride, 5, "cmp_stride = 5", "cmp_len (32)");
    BAD(sel_len, 40, "cmp_stride = 16", "sel_len (40)");
    BAD(n_sel, 0, "n_sel = 0", "allowed");
    BAD(window, 0, "window = 0", "allowed");
    BAD(phi, (NsaPhi)3, "phi = 3", "allowed");
    BAD(rope_base, 0.5f, "rope_base = 0.5", "allowed");
    BAD(norm_eps, 0.0f, "norm_eps = 0", "allowed");
    BAD(norm_eps, NAN, "norm_eps = nan", "allowed");
#undef BAD
}

/* nsaModelFlopsPerToken against an independent count: the matmul term
 * against the layout's projection matrices, the attention term against
 * the keys each query of the CPU reference op visits (its compressed
 * blocks enumerated, its selected blocks read from sel_idx, its window). */
static void test_flops_per_token(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SWIGLU);
    NsaModel *m = makeModel(&cfg, NSA_PREC_F32, 1);
    double matrix = 0;
    static const char *const products[] = {".wq", ".wk_", ".wv_", ".w_gate", ".wo", ".w_fc",
                                           ".w_up", ".w_proj", "lm_head"};
    for (int i = 0; i < nsaModelNumTensors(m); i++) {
        const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
        for (size_t k = 0; k < sizeof(products) / sizeof(products[0]); k++)
            if (strstr(ti->name, products[k])) { matrix += (double)ti->numel; break; }
    }
    nsaModelFree(m);

    enum { S = 23 };
    NsaAttnDims dims = {.B = 1, .S = S, .H = 1, .G = 1, .d_k = cfg.d_k, .d_v = cfg.d_v,
                        .cmp_len = cfg.cmp_len, .cmp_stride = cfg.cmp_stride,
                        .sel_len = cfg.sel_len, .n_sel = cfg.n_sel, .window = cfg.window};
    const size_t nk = (size_t)S * cfg.d_k, nv = (size_t)S * cfg.d_v;
    float *q = testAlloc(nk, sizeof(float)), *k = testAlloc(nk, sizeof(float));
    float *v = testAlloc(nv, sizeof(float)), *gates = testAlloc((size_t)S * 3, sizeof(float));
    float *out = testAlloc(nv, sizeof(float));
    const int slots = nsaNumSelSlots(cfg.n_sel);
    int32_t *sel = testAlloc((size_t)S * slots, sizeof(int32_t));
    NsaRng rng;
    nsaRngSeed(&rng, 5, 5);
    testFillF32(&rng, q, nk, -1, 1);
    testFillF32(&rng, k, nk, -1, 1);
    testFillF32(&rng, v, nv, -1, 1);
    testFillF32(&rng, gates, (size_t)S * 3, 0, 1);
    NsaAttnInputs in = {.q = q, .k_cmp = k, .v_cmp = v, .k_sel = k, .v_sel = v, .k_win = k,
                        .v_win = v, .gates = gates};
    NsaError err = {{0}};
    if (nsaAttnForwardCpu(&dims, &in, out, sel, NULL, &err)) fail_msg("attn: %s", err.message);
    double keys = 0, dense = 0;
    const int n_cmp = nsaNumCmpBlocks(S, cfg.cmp_len, cfg.cmp_stride);
    for (int t = 0; t < S; t++) {
        for (int i = 0; i < n_cmp; i++)
            if (i * cfg.cmp_stride + cfg.cmp_len - 1 <= t) keys += 1;
        for (int s = 0; s < slots; s++) {
            int j = sel[(size_t)t * slots + s];
            if (j < 0) continue;
            int last = j * cfg.sel_len + cfg.sel_len - 1 < t ? j * cfg.sel_len + cfg.sel_len - 1 : t;
            keys += last - j * cfg.sel_len + 1;
        }
        keys += t + 1 < cfg.window ? t + 1 : cfg.window;
        dense += t + 1;
    }
    free(q); free(k); free(v); free(gates); free(out); free(sel);

    NsaFlops f;
    assert_int_equal(nsaModelFlopsPerToken(&cfg, S, &f, &err), 0);
    const double pair = 2.0 * (cfg.d_k + cfg.d_v) * cfg.n_heads * cfg.n_layers;
    assert_true(fabs(f.matmul - 6.0 * matrix) <= 1e-9 * f.matmul);
    assert_true(fabs(f.attention - 3.0 * pair * keys / S) <= 1e-9 * f.attention);
    assert_true(fabs(f.dense_attention - 3.0 * pair * dense / S) <= 1e-9 * f.dense_attention);
    assert_true(f.total == f.matmul + f.attention);
    assert_int_equal(nsaModelFlopsPerToken(&cfg, 0, &f, &err), -1);
    assert_non_null(strstr(err.message, "S = 0"));
}

/* Without a CUDA engine in this build, a CUDA model is an error. */
static void test_cuda_device_without_engine(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU);
    NsaEngineOptions opt = {
        .device = NSA_DEVICE_CUDA, .precision = NSA_PREC_F32, .max_batch = 1, .max_seq_len = 8};
    NsaError err = {{0}};
    NsaModel *m = nsaModelCreate(&cfg, &opt, &err);
    if (m) { /* a build with the CUDA engine and a GPU: nothing to check here */
        assert_null(nsaModelHostArena(m, NSA_ARENA_PARAMS));
        nsaModelFree(m);
        skip();
    }
    assert_true(err.message[0] != '\0');
}

/* Activation recompute is the CUDA engine's: the CPU engine refuses any
 * but none, and a value out of range is named with the allowed ones. */
static void test_recompute_options(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU);
    NsaEngineOptions opt = {.device = NSA_DEVICE_CPU, .precision = NSA_PREC_F32, .max_batch = 1,
                            .max_seq_len = 8, .recompute = NSA_RECOMPUTE_SELECTIVE};
    NsaError err = {{0}};
    assert_null(nsaModelCreate(&cfg, &opt, &err));
    assert_non_null(strstr(err.message, "recompute = selective is a CUDA engine option"));
    opt.recompute = 3;
    assert_null(nsaModelCreate(&cfg, &opt, &err));
    assert_non_null(strstr(err.message, "recompute = 3; allowed: 0 (none), 1 (layer), 2 (selective)"));
    assert_string_equal(nsaRecomputeName(NSA_RECOMPUTE_LAYER), "layer");
    assert_string_equal(nsaRecomputeName(7), "?");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recompute_options),
        cmocka_unit_test(test_layout_table),
        cmocka_unit_test(test_init_is_seeded_and_scaled),
        cmocka_unit_test(test_get_set_tensor),
        cmocka_unit_test(test_linear_ops),
        cmocka_unit_test(test_rope_op),
        cmocka_unit_test(test_gradcheck_avg_silu),
        cmocka_unit_test(test_gradcheck_avg_swiglu),
        cmocka_unit_test(test_gradcheck_mlp_silu),
        cmocka_unit_test(test_gradcheck_mlp_swiglu),
        cmocka_unit_test(test_gradcheck_selection_variants),
        cmocka_unit_test(test_every_tensor_gets_gradient),
        cmocka_unit_test(test_gradient_accumulation),
        cmocka_unit_test(test_causality),
        cmocka_unit_test(test_f32_matches_f64),
        cmocka_unit_test(test_forward_matches_reference),
        cmocka_unit_test(test_threads_bit_identical),
        cmocka_unit_test(test_initial_loss_is_ln_v),
        cmocka_unit_test(test_adamw_reduces_loss),
        cmocka_unit_test(test_adamw_update_formula),
        cmocka_unit_test(test_nan_loss_guard),
        cmocka_unit_test(test_nan_grad_guard),
        cmocka_unit_test(test_eval_leaves_gradients),
        cmocka_unit_test(test_bad_batches),
        cmocka_unit_test(test_smaller_batch_than_planned),
        cmocka_unit_test(test_sequence_shorter_than_block),
        cmocka_unit_test(test_memory_report),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_config_validate),
        cmocka_unit_test(test_flops_per_token),
        cmocka_unit_test(test_cuda_device_without_engine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
