/* test_trainer.c - the training loop and its modules: lr schedule, run
 * artifacts, stack dumps, trainerRun (real text, resume, NaN policies,
 * .HALT, stalls) and `nsad train` (exit codes, signals).
 *
 * Runs from the repository root (tests/run.sh does): the real-text tests
 * read build/data/fortunes.txt, built by scripts/make-corpus.sh. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "artifacts.h"
#include "checkpoint.h"
#include "commands.h"
#include "config.h"
#include "lrschedule.h"
#include "signals.h"
#include "stackdump.h"
#include "trainer.h"
#include "trainsamples.h"
#include "testutil.h"

#define CORPUS "build/data/fortunes.txt"

/* ---- helpers ----------------------------------------------------------- */

static int fileExists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static int fileIn(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return fileExists(path);
}

/* The whole file as a string (the caller frees), or NULL when absent. */
static char *slurp(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    return buf;
}

static void writeText(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A CSV's data rows: steps and the given column (1-based after step). */
typedef struct Csv {
    int n;
    int64_t step[512];
    double value[512];
    char text[512][40];  /* the column exactly as written */
} Csv;

static void readCsv(const char *dir, const char *name, const char *header, int column, Csv *csv) {
    char *s = slurp(dir, name);
    if (!s) fail_msg("%s/%s is missing", dir, name);
    char *save = NULL;
    char *line = strtok_r(s, "\n", &save);
    assert_non_null(line);
    assert_string_equal(line, header);
    csv->n = 0;
    while ((line = strtok_r(NULL, "\n", &save)) != NULL && csv->n < 512) {
        char *fields[8];
        int nf = 0;
        char *fsave = NULL;
        for (char *f = strtok_r(line, ",", &fsave); f && nf < 8; f = strtok_r(NULL, ",", &fsave))
            fields[nf++] = f;
        assert_true(nf > column);
        csv->step[csv->n] = strtoll(fields[0], NULL, 10);
        csv->value[csv->n] = strtod(fields[column], NULL);
        snprintf(csv->text[csv->n], sizeof csv->text[0], "%s", fields[column]);
        csv->n++;
    }
    free(s);
}

/* Every heartbeat line parsed; returns how many have event == type. */
static int countEvents(const char *dir, const char *type) {
    char *s = slurp(dir, ARTIFACT_HEARTBEAT);
    assert_non_null(s);
    int count = 0;
    char *save = NULL;
    for (char *line = strtok_r(s, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(line);
        if (!o) fail_msg("heartbeat line is not JSON: %s", line);
        const cJSON *ev = cJSON_GetObjectItem(o, "event");
        assert_true(cJSON_IsString(ev));
        if (!strcmp(ev->valuestring, type)) count++;
        cJSON_Delete(o);
    }
    free(s);
    return count;
}

static void requireCorpus(void) {
    if (access(CORPUS, R_OK) != 0 && system("./scripts/make-corpus.sh >/dev/null 2>&1") != 0)
        fail_msg("%s is missing and scripts/make-corpus.sh failed: run the tests from the "
                 "repository root after `make deps`", CORPUS);
    assert_int_equal(access(CORPUS, R_OK), 0);
}

/* A small job: 12 steps of 4 x 64 tokens on a 1-layer model, fp32 CPU. */
static const char *small_job_yaml =
    "model:\n  dim: 32\n  n_layers: 1\n  n_heads: 2\n  n_kv_groups: 1\n  d_k: 16\n  d_v: 16\n"
    "  vocab_size: 256\n"
    "nsa:\n  l: 8\n  d: 4\n  l_sel: 16\n  n_sel: 4\n  w: 32\n  phi: avg\n"
    "train:\n  steps: 12\n  seq_len: 64\n  batch_size: 4\n  accumulate_grad_batches: 2\n"
    "  lr: 3.0e-3\n  min_lr: 3.0e-4\n  warmup_steps: 3\n  weight_decay: 0.1\n  grad_clip: 1.0\n"
    "  seed: 7\n  log_every: 1\n  eval_every: 4\n  eval_batches: 2\n  save_every: 4\n"
    "  keep_last: 2\n  out_dir: /nonexistent\n"
    "runtime:\n  device: cpu\n  precision: fp32\n  threads: 1\n"
    "data:\n  source: synthetic\n";

static void loadSmallJob(JobConfig *cfg, int real_text) {
    configDefaults(cfg);
    NsaError err = {{0}};
    if (configLoadString(cfg, small_job_yaml, strlen(small_job_yaml), &err) != 0)
        fail_msg("config: %s", err.message);
    if (real_text) {
        requireCorpus();
        cfg->data.source = DATA_TEXT;
        snprintf(cfg->data.path, sizeof cfg->data.path, "%s", CORPUS);
    }
    if (configValidate(cfg, &err) != 0) fail_msg("config: %s", err.message);
}

/* Hooks that act at one step: request a halt, create .HALT, or stop now. */
typedef enum HookAction { HOOK_NONE, HOOK_HALT_REQUEST, HOOK_HALT_FILE, HOOK_STOP_NOW } HookAction;

typedef struct HookCtx {
    TrainMonitor *mon;
    const char *out_dir;
    int64_t at_step;
    HookAction action;
    int samples, evals, events;
    int held; /* samples that came with their step's evaluation */
    char device[640]; /* the monitor's device lines when the job returned */
} HookCtx;

static void onSample(void *ctx, const TrainStepLog *s) {
    HookCtx *h = ctx;
    h->samples++;
    assert_true(s->ts > 1e9);
    assert_true(s->tokens_seen > 0);
    if (s->step != h->at_step) return;
    if (h->action == HOOK_HALT_REQUEST) atomic_store(&h->mon->halt_requested, 1);
    if (h->action == HOOK_STOP_NOW) atomic_store(&h->mon->stop_now, 1);
    if (h->action == HOOK_HALT_FILE) writeText(h->out_dir, ARTIFACT_HALT, "test\n");
}

static void onEval(void *ctx, const TrainStepLog *sample, int64_t step, double val_loss, double bpb) {
    HookCtx *h = ctx;
    h->evals++;
    assert_true(isfinite(val_loss) && isfinite(bpb));
    if (sample) { /* a held sample is the evaluated step's */
        assert_int_equal(sample->step, step);
        h->held++;
        onSample(ctx, sample);
    }
}

static void onEvent(void *ctx, const char *type, const char *detail) {
    HookCtx *h = ctx;
    h->events++;
    assert_non_null(type);
    cJSON *o = cJSON_Parse(detail);
    if (!cJSON_IsObject(o)) fail_msg("event %s: detail is not a JSON object: %s", type, detail);
    cJSON_Delete(o);
}

/* trainerRun with hooks into out_dir; returns its rc. */
static int runJob(const JobConfig *cfg, const char *out_dir, const char *resume, HookCtx *h,
                  TrainResult *res, NsaError *err) {
    TrainMonitor mon;
    trainMonitorInit(&mon);
    HookCtx local = {0};
    if (!h) h = &local;
    h->mon = &mon;
    h->out_dir = out_dir;
    TrainHooks hooks = {.ctx = h, .on_step = onSample, .on_eval = onEval, .on_event = onEvent};
    TrainOptions opt = {.out_dir = out_dir, .resume = resume, .device_override = -1, .quiet = 1};
    memset(err, 0, sizeof *err);
    int rc = trainerRun(cfg, &opt, &mon, &hooks, res, err);
    trainMonitorDescribeDevice(&mon, atomic_load(&mon.step_done_ns), h->device, sizeof h->device);
    return rc;
}

/* ---- schedule, phases -------------------------------------------------- */

static void test_schedule_warmup_cosine(void **state) {
    (void)state;
    LrSchedule s = {.lr = 1.0, .min_lr = 0.1, .warmup_steps = 10, .total_steps = 110};
    assert_true(fabs(lrScheduleRate(&s, 1) - 0.1) < 1e-12); /* the first step trains */
    assert_true(fabs(lrScheduleRate(&s, 5) - 0.5) < 1e-12);
    assert_true(fabs(lrScheduleRate(&s, 10) - 1.0) < 1e-12);  /* peak at the end of warmup */
    assert_true(fabs(lrScheduleRate(&s, 60) - 0.55) < 1e-12); /* cosine midpoint */
    assert_true(fabs(lrScheduleRate(&s, 110) - 0.1) < 1e-12); /* lands on min_lr */
    assert_true(fabs(lrScheduleRate(&s, 500) - 0.1) < 1e-12);
    for (int64_t k = 11; k <= 110; k++)
        assert_true(lrScheduleRate(&s, k) <= lrScheduleRate(&s, k - 1));
    for (int64_t k = 2; k <= 10; k++)
        assert_true(lrScheduleRate(&s, k) > lrScheduleRate(&s, k - 1));
    LrSchedule flat = {.lr = 0.5, .min_lr = 0.5, .warmup_steps = 0, .total_steps = 10};
    assert_true(lrScheduleRate(&flat, 1) == 0.5 && lrScheduleRate(&flat, 10) == 0.5);
    LrSchedule no_warmup = {.lr = 1.0, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 3};
    assert_true(fabs(lrScheduleRate(&no_warmup, 0) - 0.75) < 1e-12); /* clamped to step 1 */
    assert_true(fabs(lrScheduleRate(&no_warmup, 1) - 0.75) < 1e-12);
}

static void test_phase_names(void **state) {
    (void)state;
    for (int p = 0; p < PHASE_COUNT; p++)
        assert_int_equal(trainPhaseFromName(trainPhaseName((TrainPhase)p)), p);
    assert_string_equal(trainPhaseName(PHASE_FORWARD), "forward");
    assert_string_equal(trainPhaseName(PHASE_COUNT), "unknown");
    assert_int_equal(trainPhaseFromName("nonsense"), -1);
    assert_int_equal(trainPhaseFromName(NULL), -1);
    TrainMonitor mon;
    trainMonitorInit(&mon);
    int64_t before = atomic_load(&mon.phase_since_ns);
    trainMonitorEnter(&mon, PHASE_EVAL);
    assert_int_equal(atomic_load(&mon.phase), PHASE_EVAL);
    assert_true(atomic_load(&mon.phase_since_ns) >= before);
    /* every stop signal of signals.c is named as the halt's reason */
    static const struct { int sig; const char *name; } stops[] = {
        {SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"}, {SIGXCPU, "SIGXCPU"}, {SIGPWR, "SIGPWR"}};
    for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++) {
        assert_int_equal(signalsAction(stops[i].sig), SIGNAL_STOP);
        assert_string_equal(trainHaltReasonName(trainHaltReasonOfSignal(stops[i].sig)), stops[i].name);
    }
    assert_string_equal(trainHaltReasonName(trainHaltReasonOfSignal(SIGUSR2)), "nsad shutdown");
}

/* A trainer that keeps replacing its device line. */
typedef struct DeviceWriter {
    TrainMonitor *mon;
    _Atomic int stop;
} DeviceWriter;

static void *deviceWriterLoop(void *arg) {
    DeviceWriter *w = arg;
    for (unsigned i = 0; !atomic_load(&w->stop); i++)
        trainMonitorSetDevice(w->mon, i & 1 ? "cuda, bf16; 1 CUDA device: 0: first GPU, 139.8 GiB"
                                            : "cpu, f32; 4 threads");
    return NULL;
}

/* The device line a hang dump prints: a reader always gets a whole line,
 * the old or the new one, however the writer's steps interleave with its
 * own - never a torn line, never a placeholder - so every read below must
 * be one of the two lines (the seqlock this replaced gave up after 100
 * retries while a writer kept replacing the line). */
static void test_monitor_device_line(void **state) {
    (void)state;
    TrainMonitor mon;
    trainMonitorInit(&mon);
    char text[640];
    trainMonitorDescribeDevice(&mon, 0, text, sizeof text);
    assert_string_equal(text, "device: (no model built yet)\n"
                              "device_memory: not measured yet (no step logged in this process)\n"
                              "last_step_done: none yet in this process\n");
    char line[1000];
    memset(line, 'x', sizeof line - 1);
    line[sizeof line - 1] = '\0';
    trainMonitorSetDevice(&mon, line);
    trainMonitorDevice(&mon, text, sizeof text);
    assert_int_equal(strlen(text), sizeof mon.device[0] - 1);
    char small[8];
    trainMonitorDevice(&mon, small, sizeof small);
    assert_string_equal(small, "xxxxxxx");

    const char *a = "cpu, f32; 4 threads", *b = "cuda, bf16; 1 CUDA device: 0: first GPU, 139.8 GiB";
    trainMonitorSetDevice(&mon, a);
    DeviceWriter w = {.mon = &mon, .stop = 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, deviceWriterLoop, &w), 0);
    int whole = 0;
    const int reads = 200000;
    for (int i = 0; i < reads; i++) {
        trainMonitorDevice(&mon, text, sizeof text);
        if (strcmp(text, a) != 0 && strcmp(text, b) != 0) {
            atomic_store(&w.stop, 1);
            pthread_join(th, NULL);
            fail_msg("read %d of the device line: '%s', neither whole line", i, text);
        }
        whole++;
    }
    atomic_store(&w.stop, 1);
    pthread_join(th, NULL);
    assert_int_equal(whole, reads);
}

/* ---- artifacts ----------------------------------------------------------- */

static void test_artifacts_logs_and_resume_trim(void **state) {
    (void)state;
    char *dir = testTempDir("train");
    char sub[512];
    snprintf(sub, sizeof sub, "%s/a/b", dir);  /* created with parents */
    NsaError err = {{0}};
    Artifacts *a = artifactsOpen(sub, -1, &err);
    assert_non_null(a);
    for (int64_t step = 1; step <= 4; step++) {
        TrainStepLog s = {.step = step, .total_steps = 4, .ts = 1.7e9, .loss = 1.0 / 3.0 + (double)step,
                         .lr = 1e-3, .grad_norm = 0.5, .toks_per_s = 1234.56, .tokens_seen = 100 * step,
                         .mem_bytes = 4096};
        assert_int_equal(artifactsLogStep(a, &s, "train", &err), 0);
        if (step % 2 == 0) assert_int_equal(artifactsLogEval(a, step, 2.0, 2.0 / log(2.0), &err), 0);
    }
    assert_int_equal(artifactsLogEvent(a, "checkpoint", 4, "checkpoint", "{\"dir\":\"x\"}", &err), 0);
    assert_int_equal(artifactsLogEvent(a, "bad", 4, "idle", "not json", &err), -1);
    assert_non_null(strstr(err.message, "not a JSON object"));
    artifactsClose(a);

    Csv csv;
    readCsv(sub, ARTIFACT_TRAINING_CSV, TRAINING_CSV_HEADER, 1, &csv);
    assert_int_equal(csv.n, 4);
    /* the loss reads back as the same double */
    for (int i = 0; i < 4; i++) assert_true(csv.value[i] == 1.0 / 3.0 + (double)(i + 1));
    readCsv(sub, ARTIFACT_VAL_CSV, VAL_CSV_HEADER, 2, &csv);
    assert_int_equal(csv.n, 2);
    assert_true(fabs(csv.value[0] - 2.0 / log(2.0)) < 1e-12);

    /* every heartbeat line: an object with ts, event, step, phase */
    char *hb = slurp(sub, ARTIFACT_HEARTBEAT);
    char *save = NULL;
    int lines = 0, steps = 0;
    for (char *line = strtok_r(hb, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        assert_true(cJSON_IsNumber(cJSON_GetObjectItem(o, "ts")));
        assert_true(cJSON_IsNumber(cJSON_GetObjectItem(o, "step")));
        assert_true(cJSON_IsString(cJSON_GetObjectItem(o, "phase")));
        const char *ev = cJSON_GetObjectItem(o, "event")->valuestring;
        if (!strcmp(ev, "step")) {
            steps++;
            const char *keys[] = {"loss", "lr", "grad_norm", "toks_per_s", "memory", "tokens_seen"};
            for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
                assert_true(cJSON_IsNumber(cJSON_GetObjectItem(o, keys[k])));
        } else {
            assert_true(cJSON_IsObject(cJSON_GetObjectItem(o, "detail")));
        }
        cJSON_Delete(o);
        lines++;
    }
    free(hb);
    assert_int_equal(steps, 4);
    assert_int_equal(lines, 4 + 2 + 1);

    /* resuming at step 2 drops the rows logged after it; the heartbeat stays */
    a = artifactsOpen(sub, 2, &err);
    assert_non_null(a);
    artifactsClose(a);
    readCsv(sub, ARTIFACT_TRAINING_CSV, TRAINING_CSV_HEADER, 1, &csv);
    assert_int_equal(csv.n, 2);
    assert_int_equal(csv.step[1], 2);
    readCsv(sub, ARTIFACT_VAL_CSV, VAL_CSV_HEADER, 1, &csv);
    assert_int_equal(csv.n, 1);
    assert_int_equal(countEvents(sub, "step"), 4);

    /* a CSV that is not ours is not rewritten */
    writeText(sub, ARTIFACT_VAL_CSV, "epoch,acc\n1,0.5\n");
    assert_null(artifactsOpen(sub, 2, &err));
    assert_non_null(strstr(err.message, "expected the header"));
    testRemoveTree(dir);
    free(dir);
}

/* artifactsReadCsv's callback: copies up to 8 rows; stops at step 99. */
typedef struct CsvRows {
    int n;
    ArtifactCsvRow row[8];
} CsvRows;

static int collectRow(void *ctx, const ArtifactCsvRow *row, NsaError *err) {
    CsvRows *rows = ctx;
    if (row->step == 99) return nsaErrorf(err, "stopped at step 99");
    if (rows->n < 8) rows->row[rows->n++] = *row;
    return 0;
}

/* samples.jsonl: every line is a JSON object with its ts first, whatever
 * the detail ("{}" and "" have no members to follow the ts). */
static void test_samples_append_lines(void **state) {
    (void)state;
    char *dir = testTempDir("train");
    NsaError err = {{0}};
    const char *details[] = {"{\"step\":3,\"samples\":[]}", "{}", "", NULL, "{ }"};
    const int n = (int)(sizeof details / sizeof details[0]);
    for (int i = 0; i < n; i++)
        if (trainSamplesAppend(dir, details[i], 1000.0 + i, &err) != 0)
            fail_msg("detail %d: %s", i, err.message);
    assert_int_equal(trainSamplesAppend(dir, "[1]", 1.0, &err), -1);
    assert_non_null(strstr(err.message, "not a JSON object"));

    char *text = slurp(dir, "samples.jsonl");
    assert_non_null(text);
    char *save = NULL;
    int lines = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(line);
        if (!cJSON_IsObject(o)) fail_msg("line %d is not a JSON object: %s", lines + 1, line);
        const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "ts");
        assert_true(cJSON_IsNumber(ts));
        assert_true(ts->valuedouble == 1000.0 + lines);
        /* the detail's members follow, none for an empty one */
        assert_int_equal(cJSON_GetArraySize(o), lines == 0 ? 3 : 1);
        if (lines == 0) assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "step")));
        cJSON_Delete(o);
        lines++;
    }
    assert_int_equal(lines, n);
    free(text);
    testRemoveTree(dir);
    free(dir);
}

