/* test_dp_train.c - data parallelism in the daemon, on the CPU engine with
 * several ranks in this process (runtime.cpu_ranks): the runtime.gpus and
 * cpu_ranks keys, two ranks against one rank accumulating the same
 * batches, resume bit-identical with the same rank count and working on
 * another (checkpoints gather the sharded moments), a NaN on one rank
 * skipped by all, and the faults that must not hang the job: a rank that
 * sleeps in a collective, a rank that stops answering, the watchdog's
 * abort. Deadlines here are short, but no assertion depends on timing: the
 * faulty rank never arrives in time, whatever the machine's speed. */
#include <inttypes.h>
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
#include <unistd.h>
#include <cmocka.h>

#include "checkpoint.h"
#include "config.h"
#include "trainer.h"
#include "testutil.h"

/* A small job on synthetic data: 8 steps of 2 x 32 tokens per rank. */
static const char *job_yaml =
    "model:\n  dim: 16\n  n_layers: 2\n  n_heads: 2\n  n_kv_groups: 1\n  d_k: 8\n  d_v: 8\n"
    "  vocab_size: 256\n"
    "nsa:\n  l: 4\n  d: 2\n  l_sel: 8\n  n_sel: 3\n  w: 8\n"
    "train:\n  steps: 8\n  seq_len: 32\n  batch_size: 2\n  lr: 3.0e-3\n  min_lr: 3.0e-4\n"
    "  warmup_steps: 2\n  seed: 11\n  log_every: 1\n  eval_every: 0\n  save_every: 4\n"
    "  keep_last: 5\n  out_dir: /nonexistent\n"
    "runtime:\n  device: cpu\n  precision: fp32\n  threads: 1\n"
    "data:\n  source: synthetic\n";

static void loadJob(JobConfig *cfg, int ranks, int accum) {
    configDefaults(cfg);
    NsaError err = {{0}};
    if (configLoadString(cfg, job_yaml, strlen(job_yaml), &err) != 0) fail_msg("config: %s", err.message);
    cfg->runtime.cpu_ranks = ranks;
    cfg->train.accumulate_grad_batches = accum;
    if (configValidate(cfg, &err) != 0) fail_msg("config: %s", err.message);
}

/* trainerRun into out_dir (resume NULL or "latest"); mon may be NULL. */
static int run(const JobConfig *cfg, const char *out_dir, const char *resume, TrainMonitor *mon,
               TrainResult *res, NsaError *err) {
    TrainOptions opt = {.out_dir = out_dir, .resume = resume, .device_override = -1, .quiet = 1};
    memset(err, 0, sizeof *err);
    return trainerRun(cfg, &opt, mon, NULL, res, err);
}

/* training.csv's loss column, as written (exact text), steps 1..n. */
typedef struct Losses {
    int n;
    char text[64][40];
} Losses;

static void readLosses(const char *dir, Losses *out) {
    char path[1024], line[256];
    snprintf(path, sizeof path, "%s/training.csv", dir);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("%s is missing", path);
    out->n = 0;
    if (!fgets(line, sizeof line, f)) fail_msg("%s is empty", path);
    while (fgets(line, sizeof line, f) && out->n < 64) {
        char *comma = strchr(line, ',');
        assert_non_null(comma);
        snprintf(out->text[out->n], sizeof out->text[0], "%.*s", (int)strcspn(comma + 1, ","), comma + 1);
        out->n++;
    }
    fclose(f);
}

/* Whether a line of dir's heartbeat_rank0.jsonl holds every needle. */
static int heartbeatHas(const char *dir, const char *needle1, const char *needle2) {
    char path[1024], line[2048];
    snprintf(path, sizeof path, "%s/heartbeat_rank0.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("%s is missing", path);
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, needle1) && strstr(line, needle2);
    fclose(f);
    return found;
}

/* ---- config ---------------------------------------------------------------- */

static void expectConfigError(const char *yaml, const char *needle) {
    JobConfig cfg;
    configDefaults(&cfg);
    NsaError err = {{0}};
    assert_int_equal(configLoadString(&cfg, yaml, strlen(yaml), &err), -1);
    if (!strstr(err.message, needle)) fail_msg("error \"%s\" lacks \"%s\"", err.message, needle);
}

