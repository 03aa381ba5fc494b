/* test_dp.c - data parallelism on the CPU engine: the bucket layout and
 * the ZeRO-1 shard tables, the in-process transport (its collectives, its
 * deadline, abort and stall), and models of several ranks (threads of this
 * program) against a model alone: one rank equals no transport bit for
 * bit, the sharded optimizer equals the whole one bit for bit when the
 * ranks see the same data, two ranks equal one rank accumulating their two
 * micro-batches within a tight tolerance, a NaN on one rank is skipped by
 * all, and a rank that stalls fails the others by the deadline instead of
 * hanging them. Rank threads never call cmocka: they record, the main
 * thread asserts. */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "nsa.h"
#include "nsa_layout.h"
#include "nsa_rng.h"
#include "testutil.h"

enum { TB = 2, TS = 13, MAX_RANKS = 4, STEPS = 3 };

static NsaModelConfig tinyConfig(void) {
    NsaModelConfig c;
    nsaModelConfigDefaults(&c);
    c.vocab_size = 11;
    c.dim = 8;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_groups = 2;
    c.d_k = 4;
    c.d_v = 6;
    c.mlp_hidden = 16;
    c.cmp_len = 4;
    c.cmp_stride = 2;
    c.sel_len = 4;
    c.n_sel = 3;
    c.window = 5;
    return c;
}

/* Micro-batch k of step s: seeded random ids, B = TB rows. */
static void batchOf(int step, int k, int32_t *tokens, int32_t *targets) {
    NsaRng rng;
    nsaRngSeed(&rng, 4242 + (uint64_t)step * 131 + (uint64_t)k, 5);
    for (int b = 0; b < TB; b++) {
        int32_t prev = (int32_t)nsaRngBelow(&rng, 11);
        for (int t = 0; t < TS; t++) {
            int32_t next = (int32_t)nsaRngBelow(&rng, 11);
            tokens[b * TS + t] = prev;
            targets[b * TS + t] = next;
            prev = next;
        }
    }
}

static NsaModel *makeModel(NsaComm *comm) {
    const NsaModelConfig cfg = tinyConfig();
    NsaEngineOptions opt = {.device = NSA_DEVICE_CPU,
                            .precision = NSA_PREC_F32,
                            .max_batch = TB,
                            .max_seq_len = TS,
                            .threads = 1,
                            .comm = comm};
    NsaError err = {{0}};
    NsaModel *m = nsaModelCreate(&cfg, &opt, &err);
    if (!m) fail_msg("nsaModelCreate: %s", err.message);
    if (nsaModelInit(m, 7, &err)) fail_msg("nsaModelInit: %s", err.message);
    return m;
}

static NsaOptimConfig optimConfig(float clip) {
    NsaOptimConfig oc = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                         .weight_decay = 0.1f, .grad_clip = clip};
    return oc;
}

/* Every arena of tensor i as seen by a model alone (or gathered). */
static float *tensorCopy(NsaModel *m, NsaArena arena, int i) {
    const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
    float *x = testAlloc(ti->numel, sizeof(float));
    NsaError err = {{0}};
    if (nsaModelGetTensor(m, arena, i, x, &err)) fail_msg("GetTensor: %s", err.message);
    return x;
}

/* ---- threads, one per rank ----------------------------------------------------- */

typedef void (*RankFn)(void *ctx, int rank);

typedef struct RankArg {
    RankFn fn;
    void *ctx;
    int rank;
} RankArg;

static void *rankMain(void *p) {
    RankArg *a = p;
    a->fn(a->ctx, a->rank);
    return NULL;
}

/* Runs fn(ctx, r) for r in [0, world) on threads of their own; joins. */
static void runRanks(int world, RankFn fn, void *ctx) {
    pthread_t th[MAX_RANKS];
    RankArg args[MAX_RANKS];
    for (int r = 0; r < world; r++) {
        args[r] = (RankArg){fn, ctx, r};
        if (pthread_create(&th[r], NULL, rankMain, &args[r])) fail_msg("pthread_create");
    }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
}

/* ---- layout and shards ----------------------------------------------------------- */

static void test_buckets_tile_the_arena(void **state) {
    (void)state;
    const NsaModelConfig cfg = tinyConfig();
    NsaLayout one, lay;
    NsaError err = {{0}};
    assert_int_equal(nsaLayoutBuild(&one, &cfg, &err), 0);
    for (int ranks = 1; ranks <= 3; ranks++) {
        assert_int_equal(nsaLayoutBuildRanks(&lay, &cfg, ranks, &err), 0);
        assert_int_equal(lay.n_buckets, cfg.n_layers + 2);
        size_t at = 0;
        int tensor = 0;
        for (int b = 0; b < lay.n_buckets; b++) {
            const NsaLayoutBucket *bk = &lay.buckets[b];
            assert_int_equal(bk->offset, at);
            assert_int_equal(bk->first, tensor);
            assert_int_equal(bk->count % ((size_t)ranks * NSA_LAYOUT_ALIGN), 0);
            const NsaTensorInfo *last = &lay.entries[bk->end - 1].info;
            assert_true(last->offset + last->numel <= bk->offset + bk->count);
            at += bk->count;
            tensor = bk->end;
        }
        assert_int_equal(at, lay.total);
        assert_int_equal(tensor, lay.n_tensors);
        /* the embedding, each layer from its attn_norm, the head from final_norm */
        assert_int_equal(lay.buckets[NSA_BUCKET_EMBED].first, lay.tok_emb);
        for (int i = 0; i < cfg.n_layers; i++)
            assert_int_equal(lay.buckets[NSA_BUCKET_LAYER(i)].first, lay.layers[i].attn_norm);
        assert_int_equal(lay.buckets[NSA_BUCKET_HEAD(cfg.n_layers)].first, lay.final_norm);
        if (ranks == 1) /* no padding beyond the tensors' own: the old offsets */
            for (int i = 0; i < lay.n_tensors; i++)
                assert_int_equal(lay.entries[i].info.offset, one.entries[i].info.offset);
        nsaLayoutFree(&lay);
    }
    nsaLayoutFree(&one);
}

