/* test_runs.c - the run registry (daemon/runs.c): ids, the state machine's
 * predicates, persistence across a reopen (what a daemon restart sees), the
 * metric series (redone steps replace, files rebuild it), events. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "runs.h"
#include "clockutil.h"
#include "testutil.h"

static void writeText(const char *dir, const char *name, const char *text) {
    char path[RUN_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Most tests get a registry of their own as their state: opened in a new
 * temporary directory (its state dir), which the teardown removes. */
static int regSetUp(void **state) {
    char *dir = testTempDir("runs");
    NsaError err = {""};
    RunRegistry *reg = runsOpen(dir, &err);
    if (!reg) {
        fprintf(stderr, "runsOpen %s: %s\n", dir, err.message);
        testRemoveTree(dir);
    }
    free(dir);
    *state = reg;
    return reg ? 0 : -1;
}

static int regTearDown(void **state) {
    RunRegistry *reg = *state;
    char dir[RUN_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", reg->state_dir);
    runsClose(reg);
    testRemoveTree(dir);
    return 0;
}

/* Closes the test's registry and opens its state dir again, as a daemon
 * restart does. Returns the new registry, now the test's state. */
static RunRegistry *regReopen(void **state) {
    RunRegistry *reg = *state;
    char dir[RUN_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", reg->state_dir);
    runsClose(reg);
    NsaError err = {""};
    *state = reg = runsOpen(dir, &err);
    if (!reg) {
        testRemoveTree(dir); /* no teardown without a registry */
        fail_msg("runsOpen %s: %s", dir, err.message);
    }
    return reg;
}

/* runsCreate of a CPU fp32 run, which must succeed; the id is copied into
 * id (RUN_ID_MAX bytes) when id is not NULL. */
static Run *newRun(RunRegistry *reg, const char *name, const char *yaml, int64_t total_steps, RunState state,
                   char *id) {
    NsaError err = {""};
    Run *run = runsCreate(reg, name, yaml, "cpu", "fp32", total_steps, state, &err);
    if (!run) fail_msg("runsCreate: %s", err.message);
    if (id) snprintf(id, RUN_ID_MAX, "%s", run->id);
    return run;
}

/* The run of that id in the registry, which must be there. */
static Run *findRun(RunRegistry *reg, const char *id) {
    Run *run = runsFind(reg, id);
    if (!run) fail_msg("run %s is not in the registry", id);
    return run;
}

static void test_ids_and_names(void **state) {
    (void)state;
    assert_int_equal(runIdValid("20261122-004105-a149"), 1);
    assert_int_equal(runIdValid("a_b-C9"), 1);
    assert_int_equal(runIdValid(""), 0);
    assert_int_equal(runIdValid(".."), 0);
    assert_int_equal(runIdValid("a/b"), 0);
    assert_int_equal(runIdValid("a.b"), 0);
    char long_id[70];
    memset(long_id, 'a', 65);
    long_id[65] = '\0';
    assert_int_equal(runIdValid(long_id), 0);
    long_id[64] = '\0';
    assert_int_equal(runIdValid(long_id), 1);
    assert_int_equal(runNameValid("tiny-cpu.v2"), 1);
    assert_int_equal(runNameValid(".."), 0);
    assert_int_equal(runNameValid("."), 0);
    assert_int_equal(runNameValid("a b"), 0);
}

static void test_state_predicates(void **state) {
    (void)state;
    for (int s = 0; s < RUN_STATE_COUNT; s++)
        assert_int_equal(runStateFromName(runStateName((RunState)s)), s);
    assert_int_equal(runStateFromName("sleeping"), -1);
    assert_string_equal(runStateName(RUN_NAN_HALTED), "nan_halted");
    const RunState active[] = {RUN_STARTING, RUN_RUNNING, RUN_HALTING, RUN_HUNG};
    const RunState resumable[] = {RUN_HALTED, RUN_NAN_HALTED, RUN_FAILED};
    for (int s = 0; s < RUN_STATE_COUNT; s++) {
        int a = 0, r = 0;
        for (size_t i = 0; i < 4; i++) a |= active[i] == (RunState)s;
        for (size_t i = 0; i < 3; i++) r |= resumable[i] == (RunState)s;
        assert_int_equal(runStateIsActive((RunState)s), a);
        assert_int_equal(runStateIsResumable((RunState)s), r);
    }
}

static void test_create_save_reopen(void **state) {
    RunRegistry *reg = *state;
    NsaError err = {""};
    char id[RUN_ID_MAX];
    Run *run = newRun(reg, "first", "model:\n  dim: 32\n", 100, RUN_STARTING, id);
    assert_int_equal(run->state, RUN_STARTING);
    assert_string_equal(run->name, "first");
    assert_int_equal(runIdValid(id), 1);
    struct stat st;
    assert_int_equal(stat(run->out_dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));

    assert_int_equal(runsSetState(run, RUN_RUNNING, &err), 0);
    assert_true(run->started_at > 0);
    assert_int_equal(runsAddStep(run, &(TrainStepLog){.step = 7, .total_steps = 100, .loss = 3.5}), 0);
    run->last_checkpoint_step = 5;
    assert_int_equal(runsAddEvent(run, "checkpoint", 5, "{\"dir\":\"x\"}", &err), 0);
    assert_int_equal(runsAddEvent(run, "note", 6, "not json", &err), 0);
    assert_int_equal(runsSetState(run, RUN_HUNG, &err), 0);
    snprintf(run->anomaly, sizeof run->anomaly, "hang:forward");
    run->flops_per_token = 1.5e6; /* MFU's count, and no peak (a CPU run) */
    assert_int_equal(runsSave(run, &err), 0);
    Run *second = newRun(reg, NULL, "a: 1\n", 10, RUN_STARTING, NULL);
    assert_string_not_equal(second->id, id);
    assert_string_equal(second->name, second->id);

    reg = regReopen(state);
    assert_int_equal(reg->n_runs, 2);
    run = findRun(reg, id);
    assert_int_equal(run->state, RUN_HUNG);
    assert_int_equal(run->step, 7);
    assert_int_equal(run->total_steps, 100);
    assert_int_equal(run->last_checkpoint_step, 5);
    assert_string_equal(run->anomaly, "hang:forward");
    assert_true(run->flops_per_token == 1.5e6 && isnan(run->peak_flops));
    assert_string_equal(run->config_yaml, "model:\n  dim: 32\n");
    assert_string_equal(run->device, "cpu");
    assert_int_equal(run->n_events, 2);
    assert_string_equal(run->events[0].type, "checkpoint");
    assert_int_equal(run->events[0].seq, 1);
    assert_int_equal(run->events[0].step, 5);
    assert_string_equal(run->events[0].detail_json, "{\"dir\":\"x\"}");
    assert_string_equal(run->events[1].detail_json, "{\"text\":\"not json\"}");
    assert_int_equal(runsAddEvent(run, "resume", 5, NULL, &err), 0);
    assert_int_equal(run->events[2].seq, 3);
    assert_null(runsFind(reg, "nope"));
}

static void test_corrupt_record_is_skipped(void **state) {
    RunRegistry *reg = *state;
    Run *run = newRun(reg, NULL, "x: 1\n", 1, RUN_STARTING, NULL);
    writeText(run->dir, "run.json", "{\"state\": \"dancing\"}");
    reg = regReopen(state);
    assert_int_equal(reg->n_runs, 0);
}

static void test_state_dir_that_is_a_file(void **state) {
    RunRegistry *reg = *state;
    char file[RUN_PATH_MAX + 8];
    snprintf(file, sizeof file, "%s/file", reg->state_dir);
    writeText(reg->state_dir, "file", "x");
    NsaError err = {""};
    assert_null(runsOpen(file, &err));
    assert_non_null(strstr(err.message, file));
}

static void test_redone_steps_replace_the_tail(void **state) {
    (void)state;
    Run run;
    memset(&run, 0, sizeof run);
    for (int64_t s = 1; s <= 10; s++)
        assert_int_equal(runsAddStep(&run, &(TrainStepLog){.step = s, .loss = 1.0}), 0);
    /* a resume from the checkpoint at step 6 logs 7.. again */
    for (int64_t s = 7; s <= 12; s++)
        assert_int_equal(runsAddStep(&run, &(TrainStepLog){.step = s, .loss = 2.0}), 0);
    assert_int_equal(run.n_train, 12);
    assert_int_equal(run.series_generation, 1);
    for (size_t i = 0; i < run.n_train; i++) {
        assert_int_equal(run.train[i].step, (int64_t)i + 1);
        assert_true(run.train[i].loss == (i < 6 ? 1.0 : 2.0));
    }
    assert_int_equal(runsAddEval(&run, 10, 1.0, 3.0, 4.0), 0);
    assert_int_equal(runsAddEval(&run, 10, 2.0, 3.5, 4.5), 0);
    assert_int_equal(run.n_val, 1);
    assert_true(run.val_loss == 3.5);
    free(run.train);
    free(run.val);
}

/* A long run's in-memory series stays bounded: past the cap every other
 * point goes, the first and the latest stay, steps still ascend, and the
 * generation tells pollers to refetch. */
static void test_long_series_is_thinned(void **state) {
    (void)state;
    Run run;
    memset(&run, 0, sizeof run);
    const int64_t steps = 5 * RUN_SERIES_MAX_POINTS + 7;
    int64_t thinned_at = 0;
    for (int64_t s = 1; s <= steps; s++) {
        assert_int_equal(runsAddStep(&run, &(TrainStepLog){.step = s, .loss = (double)s}), 0);
        assert_true(run.n_train <= RUN_SERIES_MAX_POINTS);
        if (!thinned_at && run.series_generation) thinned_at = s;
    }
    assert_int_equal(thinned_at, RUN_SERIES_MAX_POINTS + 1);
    assert_true(run.n_train > RUN_SERIES_MAX_POINTS / 4);
    assert_int_equal(run.train[0].step, 1);
    assert_int_equal(run.train[run.n_train - 1].step, steps);
    assert_true(run.loss == (double)steps);
    for (size_t i = 1; i < run.n_train; i++) {
        assert_true(run.train[i].step > run.train[i - 1].step);
        assert_true(run.train[i].loss == (double)run.train[i].step);
    }
    /* a redo after thinning still replaces the tail */
    int64_t gen = run.series_generation;
    assert_int_equal(runsAddStep(&run, &(TrainStepLog){.step = steps - 100, .loss = -1.0}), 0);
    assert_int_equal(run.train[run.n_train - 1].step, steps - 100);
    assert_true(run.series_generation > gen);
    for (int64_t s = 1; s <= RUN_SERIES_MAX_POINTS + 1; s++)
        assert_int_equal(runsAddEval(&run, s, 0.0, 1.0, 2.0), 0);
    assert_true(run.n_val <= RUN_SERIES_MAX_POINTS);
    assert_int_equal(run.val[run.n_val - 1].step, RUN_SERIES_MAX_POINTS + 1);
    free(run.train);
    free(run.val);
}

/* runsDelete moves the run's directory aside in one rename; a crash before
 * the removal leaves trash that the next runsOpen removes. Removal never
 * follows a symbolic link out of the run. */
static void test_delete_moves_aside_then_sweeps(void **state) {
    RunRegistry *reg = *state;
    NsaError err = {""};
    char ida[RUN_ID_MAX], idb[RUN_ID_MAX], adir[RUN_PATH_MAX], link[RUN_PATH_MAX + 16], outside[RUN_PATH_MAX + 16];
    Run *a = newRun(reg, "a", "x: 1\n", 10, RUN_STARTING, ida);
    snprintf(adir, sizeof adir, "%s", a->dir);
    newRun(reg, "b", "x: 2\n", 10, RUN_STARTING, idb);
    writeText(reg->state_dir, "outside.txt", "keep me");
    snprintf(outside, sizeof outside, "%s/outside.txt", reg->state_dir);
    assert_int_equal(fsMkdirs(a->out_dir, 0750, &err), 0);
    snprintf(link, sizeof link, "%s/link", a->out_dir);
    assert_int_equal(symlink(outside, link), 0);

    char trash[RUN_PATH_MAX + 128];
    assert_int_equal(runsDelete(reg, ida, trash, sizeof trash, &err), 0);
    assert_null(runsFind(reg, ida));
    assert_non_null(runsFind(reg, idb));
    assert_int_equal(reg->n_runs, 1);
    struct stat st;
    assert_int_not_equal(lstat(adir, &st), 0);
    assert_int_equal(stat(trash, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_non_null(strstr(trash, "/" RUNS_TRASH_PREFIX));
    char again[RUN_PATH_MAX + 128];
    assert_int_equal(runsDelete(reg, ida, again, sizeof again, &err), -1);
    assert_non_null(strstr(err.message, ida));

    /* as if nsad died before removing the trash */
    reg = regReopen(state);
    assert_int_equal(reg->n_runs, 1);
    assert_non_null(runsFind(reg, idb));
    assert_int_not_equal(lstat(trash, &st), 0);
    assert_int_equal(stat(outside, &st), 0); /* the link's target survived */

    assert_int_equal(fsRemoveTree(trash, &err), 0); /* already gone: fine */
}

/* Events are bounded in memory too: the newest stay, seq keeps counting,
 * and a reopen (which reloads events.jsonl) applies the same bound. */
static void test_events_are_bounded(void **state) {
    RunRegistry *reg = *state;
    NsaError err = {""};
    char id[RUN_ID_MAX];
    Run *run = newRun(reg, NULL, "x: 1\n", 10, RUN_STARTING, id);
    const int total = RUN_EVENTS_MAX + RUN_EVENTS_MAX / 2 + 3;
    for (int i = 1; i <= total; i++)
        assert_int_equal(runsAddEvent(run, "anomaly", i, "{\"type\":\"nan_loss\"}", &err), 0);
    assert_true(run->n_events <= RUN_EVENTS_MAX);
    assert_int_equal(run->events[run->n_events - 1].seq, total);
    assert_int_equal(run->events[run->n_events - 1].step, total);
    for (size_t i = 1; i < run->n_events; i++) assert_int_equal(run->events[i].seq, run->events[i - 1].seq + 1);
    reg = regReopen(state);
    run = findRun(reg, id);
    assert_true(run->n_events <= RUN_EVENTS_MAX);
    assert_int_equal(run->events[run->n_events - 1].seq, total);
    assert_int_equal(runsAddEvent(run, "halt", total, NULL, &err), 0);
    assert_int_equal(run->events[run->n_events - 1].seq, total + 1);
}

static void test_series_rebuilt_from_files(void **state) {
    RunRegistry *reg = *state;
    NsaError err = {""};
    char id[RUN_ID_MAX];
    Run *run = newRun(reg, NULL, "x: 1\n", 30, RUN_STARTING, id);
    writeText(run->out_dir, "training.csv",
              "step,loss,lr,toks_per_s\n10,5.5,0.001,100\n20,5.0,0.002,200\n30,4.5,0.0015,300\n31,4.4");
    writeText(run->out_dir, "val.csv", "step,val_loss,bits_per_byte\n0,5.6,8.0\n20,5.1,7.4\n");
    /* step 20 logged twice (a resume): the later line is the one kept */
    writeText(run->out_dir, "heartbeat_rank0.jsonl",
              "{\"ts\":1.0,\"event\":\"start\",\"step\":0}\n"
              "{\"ts\":10.0,\"event\":\"step\",\"step\":10,\"grad_norm\":0.9,\"memory\":111}\n"
              "{\"ts\":20.0,\"event\":\"step\",\"step\":20,\"grad_norm\":0.8,\"memory\":111}\n"
              "{\"ts\":25.0,\"event\":\"resume\",\"step\":10}\n"
              "{\"ts\":26.0,\"event\":\"step\",\"step\":20,\"grad_norm\":0.7,\"memory\":222,\"tokens_seen\":2560}\n"
              "{\"ts\":27.0,\"event\":\"eval\",\"step\":20,\"detail\":{\"val_loss\":5.1}}\n"
              "{\"ts\":30.0,\"event\":\"step\",\"step\":30,\"grad_norm\":0.6,\"memory\":222}\n"
              "{\"ts\":31.0,\"event\":\"st");

    reg = regReopen(state);
    run = findRun(reg, id);
    assert_int_equal(run->n_train, 4); /* the torn last row "31,4.4" still parses its step and loss */
    assert_int_equal(run->train[0].step, 10);
    assert_true(run->train[0].ts == 10.0 && run->train[0].grad_norm == 0.9 && run->train[0].mem_bytes == 111);
    assert_true(run->train[1].ts == 26.0 && run->train[1].grad_norm == 0.7 && run->train[1].mem_bytes == 222);
    assert_true(run->train[1].lr == 0.002 && run->train[1].toks_per_s == 200);
    assert_true(run->train[1].tokens == 2560 && isnan(run->train[0].tokens)); /* from the heartbeat, if there */
    assert_true(isnan(run->train[3].grad_norm) && isnan(run->train[3].lr));
    assert_int_equal(run->step, 31);
    assert_true(run->loss == 4.4);
    assert_int_equal(run->n_val, 2);
    assert_true(isnan(run->val[0].ts));
    assert_true(run->val[1].ts == 27.0 && run->val[1].val_loss == 5.1 && run->val[1].bits_per_byte == 7.4);
    assert_true(run->val_loss == 5.1);

    writeText(run->out_dir, "training.csv", "loss,lr\n1,2\n");
    assert_int_equal(runsLoadSeries(run, &err), -1);
    assert_non_null(strstr(err.message, "training.csv"));
    assert_non_null(strstr(err.message, "step"));
}

/* The queue in start order as "id id ...", for comparing whole orders. */
static const char *queueText(const RunRegistry *reg) {
    static char text[4 * RUN_ID_MAX];
    Run **q = NULL;
    size_t n = 0;
    assert_int_equal(runsQueue(reg, &q, &n), 0);
    text[0] = '\0';
    for (size_t i = 0; i < n; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text), "%s%s", i ? " " : "", q[i]->id);
    free(q);
    return text;
}

/* The queue: created at the back, front moves first, a run out of the
 * queue leaves a gap that positions close, and the order survives a
 * reopen (run.json keeps queue_order and queue_resume). */
static void test_queue_order_survives_reopen(void **state) {
    RunRegistry *reg = *state;
    NsaError err = {""};
    assert_string_equal(queueText(reg), "");
    char ida[RUN_ID_MAX], idb[RUN_ID_MAX], idc[RUN_ID_MAX];
    Run *active = newRun(reg, "active", "x: 1\n", 10, RUN_STARTING, NULL);
    Run *a = newRun(reg, "a", "x: 1\n", 10, RUN_QUEUED, ida);
    Run *b = newRun(reg, "b", "x: 1\n", 10, RUN_QUEUED, idb);
    Run *c = newRun(reg, "c", "x: 1\n", 10, RUN_QUEUED, idc);
    assert_int_equal(runsQueuePosition(reg, active), 0);
    assert_int_equal(runsQueueLength(reg), 3);
    char want[4 * RUN_ID_MAX];
    snprintf(want, sizeof want, "%s %s %s", ida, idb, idc);
    assert_string_equal(queueText(reg), want);
    assert_int_equal(runsQueuePosition(reg, c), 3);
    assert_int_equal(runsEnqueue(reg, c, 1, 0, &err), 0); /* front */
    snprintf(want, sizeof want, "%s %s %s", idc, ida, idb);
    assert_string_equal(queueText(reg), want);
    assert_int_equal(runsQueuePosition(reg, a), 2);
    assert_int_equal(runsQueuePosition(reg, b), 3);
    assert_int_equal(runsSetState(a, RUN_HALTED, &err), 0); /* out of the queue */
    assert_int_equal(runsQueuePosition(reg, b), 2);
    assert_int_equal(runsEnqueue(reg, a, 0, 1, &err), 0); /* back, as a resume */
    assert_int_equal(runsQueuePosition(reg, a), 3);

    reg = regReopen(state);
    assert_int_equal(runsQueueLength(reg), 3);
    snprintf(want, sizeof want, "%s %s %s", idc, idb, ida);
    assert_string_equal(queueText(reg), want);
    assert_int_equal(runsQueuePosition(reg, runsFind(reg, idb)), 2);
    assert_int_equal(runsQueuePosition(reg, runsFind(reg, ida)), 3);
    assert_int_equal(runsFind(reg, ida)->queue_resume, 1);
    assert_int_equal(runsFind(reg, idb)->queue_resume, 0);
}

/* Feeds a sample of step `step` logged at unix time ts; step_seconds is
 * what the trainer measured for that one step alone. */
static void sample(Run *run, int64_t step, double ts, double step_seconds) {
    TrainStepLog s = {.step = step, .total_steps = 1000, .ts = ts, .loss = 3.0, .step_seconds = step_seconds};
    assert_int_equal(runsAddStep(run, &s), 0);
}

/* The ETA comes from a smoothed step time: a step logged after a slow
 * stretch (an evaluation, a checkpoint, one slow step) moves it a little,
 * not by the ratio of one step's time to the next; between samples it
 * counts down; a resume starts a new estimate (the halted hours are no step
 * time). */
static void test_eta_is_smoothed(void **state) {
    RunRegistry *reg = *state;
    NsaError err = {""};
    Run *run = newRun(reg, "eta", "a: 1\n", 1000, RUN_STARTING, NULL);
    assert_int_equal(runsSetState(run, RUN_RUNNING, &err), 0);
    const double t0 = 1.8e9;
    assert_true(isnan(runsEtaSeconds(run, t0)));
    sample(run, 5, t0 + 5, 1.0);
    assert_true(isnan(runsEtaSeconds(run, t0 + 5)));  /* one sample: no rate yet */
    double ts = t0 + 5;
    for (int64_t step = 10; step <= 100; step += 5) sample(run, step, ts += 5.0, 1.0);  /* 1 s a step */
    double eta = runsEtaSeconds(run, ts);
    assert_true(fabs(eta - 900.0) < 1e-6);
    assert_true(fabs(runsEtaSeconds(run, ts + 10) - 890.0) < 1e-6);  /* counts down */
    assert_true(runsEtaSeconds(run, ts + 5000) == 0);                /* never below 0 */
    /* five steps that took 30 s (an evaluation), the last of them 3 s on its own */
    sample(run, 105, ts += 30.0, 3.0);
    double after = runsEtaSeconds(run, ts);
    if (!(after > eta * 0.95 && after < eta * 1.35))
        fail_msg("ETA went from %.0f s to %.0f s over one slow logging interval", eta, after);
    for (int64_t step = 110; step <= 400; step += 5) sample(run, step, ts += 5.0, 1.0);
    double steady = runsEtaSeconds(run, ts);
    if (!(steady > 600 * 1.0 && steady < 600 * 1.1))  /* back near 1 s a step */
        fail_msg("ETA %.0f s at step 400 of 1000 at about 1 s a step", steady);

    /* halt, an hour later resume: a fresh estimate */
    assert_int_equal(runsSetState(run, RUN_HALTED, &err), 0);
    assert_int_equal(runsSetState(run, RUN_STARTING, &err), 0);
    assert_int_equal(runsSetState(run, RUN_RUNNING, &err), 0);
    assert_true(isnan(runsEtaSeconds(run, ts + 3600)));
    sample(run, 405, ts += 3605, 2.0);
    sample(run, 410, ts += 10.0, 2.0);  /* 2 s a step now */
    eta = runsEtaSeconds(run, ts);
    if (!(fabs(eta - 590 * 2.0) < 1e-6)) fail_msg("ETA after the resume: %.1f s, wanted 1180", eta);
}

/* elapsed counts every active stretch of a run, across resumes and a
 * daemon restart (a reopened registry), and nothing while it is halted. */
static void test_elapsed_spans_resumes(void **state) {
    RunRegistry *reg = *state;
    NsaError err = {""};
    char id[RUN_ID_MAX];
    Run *run = newRun(reg, "elapsed", "a: 1\n", 1000, RUN_STARTING, id);
    assert_int_equal(runsSetState(run, RUN_RUNNING, &err), 0);
    run->segment_started -= 1000;  /* as if it had run for 1000 s */
    assert_int_equal(runsSetState(run, RUN_HALTED, &err), 0);
    double now = clockUnixSeconds();
    assert_true(fabs(runsElapsedSeconds(run, now) - 1000) < 60);
    assert_true(fabs(runsElapsedSeconds(run, now + 7200) - 1000) < 60);  /* halted: no time passes */
    assert_int_equal(runsSetState(run, RUN_STARTING, &err), 0);  /* resume */
    assert_int_equal(runsSetState(run, RUN_RUNNING, &err), 0);
    run->segment_started -= 500;
    now = clockUnixSeconds();
    assert_true(fabs(runsElapsedSeconds(run, now) - 1500) < 60);
    assert_int_equal(runsSave(run, &err), 0);  /* then nsad is killed */

    reg = regReopen(state);
    run = findRun(reg, id);
    assert_true(fabs(runsElapsedSeconds(run, clockUnixSeconds()) - 1500) < 60);
    assert_int_equal(runsSetState(run, RUN_STARTING, &err), 0);  /* the restart picks it up */
    run->segment_started -= 100;
    assert_true(fabs(runsElapsedSeconds(run, clockUnixSeconds()) - 1600) < 60);
}

/* A test on a registry of its own (regSetUp) */
#define REGISTRY_TEST(test) cmocka_unit_test_setup_teardown(test, regSetUp, regTearDown)

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids_and_names),
        cmocka_unit_test(test_state_predicates),
        REGISTRY_TEST(test_create_save_reopen),
        REGISTRY_TEST(test_queue_order_survives_reopen),
        REGISTRY_TEST(test_corrupt_record_is_skipped),
        REGISTRY_TEST(test_state_dir_that_is_a_file),
        cmocka_unit_test(test_redone_steps_replace_the_tail),
        cmocka_unit_test(test_long_series_is_thinned),
        REGISTRY_TEST(test_delete_moves_aside_then_sweeps),
        REGISTRY_TEST(test_events_are_bounded),
        REGISTRY_TEST(test_series_rebuilt_from_files),
        REGISTRY_TEST(test_eta_is_smoothed),
        REGISTRY_TEST(test_elapsed_spans_resumes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
