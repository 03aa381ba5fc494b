/* test_decode.c - the CPU decoder (kernels/nsa_decode.c, kernels/cpu/decode.c)
 * against the full forward: prefill + token-by-token decode must give, at
 * every position, the logits nsaModelForward gives there (F64 to 1e-9, F32
 * to 1e-5 relative), over sequences that cross many compressed, selection
 * and window boundaries, for every phi/MLP kind, d_k != d_v, tiny and large
 * n_sel, several slots at different positions, and prefill chunks larger
 * than one pass. Then resets, and every refusal. */
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
#include "nsa_rng.h"
#include "cpu/cpu_model.h"
#include "cpu/decode.h"
#include "testutil.h"

enum { SEQ = 2, LEN = 83 };

typedef struct Reference {
    NsaModel *model;
    int32_t tokens[SEQ][LEN];
    double *logits;   /* [SEQ][LEN][V] of the full forward */
} Reference;

/* Two random sequences; the second's first `shared` tokens are the first's. */
static void referenceBuild(Reference *ref, const NsaModelConfig *cfg, NsaPrecision prec,
                           uint64_t seed, int shared) {
    NsaEngineOptions eo = {.device = NSA_DEVICE_CPU, .precision = prec, .max_batch = SEQ,
                           .max_seq_len = LEN, .threads = 1};
    NsaError err = {{0}};
    ref->model = nsaModelCreate(cfg, &eo, &err);
    if (!ref->model) fail_msg("nsaModelCreate: %s", err.message);
    testScrambleWeights(ref->model, seed);
    NsaRng rng;
    nsaRngSeed(&rng, seed, 3);
    int32_t targets[SEQ * LEN];
    for (int b = 0; b < SEQ; b++)
        for (int t = 0; t < LEN; t++) {
            ref->tokens[b][t] = (int32_t)nsaRngBelow(&rng, (uint32_t)cfg->vocab_size);
            targets[b * LEN + t] = 0;
        }
    for (int t = 0; t < shared; t++) ref->tokens[1][t] = ref->tokens[0][t];
    if (nsaModelForward(ref->model, &ref->tokens[0][0], targets, SEQ, LEN, 1.0f, &err))
        fail_msg("forward: %s", err.message);
    NsaCpuModel *cm = nsaModelCpuEngine(ref->model);
    const size_t n = (size_t)SEQ * LEN * cfg->vocab_size;
    ref->logits = testAlloc(n, sizeof(double));
    for (size_t j = 0; j < n; j++)
        ref->logits[j] = cm->f64 ? ((const double *)cm->acts)[cm->logits + j]
                                 : ((const float *)cm->acts)[cm->logits + j];
}

static void referenceFree(Reference *ref) {
    nsaModelFree(ref->model);
    free(ref->logits);
}

static NsaDecoder *makeDecoder(const NsaModelConfig *cfg, NsaPrecision prec, int slots,
                               int context) {
    NsaDecoderOptions o = {.device = NSA_DEVICE_CPU, .precision = prec, .max_batch = slots,
                           .max_context = context};
    NsaError err = {{0}};
    NsaDecoder *d = nsaDecoderCreate(cfg, &o, &err);
    if (!d) fail_msg("nsaDecoderCreate: %s", err.message);
    return d;
}

/* Worst |decoded - forward| / max(1, |forward|) over row `row` of the decoder's
 * logits (read at full precision) against sequence b, position t. */
static double rowError(NsaDecoder *d, int row, const Reference *ref, int b, int t, int V) {
    const NsaCpuDecoder *cd = nsaDecoderCpuEngine(d);
    const double *want = ref->logits + ((size_t)b * LEN + t) * V;
    double worst = 0;
    for (int v = 0; v < V; v++) {
        const size_t at = cd->logits + (size_t)row * V + v;
        const double got = cd->f64 ? ((const double *)cd->arena)[at] : ((const float *)cd->arena)[at];
        double e = fabs(got - want[v]) / (fabs(want[v]) > 1 ? fabs(want[v]) : 1);
        if (!(e <= worst)) worst = e;   /* NaN sticks */
    }
    return worst;
}

/* Slot 0 prefills `p0` tokens of sequence 0, slot 1 `p1` of sequence 1
 * (chunks of `chunk`), then both decode token by token, slot 1 alone at
 * the end; every logit row is compared with the forward. Returns the worst
 * error. */