static void test_shards_cover_each_tensor_once(void **state) {
    (void)state;
    const NsaModelConfig cfg = tinyConfig();
    for (int ranks = 1; ranks <= 3; ranks++) {
        NsaLayout lay;
        NsaError err = {{0}};
        assert_int_equal(nsaLayoutBuildRanks(&lay, &cfg, ranks, &err), 0);
        unsigned char *owned = testAlloc(lay.total, 1);
        size_t shard_total = 0;
        for (int r = 0; r < ranks; r++) {
            NsaShard sh;
            assert_int_equal(nsaShardBuild(&sh, &lay, r, &err), 0);
            assert_int_equal(sh.total * (size_t)ranks, lay.total);
            shard_total += sh.total;
            for (int p = 0; p < sh.n_pieces; p++) {
                const NsaShardPiece *pc = &sh.pieces[p];
                const NsaTensorInfo *ti = &lay.entries[pc->tensor].info;
                assert_int_equal(pc->offset, ti->offset + pc->begin);
                assert_true(pc->begin + pc->numel <= ti->numel);
                assert_true(pc->local + pc->numel <= sh.total);
                assert_int_equal(pc->weight_decay, ti->weight_decay);
                assert_int_equal(sh.tensor_piece[pc->tensor], p);
                if (ranks == 1) assert_int_equal(pc->local, pc->offset);
                for (size_t j = 0; j < pc->numel; j++) {
                    assert_int_equal(owned[pc->offset + j], 0);
                    owned[pc->offset + j] = 1;
                }
            }
            nsaShardFree(&sh);
        }
        assert_int_equal(shard_total, lay.total);
        for (int i = 0; i < lay.n_tensors; i++)
            for (size_t j = 0; j < lay.entries[i].info.numel; j++)
                assert_int_equal(owned[lay.entries[i].info.offset + j], 1);
        free(owned);
        nsaLayoutFree(&lay);
    }
}

/* ---- the local transport --------------------------------------------------------- */

typedef struct Exchange {
    NsaComm *comms[MAX_RANKS];
    int world;
    float *bufs[MAX_RANKS];
    size_t shard;
    int rc[MAX_RANKS];
    NsaError err[MAX_RANKS];
    int op;                 /* which collective rank 1 issues (mismatch test) */
} Exchange;

static float valueOf(int rank, size_t i) { return (float)(0.1 * (rank + 1)) + (float)i * 1e-3f; }

static void collectivesRank(void *ctx, int r) {
    Exchange *x = ctx;
    const size_t n = x->shard * (size_t)x->world;
    float *b = x->bufs[r];
    for (size_t i = 0; i < n; i++) b[i] = valueOf(r, i);
    x->rc[r] = nsaCommReduceScatter(x->comms[r], b, x->shard, 0, NULL, "test reduce", &x->err[r]);
    /* each slice now holds its sum; gather them all, then broadcast rank 1's */
    if (!x->rc[r])
        x->rc[r] = nsaCommAllGather(x->comms[r], b, x->shard * sizeof(float), NULL, "test gather",
                                    &x->err[r]);
    if (!x->rc[r] && r != 1) memset(b, 0, n * sizeof(float));
    if (!x->rc[r])
        x->rc[r] = nsaCommBroadcast(x->comms[r], b, n * sizeof(float), 1, NULL, "test bcast",
                                    &x->err[r]);
}

static void test_local_collectives(void **state) {
    (void)state;
    Exchange x = {.world = 3, .shard = 37};
    NsaError err = {{0}};
    assert_int_equal(nsaCommLocalCreate(x.world, 60, x.comms, &err), 0);
    for (int r = 0; r < x.world; r++) {
        assert_int_equal(nsaCommRank(x.comms[r]), r);
        assert_int_equal(nsaCommWorld(x.comms[r]), x.world);
        assert_string_equal(nsaCommKind(x.comms[r]), "local");
        x.bufs[r] = testAlloc(x.shard * (size_t)x.world, sizeof(float));
    }
    runRanks(x.world, collectivesRank, &x);
    for (int r = 0; r < x.world; r++) {
        if (x.rc[r]) fail_msg("rank %d: %s", r, x.err[r].message);
        for (size_t i = 0; i < x.shard * (size_t)x.world; i++) {
            float want = valueOf(0, i); /* summed in rank order */
            for (int k = 1; k < x.world; k++) want += valueOf(k, i);
            assert_memory_equal(&x.bufs[r][i], &want, sizeof want);
        }
    }
    for (int r = 0; r < x.world; r++) {
        free(x.bufs[r]);
        nsaCommFree(x.comms[r]);
    }
}