static void test_artifacts_read_csv(void **state) {
    (void)state;
    char *dir = testTempDir("train");
    NsaError err = {{0}};
    CsvRows rows = {.n = 0};
    /* no file: no rows, no error */
    assert_int_equal(artifactsReadCsv(dir, ARTIFACT_VAL_CSV, collectRow, &rows, &err), 0);
    assert_int_equal(rows.n, 0);

    /* the prototype's column names, in another order, a torn last line */
    writeText(dir, ARTIFACT_TRAINING_CSV,
              "tokens_per_s, train_loss,step,learning_rate,gnorm\n100,5.5,10,0.001,0.9\n200,nan,20,,1\n7");
    assert_int_equal(artifactsReadCsv(dir, ARTIFACT_TRAINING_CSV, collectRow, &rows, &err), 0);
    assert_int_equal(rows.n, 2);
    assert_int_equal(rows.row[0].step, 10);
    assert_true(rows.row[0].loss == 5.5 && rows.row[0].lr == 0.001 && rows.row[0].toks_per_s == 100);
    assert_true(rows.row[0].grad_norm == 0.9 && isnan(rows.row[0].ts) && isnan(rows.row[0].mem_bytes));
    assert_true(isnan(rows.row[1].loss) && isnan(rows.row[1].lr) && rows.row[1].grad_norm == 1);

    /* a val.csv with "loss" and "bpb": loss stands for val_loss */
    rows.n = 0;
    writeText(dir, ARTIFACT_VAL_CSV, "step,loss,bpb\n0,5.6,8.0\n");
    assert_int_equal(artifactsReadCsv(dir, ARTIFACT_VAL_CSV, collectRow, &rows, &err), 0);
    assert_int_equal(rows.n, 1);
    assert_true(rows.row[0].val_loss == 5.6 && rows.row[0].bits_per_byte == 8.0);

    /* the callback stops the read with its error */
    writeText(dir, ARTIFACT_VAL_CSV, VAL_CSV_HEADER "\n99,1,2\n100,1,2\n");
    assert_int_equal(artifactsReadCsv(dir, ARTIFACT_VAL_CSV, collectRow, &rows, &err), -1);
    assert_string_equal(err.message, "stopped at step 99");

    /* no step column: refused, naming the file */
    writeText(dir, ARTIFACT_VAL_CSV, "epoch,acc\n1,0.5\n");
    assert_int_equal(artifactsReadCsv(dir, ARTIFACT_VAL_CSV, collectRow, &rows, &err), -1);
    assert_non_null(strstr(err.message, ARTIFACT_VAL_CSV));
    assert_non_null(strstr(err.message, "step"));
    testRemoveTree(dir);
    free(dir);
}