static void test_gpus_key(void **state) {
    (void)state;
    JobConfig cfg;
    NsaError err = {{0}};
    configDefaults(&cfg);
    assert_int_equal(cfg.runtime.gpus, 0); /* all */
    assert_int_equal(cfg.runtime.cpu_ranks, 1);
    const char *list = "runtime:\n  device: cuda\n  precision: bf16\n  gpus: [3, 1]\n";
    assert_int_equal(configLoadString(&cfg, list, strlen(list), &err), 0);
    assert_int_equal(cfg.runtime.n_gpu_list, 2);
    assert_int_equal(cfg.runtime.gpu_list[0], 3);
    assert_int_equal(cfg.runtime.gpu_list[1], 1);
    /* the resolved YAML loads back to the same list */
    char *yaml = configToYaml(&cfg);
    assert_non_null(strstr(yaml, "gpus: [3, 1]"));
    JobConfig back;
    configDefaults(&back);
    assert_int_equal(configLoadString(&back, yaml, strlen(yaml), &err), 0);
    assert_int_equal(back.runtime.n_gpu_list, 2);
    assert_int_equal(back.runtime.gpu_list[0], 3);
    free(yaml);
    const char *count = "runtime:\n  device: cuda\n  precision: bf16\n  gpus: 4\n";
    configDefaults(&cfg);
    assert_int_equal(configLoadString(&cfg, count, strlen(count), &err), 0);
    assert_int_equal(cfg.runtime.gpus, 4);
    assert_int_equal(cfg.runtime.n_gpu_list, 0);
    const char *text = "runtime:\n  device: cuda\n  precision: bf16\n  gpus: \"0,2\"\n";
    configDefaults(&cfg);
    assert_int_equal(configLoadString(&cfg, text, strlen(text), &err), 0);
    assert_int_equal(cfg.runtime.n_gpu_list, 2);
    assert_int_equal(cfg.runtime.gpu_list[1], 2);
    /* the GPU count is not part of the run's identity: resume elsewhere */
    JobConfig other = cfg;
    other.runtime.gpus = 1;
    other.runtime.n_gpu_list = 0;
    assert_true(configHash(&cfg) == configHash(&other));

    expectConfigError("runtime:\n  device: cuda\n  gpus: 0\n", "runtime.gpus: 0 is not a GPU count");
    expectConfigError("runtime:\n  device: cuda\n  gpus: [1, 1]\n", "names GPU 1 twice");
    expectConfigError("runtime:\n  device: cuda\n  gpus: []\n", "names no GPU");
    expectConfigError("runtime:\n  device: cuda\n  gpus: some\n", "allowed: all, a count");
    expectConfigError("runtime:\n  device: cpu\n  gpus: 2\n", "runtime.gpus: 2 GPUs on device cpu");
    expectConfigError("runtime:\n  device: cuda\n  precision: bf16\n  cpu_ranks: 2\n",
                      "runtime.cpu_ranks: 2 on device cuda");
    expectConfigError("runtime:\n  device: cpu\n  cpu_ranks: 0\n", "runtime.cpu_ranks");
    expectConfigError("watchdog:\n  allreduce: 0\n", "watchdog.allreduce");
}

/* ---- training ---------------------------------------------------------------- */

static void test_two_ranks_train_as_one_accumulating(void **state) {
    (void)state;
    /* the same sequences step for step: rank r of the 2-rank job reads what
     * micro-batch r of the 1-rank job reads */
    char *one = testTempDir("dp1"), *two = testTempDir("dp2");
    JobConfig cfg;
    TrainResult res;
    NsaError err;
    loadJob(&cfg, 1, 2);
    if (run(&cfg, one, NULL, NULL, &res, &err)) fail_msg("1 rank: %s", err.message);
    loadJob(&cfg, 2, 1);
    if (run(&cfg, two, NULL, NULL, &res, &err)) fail_msg("2 ranks: %s", err.message);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    Losses a, b;
    readLosses(one, &a);
    readLosses(two, &b);
    assert_int_equal(a.n, 8);
    assert_int_equal(b.n, 8);
    for (int i = 0; i < 8; i++) {
        const double x = strtod(a.text[i], NULL), y = strtod(b.text[i], NULL);
        if (!(fabs(x - y) <= 1e-6 * fabs(x))) fail_msg("step %d: loss %s vs %s", i + 1, a.text[i], b.text[i]);
    }
    /* a checkpoint holds every tensor whole, the moments gathered */
    ResumeState st;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/checkpoints/step_00000008", two);
    assert_int_equal(checkpointReadState(dir, &st, &err), 0);
    assert_int_equal(st.ranks, 2);
    assert_int_equal(st.data_position, 16); /* 8 steps x 2 ranks x 1 micro-batch */
    testRemoveTree(one);
    testRemoveTree(two);
    free(one);
    free(two);
}