/* Rank 0 alone reaches a collective; rank 1 only after rank 0 returned. */
static void lonelyRank(void *ctx, int r) {
    Exchange *x = ctx;
    x->rc[r] = nsaCommReduceScatter(x->comms[r], x->bufs[r], x->shard, 0, NULL,
                                    "reduce-scatter of bucket 2 (layer 1)", &x->err[r]);
}

static void test_deadline_names_the_missing_rank(void **state) {
    (void)state;
    Exchange x = {.world = 2, .shard = 4};
    NsaError err = {{0}};
    assert_int_equal(nsaCommLocalCreate(2, 0.05, x.comms, &err), 0);
    for (int r = 0; r < 2; r++) x.bufs[r] = testAlloc(8, sizeof(float));
    runRanks(1, lonelyRank, &x); /* rank 0 only: rank 1 cannot arrive */
    assert_int_equal(x.rc[0], -1);
    assert_non_null(strstr(x.err[0].message, "rank 0: reduce-scatter of bucket 2 (layer 1): rank 1 "
                                             "did not arrive within 0.05 s"));
    char reason[400];
    assert_int_equal(nsaCommAborted(x.comms[1], reason, sizeof reason), 1);
    assert_non_null(strstr(reason, "rank 1 did not arrive"));
    /* the late rank fails at once, with the reason, instead of waiting */
    x.rc[1] = nsaCommReduceScatter(x.comms[1], x.bufs[1], 4, 0, NULL, "late", &x.err[1]);
    assert_int_equal(x.rc[1], -1);
    assert_non_null(strstr(x.err[1].message, "rank 1: late: the transport was aborted"));
    for (int r = 0; r < 2; r++) {
        free(x.bufs[r]);
        nsaCommFree(x.comms[r]);
    }
}

static void test_abort_wakes_a_waiting_rank(void **state) {
    (void)state;
    Exchange x = {.world = 2, .shard = 4};
    NsaError err = {{0}};
    assert_int_equal(nsaCommLocalCreate(2, 3600, x.comms, &err), 0);
    for (int r = 0; r < 2; r++) x.bufs[r] = testAlloc(8, sizeof(float));
    pthread_t th;
    RankArg arg = {.fn = lonelyRank, .ctx = &x, .rank = 0};
    assert_int_equal(pthread_create(&th, NULL, rankMain, &arg), 0);
    /* before or while rank 0 waits: either way its call fails now */
    nsaCommAbort(x.comms[1], "the watchdog gave up on rank 1");
    pthread_join(th, NULL);
    assert_int_equal(x.rc[0], -1);
    assert_non_null(strstr(x.err[0].message, "the watchdog gave up on rank 1"));
    for (int r = 0; r < 2; r++) {
        free(x.bufs[r]);
        nsaCommFree(x.comms[r]);
    }
}

static void mismatchedRank(void *ctx, int r) {
    Exchange *x = ctx;
    if (r == 0)
        x->rc[r] = nsaCommReduceScatter(x->comms[r], x->bufs[r], x->shard, 0, NULL, "step", &x->err[r]);
    else
        x->rc[r] = nsaCommAllGather(x->comms[r], x->bufs[r], x->shard * sizeof(float), NULL, "step",
                                    &x->err[r]);
}

static void test_mismatched_calls_fail_on_every_rank(void **state) {
    (void)state;
    Exchange x = {.world = 2, .shard = 4};
    NsaError err = {{0}};
    assert_int_equal(nsaCommLocalCreate(2, 60, x.comms, &err), 0);
    for (int r = 0; r < 2; r++) x.bufs[r] = testAlloc(8, sizeof(float));
    runRanks(2, mismatchedRank, &x);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(x.rc[r], -1);
        assert_non_null(strstr(x.err[r].message, "the same collectives in the same order"));
        free(x.bufs[r]);
        nsaCommFree(x.comms[r]);
    }
}

static void test_stalled_rank_is_cut_off(void **state) {
    (void)state;
    Exchange x = {.world = 2, .shard = 4};
    NsaError err = {{0}};
    assert_int_equal(nsaCommLocalCreate(2, 0.05, x.comms, &err), 0);
    for (int r = 0; r < 2; r++) x.bufs[r] = testAlloc(8, sizeof(float));
    /* rank 1 sleeps in its next collective far longer than the deadline;
     * the abort that rank 0's deadline raises ends the sleep */
    nsaCommInjectStall(x.comms[1], 3600);
    runRanks(2, lonelyRank, &x);
    assert_int_equal(x.rc[0], -1);
    assert_non_null(strstr(x.err[0].message, "rank 1 did not arrive"));
    assert_int_equal(x.rc[1], -1);
    assert_non_null(strstr(x.err[1].message, "the transport was aborted"));
    for (int r = 0; r < 2; r++) {
        free(x.bufs[r]);
        nsaCommFree(x.comms[r]);
    }
}

/* ---- models of several ranks ------------------------------------------------------ */

typedef struct Job {
    int world;
    NsaModel *models[MAX_RANKS];
    int same_data;        /* every rank gets micro-batch 0 (else rank r gets r) */
    int reduce_in_backward;
    float clip;
    int nan_rank;         /* rank whose step-2 gradient is poisoned, -1 none */
    double loss[MAX_RANKS][STEPS];
    int applied[MAX_RANKS][STEPS];
    int rc[MAX_RANKS];
    NsaError err[MAX_RANKS];
} Job;