static void test_artifacts_markers_and_metrics(void **state) {
    (void)state;
    char *dir = testTempDir("train");
    NsaError err = {{0}};
    assert_false(artifactsHaltRequested(dir));
    assert_int_equal(artifactsWriteHalt(dir, "because", &err), 0);
    assert_true(artifactsHaltRequested(dir));
    assert_int_equal(artifactsWriteAnomaly(dir, "nan_grad", &err), 0);
    char *text = slurp(dir, ARTIFACT_ANOMALY);
    assert_string_equal(text, "nan_grad\n");
    free(text);
    assert_int_equal(artifactsClearStale(dir, &err), 2);
    assert_false(artifactsHaltRequested(dir));
    assert_int_equal(artifactsClearStale(dir, &err), 0);

    char name[32];
    artifactsAnomalyName(NAN, "loss", name, sizeof name);
    assert_string_equal(name, "nan_loss");
    artifactsAnomalyName(-INFINITY, "grad", name, sizeof name);
    assert_string_equal(name, "inf_grad");

    RunSummary s = {.outcome = "completed", .step = 3, .total_steps = 3, .final_loss = 1.5,
                    .first_val_loss = 5.0, .first_bits_per_byte = 7.2, .final_val_loss = NAN,
                    .final_bits_per_byte = NAN, .best_val_loss = 5.0, .tokens_seen = 99,
                    .wall_seconds = 1.0, .mean_toks_per_s = 99.0, .anomalies = 0, .anomaly = "",
                    .last_checkpoint = "x", .error = ""};
    assert_int_equal(artifactsWriteMetrics(dir, &s, &err), 0);
    text = slurp(dir, ARTIFACT_METRICS);
    cJSON *o = cJSON_Parse(text);
    free(text);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "outcome")->valuestring, "completed");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "final_val_loss")));  /* NaN -> null */
    assert_true(cJSON_GetObjectItem(o, "first_bits_per_byte")->valuedouble == 7.2);
    cJSON_Delete(o);
    testRemoveTree(dir);
    free(dir);
}

