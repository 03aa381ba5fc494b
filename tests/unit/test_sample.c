/* test_sample.c - using a trained checkpoint: next-token sampling
 * (daemon/sampler.c: greedy, temperature, top-k, top-p, seeds, stop strings,
 * batched prompts, cancel, UTF-8 hold-back), greedy generation against the
 * full forward's arg max, the checkpoint opened for use (daemon/weights.c)
 * and whole-file evaluation (daemon/evaluate.c) against nsaModelEvalLoss
 * over the same windows by hand; a model of 100 token ids (a shard run's):
 * opened, sampled as ids, evaluated on shards, text refused. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <cjson/cJSON.h>

#include "artifacts.h"
#include "checkpoint.h"
#include "config.h"
#include "evaluate.h"
#include "nsa.h"
#include "cpu/cpu_model.h"
#include "nsa_rng.h"
#include "sampler.h"
#include "testutil.h"
#include "tokenizer.h"
#include "weights.h"

/* ---- samplePick ------------------------------------------------------------------ */

static int pick(const float *z, int V, double temperature, int top_k, double top_p, double u) {
    SampleOptions o;
    sampleDefaults(&o);
    o.temperature = temperature;
    o.top_k = top_k;
    o.top_p = top_p;
    void *scratch = testAlloc(sampleScratchBytes(V), 1);
    int id = samplePick(z, V, &o, u, scratch);
    free(scratch);
    return id;
}

static void test_pick_rules(void **state) {
    (void)state;
    const float tie[4] = {1.0f, 3.0f, 3.0f, 2.0f};
    assert_int_equal(pick(tie, 4, 0, 0, 1, 0.99), 1);   /* greedy: the lower of a tie */
    assert_int_equal(pick(tie, 4, 1, 1, 1, 0.99), 1);   /* top-k 1 is greedy */
    /* p proportional to 1, 2, 4 at temperature 1 */
    const float z[3] = {0.0f, (float)log(2.0), (float)log(4.0)};
    assert_int_equal(pick(z, 3, 1, 0, 1, 0.50), 2);     /* 4/7 = 0.571 */
    assert_int_equal(pick(z, 3, 1, 0, 1, 0.60), 1);     /* up to 6/7 */
    assert_int_equal(pick(z, 3, 1, 0, 1, 0.90), 0);
    assert_int_equal(pick(z, 3, 1, 0, 0.5, 0.99), 2);   /* top-p 0.5 keeps id 2 alone */
    assert_int_equal(pick(z, 3, 1, 0, 0.6, 0.90), 1);   /* 0.6 keeps 2 and 1: 0.9*6/7 */
    assert_int_equal(pick(z, 3, 1, 2, 1, 0.90), 1);     /* top-k 2 drops id 0 */
    /* a high temperature flattens: u = 0.5 lands past the first third */
    assert_int_equal(pick(z, 3, 1e6, 0, 1, 0.5), 1);
    /* a NaN or an infinity anywhere: no token, greedy or sampled */
    const float nan_at_end[3] = {0.0f, 1.0f, NAN}, inf_first[3] = {INFINITY, 1.0f, 0.0f};
    assert_int_equal(pick(nan_at_end, 3, 0, 0, 1, 0.5), -1);
    assert_int_equal(pick(nan_at_end, 3, 1, 0, 0.9, 0.5), -1);
    assert_int_equal(pick(inf_first, 3, 0, 0, 1, 0.5), -1);
}

static void test_validate(void **state) {
    (void)state;
    SampleOptions o;
    NsaError err = {{0}};
    sampleDefaults(&o);
    assert_int_equal(sampleValidate(&o, &err), 0);
    o.temperature = -1;
    assert_int_equal(sampleValidate(&o, &err), -1);
    assert_non_null(strstr(err.message, "temperature"));
    sampleDefaults(&o);
    o.top_p = 0;
    assert_int_equal(sampleValidate(&o, &err), -1);
    assert_non_null(strstr(err.message, "top_p"));
    sampleDefaults(&o);
    o.max_tokens = 0;
    assert_int_equal(sampleValidate(&o, &err), -1);
    assert_non_null(strstr(err.message, "max_tokens"));
    sampleDefaults(&o);
    o.n_stops = 1;
    assert_int_equal(sampleValidate(&o, &err), -1);   /* an empty stop string */
    assert_non_null(strstr(err.message, "stop[0]"));
}