static void jobRank(void *ctx, int r) {
    Job *job = ctx;
    NsaModel *m = job->models[r];
    NsaError *err = &job->err[r];
    int32_t tok[TB * TS], tgt[TB * TS];
    const NsaOptimConfig oc = optimConfig(job->clip);
    for (int s = 0; s < STEPS; s++) {
        batchOf(s, job->same_data ? 0 : r, tok, tgt);
        if (s == 1 && r == job->nan_rank && nsaModelInjectFault(m, NSA_FAULT_NAN_GRAD, err)) goto fail;
        NsaStepStats st;
        if (nsaModelZeroGrad(m, err) || nsaModelForward(m, tok, tgt, TB, TS, 1.0f, err) ||
            (job->reduce_in_backward ? nsaModelBackwardReduce(m, err) : nsaModelBackward(m, err)) ||
            nsaModelOptimizerStep(m, &oc, s + 1, err) || nsaModelStepStats(m, &st, err))
            goto fail;
        job->loss[r][s] = st.loss;
        job->applied[r][s] = st.applied;
    }
    job->rc[r] = 0;
    return;
fail:
    job->rc[r] = -1;
}

/* A model alone trained on micro-batches 0..accum-1 per step (grad_scale
 * 1/accum each), the reference the ranks are held to. */
static NsaModel *trainAlone(int accum, float clip, double *loss) {
    NsaModel *m = makeModel(NULL);
    NsaError err = {{0}};
    int32_t tok[TB * TS], tgt[TB * TS];
    const NsaOptimConfig oc = optimConfig(clip);
    for (int s = 0; s < STEPS; s++) {
        if (nsaModelZeroGrad(m, &err)) fail_msg("%s", err.message);
        for (int k = 0; k < accum; k++) {
            batchOf(s, k, tok, tgt);
            if (nsaModelForward(m, tok, tgt, TB, TS, 1.0f / (float)accum, &err) ||
                nsaModelBackward(m, &err))
                fail_msg("%s", err.message);
        }
        NsaStepStats st;
        if (nsaModelOptimizerStep(m, &oc, s + 1, &err) || nsaModelStepStats(m, &st, &err))
            fail_msg("%s", err.message);
        loss[s] = st.loss;
    }
    return m;
}

static void jobStart(Job *job, NsaComm **comms, double timeout) {
    NsaError err = {{0}};
    if (nsaCommLocalCreate(job->world, timeout, comms, &err)) fail_msg("%s", err.message);
    for (int r = 0; r < job->world; r++) job->models[r] = makeModel(comms[r]);
}

static void jobFree(Job *job, NsaComm **comms) {
    for (int r = 0; r < job->world; r++) {
        nsaModelFree(job->models[r]);
        nsaCommFree(comms[r]);
    }
}

static void jobRun(Job *job) {
    runRanks(job->world, jobRank, job);
    for (int r = 0; r < job->world; r++)
        if (job->rc[r]) fail_msg("rank %d: %s", r, job->err[r].message);
}

/* Every rank's weights equal ref's (bit for bit when exact, else within
 * tol of the relative 2-norm error per tensor). */
static void assertWeights(const Job *job, NsaModel *ref, int exact, double tol) {
    for (int i = 0; i < nsaModelNumTensors(ref); i++) {
        const NsaTensorInfo *ti = nsaModelTensorInfo(ref, i);
        float *want = tensorCopy(ref, NSA_ARENA_PARAMS, i);
        double *wide = testWidenF32(want, ti->numel);
        for (int r = 0; r < job->world; r++) {
            float *got = tensorCopy(job->models[r], NSA_ARENA_PARAMS, i);
            if (exact) {
                if (memcmp(got, want, ti->numel * sizeof(float)))
                    fail_msg("rank %d: %s differs from the model alone", r, ti->name);
            } else {
                double e = testRelErrF32(got, wide, ti->numel);
                if (!(e <= tol)) fail_msg("rank %d: %s rel err %.3g > %.3g", r, ti->name, e, tol);
            }
            free(got);
        }
        free(wide);
        free(want);
    }
}

static void test_one_rank_is_a_model_alone(void **state) {
    (void)state;
    double alone[STEPS];
    NsaModel *ref = trainAlone(1, 1.0f, alone);
    for (int in_backward = 0; in_backward < 2; in_backward++) {
        NsaComm *comms[1];
        Job job = {.world = 1, .same_data = 1, .reduce_in_backward = in_backward, .clip = 1.0f,
                   .nan_rank = -1};
        jobStart(&job, comms, 60);
        jobRun(&job);
        for (int s = 0; s < STEPS; s++) assert_memory_equal(&job.loss[0][s], &alone[s], sizeof(double));
        assertWeights(&job, ref, 1, 0);
        jobFree(&job, comms);
    }
    nsaModelFree(ref);
}