/* ---- stack dumps --------------------------------------------------------- */

typedef struct Parked {
    const char *name;
    int block_signal;
    _Atomic int ready, release;
} Parked;

/* A recognisable frame: the dump must show this function's name. */
__attribute__((noinline)) void parkedThreadWaitsHere(Parked *p) {
    atomic_store(&p->ready, 1);
    while (!atomic_load(&p->release)) {
        struct timespec t = {.tv_sec = 0, .tv_nsec = 2000000};
        nanosleep(&t, NULL);
    }
}

/* an unregistered thread: parks without telling the registry */
static void *anonMain(void *arg) {
    parkedThreadWaitsHere(arg);
    return NULL;
}

static void *parkedMain(void *arg) {
    Parked *p = arg;
    assert_int_equal(stackdumpRegisterThread(p->name), 0);
    if (p->block_signal) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, STACKDUMP_SIGNAL);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
    }
    parkedThreadWaitsHere(p);
    stackdumpUnregisterThread();
    return NULL;
}

static void test_stackdump_all_threads(void **state) {
    (void)state;
    Parked good = {.name = "parked-good", .block_signal = 0, .ready = 0, .release = 0};
    Parked deaf = {.name = "parked-deaf", .block_signal = 1, .ready = 0, .release = 0};
    pthread_t t1, t2, t3;
    assert_int_equal(pthread_create(&t1, NULL, parkedMain, &good), 0);
    assert_int_equal(pthread_create(&t2, NULL, parkedMain, &deaf), 0);
    /* an unregistered thread is listed by tid, without a stack */
    Parked anon = {.name = "anon", .block_signal = 0, .ready = 0, .release = 0};
    assert_int_equal(pthread_create(&t3, NULL, anonMain, &anon), 0);
    while (!atomic_load(&good.ready) || !atomic_load(&deaf.ready) || !atomic_load(&anon.ready)) {
        struct timespec t = {.tv_sec = 0, .tv_nsec = 1000000};
        nanosleep(&t, NULL);
    }
    assert_int_equal(stackdumpRegisterThread("test-main"), 0);
    char *dump = stackdumpString("unit test");
    assert_non_null(dump);
    assert_non_null(strstr(dump, "reason: unit test"));
    assert_non_null(strstr(dump, "thread \"test-main\""));
    assert_non_null(strstr(dump, "the dumping thread"));
    const char *g = strstr(dump, "thread \"parked-good\"");
    assert_non_null(g);
    const char *d = strstr(dump, "thread \"parked-deaf\"");
    assert_non_null(d);
    /* the good thread's own frames, symbolised */
    const char *frame = strstr(g, "parkedThreadWaitsHere");
    assert_non_null(frame);
    assert_true(d < g ? 1 : frame < d);
    assert_non_null(strstr(d, "no answer within"));
    assert_non_null(strstr(dump, "threads not registered"));

    /* the fd form writes the same kind of text */
    char path[] = "/tmp/nsad-test-stack-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(stackdumpWrite(fd, "to fd"), 0);
    close(fd);
    FILE *f = fopen(path, "r");
    char head[64] = "";
    assert_non_null(fgets(head, sizeof head, f));
    fclose(f);
    unlink(path);
    assert_string_equal(head, "nsad stack dump\n");

    stackdumpUnregisterThread();
    atomic_store(&good.release, 1);
    atomic_store(&deaf.release, 1);
    atomic_store(&anon.release, 1);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    pthread_join(t3, NULL);
    free(dump);
    /* unregistered threads are gone from the next dump */
    dump = stackdumpString("after");
    assert_null(strstr(dump, "parked-good"));
    free(dump);
}

/* ---- training -------------------------------------------------------------- */

/* Checks env.json, metrics.json and the heartbeat of a finished run. */
static void checkRunArtifacts(const char *dir, const char *outcome, int64_t steps) {
    char *text = slurp(dir, ARTIFACT_ENV);
    assert_non_null(text);
    cJSON *env = cJSON_Parse(text);
    free(text);
    assert_non_null(env);
    const cJSON *versions = cJSON_GetObjectItem(env, "versions");
    assert_string_equal(cJSON_GetObjectItem(versions, "nsad")->valuestring, NSA_VERSION);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(versions, "cjson")));
    assert_true(cJSON_IsString(cJSON_GetObjectItem(env, "git_commit")));
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(env, "device"), "kind")->valuestring,
                        "cpu");
    const cJSON *config = cJSON_GetObjectItem(env, "config");
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(cJSON_GetObjectItem(config, "model"), "dim")));
    assert_true(cJSON_IsString(cJSON_GetObjectItem(env, "config_yaml")));
    assert_int_equal(strlen(cJSON_GetObjectItem(env, "config_hash")->valuestring), 16);
    cJSON_Delete(env);

    text = slurp(dir, ARTIFACT_METRICS);
    assert_non_null(text);
    cJSON *m = cJSON_Parse(text);
    free(text);
    assert_non_null(m);
    assert_string_equal(cJSON_GetObjectItem(m, "outcome")->valuestring, outcome);
    assert_int_equal((int64_t)cJSON_GetObjectItem(m, "step")->valuedouble, steps);
    const char *keys[] = {"total_steps", "tokens_seen", "wall_seconds", "anomalies"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
        assert_true(cJSON_IsNumber(cJSON_GetObjectItem(m, keys[k])));
    cJSON_Delete(m);
    assert_int_equal(countEvents(dir, "start") + countEvents(dir, "resume") >= 1, 1);
}