static void test_utf8_hold_back(void **state) {
    (void)state;
    assert_int_equal(sampleUtf8Complete("abc", 3), 3);
    assert_int_equal(sampleUtf8Complete("a\xc3", 2), 1);           /* é cut after its lead */
    assert_int_equal(sampleUtf8Complete("a\xc3\xa9", 3), 3);
    assert_int_equal(sampleUtf8Complete("\xe2\x82", 2), 0);        /* € incomplete */
    assert_int_equal(sampleUtf8Complete("\xe2\x82\xac!", 4), 4);
    assert_int_equal(sampleUtf8Complete("\xff" "a", 2), 2);        /* invalid: passed on */
    assert_int_equal(sampleUtf8Complete("\xc3" "a", 2), 2);        /* broken sequence: passed on */
}

/* ---- generation on a small random model ---------------------------------------------- */

static NsaModelConfig smallConfig(void) {
    NsaModelConfig c;
    nsaModelConfigDefaults(&c);
    c.dim = 16;
    c.n_layers = 2;
    c.n_heads = 2;
    c.n_kv_groups = 1;
    c.d_k = 8;
    c.d_v = 8;
    c.cmp_len = 4;
    c.cmp_stride = 2;
    c.sel_len = 4;
    c.n_sel = 3;
    c.window = 6;
    return c;
}

/* A model with larger weights than the init's (peaked distributions). */
static NsaModel *randomModel(const NsaModelConfig *cfg, int B, int S) {
    NsaEngineOptions eo = {.device = NSA_DEVICE_CPU, .precision = NSA_PREC_F32, .max_batch = B,
                           .max_seq_len = S, .threads = 1};
    NsaError err = {{0}};
    NsaModel *m = nsaModelCreate(cfg, &eo, &err);
    if (!m) fail_msg("%s", err.message);
    NsaRng rng;
    nsaRngSeed(&rng, 77, 1);
    for (int i = 0; i < nsaModelNumTensors(m); i++) {
        const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
        float *w = testAlloc(ti->numel, sizeof(float));
        testFillF32(&rng, w, ti->numel, ti->ndim == 1 ? 0.9 : -0.5, ti->ndim == 1 ? 1.1 : 0.5);
        assert_int_equal(nsaModelSetTensor(m, NSA_ARENA_PARAMS, i, w, &err), 0);
        free(w);
    }
    return m;
}

typedef struct Capture {
    char text[SAMPLE_MAX_PROMPTS][2048];
    size_t len[SAMPLE_MAX_PROMPTS];
    int cancel_after;   /* emits before cancelling; 0 never */
    int emitted;
} Capture;

static int capture(void *ctx, int prompt, const char *bytes, size_t len) {
    Capture *c = ctx;
    memcpy(c->text[prompt] + c->len[prompt], bytes, len);
    c->len[prompt] += len;
    c->text[prompt][c->len[prompt]] = '\0';
    return c->cancel_after && ++c->emitted >= c->cancel_after;
}

/* Each prompt's token ids (sampleGenerateIds). */
typedef struct IdCapture {
    int32_t ids[SAMPLE_MAX_PROMPTS][256];
    int n[SAMPLE_MAX_PROMPTS];
} IdCapture;

static int captureId(void *ctx, int prompt, int32_t id) {
    IdCapture *c = ctx;
    c->ids[prompt][c->n[prompt]++] = id;
    return 0;
}