static double decodeAll(NsaDecoder *d, const Reference *ref, int V, int p0, int p1, int chunk) {
    NsaError err = {{0}};
    double worst = 0;
    const int prompt[SEQ] = {p0, p1};
    float *last = testAlloc((size_t)V, sizeof(float));
    for (int b = 0; b < SEQ; b++) {
        for (int at = 0; at < prompt[b]; at += chunk) {
            const int n = prompt[b] - at < chunk ? prompt[b] - at : chunk;
            if (nsaDecoderPrefill(d, b, &ref->tokens[b][at], n, last, &err))
                fail_msg("prefill: %s", err.message);
            const int rows_left = n % 64 ? n % 64 : 64;   /* the last pass's rows */
            double e = rowError(d, rows_left - 1, ref, b, at + n - 1, V);
            if (!(e <= worst)) worst = e;
            /* the fp32 copy handed out is the same row */
            const double want = ref->logits[((size_t)b * LEN + at + n - 1) * V];
            if (fabs(last[0] - want) > 1e-4 * (fabs(want) > 1 ? fabs(want) : 1)) worst = INFINITY;
        }
        assert_int_equal(nsaDecoderPosition(d, b), prompt[b]);
    }
    /* together while both have tokens left, then the longer one alone */
    int32_t step[SEQ];
    while (nsaDecoderPosition(d, 0) < LEN && nsaDecoderPosition(d, 1) < LEN) {
        const int t0 = nsaDecoderPosition(d, 0), t1 = nsaDecoderPosition(d, 1);
        step[0] = ref->tokens[0][t0];
        step[1] = ref->tokens[1][t1];
        if (nsaDecoderStep(d, 2, step, NULL, &err)) fail_msg("step: %s", err.message);
        double e0 = rowError(d, 0, ref, 0, t0, V), e1 = rowError(d, 1, ref, 1, t1, V);
        if (!(e0 <= worst)) worst = e0;
        if (!(e1 <= worst)) worst = e1;
    }
    while (nsaDecoderPosition(d, 0) < LEN) {
        const int t0 = nsaDecoderPosition(d, 0);
        if (nsaDecoderStep(d, 1, &ref->tokens[0][t0], NULL, &err)) fail_msg("step: %s", err.message);
        double e = rowError(d, 0, ref, 0, t0, V);
        if (!(e <= worst)) worst = e;
    }
    free(last);
    return worst;
}

static void checkConfig(NsaModelConfig cfg, NsaPrecision prec, double tol, uint64_t seed) {
    Reference ref;
    referenceBuild(&ref, &cfg, prec, seed, 0);
    NsaDecoder *d = makeDecoder(&cfg, prec, SEQ, LEN);
    NsaError err = {{0}};
    if (nsaDecoderLoadModel(d, ref.model, &err)) fail_msg("LoadModel: %s", err.message);
    /* prompts of 1 and 70 tokens (70: two passes of 64 rows) */
    double e = decodeAll(d, &ref, cfg.vocab_size, 1, 70, 70);
    print_message("# worst relative error %.3g (tol %.0e)\n", e, tol);
    assert_true(e <= tol);
    /* again after a reset: short prefill chunks, slot 0 ahead */
    assert_int_equal(nsaDecoderReset(d, -1, &err), 0);
    assert_int_equal(nsaDecoderPosition(d, 0), 0);
    e = decodeAll(d, &ref, cfg.vocab_size, 17, 5, 3);
    assert_true(e <= tol);
    nsaDecoderFree(d);
    referenceFree(&ref);
}

static void test_f64_avg_silu(void **state) {
    (void)state;
    checkConfig(testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU), NSA_PREC_F64, 1e-9, 1);
}

static void test_f64_mlp_swiglu(void **state) {
    (void)state;
    checkConfig(testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SWIGLU), NSA_PREC_F64, 1e-9, 2);
}

/* l = d (no overlap), l' = 2d, more selected blocks than forced, a window
 * longer than the compressed block, one KV group, d_k > d_v. */
static void test_f64_shape_variants(void **state) {
    (void)state;
    NsaModelConfig c = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU);
    c.cmp_len = 2;
    c.cmp_stride = 2;
    c.sel_len = 4;
    c.n_sel = 5;
    c.window = 9;
    c.n_kv_groups = 1;
    c.d_k = 6;
    c.d_v = 4;
    checkConfig(c, NSA_PREC_F64, 1e-9, 3);
    /* every block selected and a window covering everything */
    c = testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SILU);
    c.n_sel = 64;
    c.window = 200;
    checkConfig(c, NSA_PREC_F64, 1e-9, 4);
    /* n_sel below the forced blocks, l = 8 > l' = 4 */
    c = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SWIGLU);
    c.cmp_len = 8;
    c.cmp_stride = 4;
    c.n_sel = 1;
    checkConfig(c, NSA_PREC_F64, 1e-9, 5);
    /* l = 16 > 2 l' = 8: a compressed block overlaps four selection blocks
     * and ends past the one it starts in; d < l' */
    c = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU);
    c.cmp_len = 16;
    c.cmp_stride = 2;
    c.sel_len = 4;
    c.n_sel = 6;
    checkConfig(c, NSA_PREC_F64, 1e-9, 7);
}