static void test_train_real_text_loss_falls(void **state) {
    (void)state;
    requireCorpus();
    JobConfig *cfg = malloc(sizeof *cfg);
    configDefaults(cfg);
    NsaError err = {{0}};
    if (configLoadFile(cfg, "configs/tiny-cpu.yaml", &err) != 0) fail_msg("%s", err.message);
    char *dir = testTempDir("train");
    HookCtx h = {0};
    TrainResult res;
    int rc = runJob(cfg, dir, NULL, &h, &res, &err);
    if (rc != 0) fail_msg("trainerRun: %s", err.message);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    assert_int_equal(res.step, cfg->train.steps);
    /* what a hang dump would have said about the device at the end */
    char want[96];
    snprintf(want, sizeof want, "device: cpu, %s; %d threads\n",
             configPrecisionName(cfg->runtime.precision), cfg->runtime.threads);
    if (strncmp(h.device, want, strlen(want)) != 0) fail_msg("device lines: %s", h.device);
    snprintf(want, sizeof want, "last_step_done: step %" PRId64 ", 0.0 s ago\n", cfg->train.steps);
    assert_non_null(strstr(h.device, want));
    snprintf(want, sizeof want, "GB in use at step %" PRId64 "\n", cfg->train.steps);
    assert_non_null(strstr(h.device, want));

    Csv val;
    readCsv(dir, ARTIFACT_VAL_CSV, VAL_CSV_HEADER, 2, &val);
    assert_true(val.n >= 2);
    assert_int_equal(val.step[0], 0);
    double first = val.value[0], last = val.value[val.n - 1];
    print_message("# real text (%s, %d steps): val bits/byte %.4f -> %.4f\n", CORPUS,
                  (int)cfg->train.steps, first, last);
    /* an untrained byte model sits near log2(256) = 8 bits per byte */
    assert_true(first > 7.0 && first < 9.0);
    /* learning English, not noise: well below the start */
    assert_true(last < first - 2.5);
    Csv train;
    readCsv(dir, ARTIFACT_TRAINING_CSV, TRAINING_CSV_HEADER, 1, &train);
    assert_int_equal(train.n, (int)(cfg->train.steps / cfg->train.log_every));
    for (int i = 0; i < train.n; i++) assert_true(isfinite(train.value[i]));
    assert_true(h.samples == train.n && h.evals == val.n);
    /* every evaluation after step 0 is of a logged step (log_every divides
     * eval_every here): each brought that step's sample along */
    assert_true(cfg->train.eval_every % cfg->train.log_every == 0);
    assert_int_equal(h.held, val.n - 1);
    checkRunArtifacts(dir, "completed", cfg->train.steps);
    char latest[1024];
    assert_int_equal(checkpointResolve(dir, "latest", latest, sizeof latest, &err), 1);
    assert_non_null(strstr(latest, "step_00000060"));
    testRemoveTree(dir);
    free(dir);
    free(cfg);
}

/* Losses of the uninterrupted small run, computed once. */
static Csv reference_losses, reference_val;
static int have_reference;

static void referenceRun(void) {
    if (have_reference) return;
    JobConfig cfg;
    loadSmallJob(&cfg, 1);
    char *dir = testTempDir("train");
    TrainResult res;
    NsaError err;
    if (runJob(&cfg, dir, NULL, NULL, &res, &err) != 0) fail_msg("reference run: %s", err.message);
    readCsv(dir, ARTIFACT_TRAINING_CSV, TRAINING_CSV_HEADER, 1, &reference_losses);
    readCsv(dir, ARTIFACT_VAL_CSV, VAL_CSV_HEADER, 1, &reference_val);
    assert_int_equal(reference_losses.n, 12);
    testRemoveTree(dir);
    free(dir);
    have_reference = 1;
}

static void assertSameCurve(const char *dir) {
    Csv got;
    readCsv(dir, ARTIFACT_TRAINING_CSV, TRAINING_CSV_HEADER, 1, &got);
    assert_int_equal(got.n, reference_losses.n);
    for (int i = 0; i < got.n; i++) {
        assert_int_equal(got.step[i], reference_losses.step[i]);
        if (got.value[i] != reference_losses.value[i])
            fail_msg("step %d: loss %s differs from the uninterrupted run's %s",
                     (int)got.step[i], got.text[i], reference_losses.text[i]);
    }
    readCsv(dir, ARTIFACT_VAL_CSV, VAL_CSV_HEADER, 1, &got);
    assert_int_equal(got.n, reference_val.n);
    for (int i = 0; i < got.n; i++) assert_true(got.value[i] == reference_val.value[i]);
}

static void test_resume_is_bit_identical(void **state) {
    (void)state;
    referenceRun();
    JobConfig cfg;
    loadSmallJob(&cfg, 1);
    char *dir = testTempDir("train");
    /* halt after step 5 (between checkpoints 4 and 8): the halt writes its
     * own checkpoint at 5 and exits cleanly */
    HookCtx h = {.at_step = 5, .action = HOOK_HALT_REQUEST};
    TrainResult res;
    NsaError err;
    assert_int_equal(runJob(&cfg, dir, NULL, &h, &res, &err), 0);
    assert_int_equal(res.outcome, TRAIN_HALTED);
    assert_int_equal(res.step, 5);
    checkRunArtifacts(dir, "halted", 5);
    char found[1024];
    assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), 1);
    assert_non_null(strstr(found, "step_00000005"));

    HookCtx h2 = {0};
    if (runJob(&cfg, dir, "latest", &h2, &res, &err) != 0) fail_msg("resume: %s", err.message);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    assert_int_equal(res.step, 12);
    assert_int_equal(h2.samples, 7);  /* steps 6..12 only */
    assertSameCurve(dir);
    assert_int_equal(countEvents(dir, "resume"), 1);
    checkRunArtifacts(dir, "completed", 12);
    /* the summary covers the whole curve, the halted process's part too */
    char *text = slurp(dir, ARTIFACT_METRICS);
    cJSON *m = cJSON_Parse(text);
    free(text);
    assert_true(cJSON_GetObjectItem(m, "first_val_loss")->valuedouble == reference_val.value[0]);
    assert_true(cJSON_GetObjectItem(m, "final_val_loss")->valuedouble ==
                reference_val.value[reference_val.n - 1]);
    cJSON_Delete(m);

    /* resuming a finished run is a no-op that completes */
    assert_int_equal(runJob(&cfg, dir, "latest", NULL, &res, &err), 0);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    assert_int_equal(res.step, 12);

    /* another seed is another run: refused, naming the hash */
    cfg.train.seed = 8;
    assert_int_equal(runJob(&cfg, dir, "latest", NULL, &res, &err), -1);
    assert_int_equal(res.outcome, TRAIN_FAILED);
    assert_non_null(strstr(err.message, "hash"));
    testRemoveTree(dir);
    free(dir);
}