static NsaDecoder *decoderOf(NsaModel *m, int slots, int context) {
    NsaDecoderOptions o = {.device = NSA_DEVICE_CPU, .precision = NSA_PREC_F32,
                           .max_batch = slots, .max_context = context};
    NsaError err = {{0}};
    NsaDecoder *d = nsaDecoderCreate(nsaModelGetConfig(m), &o, &err);
    if (!d || nsaDecoderLoadModel(d, m, &err)) fail_msg("%s", err.message);
    return d;
}

static void generate(NsaDecoder *d, const char *const *prompts, int n, const SampleOptions *o,
                     Capture *c, SampleResult *res) {
    NsaError err = {{0}};
    memset(c->len, 0, sizeof c->len);
    c->emitted = 0;
    if (sampleGenerate(d, tokenizerFind("byte"), prompts, n, o, capture, c, res, &err))
        fail_msg("sampleGenerate: %s", err.message);
}

/* tokens [P + N]: a P-token prompt and N greedily generated tokens; each
 * generated token must be the arg max of the full forward's logits at the
 * position before it, and the N must not be one token repeated (so the check
 * has teeth). */
static void assertGreedy(NsaModel *m, const int32_t *tokens, const int32_t *targets, int P, int N,
                         int V) {
    NsaError err = {{0}};
    assert_int_equal(nsaModelForward(m, tokens, targets, 1, P + N, 1.0f, &err), 0);
    const float *logits = (const float *)nsaModelCpuEngine(m)->acts + nsaModelCpuEngine(m)->logits;
    int distinct = 0;
    for (int t = P - 1; t < P + N - 1; t++) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (logits[(size_t)t * V + v] > logits[(size_t)t * V + best]) best = v;
        assert_int_equal(best, tokens[t + 1]);
        distinct += tokens[t + 1] != tokens[t];
    }
    assert_true(distinct > 3);
}

/* Greedy generation = the arg max of the full forward at every position. */
static void test_greedy_matches_forward(void **state) {
    (void)state;
    enum { P = 5, N = 30 };
    NsaModelConfig cfg = smallConfig();
    NsaModel *m = randomModel(&cfg, 1, P + N);
    NsaDecoder *d = decoderOf(m, 1, P + N);
    SampleOptions o;
    sampleDefaults(&o);
    o.temperature = 0;
    o.max_tokens = N;
    Capture c = {0};
    SampleResult res;
    const char *prompts[1] = {"hello"};
    generate(d, prompts, 1, &o, &c, &res);
    assert_int_equal(res.tokens[0], N);
    assert_int_equal(res.stop[0], SAMPLE_STOP_TOKENS);
    int32_t tokens[P + N], targets[P + N];
    for (int t = 0; t < P; t++) tokens[t] = (unsigned char)"hello"[t];
    for (int t = 0; t < N; t++) tokens[P + t] = (unsigned char)c.text[0][t];
    for (int t = 0; t < P + N; t++) targets[t] = 0;
    assertGreedy(m, tokens, targets, P, N, cfg.vocab_size);
    nsaDecoderFree(d);
    nsaModelFree(m);
}