/* A monitor watcher that asks for a halt once step `at` is done. */
typedef struct Halter {
    TrainMonitor *mon;
    int64_t at;
    _Atomic int stop;
} Halter;

static void *halterMain(void *p) {
    Halter *h = p;
    while (!atomic_load(&h->stop)) {
        if (atomic_load(&h->mon->step) >= h->at) {
            atomic_store(&h->mon->halt_requested, 1);
            break;
        }
        struct timespec nap = {.tv_sec = 0, .tv_nsec = 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    return NULL;
}

/* Runs the job with a halt requested after step `at` (the trainer checks
 * between steps, so the halt lands at or right after `at`). */
static void runHalting(const JobConfig *cfg, const char *dir, int64_t at, TrainResult *res) {
    TrainMonitor mon;
    trainMonitorInit(&mon);
    Halter h = {.mon = &mon, .at = at};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, halterMain, &h), 0);
    NsaError err;
    int rc = run(cfg, dir, NULL, &mon, res, &err);
    atomic_store(&h.stop, 1);
    pthread_join(th, NULL);
    if (rc) fail_msg("halting run: %s", err.message);
    assert_int_equal(res->outcome, TRAIN_HALTED);
}

static void test_resume_same_and_other_rank_count(void **state) {
    (void)state;
    char *full = testTempDir("dpfull"), *cut = testTempDir("dpcut"), *moved = testTempDir("dpmove");
    JobConfig cfg;
    TrainResult res;
    NsaError err;
    loadJob(&cfg, 2, 1);
    if (run(&cfg, full, NULL, NULL, &res, &err)) fail_msg("uninterrupted: %s", err.message);
    /* halted part way (checkpointed), resumed with the same 2 ranks: the
     * same curve, bit for bit */
    runHalting(&cfg, cut, 3, &res);
    const int64_t halted_at = res.step;
    if (run(&cfg, cut, "latest", NULL, &res, &err)) fail_msg("resume: %s", err.message);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    Losses a, b;
    readLosses(full, &a);
    readLosses(cut, &b);
    assert_int_equal(a.n, 8);
    assert_int_equal(b.n, 8);
    for (int i = 0; i < 8; i++)
        if (strcmp(a.text[i], b.text[i]))
            fail_msg("step %d (halted at %lld): %s vs %s", i + 1, (long long)halted_at, a.text[i],
                     b.text[i]);
    /* on 3 ranks from 2 ranks' checkpoint: it loads (every tensor whole,
     * the moments re-sharded) and goes on from the same data position */
    runHalting(&cfg, moved, 4, &res);
    const int64_t at = res.step;
    loadJob(&cfg, 3, 1);
    if (run(&cfg, moved, "latest", NULL, &res, &err)) fail_msg("resume on 3 ranks: %s", err.message);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    assert_int_equal(res.step, 8);
    ResumeState st;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/checkpoints/step_00000008", moved);
    assert_int_equal(checkpointReadState(dir, &st, &err), 0);
    assert_int_equal(st.ranks, 3);
    assert_int_equal((int64_t)st.data_position, at * 2 + (8 - at) * 3);
    testRemoveTree(full);
    testRemoveTree(cut);
    testRemoveTree(moved);
    free(full);
    free(cut);
    free(moved);
}

static void test_nan_on_one_rank_is_skipped_by_all(void **state) {
    (void)state;
    char *dir = testTempDir("dpnan");
    JobConfig cfg;
    loadJob(&cfg, 3, 1);
    cfg.fault.nan_at_step = 3;
    cfg.fault.nan_kind = FAULT_NAN_GRAD;
    cfg.fault.rank = 2;
    cfg.nan.policy = NAN_SKIP;
    TrainResult res;
    NsaError err;
    if (run(&cfg, dir, NULL, NULL, &res, &err)) fail_msg("%s", err.message);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    assert_string_equal(res.anomaly, "nan_grad");
    /* 8 steps done, one skipped: training.csv has no row for the skipped one */
    Losses l;
    readLosses(dir, &l);
    assert_int_equal(l.n, 8);
    testRemoveTree(dir);
    free(dir);
}