static void test_sharded_adamw_is_the_whole_one(void **state) {
    (void)state;
    /* every rank sees micro-batch 0: its gradient is exactly half the
     * alone model's, the sum exactly the same; without clipping (the
     * norm's sum runs in another order) the update is element by element */
    double alone[STEPS];
    NsaModel *ref = trainAlone(1, 0.0f, alone);
    for (int in_backward = 0; in_backward < 2; in_backward++) {
        NsaComm *comms[2];
        Job job = {.world = 2, .same_data = 1, .reduce_in_backward = in_backward, .clip = 0.0f,
                   .nan_rank = -1};
        jobStart(&job, comms, 60);
        jobRun(&job);
        for (int r = 0; r < 2; r++)
            for (int s = 0; s < STEPS; s++)
                assert_memory_equal(&job.loss[r][s], &alone[s], sizeof(double));
        assertWeights(&job, ref, 1, 0);
        /* the moments too: each rank's range, and gathered whole */
        for (int i = 0; i < nsaModelNumTensors(ref); i++) {
            const NsaTensorInfo *ti = nsaModelTensorInfo(ref, i);
            for (NsaArena a = NSA_ARENA_ADAM_M; a <= NSA_ARENA_ADAM_V; a++) {
                float *want = tensorCopy(ref, a, i);
                size_t covered = 0;
                for (int r = 0; r < 2; r++) {
                    size_t begin, end;
                    NsaError err = {{0}};
                    assert_int_equal(nsaModelTensorShard(job.models[r], i, &begin, &end, &err), 0);
                    covered += end - begin;
                    float *got = testAlloc(ti->numel, sizeof(float));
                    assert_int_equal(nsaModelGetTensor(job.models[r], a, i, got, &err), 0);
                    if (end > begin)
                        assert_memory_equal(got + begin, want + begin, (end - begin) * sizeof(float));
                    free(got);
                }
                assert_int_equal(covered, ti->numel);
                free(want);
            }
        }
        jobFree(&job, comms);
    }
    nsaModelFree(ref);
}

static void test_two_ranks_match_one_rank_accumulating(void **state) {
    (void)state;
    double alone[STEPS];
    NsaModel *ref = trainAlone(2, 1.0f, alone); /* micro-batches 0 and 1 */
    NsaComm *comms[2];
    Job job = {.world = 2, .reduce_in_backward = 1, .clip = 1.0f, .nan_rank = -1};
    jobStart(&job, comms, 60);
    jobRun(&job);
    for (int s = 0; s < STEPS; s++) {
        assert_memory_equal(&job.loss[0][s], &job.loss[1][s], sizeof(double));
        assert_true(fabs(job.loss[0][s] - alone[s]) <= 1e-6 * fabs(alone[s]));
    }
    assertWeights(&job, ref, 0, 1e-5);
    /* what the step's communication cost: the CPU transport hides nothing */
    for (int r = 0; r < 2; r++) {
        NsaCommStats cs;
        NsaError err = {{0}};
        assert_int_equal(nsaModelCommStats(job.models[r], &cs, &err), 0);
        assert_true(cs.reduce_seconds >= 0 && cs.gather_seconds >= 0);
        assert_true(cs.exposed_seconds == cs.reduce_seconds);
        assert_true(cs.overlap == 0.0);
        assert_true(cs.bytes_sent == (double)nsaModelNumParams(job.models[r]) * sizeof(float));
    }
    NsaCommStats none;
    NsaError err = {{0}};
    assert_int_equal(nsaModelCommStats(ref, &none, &err), 0);
    assert_true(none.bytes_sent == 0 && none.reduce_seconds == 0);
    jobFree(&job, comms);
    nsaModelFree(ref);
}

static void test_nan_on_one_rank_is_skipped_by_all(void **state) {
    (void)state;
    NsaComm *comms[3];
    Job job = {.world = 3, .reduce_in_backward = 1, .clip = 1.0f, .nan_rank = 2};
    jobStart(&job, comms, 60);
    jobRun(&job);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(job.applied[r][0], 1);
        assert_int_equal(job.applied[r][1], 0); /* the same decision everywhere */
        assert_int_equal(job.applied[r][2], 1);
    }
    /* and the weights stayed identical on every rank */
    for (int i = 0; i < nsaModelNumTensors(job.models[0]); i++) {
        float *w0 = tensorCopy(job.models[0], NSA_ARENA_PARAMS, i);
        for (int r = 1; r < 3; r++) {
            float *w = tensorCopy(job.models[r], NSA_ARENA_PARAMS, i);
            assert_memory_equal(w, w0, nsaModelTensorInfo(job.models[0], i)->numel * sizeof(float));
            assert_true(testAllFiniteF32(w, nsaModelTensorInfo(job.models[0], i)->numel));
            free(w);
        }
        free(w0);
    }
    jobFree(&job, comms);
}

/* Gathering the moments whole on every rank, then broadcasting them back
 * from rank 1 after scribbling over rank 0's copy. */
typedef struct GatherJob {
    Job *job;
    int rc[MAX_RANKS];
    NsaError err[MAX_RANKS];
    float *gathered[MAX_RANKS];
    int tensor;
} GatherJob;

static void gatherRank(void *ctx, int r) {
    GatherJob *g = ctx;
    NsaModel *m = g->job->models[r];
    const NsaTensorInfo *ti = nsaModelTensorInfo(m, g->tensor);
    g->rc[r] = nsaModelGatherTensor(m, NSA_ARENA_ADAM_V, g->tensor, g->gathered[r], &g->err[r]);
    if (g->rc[r]) return;
    float *buf = testAlloc(ti->numel, sizeof(float));
    for (size_t j = 0; j < ti->numel; j++) buf[j] = r == 1 ? (float)j : -1.0f;
    g->rc[r] = nsaModelBroadcastTensor(m, NSA_ARENA_ADAM_V, g->tensor, buf, 1, &g->err[r]);
    free(buf);
}