static void test_f32(void **state) {
    (void)state;
    checkConfig(testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SILU), NSA_PREC_F32, 1e-5, 6);
}

/* The test can fail: a decoder whose weights differ in one element of one
 * key projection no longer matches. */
static void test_detects_a_difference(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU);
    Reference ref;
    referenceBuild(&ref, &cfg, NSA_PREC_F64, 8, 0);
    NsaDecoder *d = makeDecoder(&cfg, NSA_PREC_F64, SEQ, LEN);
    NsaError err = {{0}};
    assert_int_equal(nsaDecoderLoadModel(d, ref.model, &err), 0);
    const int i = nsaDecoderFindTensor(d, "layers.1.wk_sel");
    assert_true(i >= 0);
    const NsaTensorInfo *ti = nsaDecoderTensorInfo(d, i);
    float *w = testAlloc(ti->numel, sizeof(float));
    assert_int_equal(nsaModelGetTensor(ref.model, NSA_ARENA_PARAMS, i, w, &err), 0);
    w[3] += 0.25f;
    assert_int_equal(nsaDecoderSetTensor(d, i, w, &err), 0);
    assert_true(decodeAll(d, &ref, cfg.vocab_size, 10, 10, 10) > 1e-6);
    free(w);
    nsaDecoderFree(d);
    referenceFree(&ref);
}

/* A prompt prefilled once and copied into other slots continues there as if
 * prefilled in each: the two sequences share their first PREFIX tokens;
 * slot 0 prefills them, slot 1 (and slot 2, which held another prompt)
 * take a copy, then slot 0 and slot 2 go on with sequence 0, slot 1 with
 * sequence 1, all through the compressed, selection and window boundaries
 * that follow. Slot 2 must match slot 0 bit for bit. */
static void checkCopySlot(NsaModelConfig cfg, uint64_t seed) {
    enum { PREFIX = 37 };
    Reference ref;
    referenceBuild(&ref, &cfg, NSA_PREC_F64, seed, PREFIX);
    const int V = cfg.vocab_size;
    NsaDecoder *d = makeDecoder(&cfg, NSA_PREC_F64, 3, LEN);
    NsaError err = {{0}};
    assert_int_equal(nsaDecoderLoadModel(d, ref.model, &err), 0);
    assert_int_equal(nsaDecoderPrefill(d, 2, ref.tokens[1], 11, NULL, &err), 0);
    assert_int_equal(nsaDecoderPrefill(d, 0, ref.tokens[0], PREFIX, NULL, &err), 0);
    assert_int_equal(nsaDecoderCopySlot(d, 1, 0, &err), 0);
    assert_int_equal(nsaDecoderCopySlot(d, 2, 0, &err), 0);
    assert_int_equal(nsaDecoderCopySlot(d, 0, 0, &err), 0);   /* onto itself: nothing */
    for (int s = 0; s < 3; s++) assert_int_equal(nsaDecoderPosition(d, s), PREFIX);
    const NsaCpuDecoder *cd = nsaDecoderCpuEngine(d);
    const double *logits = (const double *)cd->arena + cd->logits;
    double worst = 0;
    for (int t = PREFIX; t < LEN; t++) {
        const int32_t step[3] = {ref.tokens[0][t], ref.tokens[1][t], ref.tokens[0][t]};
        if (nsaDecoderStep(d, 3, step, NULL, &err)) fail_msg("step: %s", err.message);
        const double e0 = rowError(d, 0, &ref, 0, t, V), e1 = rowError(d, 1, &ref, 1, t, V);
        if (!(e0 <= worst)) worst = e0;
        if (!(e1 <= worst)) worst = e1;
        assert_memory_equal(logits, logits + 2 * (size_t)V, (size_t)V * sizeof(double));
    }
    print_message("# copied slots: worst relative error %.3g\n", worst);
    assert_true(worst <= 1e-9);
    /* slots out of range are refused and change nothing */
    assert_int_equal(nsaDecoderCopySlot(d, 3, 0, &err), -1);
    assert_non_null(strstr(err.message, "slot"));
    assert_int_equal(nsaDecoderCopySlot(d, 0, -1, &err), -1);
    assert_int_equal(nsaDecoderPosition(d, 0), LEN);
    nsaDecoderFree(d);
    referenceFree(&ref);
}