static void test_seeds_batches_stops(void **state) {
    (void)state;
    NsaModelConfig cfg = smallConfig();
    NsaModel *m = randomModel(&cfg, 1, 8);
    NsaDecoder *d = decoderOf(m, 3, 80);
    SampleOptions o;
    sampleDefaults(&o);
    o.max_tokens = 40;
    o.temperature = 1.0;
    o.seed = 5;
    Capture a = {0}, b = {0};
    SampleResult res;
    const char *one[1] = {"abc"};
    generate(d, one, 1, &o, &a, &res);
    generate(d, one, 1, &o, &b, &res);
    assert_string_equal(a.text[0], b.text[0]);          /* same seed, same text */
    assert_int_equal(a.len[0], 40);                     /* byte tokenizer: a byte a token */
    /* the prompt given as its ids gives the text's tokens, as ids */
    IdCapture as_ids = {0};
    NsaError ierr = {{0}};
    const int32_t abc[3] = {'a', 'b', 'c'};
    assert_int_equal(sampleGenerateIds(d, abc, 3, 1, &o, captureId, &as_ids, &res, &ierr), 0);
    assert_int_equal(as_ids.n[0], 40);
    for (int t = 0; t < 40; t++)
        assert_int_equal(as_ids.ids[0][t], (unsigned char)a.text[0][t]);
    o.seed = 6;
    generate(d, one, 1, &o, &b, &res);
    assert_true(strcmp(a.text[0], b.text[0]) != 0);     /* another seed, another text */
    /* batched: prompt 0 as alone (its stream is 0), the others on their own */
    o.seed = 5;
    const char *three[3] = {"abc", "a much longer prompt than the first", "z"};
    Capture batch = {0};
    generate(d, three, 3, &o, &batch, &res);
    assert_string_equal(batch.text[0], a.text[0]);
    for (int i = 0; i < 3; i++) assert_int_equal(res.tokens[i], 40);
    /* samples of one prompt share its prefill (a copied slot) and draw from
     * their own streams: sample 1 of {abc, abc} is what a prompt prefilled
     * in slot 1 on its own gives with stream 1 */
    const char *twice[2] = {"abc", "abc"}, *other_first[2] = {"zz", "abc"};
    Capture shared = {0}, own = {0};
    generate(d, twice, 2, &o, &shared, &res);
    generate(d, other_first, 2, &o, &own, &res);
    assert_string_equal(shared.text[0], a.text[0]);
    assert_string_equal(shared.text[1], own.text[1]);
    assert_true(strcmp(shared.text[0], shared.text[1]) != 0);
    /* greedy batched = greedy alone, prompt by prompt */
    o.temperature = 0;
    generate(d, three, 3, &o, &batch, &res);
    for (int i = 0; i < 3; i++) {
        Capture solo = {0};
        const char *p[1] = {three[i]};
        generate(d, p, 1, &o, &solo, &res);
        assert_string_equal(batch.text[i], solo.text[0]);
    }
    /* a stop string: the text ends at its first occurrence */
    const char *full = batch.text[1];
    char stop[3] = {full[10], full[11], 0};
    const char *first = strstr(full, stop);
    assert_non_null(first);
    o.n_stops = 1;
    snprintf(o.stops[0], sizeof o.stops[0], "%s", stop);
    Capture st = {0};
    const char *p1[1] = {three[1]};
    generate(d, p1, 1, &o, &st, &res);
    assert_int_equal(res.stop[0], SAMPLE_STOP_STRING);
    assert_int_equal(st.len[0], (size_t)(first - full) + 2);
    assert_memory_equal(st.text[0], full, st.len[0]);
    /* a cancel from the emitter ends every prompt */
    o.n_stops = 0;
    Capture cancel = {.cancel_after = 7};
    generate(d, three, 3, &o, &cancel, &res);
    assert_int_equal(cancel.emitted, 7);
    for (int i = 0; i < 3; i++) assert_int_equal(res.stop[i], SAMPLE_STOP_CANCEL);
    /* refusals: too long for the context, an empty prompt */
    NsaError err = {{0}};
    o.max_tokens = 79;
    assert_int_equal(sampleGenerate(d, tokenizerFind("byte"), one, 1, &o, NULL, NULL, &res, &err), -1);
    assert_non_null(strstr(err.message, "context"));
    o.max_tokens = 5;
    const char *empty[1] = {""};
    assert_int_equal(sampleGenerate(d, tokenizerFind("byte"), empty, 1, &o, NULL, NULL, &res, &err),
                     -1);
    assert_non_null(strstr(err.message, "empty"));
    nsaDecoderFree(d);
    nsaModelFree(m);
}

/* ---- a checkpoint opened for use; evaluation ----------------------------------------- */

/* m's weights as a checkpoint in dir (its checkpoints/step_N) at rs, with
 * mc_json as its model_config (NULL: job's model and nsa sections, as the
 * trainer writes them). */