static void test_gather_and_broadcast_moments(void **state) {
    (void)state;
    NsaComm *comms[3];
    Job job = {.world = 3, .reduce_in_backward = 1, .clip = 1.0f, .nan_rank = -1};
    jobStart(&job, comms, 60);
    jobRun(&job);
    NsaModel *m0 = job.models[0];
    for (int i = 0; i < nsaModelNumTensors(m0); i++) {
        const NsaTensorInfo *ti = nsaModelTensorInfo(m0, i);
        /* the whole tensor, each rank's range read from that rank */
        float *want = testAlloc(ti->numel, sizeof(float));
        for (int r = 0; r < 3; r++) {
            NsaError err = {{0}};
            assert_int_equal(nsaModelGetTensor(job.models[r], NSA_ARENA_ADAM_V, i, want, &err), 0);
        }
        assert_true(testAllFiniteF32(want, ti->numel));
        GatherJob g = {.job = &job, .tensor = i};
        for (int r = 0; r < 3; r++) g.gathered[r] = testAlloc(ti->numel, sizeof(float));
        runRanks(3, gatherRank, &g);
        for (int r = 0; r < 3; r++) {
            if (g.rc[r]) fail_msg("rank %d: %s", r, g.err[r].message);
            assert_memory_equal(g.gathered[r], want, ti->numel * sizeof(float));
            /* rank 1's values landed in every rank's range */
            size_t begin, end;
            NsaError err = {{0}};
            float *got = testAlloc(ti->numel, sizeof(float));
            assert_int_equal(nsaModelTensorShard(job.models[r], i, &begin, &end, &err), 0);
            assert_int_equal(nsaModelGetTensor(job.models[r], NSA_ARENA_ADAM_V, i, got, &err), 0);
            for (size_t j = begin; j < end; j++) assert_true(got[j] == (float)j);
            free(got);
            free(g.gathered[r]);
        }
        free(want);
    }
    jobFree(&job, comms);
}

static void test_stalled_rank_fails_the_step_not_hangs(void **state) {
    (void)state;
    NsaComm *comms[2];
    Job job = {.world = 2, .reduce_in_backward = 1, .clip = 1.0f, .nan_rank = -1};
    jobStart(&job, comms, 0.05);
    nsaCommInjectStall(comms[1], 3600); /* rank 1 sleeps in its first collective */
    runRanks(2, jobRank, &job);
    assert_int_equal(job.rc[0], -1);
    assert_non_null(strstr(job.err[0].message, "rank 0: reduce-scatter of bucket 3 (head): rank 1 "
                                               "did not arrive"));
    assert_int_equal(job.rc[1], -1);
    assert_non_null(strstr(job.err[1].message, "the transport was aborted"));
    jobFree(&job, comms);
}

static void test_reduced_step_takes_no_more_backward(void **state) {
    (void)state;
    NsaComm *comms[1];
    NsaError err = {{0}};
    assert_int_equal(nsaCommLocalCreate(1, 60, comms, &err), 0);
    NsaModel *m = makeModel(comms[0]);
    int32_t tok[TB * TS], tgt[TB * TS];
    batchOf(0, 0, tok, tgt);
    assert_int_equal(nsaModelZeroGrad(m, &err), 0);
    assert_int_equal(nsaModelForward(m, tok, tgt, TB, TS, 0.5f, &err), 0);
    assert_int_equal(nsaModelBackwardReduce(m, &err), 0);
    assert_int_equal(nsaModelForward(m, tok, tgt, TB, TS, 0.5f, &err), 0);
    assert_int_equal(nsaModelBackward(m, &err), -1);
    assert_non_null(strstr(err.message, "must be the step's last backward"));
    nsaModelFree(m);
    nsaCommFree(comms[0]);
}