/* Replaces the first occurrence of from by to (same length) in dir/name. */
static void editBytes(const char *dir, const char *name, const char *from, const char *to) {
    char path[1300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    char *at = memmem(buf, (size_t)n, from, strlen(from));
    if (!at) fail_msg("%s holds no '%s'", path, from);
    assert_int_equal(strlen(from), strlen(to));
    fseek(f, at - buf, SEEK_SET);
    fwrite(to, 1, strlen(to), f);
    fclose(f);
    free(buf);
}

/* Issue 39, item 5: a state file edited to another step "resumed" there
 * and the run completed without training. Now resume refuses a damaged
 * checkpoint, and latest-valid (what nsad serve uses) goes back to the
 * previous one, says so, and trains the steps again. */
static void test_damaged_checkpoint_is_refused_or_skipped(void **state) {
    (void)state;
    JobConfig cfg;
    loadSmallJob(&cfg, 0);
    char *dir = testTempDir("train");
    TrainResult res;
    NsaError err;
    /* checkpoints at 4 and 8 (keep_last 2), halted at 8 */
    HookCtx h = {.at_step = 8, .action = HOOK_HALT_REQUEST};
    assert_int_equal(runJob(&cfg, dir, NULL, &h, &res, &err), 0);
    assert_int_equal(res.step, 8);
    char ck[1100];
    snprintf(ck, sizeof ck, "%s/checkpoints/step_00000008", dir);
    editBytes(ck, "state.safetensors", "\"step\":\"8\"", "\"step\":\"9\"");

    assert_int_equal(runJob(&cfg, dir, "latest", NULL, &res, &err), -1);
    assert_int_equal(res.outcome, TRAIN_FAILED);
    if (!strstr(err.message, "state.safetensors: CRC-32C") || !strstr(err.message, "damaged"))
        fail_msg("resume from the edited checkpoint: %s", err.message);

    HookCtx h2 = {0};
    if (runJob(&cfg, dir, "latest-valid", &h2, &res, &err) != 0) fail_msg("latest-valid: %s", err.message);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    assert_int_equal(res.step, 12);
    assert_int_equal(h2.samples, 8); /* steps 5..12: trained again from step 4 */
    char found[1024];
    assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), 1);
    assert_int_equal(checkpointVerify(found, &err), 0);
    testRemoveTree(dir);
    free(dir);
}

/* A kill cut the NFS replacement of step 8 (no RENAME_EXCHANGE) between
 * its renames: latest moved to step 4 and .replacing written, step_8 renamed
 * to .step_00000008.old, the new copy still .step_00000008.tmp. The resume
 * sweeps first: it finishes the replacement and resumes from step 8, not
 * from step 4 with step 8 lost. */
static void test_resume_finishes_a_cut_replacement(void **state) {
    (void)state;
    JobConfig cfg;
    loadSmallJob(&cfg, 0);
    char *dir = testTempDir("train");
    TrainResult res;
    NsaError err;
    HookCtx h = {.at_step = 8, .action = HOOK_HALT_REQUEST}; /* checkpoints at 4 and 8 */
    assert_int_equal(runJob(&cfg, dir, NULL, &h, &res, &err), 0);
    assert_int_equal(res.step, 8);
    char cmd[1200], ck[512];
    snprintf(ck, sizeof ck, "%s/checkpoints", dir);
    snprintf(cmd, sizeof cmd, "cp -r '%s/step_00000008' '%s/.step_00000008.tmp'", ck, ck);
    assert_int_equal(system(cmd), 0);
    writeText(ck, ".replacing", "step_00000008\n");
    writeText(ck, "latest", "step_00000004\n");
    snprintf(cmd, sizeof cmd, "mv '%s/step_00000008' '%s/.step_00000008.old'", ck, ck);
    assert_int_equal(system(cmd), 0);

    HookCtx h2 = {0};
    if (runJob(&cfg, dir, "latest-valid", &h2, &res, &err) != 0)
        fail_msg("resume: %s", err.message);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    assert_int_equal(res.step, 12);
    assert_int_equal(h2.samples, 4); /* steps 9..12: resumed from 8 */
    assert_false(fileIn(ck, ".step_00000008.old"));
    assert_false(fileIn(ck, ".step_00000008.tmp"));
    assert_false(fileIn(ck, ".replacing"));
    testRemoveTree(dir);
    free(dir);
}

static void test_halt_file_stops_with_checkpoint(void **state) {
    (void)state;
    JobConfig cfg;
    loadSmallJob(&cfg, 0);
    char *dir = testTempDir("train");
    HookCtx h = {.at_step = 3, .action = HOOK_HALT_FILE};
    TrainResult res;
    NsaError err;
    assert_int_equal(runJob(&cfg, dir, NULL, &h, &res, &err), 0);
    assert_int_equal(res.outcome, TRAIN_HALTED);
    assert_int_equal(res.step, 3);
    assert_true(fileIn(dir, "checkpoints/step_00000003/model.safetensors"));
    assert_int_equal(countEvents(dir, "halt"), 1);
    char *hb = slurp(dir, ARTIFACT_HEARTBEAT);
    assert_non_null(strstr(hb, "\".HALT file\""));
    free(hb);
    /* a resume clears the stale .HALT instead of stopping at once */
    assert_int_equal(runJob(&cfg, dir, "latest", NULL, &res, &err), 0);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    assert_false(fileIn(dir, ARTIFACT_HALT));
    testRemoveTree(dir);
    free(dir);
}

static void test_stop_now_skips_checkpoint(void **state) {
    (void)state;
    JobConfig cfg;
    loadSmallJob(&cfg, 0);
    cfg.train.save_every = 0;
    char *dir = testTempDir("train");
    HookCtx h = {.at_step = 2, .action = HOOK_STOP_NOW};
    TrainResult res;
    NsaError err;
    assert_int_equal(runJob(&cfg, dir, NULL, &h, &res, &err), 0);
    assert_int_equal(res.outcome, TRAIN_HALTED);
    assert_int_equal(res.step, 2);
    assert_false(fileIn(dir, "checkpoints"));
    testRemoveTree(dir);
    free(dir);
}

static void nanHaltCase(FaultKind kind, const char *anomaly) {
    JobConfig cfg;
    loadSmallJob(&cfg, 0);
    cfg.nan.policy = NAN_HALT;
    cfg.fault.nan_at_step = 3;
    cfg.fault.nan_kind = kind;
    char *dir = testTempDir("train");
    TrainResult res;
    NsaError err;
    assert_int_equal(runJob(&cfg, dir, NULL, NULL, &res, &err), -1);
    assert_int_equal(res.outcome, TRAIN_NAN_HALTED);
    assert_int_equal(res.step, 2);  /* step 3 never happened */
    assert_string_equal(res.anomaly, anomaly);
    assert_non_null(strstr(err.message, anomaly));
    assert_non_null(strstr(err.message, "step 3"));
    char *text = slurp(dir, ARTIFACT_ANOMALY);
    assert_non_null(text);
    char expect[40];
    snprintf(expect, sizeof expect, "%s\n", anomaly);
    assert_string_equal(text, expect);
    free(text);
    assert_true(fileIn(dir, ARTIFACT_HALT));
    assert_int_equal(countEvents(dir, "anomaly"), 1);
    Csv csv;
    readCsv(dir, ARTIFACT_TRAINING_CSV, TRAINING_CSV_HEADER, 1, &csv);
    assert_int_equal(csv.n, 2);
    checkRunArtifacts(dir, "nan_halted", 2);
    testRemoveTree(dir);
    free(dir);
}

static void test_nan_policy_halt_loss(void **state) {
    (void)state;
    nanHaltCase(FAULT_NAN_LOSS, "nan_loss");
}

static void test_nan_policy_halt_grad(void **state) {
    (void)state;
    nanHaltCase(FAULT_NAN_GRAD, "nan_grad");
}