static void saveModel(NsaModel *m, const JobConfig *job, const char *mc_json, const char *dir,
                      const ResumeState *rs) {
    char *own = NULL;
    if (!mc_json) {
        cJSON *all = artifactsConfigJson(job), *mc = cJSON_CreateObject();
        cJSON_AddItemToObject(mc, "model", cJSON_DetachItemFromObject(all, "model"));
        cJSON_AddItemToObject(mc, "nsa", cJSON_DetachItemFromObject(all, "nsa"));
        mc_json = own = cJSON_PrintUnformatted(mc);
        cJSON_Delete(all);
        cJSON_Delete(mc);
    }
    char saved[4096];
    NsaError err = {{0}};
    if (checkpointSave(m, dir, rs, 0, mc_json, saved, sizeof saved, &err))
        fail_msg("checkpointSave: %s", err.message);
    free(own);
}

/* Writes len bytes of data to dir/name; its path into path (cap bytes). */
static void writeFile(const char *dir, const char *name, const void *data, size_t len, char *path,
                      size_t cap) {
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void test_weights_and_eval(void **state) {
    (void)state;
    char *dir = testTempDir("sample");
    JobConfig job;
    configDefaults(&job);
    job.model = smallConfig();
    job.train.seq_len = 16;
    job.train.batch_size = 3;
    NsaModel *m = randomModel(&job.model, 3, 16);
    ResumeState rs = {.step = 12, .seed = 3, .tokens_seen = 999};
    NsaError err = {{0}};
    saveModel(m, &job, NULL, dir, &rs);

    Weights w;
    if (weightsOpen(dir, &w, &err)) fail_msg("weightsOpen: %s", err.message);   /* a run dir: its latest */
    assert_int_equal(w.state.step, 12);
    assert_int_equal(w.state.tokens_seen, 999);
    assert_memory_equal(&w.job.model, &job.model, sizeof job.model);
    assert_string_equal(weightsTokenizer(&w), "byte");
    assert_true(isnan(w.bits_per_byte));                /* no val.csv */

    /* a text file of 200 bytes: windows of 17, stride 16 */
    char path[4200];
    snprintf(path, sizeof path, "%s/held.txt", dir);
    FILE *f = fopen(path, "w");
    char text[201];
    for (int i = 0; i < 200; i++) text[i] = (char)('a' + (i * 7 + i / 13) % 26);
    text[200] = 0;
    fputs(text, f);
    fclose(f);
    EvalOptions eo = {.device = NSA_DEVICE_CPU, .precision = NSA_PREC_F32, .threads = 1,
                      .seq_len = 16};
    evalOptionsFromPath(&eo, path);
    assert_int_equal(eo.shards, 0);
    EvalResult r1, r3;
    eo.batch = 1;
    if (evalRun(&w, &eo, NULL, NULL, &r1, &err)) fail_msg("evalRun: %s", err.message);
    eo.batch = 3;
    assert_int_equal(evalRun(&w, &eo, NULL, NULL, &r3, &err), 0);
    assert_int_equal(r1.windows, 12);   /* the stream is the text + "\n\n": (202 - 1) / 16 */
    assert_int_equal(r1.tokens, r1.windows * 16);
    assert_int_equal(r3.tokens, r1.tokens);              /* 12 windows: the last batch is whole */
    assert_true(fabs(r1.loss - r3.loss) <= 1e-12 * r1.loss);
    assert_true(fabs(r1.bits_per_byte - r1.loss / log(2.0)) <= 1e-12);
    /* by hand: window k = bytes [16k, 16k + 17) */
    double sum = 0;
    for (int k = 0; k < r1.windows; k++) {
        int32_t tok[16], tgt[16];
        for (int t = 0; t < 16; t++) {
            tok[t] = (unsigned char)text[16 * k + t];
            tgt[t] = (unsigned char)text[16 * k + t + 1];
        }
        double loss;
        assert_int_equal(nsaModelEvalLoss(m, tok, tgt, 1, 16, &loss, &err), 0);
        sum += loss;
    }
    assert_true(fabs(sum / r1.windows - r1.loss) <= 1e-9);
    /* max_tokens: the windows that reach it */
    eo.max_tokens = 40;
    assert_int_equal(evalRun(&w, &eo, NULL, NULL, &r3, &err), 0);
    assert_int_equal(r3.windows, 3);
    assert_int_equal(r3.tokens, 48);
    /* a file shorter than one window */
    snprintf(path, sizeof path, "%s/short.txt", dir);
    f = fopen(path, "w");
    fputs("tiny", f);
    fclose(f);
    evalOptionsFromPath(&eo, path);
    assert_int_equal(evalRun(&w, &eo, NULL, NULL, &r3, &err), -1);
    assert_true(err.message[0] != 0);
    weightsClose(&w);

    /* an env.json whose config does not load here: a 256-token model is
     * read with the byte tokenizer (with a warning), any other refused,
     * never silently decoded as bytes */
    snprintf(path, sizeof path, "%s/env.json", dir);
    f = fopen(path, "w");
    fputs("{\"config_yaml\": \"model: {dim: -1}\\n\"}", f);
    fclose(f);
    assert_int_equal(job.model.vocab_size, 256);
    if (weightsOpen(dir, &w, &err)) fail_msg("weightsOpen: %s", err.message);
    assert_string_equal(weightsTokenizer(&w), "byte");
    weightsClose(&w);
    char *dir2 = testTempDir("sample-v300");
    JobConfig job2 = job;
    job2.model.vocab_size = 300;
    NsaModel *m2 = randomModel(&job2.model, 3, 16);
    saveModel(m2, &job2, NULL, dir2, &rs);
    nsaModelFree(m2);
    snprintf(path, sizeof path, "%s/env.json", dir2);
    f = fopen(path, "w");
    fputs("{\"config_yaml\": \"model: {dim: -1}\\n\"}", f);
    fclose(f);
    assert_int_equal(weightsOpen(dir2, &w, &err), -1);
    assert_non_null(strstr(err.message, "env.json's config does not load here"));
    assert_non_null(strstr(err.message, "vocabulary (300)"));
    testRemoveTree(dir2);
    free(dir2);

    /* a checkpoint whose tensors do not match its config is refused */
    assert_int_equal(weightsOpen("/nonexistent-dir", &w, &err), -1);
    nsaModelFree(m);
    testRemoveTree(dir);
    free(dir);
}

/* ---- a model of fewer ids than bytes (token shards of its own vocabulary) -------------- */

/* An llm.c shard of n tokens (header: magic, version, count) at path. */
static void writeShard(const char *path, const uint16_t *tokens, int n) {
    int32_t header[256] = {20240520, 1, n};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(header, sizeof header, 1, f), 1);
    assert_int_equal(fwrite(tokens, sizeof *tokens, (size_t)n, f), (size_t)n);
    fclose(f);
}