static void test_transport_kind_must_fit_the_device(void **state) {
    (void)state;
    const NsaModelConfig cfg = tinyConfig();
    NsaCommId id;
    NsaError err = {{0}};
    if (!nsaCommHaveNccl()) {
        /* built without NCCL, or its library is not on this machine: both
         * entry points say which (never a silent fallback) */
        const char *why[] = {"without", "libnccl.so.2 could not be loaded",
                             "NCCL >= 2.14 is needed"};
        assert_int_equal(nsaCommNcclUniqueId(&id, &err), -1);
        int named = 0;
        for (size_t i = 0; i < sizeof why / sizeof why[0]; i++)
            named |= strstr(err.message, why[i]) != NULL;
        assert_true(named);
        assert_null(nsaCommNcclCreate(&id, 0, 1, 0, 60, &err));
        named = 0;
        for (size_t i = 0; i < sizeof why / sizeof why[0]; i++)
            named |= strstr(err.message, why[i]) != NULL;
        assert_true(named);
    } else {
        /* the library loaded (every entry point resolved, version checked):
         * a job's id is made without a GPU */
        NsaCommId zero;
        memset(&zero, 0, sizeof zero);
        memset(&id, 0, sizeof id);
        if (nsaCommNcclUniqueId(&id, &err) != 0) fail_msg("%s", err.message);
        assert_memory_not_equal(&id, &zero, sizeof id);
    }
    NsaComm *comms[1];
    assert_int_equal(nsaCommLocalCreate(1, 60, comms, &err), 0);
    NsaEngineOptions opt = {.device = NSA_DEVICE_CUDA, .precision = NSA_PREC_BF16, .max_batch = 1,
                            .max_seq_len = 8, .threads = 1, .comm = comms[0]};
    assert_null(nsaModelCreate(&cfg, &opt, &err));
    nsaCommFree(comms[0]);
    assert_int_equal(nsaCommLocalCreate(0, 60, comms, &err), -1);
    assert_non_null(strstr(err.message, "world = 0"));
    assert_int_equal(nsaCommLocalCreate(2, 0, comms, &err), -1);
    assert_non_null(strstr(err.message, "timeout"));
    /* every collective has a deadline: none that is infinite or would
     * overflow the clock's arithmetic */
    const double no_deadline[] = {INFINITY, NAN, 1e20};
    for (int k = 0; k < 3; k++) {
        memset(&err, 0, sizeof err);
        assert_int_equal(nsaCommLocalCreate(2, no_deadline[k], comms, &err), -1);
        assert_non_null(strstr(err.message, "up to 1e+09"));
    }
    NsaCommId tcp_id;
    assert_int_equal(nsaCommTcpUniqueId("127.0.0.1", &tcp_id, &err), 0);
    assert_null(nsaCommTcpCreate(&tcp_id, 0, 2, 1e20, &err));
    assert_non_null(strstr(err.message, "up to 1e+09"));
    nsaCommTcpIdRelease(&tcp_id);
}

/* ---- the TCP transport (ranks in threads here, over loopback) ----------------- */

typedef struct TcpJoin {
    NsaCommId id;
    int world;
    double timeout;
    NsaComm *comms[MAX_RANKS];
    NsaError err[MAX_RANKS];
} TcpJoin;

static void tcpJoinRank(void *ctx, int r) {
    TcpJoin *j = ctx;
    j->comms[r] = nsaCommTcpCreate(&j->id, r, j->world, j->timeout, &j->err[r]);
}

/* world TCP handles joined through a fresh id on 127.0.0.1. */
static void tcpCreateAll(int world, double timeout, NsaComm **comms) {
    TcpJoin j = {.world = world, .timeout = timeout};
    NsaError err = {{0}};
    if (nsaCommTcpUniqueId("127.0.0.1", &j.id, &err)) fail_msg("%s", err.message);
    runRanks(world, tcpJoinRank, &j);
    nsaCommTcpIdRelease(&j.id);
    for (int r = 0; r < world; r++) {
        if (!j.comms[r]) fail_msg("rank %d: %s", r, j.err[r].message);
        comms[r] = j.comms[r];
    }
}

static void test_tcp_collectives(void **state) {
    (void)state;
    Exchange x = {.world = 3, .shard = 300000}; /* several of rank 0's chunks */
    tcpCreateAll(3, 60, x.comms);
    for (int r = 0; r < x.world; r++) {
        assert_string_equal(nsaCommKind(x.comms[r]), "tcp");
        x.bufs[r] = testAlloc(x.shard * (size_t)x.world, sizeof(float));
    }
    runRanks(x.world, collectivesRank, &x);
    for (int r = 0; r < x.world; r++) {
        if (x.rc[r]) fail_msg("rank %d: %s", r, x.err[r].message);
        for (size_t i = 0; i < x.shard * (size_t)x.world; i++) {
            float want = valueOf(0, i); /* rank order, as the local transport */
            for (int k = 1; k < x.world; k++) want += valueOf(k, i);
            if (memcmp(&x.bufs[r][i], &want, sizeof want)) fail_msg("rank %d element %zu", r, i);
        }
    }
    for (int r = 0; r < x.world; r++) {
        free(x.bufs[r]);
        nsaCommFree(x.comms[r]);
    }
}

/* Descriptors this process has open. */
static int openDescriptors(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) fail_msg("cannot list /proc/self/fd");
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the listing's own */
}

/* A job that never forms leaves no descriptor once the maker releases its
 * id, and a released id makes no rank 0. */
static void test_tcp_rank_that_never_joins(void **state) {
    (void)state;
    NsaCommId id;
    NsaError err = {{0}};
    const int before = openDescriptors();
    assert_int_equal(nsaCommTcpUniqueId("127.0.0.1", &id, &err), 0);
    assert_int_equal(openDescriptors(), before + 1);
    assert_null(nsaCommTcpCreate(&id, 0, 2, 0.05, &err)); /* rank 1 never comes */
    assert_non_null(strstr(err.message, "rank 1 did not join within 0.05 s"));
    assert_int_equal(openDescriptors(), before + 1); /* the maker's, until released */
    nsaCommTcpIdRelease(&id);
    assert_int_equal(openDescriptors(), before);
    nsaCommTcpIdRelease(&id); /* twice is a no-op */
    nsaCommTcpIdRelease(NULL);
    assert_null(nsaCommTcpCreate(&id, 0, 2, 1, &err));
    assert_non_null(strstr(err.message, "not released"));
    assert_int_equal(openDescriptors(), before);
    /* a job that forms leaves only its handles' sockets, gone at free */
    NsaComm *comms[2];
    tcpCreateAll(2, 30, comms);
    assert_int_equal(openDescriptors(), before + 2); /* one connection, two ends */
    nsaCommFree(comms[0]);
    nsaCommFree(comms[1]);
    assert_int_equal(openDescriptors(), before);
    assert_int_equal(nsaCommTcpUniqueId("not-an-address", &id, &err), -1);
}