static void test_nan_policy_skip(void **state) {
    (void)state;
    JobConfig cfg;
    loadSmallJob(&cfg, 0);
    cfg.nan.policy = NAN_SKIP;
    cfg.nan.max_skips = 1;
    cfg.fault.nan_at_step = 3;
    cfg.fault.nan_kind = FAULT_NAN_GRAD;
    char *dir = testTempDir("train");
    TrainResult res;
    NsaError err;
    if (runJob(&cfg, dir, NULL, NULL, &res, &err) != 0) fail_msg("%s", err.message);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    assert_int_equal(res.step, 12);
    assert_string_equal(res.anomaly, "nan_grad");
    /* the poisoned gradient never reached the weights: every later loss is
     * finite, and the step was retried on the next batch */
    Csv csv;
    readCsv(dir, ARTIFACT_TRAINING_CSV, TRAINING_CSV_HEADER, 1, &csv);
    assert_int_equal(csv.n, 12);
    for (int i = 0; i < csv.n; i++) assert_true(isfinite(csv.value[i]));
    assert_true(isfinite(res.last_val_loss));
    assert_true(fileIn(dir, ARTIFACT_ANOMALY));
    assert_false(fileIn(dir, ARTIFACT_HALT));
    assert_int_equal(countEvents(dir, "anomaly"), 1);
    ResumeState st;
    char found[1024];
    assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), 1);
    assert_int_equal(checkpointReadState(found, &st, &err), 0);
    assert_int_equal(st.anomalies, 1);
    assert_int_equal(st.data_position, 2 * 12 + 2);  /* one extra step's micro-batches */
    testRemoveTree(dir);
    free(dir);

    /* with no skips allowed the same fault halts */
    cfg.nan.max_skips = 0;
    dir = testTempDir("train");
    assert_int_equal(runJob(&cfg, dir, NULL, NULL, &res, &err), -1);
    assert_int_equal(res.outcome, TRAIN_NAN_HALTED);
    assert_non_null(strstr(err.message, "max_skips"));
    assert_true(fileIn(dir, ARTIFACT_HALT));
    testRemoveTree(dir);
    free(dir);
}

static void test_nan_policy_rollback(void **state) {
    (void)state;
    referenceRun();
    JobConfig cfg;
    loadSmallJob(&cfg, 1);
    cfg.nan.policy = NAN_ROLLBACK;
    cfg.nan.max_skips = 3;
    cfg.fault.nan_at_step = 7;  /* after the checkpoint at 4 */
    cfg.fault.nan_kind = FAULT_NAN_LOSS;
    char *dir = testTempDir("train");
    TrainResult res;
    NsaError err;
    if (runJob(&cfg, dir, NULL, NULL, &res, &err) != 0) fail_msg("%s", err.message);
    assert_int_equal(res.outcome, TRAIN_COMPLETED);
    assert_string_equal(res.anomaly, "nan_loss");
    assert_int_equal(countEvents(dir, "rollback"), 1);
    /* back at step 4 with step 4's weights, moments and data position, the
     * replay is the uninterrupted run exactly */
    assertSameCurve(dir);
    testRemoveTree(dir);
    free(dir);

    /* nothing to roll back to: halt, saying so */
    cfg.train.save_every = 0;
    dir = testTempDir("train");
    assert_int_equal(runJob(&cfg, dir, NULL, NULL, &res, &err), -1);
    assert_int_equal(res.outcome, TRAIN_NAN_HALTED);
    assert_non_null(strstr(err.message, "no checkpoint"));
    testRemoveTree(dir);
    free(dir);
}

/* What the stall test sees through the hooks, on the trainer's thread. */
typedef struct StallSeen {
    TrainMonitor *mon;
    int stalls;             /* stall events */
    int phase_at_stall;     /* the monitor's phase when the event came */
    int64_t step_at_stall;  /* the last completed step then */
    char detail[256];
    double step2_seconds;   /* the logged wall time of step 2 */
} StallSeen;

static void stallOnEvent(void *ctx, const char *type, const char *detail) {
    StallSeen *s = ctx;
    if (strcmp(type, "stall") != 0) return;
    s->stalls++;
    s->phase_at_stall = atomic_load(&s->mon->phase);
    s->step_at_stall = atomic_load(&s->mon->step);
    snprintf(s->detail, sizeof s->detail, "%s", detail);
}

static void stallOnSample(void *ctx, const TrainStepLog *sample) {
    StallSeen *s = ctx;
    if (sample->step == 2) s->step2_seconds = sample->step_seconds;
}

/* The stall fault sleeps in the named phase of the named step: its event
 * comes while the monitor shows that phase (the hook runs on the trainer's
 * thread, so no watcher has to be scheduled at the right moment), its
 * heartbeat line names the phase, and the step takes at least the stall. */
static void test_stall_fault_sleeps_in_phase(void **state) {
    (void)state;
    JobConfig cfg;
    loadSmallJob(&cfg, 0);
    cfg.train.steps = 3;
    cfg.train.eval_every = 0;
    cfg.fault.stall_at_step = 2;
    snprintf(cfg.fault.stall_phase, sizeof cfg.fault.stall_phase, "forward");
    cfg.fault.stall_seconds = 0.4;
    char *dir = testTempDir("train");
    TrainMonitor mon;
    trainMonitorInit(&mon);
    StallSeen seen = {.mon = &mon};
    TrainHooks hooks = {.ctx = &seen, .on_step = stallOnSample, .on_event = stallOnEvent};
    TrainOptions opt = {.out_dir = dir, .device_override = -1, .quiet = 1};
    TrainResult res;
    NsaError err;
    int rc = trainerRun(&cfg, &opt, &mon, &hooks, &res, &err);
    assert_int_equal(rc, 0);
    assert_int_equal(atomic_load(&mon.step), 3);
    assert_int_equal(atomic_load(&mon.phase), PHASE_IDLE);
    assert_int_equal(seen.stalls, 1);
    assert_int_equal(seen.phase_at_stall, PHASE_FORWARD);
    assert_int_equal(seen.step_at_stall, 1);
    assert_string_equal(seen.detail, "{\"phase\":\"forward\",\"at_step\":2,\"seconds\":0.4}");
    assert_true(seen.step2_seconds >= 0.4);  /* a lower bound: the sleep lasts at least that */
    char *hb = slurp(dir, ARTIFACT_HEARTBEAT);
    assert_non_null(hb);
    assert_non_null(strstr(hb, "\"event\":\"stall\",\"step\":1,\"phase\":\"forward\""));
    free(hb);
    testRemoveTree(dir);
    free(dir);
}

/* ---- nsad train ------------------------------------------------------------- */

static void test_cmd_train_usage_and_config_errors(void **state) {
    (void)state;
    char *dir = testTempDir("train");
    char *help[] = {"train", "--help", NULL};
    assert_int_equal(cmdTrain(2, help), 0);
    char *none[] = {"train", NULL};
    assert_int_equal(cmdTrain(1, none), EXIT_USAGE);
    char *bad_device[] = {"train", "x.yaml", "--device", "tpu", NULL};
    assert_int_equal(cmdTrain(4, bad_device), EXIT_USAGE);
    char *bad_steps[] = {"train", "x.yaml", "--steps", "-3", NULL};
    assert_int_equal(cmdTrain(4, bad_steps), EXIT_USAGE);
    char *missing[] = {"train", "/nonexistent/job.yaml", NULL};
    assert_int_equal(cmdTrain(2, missing), EXIT_CONFIG);
    char path[1024];
    snprintf(path, sizeof path, "%s/bad.yaml", dir);
    writeText(dir, "bad.yaml", "train:\n  steps: many\n");
    char *bad[] = {"train", path, NULL};
    assert_int_equal(cmdTrain(2, bad), EXIT_CONFIG);
    /* an override that makes the config invalid is a config error too */
    writeText(dir, "good.yaml", small_job_yaml);
    snprintf(path, sizeof path, "%s/good.yaml", dir);
    char long_out[CONFIG_PATH_MAX + 16];
    memset(long_out, 'x', sizeof long_out - 1);
    long_out[sizeof long_out - 1] = 0;
    char *too_long[] = {"train", path, "--out", long_out, NULL};
    assert_int_equal(cmdTrain(4, too_long), EXIT_CONFIG);
    testRemoveTree(dir);
    free(dir);
}