static void test_copy_slot(void **state) {
    (void)state;
    checkCopySlot(testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU), 9);
    checkCopySlot(testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SWIGLU), 10);
}

/* The copy test can fail: a slot copied before its source's last token
 * (one position short) no longer matches the reference. */
static void test_copy_slot_detects_a_difference(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU);
    Reference ref;
    referenceBuild(&ref, &cfg, NSA_PREC_F64, 11, 20);
    NsaDecoder *d = makeDecoder(&cfg, NSA_PREC_F64, 2, LEN);
    NsaError err = {{0}};
    assert_int_equal(nsaDecoderLoadModel(d, ref.model, &err), 0);
    assert_int_equal(nsaDecoderPrefill(d, 0, ref.tokens[0], 19, NULL, &err), 0);
    assert_int_equal(nsaDecoderCopySlot(d, 1, 0, &err), 0);
    assert_int_equal(nsaDecoderPrefill(d, 0, &ref.tokens[0][19], 1, NULL, &err), 0);
    /* slot 1 lacks token 19: stepping token 20 there is another sequence */
    int32_t step[2] = {ref.tokens[0][20], ref.tokens[1][20]};
    assert_int_equal(nsaDecoderStep(d, 2, step, NULL, &err), 0);
    assert_true(rowError(d, 0, &ref, 0, 20, cfg.vocab_size) <= 1e-9);
    assert_true(rowError(d, 1, &ref, 1, 20, cfg.vocab_size) > 1e-6);
    nsaDecoderFree(d);
    referenceFree(&ref);
}

/* Threads split the products' output columns: the logits are the same
 * bits for any count (3 threads against 1 here, widths that leave a
 * remainder past the blocks of 8), through prefill passes and batched
 * steps. */
static void test_threads_bit_identical(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_MLP, NSA_MLP_SWIGLU);
    cfg.vocab_size = 37;
    cfg.dim = 44;
    Reference ref;
    referenceBuild(&ref, &cfg, NSA_PREC_F32, 12, 0);
    NsaError err = {{0}};
    NsaDecoder *d[2];
    for (int k = 0; k < 2; k++) {
        NsaDecoderOptions o = {.device = NSA_DEVICE_CPU,
                               .precision = NSA_PREC_F32,
                               .max_batch = SEQ,
                               .max_context = LEN,
                               .threads = k ? 3 : 1};
        d[k] = nsaDecoderCreate(&cfg, &o, &err);
        if (!d[k]) fail_msg("nsaDecoderCreate: %s", err.message);
        assert_int_equal(nsaDecoderLoadModel(d[k], ref.model, &err), 0);
    }
    const size_t V = (size_t)cfg.vocab_size;
    float *got[2] = {testAlloc(SEQ * V, sizeof(float)), testAlloc(SEQ * V, sizeof(float))};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(nsaDecoderPrefill(d[k], 0, ref.tokens[0], 9, got[k], &err), 0);
        assert_int_equal(nsaDecoderPrefill(d[k], 1, ref.tokens[1], 30, got[k] + V, &err), 0);
    }
    assert_memory_equal(got[0], got[1], SEQ * V * sizeof(float));
    for (int t = 30; t < LEN; t++) {
        const int32_t step[SEQ] = {ref.tokens[0][t - 21], ref.tokens[1][t]};
        for (int k = 0; k < 2; k++)
            if (nsaDecoderStep(d[k], SEQ, step, got[k], &err)) fail_msg("step: %s", err.message);
        assert_memory_equal(got[0], got[1], SEQ * V * sizeof(float));
    }
    /* and they are the forward's logits, to fp32 rounding */
    assert_true(rowError(d[1], 1, &ref, 1, LEN - 1, cfg.vocab_size) <= 1e-5);
    for (int k = 0; k < 2; k++) {
        nsaDecoderFree(d[k]);
        free(got[k]);
    }
    referenceFree(&ref);
}