static void test_tcp_deadline_and_lost_peer(void **state) {
    (void)state;
    /* rank 1 joined but never calls the collective: the deadline */
    Exchange x = {.world = 2, .shard = 4};
    tcpCreateAll(2, 0.05, x.comms);
    for (int r = 0; r < 2; r++) x.bufs[r] = testAlloc(8, sizeof(float));
    runRanks(1, lonelyRank, &x);
    assert_int_equal(x.rc[0], -1);
    assert_non_null(strstr(x.err[0].message, "rank 1 did not send its part within 0.05 s"));
    for (int r = 0; r < 2; r++) nsaCommFree(x.comms[r]);
    /* rank 1's process ends (its socket closes): rank 0 fails at once,
     * long before its 3600 s deadline */
    tcpCreateAll(2, 3600, x.comms);
    nsaCommFree(x.comms[1]);
    runRanks(1, lonelyRank, &x);
    assert_int_equal(x.rc[0], -1);
    assert_non_null(strstr(x.err[0].message, "the connection with rank 1 closed"));
    nsaCommFree(x.comms[0]);
    /* an abort from another thread ends rank 0's wait */
    tcpCreateAll(2, 3600, x.comms);
    pthread_t th;
    RankArg arg = {.fn = lonelyRank, .ctx = &x, .rank = 0};
    assert_int_equal(pthread_create(&th, NULL, rankMain, &arg), 0);
    nsaCommAbort(x.comms[0], "shut down by the test");
    pthread_join(th, NULL);
    assert_int_equal(x.rc[0], -1);
    assert_non_null(strstr(x.err[0].message, "shut down by the test"));
    for (int r = 0; r < 2; r++) {
        nsaCommFree(x.comms[r]);
        free(x.bufs[r]);
    }
    /* rank 0 joined but never reads: rank 1's part (far more than the
     * sockets buffer) cannot all be sent - the deadline, not a send that
     * waits for room for ever */
    Exchange big = {.world = 2, .shard = (size_t)4 << 20};
    tcpCreateAll(2, 0.2, big.comms);
    big.bufs[1] = testAlloc(big.shard * 2, sizeof(float));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    RankArg arg1 = {.fn = lonelyRank, .ctx = &big, .rank = 1};
    assert_int_equal(pthread_create(&th, NULL, rankMain, &arg1), 0);
    pthread_join(th, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    assert_int_equal(big.rc[1], -1);
    print_message("# %s (%.2f s)\n", big.err[1].message, took);
    assert_non_null(strstr(big.err[1].message, "rank 0 did not take our data within 0.2 s"));
    assert_true(took < 30);
    for (int r = 0; r < 2; r++) nsaCommFree(big.comms[r]);
    free(big.bufs[1]);
}

static void test_tcp_ranks_train_as_local_ones(void **state) {
    (void)state;
    NsaComm *local[2], *tcp[2];
    Job a = {.world = 2, .reduce_in_backward = 1, .clip = 1.0f, .nan_rank = -1};
    Job b = a;
    jobStart(&a, local, 60);
    tcpCreateAll(2, 60, tcp);
    for (int r = 0; r < 2; r++) b.models[r] = makeModel(tcp[r]);
    jobRun(&a);
    jobRun(&b);
    for (int s = 0; s < STEPS; s++) assert_memory_equal(&a.loss[0][s], &b.loss[0][s], sizeof(double));
    for (int i = 0; i < nsaModelNumTensors(a.models[0]); i++) {
        float *x = tensorCopy(a.models[0], NSA_ARENA_PARAMS, i), *y = tensorCopy(b.models[1], NSA_ARENA_PARAMS, i);
        assert_memory_equal(x, y, nsaModelTensorInfo(a.models[0], i)->numel * sizeof(float));
        free(x);
        free(y);
    }
    jobFree(&a, local);
    jobFree(&b, tcp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_tile_the_arena),
        cmocka_unit_test(test_shards_cover_each_tensor_once),
        cmocka_unit_test(test_local_collectives),
        cmocka_unit_test(test_deadline_names_the_missing_rank),
        cmocka_unit_test(test_abort_wakes_a_waiting_rank),
        cmocka_unit_test(test_mismatched_calls_fail_on_every_rank),
        cmocka_unit_test(test_stalled_rank_is_cut_off),
        cmocka_unit_test(test_one_rank_is_a_model_alone),
        cmocka_unit_test(test_sharded_adamw_is_the_whole_one),
        cmocka_unit_test(test_two_ranks_match_one_rank_accumulating),
        cmocka_unit_test(test_nan_on_one_rank_is_skipped_by_all),
        cmocka_unit_test(test_gather_and_broadcast_moments),
        cmocka_unit_test(test_stalled_rank_fails_the_step_not_hangs),
        cmocka_unit_test(test_reduced_step_takes_no_more_backward),
        cmocka_unit_test(test_transport_kind_must_fit_the_device),
        cmocka_unit_test(test_tcp_collectives),
        cmocka_unit_test(test_tcp_rank_that_never_joins),
        cmocka_unit_test(test_tcp_deadline_and_lost_peer),
        cmocka_unit_test(test_tcp_ranks_train_as_local_ones),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