/* `nsad train` in the foreground prints each evaluation once, stdout and
 * the log together (as on a terminal): steps 0, 4 and 8 of an 8-step run. */
static void test_cmd_train_prints_each_eval_once(void **state) {
    (void)state;
    char *dir = testTempDir("train");
    char out[1024], cfg_path[1024], log_path[1024];
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(cfg_path, sizeof cfg_path, "%s/job.yaml", dir);
    snprintf(log_path, sizeof log_path, "%s/console.txt", dir);
    writeText(dir, "job.yaml", small_job_yaml);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        char *argv[] = {"train", cfg_path, "--out", out, "--steps", "8", NULL};
        _exit(cmdTrain(6, argv));
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    char *text = slurp(dir, "console.txt");
    assert_non_null(text);
    /* the progress line ("eval  4 | val_loss ...") and the log's ("eval: step 4 ...") */
    int evals = 0;
    for (char *p = strstr(text, "| val_loss"); p; p = strstr(p + 1, "| val_loss")) evals++;
    for (char *p = strstr(text, "eval: step"); p; p = strstr(p + 1, "eval: step")) evals++;
    if (evals != 3) fail_msg("%d evaluation lines, wanted 3 (steps 0, 4, 8):\n%.1500s", evals, text);
    free(text);
    testRemoveTree(dir);
    free(dir);
}

/* Waits up to `seconds` for pred(dir); returns its last value. */
static int waitFor(int (*pred)(const char *), const char *dir, double seconds) {
    for (int i = 0; i < (int)(seconds * 100); i++) {
        if (pred(dir)) return 1;
        struct timespec t = {.tv_sec = 0, .tv_nsec = 10000000};
        nanosleep(&t, NULL);
    }
    return pred(dir);
}

static int hasTwoSteps(const char *dir) {
    char *s = slurp(dir, ARTIFACT_TRAINING_CSV);
    int lines = 0;
    for (char *p = s; p && *p; p++) lines += *p == '\n';
    free(s);
    return lines >= 3;
}

static int hasStackFile(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, "stacks-", 7)) found = 1;
    closedir(d);
    return found;
}

static char *stackFileText(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char *text = NULL;
    while (!text && (e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, "stacks-", 7)) text = slurp(dir, e->d_name);
    closedir(d);
    return text;
}

static void test_cmd_train_signals(void **state) {
    (void)state;
    char *dir = testTempDir("train");
    char out[1024], cfg_path[1024];
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(cfg_path, sizeof cfg_path, "%s/job.yaml", dir);
    /* long enough that SIGTERM arrives mid-run */
    char *yaml = malloc(strlen(small_job_yaml) + 1);
    strcpy(yaml, small_job_yaml);
    char *steps = strstr(yaml, "steps: 12");
    memcpy(steps, "steps: 99", 9);
    writeText(dir, "job.yaml", yaml);
    free(yaml);

    char console_path[1024];
    snprintf(console_path, sizeof console_path, "%s/console.txt", dir);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int log = open(console_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(log, STDERR_FILENO);
        char *argv[] = {"train", cfg_path, "--out", out, "--quiet", "--steps", "5000", NULL};
        _exit(cmdTrain(7, argv));
    }
    int ok = waitFor(hasTwoSteps, out, 60);
    if (ok) {
        kill(pid, SIGUSR1);
        ok = waitFor(hasStackFile, out, 20);
    }
    kill(pid, SIGTERM);
    /* a child that ignores SIGTERM must not hang the suite */
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 6000 && done == 0; i++) {
        done = waitpid(pid, &status, WNOHANG);
        if (done == 0) {
            struct timespec t = {.tv_sec = 0, .tv_nsec = 10000000};
            nanosleep(&t, NULL);
        }
    }
    if (done == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("nsad train did not exit within 60 s of SIGTERM");
    }
    assert_int_equal(done, pid);
    if (!ok) fail_msg("the child never logged two steps or never wrote a stack file");
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);

    char *stacks = stackFileText(out);
    assert_non_null(stacks);
    assert_non_null(strstr(stacks, "reason: SIGUSR1"));
    assert_non_null(strstr(stacks, "thread \"trainer\""));
    assert_non_null(strstr(stacks, "thread \"signals\""));
    free(stacks);

    char *text = slurp(out, ARTIFACT_METRICS);
    assert_non_null(text);
    cJSON *m = cJSON_Parse(text);
    free(text);
    assert_string_equal(cJSON_GetObjectItem(m, "outcome")->valuestring, "halted");
    int64_t step = (int64_t)cJSON_GetObjectItem(m, "step")->valuedouble;
    cJSON_Delete(m);
    assert_true(step >= 2 && step < 5000);
    /* the halt says what stopped it: the signal, not a "halt request" */
    char *hb = slurp(out, ARTIFACT_HEARTBEAT);
    assert_non_null(hb);
    if (!strstr(hb, "\"event\":\"halt\"") || !strstr(hb, "\"reason\":\"SIGTERM\""))
        fail_msg("the heartbeat's halt event does not name SIGTERM:\n%.800s",
                 strstr(hb, "\"halt\"") ? strstr(hb, "\"halt\"") : hb);
    free(hb);
    char *console = slurp(dir, "console.txt");
    assert_non_null(console);
    assert_non_null(strstr(console, "SIGTERM: stopping after the step in progress"));
    assert_non_null(strstr(console, "stopped by SIGTERM after step"));
    free(console);
    char found[1024], expect[64];
    NsaError err;
    assert_int_equal(checkpointResolve(out, "latest", found, sizeof found, &err), 1);
    snprintf(expect, sizeof expect, "step_%08d", (int)step);
    assert_non_null(strstr(found, expect));
    testRemoveTree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule_warmup_cosine),
        cmocka_unit_test(test_phase_names),
        cmocka_unit_test(test_monitor_device_line),
        cmocka_unit_test(test_artifacts_logs_and_resume_trim),
        cmocka_unit_test(test_artifacts_read_csv),
        cmocka_unit_test(test_samples_append_lines),
        cmocka_unit_test(test_artifacts_markers_and_metrics),
        cmocka_unit_test(test_stackdump_all_threads),
        cmocka_unit_test(test_train_real_text_loss_falls),
        cmocka_unit_test(test_resume_is_bit_identical),
        cmocka_unit_test(test_damaged_checkpoint_is_refused_or_skipped),
        cmocka_unit_test(test_resume_finishes_a_cut_replacement),
        cmocka_unit_test(test_halt_file_stops_with_checkpoint),
        cmocka_unit_test(test_stop_now_skips_checkpoint),
        cmocka_unit_test(test_nan_policy_halt_loss),
        cmocka_unit_test(test_nan_policy_halt_grad),
        cmocka_unit_test(test_nan_policy_skip),
        cmocka_unit_test(test_nan_policy_rollback),
        cmocka_unit_test(test_stall_fault_sleeps_in_phase),
        cmocka_unit_test(test_cmd_train_usage_and_config_errors),
        cmocka_unit_test(test_cmd_train_prints_each_eval_once),
        cmocka_unit_test(test_cmd_train_signals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