static void test_refusals(void **state) {
    (void)state;
    NsaModelConfig cfg = testTinyModelConfig(NSA_PHI_AVG, NSA_MLP_SILU);
    NsaError err = {{0}};
    NsaDecoderOptions o = {.device = NSA_DEVICE_CPU, .precision = NSA_PREC_BF16, .max_batch = 2,
                           .max_context = 8};
    assert_null(nsaDecoderCreate(&cfg, &o, &err));
    assert_non_null(strstr(err.message, "precision"));
    o.precision = NSA_PREC_F32;
    o.max_context = 0;
    assert_null(nsaDecoderCreate(&cfg, &o, &err));
    assert_non_null(strstr(err.message, "max_context"));
    o.max_context = 8;
    o.threads = 257;
    assert_null(nsaDecoderCreate(&cfg, &o, &err));
    assert_non_null(strstr(err.message, "threads = 257"));
    o.threads = 0;
#ifndef NSA_HAVE_CUDA
    o.max_context = 8;
    o.device = NSA_DEVICE_CUDA;
    o.precision = NSA_PREC_BF16;
    assert_null(nsaDecoderCreate(&cfg, &o, &err));
    assert_non_null(strstr(err.message, "no CUDA"));
#endif

    NsaDecoder *d = makeDecoder(&cfg, NSA_PREC_F32, 2, 8);
    assert_non_null(strstr(nsaDecoderPrefillPath(d), "reference rows"));
    assert_null(nsaDecoderPrefillPath(NULL));
    int32_t toks[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    assert_int_equal(nsaDecoderPrefill(d, 0, toks, 5, NULL, &err), 0);
    toks[1] = 11;  /* V = 11: out of range */
    assert_int_equal(nsaDecoderPrefill(d, 0, toks, 2, NULL, &err), -1);
    assert_non_null(strstr(err.message, "tokens[1] = 11"));
    toks[1] = 2;
    assert_int_equal(nsaDecoderPrefill(d, 0, toks, 4, NULL, &err), -1);
    assert_non_null(strstr(err.message, "max_context"));
    assert_int_equal(nsaDecoderPosition(d, 0), 5);   /* nothing changed */
    assert_int_equal(nsaDecoderPrefill(d, 2, toks, 1, NULL, &err), -1);
    assert_non_null(strstr(err.message, "slot 2"));
    assert_int_equal(nsaDecoderStep(d, 3, toks, NULL, &err), -1);
    assert_int_equal(nsaDecoderPrefill(d, 0, toks, 3, NULL, &err), 0);
    assert_int_equal(nsaDecoderStep(d, 2, toks, NULL, &err), -1);   /* slot 0 is full */
    assert_int_equal(nsaDecoderPosition(d, 1), 0);
    assert_int_equal(nsaDecoderReset(d, 0, &err), 0);
    assert_int_equal(nsaDecoderPosition(d, 0), 0);
    assert_int_equal(nsaDecoderStep(d, 2, toks, NULL, &err), 0);
    assert_int_equal(nsaDecoderReset(d, 5, &err), -1);
    const float one = 1.0f;
    assert_int_equal(nsaDecoderSetTensor(d, 999, &one, &err), -1);
    assert_int_equal(nsaDecoderSetTensor(d, 0, NULL, &err), -1);

    /* a model of another config is refused */
    NsaModelConfig other = cfg;
    other.window = 6;
    NsaEngineOptions eo = {.device = NSA_DEVICE_CPU, .precision = NSA_PREC_F32, .max_batch = 1,
                           .max_seq_len = 4};
    NsaModel *m = nsaModelCreate(&other, &eo, &err);
    assert_non_null(m);
    assert_int_equal(nsaDecoderLoadModel(d, m, &err), -1);
    assert_non_null(strstr(err.message, "config"));
    nsaModelFree(m);
    nsaDecoderFree(d);
}

/* KV bytes a decoded token reads at the prototype's shape (bf16 on CUDA is
 * the bench's case; here fp32 on the CPU): compressed blocks visible, the
 * selected tokens, the window. */
static void test_kv_bytes(void **state) {
    (void)state;
    NsaModelConfig cfg;
    nsaModelConfigDefaults(&cfg);
    cfg.n_layers = 1;
    cfg.dim = 64;
    NsaDecoder *d = makeDecoder(&cfg, NSA_PREC_F32, 1, 4096);
    /* T = 4096: (4096-32)/16+1 = 255 blocks, 16 x 64 selected, 512 window */
    const size_t per_token = (size_t)2 * (64 + 64) * 4;
    assert_int_equal(nsaDecoderKvBytesPerToken(d, 4096), per_token * (255 + 1024 + 512));
    /* T = 100: 5 blocks, all 2 selection blocks' 100 tokens, window 100 */
    assert_int_equal(nsaDecoderKvBytesPerToken(d, 100), per_token * (5 + 100 + 100));
    nsaDecoderFree(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f64_avg_silu),
        cmocka_unit_test(test_f64_mlp_swiglu),
        cmocka_unit_test(test_f64_shape_variants),
        cmocka_unit_test(test_f32),
        cmocka_unit_test(test_detects_a_difference),
        cmocka_unit_test(test_copy_slot),
        cmocka_unit_test(test_copy_slot_detects_a_difference),
        cmocka_unit_test(test_threads_bit_identical),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_kv_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