/* A checkpoint of a 100-token model (a run on shards of a 100-token
 * vocabulary) opens for use: its model config is checked as a model, not
 * against the default byte tokenizer. It has no text form: it samples as
 * token ids (greedy = the forward's arg max), evaluates on shards, and a
 * text prompt or text data is refused naming why. */
static void test_small_vocab_checkpoint(void **state) {
    (void)state;
    enum { V = 100, P = 5, N = 30 };
    char *dir = testTempDir("sample-v100");
    JobConfig job;
    configDefaults(&job);
    job.model = smallConfig();
    job.model.vocab_size = V;
    NsaModel *m = randomModel(&job.model, 1, P + N);
    ResumeState rs = {.step = 7, .seed = 3, .tokens_seen = 448};
    saveModel(m, &job, NULL, dir, &rs);

    /* no run config beside it: the tokenizer cannot be bytes */
    Weights w;
    NsaError err = {{0}};
    if (weightsOpen(dir, &w, &err)) fail_msg("weightsOpen: %s", err.message);
    assert_int_equal(w.job.model.vocab_size, V);
    assert_memory_equal(&w.job.model, &job.model, sizeof job.model);
    assert_string_equal(weightsTokenizer(&w), WEIGHTS_TOKENIZER_UNKNOWN);
    assert_null(weightsTextTokenizer(&w, &err));
    assert_non_null(strstr(err.message, "tokenizer is unknown"));
    assert_non_null(strstr(err.message, "vocabulary of 100"));

    /* sampled as ids: greedy = the full forward's arg max at every position */
    NsaDecoder *d = weightsNewDecoder(&w, NSA_DEVICE_CPU, 0, 2, P + N, 1, &err);
    if (!d) fail_msg("weightsNewDecoder: %s", err.message);
    const int32_t prompt[P] = {5, 17, 99, 0, 42};
    SampleOptions o;
    sampleDefaults(&o);
    o.temperature = 0;
    o.max_tokens = N;
    IdCapture c = {0};
    SampleResult res;
    if (sampleGenerateIds(d, prompt, P, 1, &o, captureId, &c, &res, &err))
        fail_msg("sampleGenerateIds: %s", err.message);
    assert_int_equal(res.tokens[0], N);
    assert_int_equal(c.n[0], N);
    assert_int_equal(res.stop[0], SAMPLE_STOP_TOKENS);
    int32_t tokens[P + N], targets[P + N];
    memcpy(tokens, prompt, sizeof prompt);
    memcpy(tokens + P, c.ids[0], N * sizeof(int32_t));
    for (int t = 0; t < P + N; t++)
        targets[t] = 0;
    assertGreedy(m, tokens, targets, P, N, V);
    /* two continuations: continuation 0 is the single one of that seed */
    o.temperature = 1.0;
    o.seed = 11;
    IdCapture one = {0}, two = {0};
    assert_int_equal(sampleGenerateIds(d, prompt, P, 1, &o, captureId, &one, &res, &err), 0);
    assert_int_equal(sampleGenerateIds(d, prompt, P, 2, &o, captureId, &two, &res, &err), 0);
    assert_int_equal(two.n[0], N);
    assert_int_equal(two.n[1], N);
    assert_memory_equal(two.ids[0], one.ids[0], N * sizeof(int32_t));
    assert_true(memcmp(two.ids[1], two.ids[0], N * sizeof(int32_t)) != 0);
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < N; t++)
            assert_true(two.ids[i][t] >= 0 && two.ids[i][t] < V);
    /* refusals, each naming what was wrong */
    const int32_t out_of_vocab[2] = {3, V};
    assert_int_equal(sampleGenerateIds(d, out_of_vocab, 2, 1, &o, NULL, NULL, &res, &err), -1);
    assert_non_null(strstr(err.message, "id 100; allowed: 0 to 99"));
    assert_int_equal(sampleGenerateIds(d, prompt, 0, 1, &o, NULL, NULL, &res, &err), -1);
    assert_non_null(strstr(err.message, "empty"));
    o.n_stops = 1;
    snprintf(o.stops[0], sizeof o.stops[0], "x");
    assert_int_equal(sampleGenerateIds(d, prompt, P, 1, &o, NULL, NULL, &res, &err), -1);
    assert_non_null(strstr(err.message, "stop strings need text"));
    o.n_stops = 0;
    o.max_tokens = N + 1;
    assert_int_equal(sampleGenerateIds(d, prompt, P, 1, &o, NULL, NULL, &res, &err), -1);
    assert_non_null(strstr(err.message, "context"));
    assert_int_equal(sampleGenerate(d, tokenizerFind("byte"), (const char *[]){"hi"}, 1, &o, NULL,
                                    NULL, &res, &err),
                     -1);
    assert_non_null(strstr(err.message, "256 ids do not fit the model's vocabulary (100)"));
    nsaDecoderFree(d);

    /* evaluated on shards of its vocabulary: the loss of the windows by hand */
    enum { S = 8, T = 60 };
    uint16_t stream[T];
    for (int i = 0; i < T; i++)
        stream[i] = (uint16_t)((i * 37 + i / 7) % V);
    char path[4200];
    snprintf(path, sizeof path, "%s/held_val_000.bin", dir);
    writeShard(path, stream, T);
    EvalOptions eo = {.device = NSA_DEVICE_CPU,
                      .precision = NSA_PREC_F32,
                      .threads = 1,
                      .seq_len = S,
                      .batch = 1};
    evalOptionsFromPath(&eo, path);
    assert_int_equal(eo.shards, 1);
    EvalResult r;
    if (evalRun(&w, &eo, NULL, NULL, &r, &err)) fail_msg("evalRun: %s", err.message);
    assert_int_equal(r.windows, (T - 1) / S);
    assert_true(isnan(r.bits_per_byte)); /* token shards: no bytes */
    double sum = 0;
    for (int k = 0; k < r.windows; k++) {
        int32_t tok[S], tgt[S];
        for (int t = 0; t < S; t++)
            tok[t] = stream[S * k + t], tgt[t] = stream[S * k + t + 1];
        double loss;
        assert_int_equal(nsaModelEvalLoss(m, tok, tgt, 1, S, &loss, &err), 0);
        sum += loss;
    }
    assert_true(fabs(sum / r.windows - r.loss) <= 1e-9);
    /* a shard token outside the vocabulary, and text, are refused */
    stream[20] = V;
    writeShard(path, stream, T);
    assert_int_equal(evalRun(&w, &eo, NULL, NULL, &r, &err), -1);
    assert_non_null(strstr(err.message, "token 100 is not below model.vocab_size (100)"));
    char txt[4200];
    writeFile(dir, "held.txt", "some text to evaluate on, long enough", 37, txt, sizeof txt);
    evalOptionsFromPath(&eo, txt);
    assert_int_equal(evalRun(&w, &eo, NULL, NULL, &r, &err), -1);
    assert_non_null(strstr(err.message, "is text"));
    assert_non_null(strstr(err.message, ".bin token shards"));
    weightsClose(&w);

    /* with its run's config: the shard run's tokenizer, which nsad cannot run */
    const char *env = "{\"config_yaml\": \"data: {source: shards, path: /x/t.bin, tokenizer: "
                      "char100}\\n\"}";
    writeFile(dir, "env.json", env, strlen(env), path, sizeof path);
    if (weightsOpen(dir, &w, &err)) fail_msg("weightsOpen: %s", err.message);
    assert_int_equal(w.have_run_config, 1);
    assert_int_equal(w.job.model.vocab_size, V);
    assert_string_equal(weightsTokenizer(&w), "char100");
    assert_null(weightsTextTokenizer(&w, &err));
    assert_non_null(strstr(err.message, "'char100'"));
    assert_non_null(strstr(err.message, "only token ids"));
    weightsClose(&w);
    testRemoveTree(dir);

    /* bad model configs are still refused, naming the key */
    job.model.vocab_size = 1;
    saveModel(m, &job, "{\"model\":{\"vocab_size\":1}}", dir, &rs);
    assert_int_equal(weightsOpen(dir, &w, &err), -1);
    assert_non_null(strstr(err.message, "model_config does not load"));
    assert_non_null(strstr(err.message, "model.vocab_size: 1 is out of range"));
    testRemoveTree(dir);
    saveModel(m, &job, "{\"model\":{\"vocab_size\":100},\"data\":{\"tokenizer\":\"x\"}}", dir, &rs);
    assert_int_equal(weightsOpen(dir, &w, &err), -1);
    assert_non_null(strstr(err.message, "data: not a section of a model config"));
    nsaModelFree(m);
    testRemoveTree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick_rules),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_utf8_hold_back),
        cmocka_unit_test(test_greedy_matches_forward),
        cmocka_unit_test(test_seeds_batches_stops),
        cmocka_unit_test(test_weights_and_eval),
        cmocka_unit_test(test_small_vocab_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