static void test_rank_asleep_in_a_collective_fails_the_run(void **state) {
    (void)state;
    char *dir = testTempDir("dpstall");
    JobConfig cfg;
    loadJob(&cfg, 2, 1);
    cfg.watchdog.allreduce = 0.2;
    cfg.fault.stall_at_step = 6;
    snprintf(cfg.fault.stall_phase, sizeof cfg.fault.stall_phase, "allreduce");
    cfg.fault.stall_seconds = 3600; /* cut short by the abort */
    cfg.fault.rank = 1;
    TrainResult res;
    NsaError err;
    assert_int_equal(run(&cfg, dir, NULL, NULL, &res, &err), -1);
    assert_int_equal(res.outcome, TRAIN_FAILED);
    /* the stall is on record as it begins, as in any other phase */
    assert_true(heartbeatHas(dir, "\"stall\"", "\"phase\":\"allreduce\""));
    /* rank 0 waited in the first reduce-scatter; rank 1 never arrived */
    if (!strstr(err.message, "rank 0 (in backward") || !strstr(err.message, "reduce-scatter of bucket") ||
        !strstr(err.message, "rank 1 did not arrive within 0.2 s"))
        fail_msg("error: %s", err.message);
    assert_int_equal(res.step, 5);
    /* resumable from its last checkpoint (step 4) */
    cfg.fault.stall_at_step = 0;
    cfg.watchdog.allreduce = 60;
    if (run(&cfg, dir, "latest", NULL, &res, &err)) fail_msg("resume: %s", err.message);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    assert_int_equal(res.step, 8);
    testRemoveTree(dir);
    free(dir);
}

static void test_rank_that_stops_answering_fails_the_run(void **state) {
    (void)state;
    char *dir = testTempDir("dpexit");
    JobConfig cfg;
    loadJob(&cfg, 3, 1);
    cfg.watchdog.allreduce = 0.2;
    cfg.fault.exit_at_step = 2;
    cfg.fault.rank = 2;
    TrainResult res;
    NsaError err;
    assert_int_equal(run(&cfg, dir, NULL, NULL, &res, &err), -1);
    assert_int_equal(res.outcome, TRAIN_FAILED);
    if (!strstr(err.message, "rank 2 did not arrive") || !strstr(err.message, "rank 2") ||
        !strstr(err.message, "stopped answering: abandoned"))
        fail_msg("error: %s", err.message);
    assert_int_equal(res.step, 1);
    testRemoveTree(dir);
    free(dir);
}

/* The watchdog's abort: rank 1 sleeps in its forward, rank 0 waits for it
 * in a collective with a long deadline; the abort ends both. */
typedef struct Aborter {
    TrainMonitor *mon;
    _Atomic int stop;
} Aborter;

static void *aborterMain(void *p) {
    Aborter *a = p;
    while (!atomic_load(&a->stop)) {
        if (atomic_load(&a->mon->n_ranks) == 2 && atomic_load(&a->mon->step) >= 2 &&
            atomic_load(&a->mon->rank_phase[1]) == PHASE_FORWARD &&
            atomic_load(&a->mon->rank_phase[0]) == PHASE_BACKWARD) {
            atomic_store(&a->mon->abort_requested, 1);
            break;
        }
        struct timespec nap = {.tv_sec = 0, .tv_nsec = 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    return NULL;
}

static void test_watchdog_abort_ends_a_stuck_job(void **state) {
    (void)state;
    char *dir = testTempDir("dpabort");
    JobConfig cfg;
    loadJob(&cfg, 2, 1);
    cfg.watchdog.allreduce = 3600;
    cfg.fault.stall_at_step = 3;
    snprintf(cfg.fault.stall_phase, sizeof cfg.fault.stall_phase, "forward");
    cfg.fault.stall_seconds = 3600;
    cfg.fault.rank = 1;
    TrainMonitor mon;
    trainMonitorInit(&mon);
    Aborter a = {.mon = &mon};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, aborterMain, &a), 0);
    TrainResult res;
    NsaError err;
    int rc = run(&cfg, dir, NULL, &mon, &res, &err);
    atomic_store(&a.stop, 1);
    pthread_join(th, NULL);
    assert_int_equal(rc, -1);
    assert_int_equal(res.outcome, TRAIN_FAILED);
    if (!strstr(err.message, "the watchdog aborted the job")) fail_msg("error: %s", err.message);
    assert_int_equal(res.step, 2);
    testRemoveTree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpus_key),
        cmocka_unit_test(test_two_ranks_train_as_one_accumulating),
        cmocka_unit_test(test_resume_same_and_other_rank_count),
        cmocka_unit_test(test_nan_on_one_rank_is_skipped_by_all),
        cmocka_unit_test(test_rank_asleep_in_a_collective_fails_the_run),
        cmocka_unit_test(test_rank_that_stops_answering_fails_the_run),
        cmocka_unit_test(test_watchdog_abort_ends_a_stuck_job),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
