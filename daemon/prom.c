/* prom.c - Prometheus text exposition; see prom.h. */
#include "prom.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nsa.h"

/* A growing text buffer; a failed allocation sticks (oom) and the render
 * returns NULL at the end. */
typedef struct PromBuf {
    char *data;
    size_t len, cap;
    int oom;
} PromBuf;

static void put(PromBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(PromBuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *bigger = realloc(b->data, cap);
        if (!bigger) {
            b->oom = 1;
            return;
        }
        b->data = bigger;
        b->cap = cap;
    }
}

static void family(PromBuf *b, const char *name, const char *type, const char *help) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A sample value in the format's float syntax (NaN and +Inf spelled its way). */
static void value(PromBuf *b, double v) {
    if (isnan(v))
        put(b, " NaN\n");
    else if (isinf(v))
        put(b, v > 0 ? " +Inf\n" : " -Inf\n");
    else
        put(b, " %.17g\n", v);
}

/* Run ids and state names are [A-Za-z0-9_-]: nothing to escape in labels. */
static void runSample(PromBuf *b, const char *name, const Run *run, double v) {
    put(b, "%s{run_id=\"%s\"}", name, run->id);
    value(b, v);
}

typedef struct RunGauge {
    const char *name, *help;
    size_t offset; /* of a double in Run */
} RunGauge;

static const RunGauge run_gauges[] = {
    {"nsad_run_loss", "Training loss at the last logged step.", offsetof(Run, loss)},
    {"nsad_run_val_loss", "Validation loss at the last evaluation.", offsetof(Run, val_loss)},
    {"nsad_run_bits_per_byte", "Validation bits per byte at the last evaluation.",
     offsetof(Run, bits_per_byte)},
    {"nsad_run_tokens_per_second", "Training throughput at the last logged step.", offsetof(Run, toks_per_s)},
    {"nsad_run_learning_rate", "Learning rate at the last logged step.", offsetof(Run, lr)},
    {"nsad_run_grad_norm", "Global gradient norm at the last logged step.", offsetof(Run, grad_norm)},
    {"nsad_run_memory_bytes", "Device (or host) memory the run uses.", offsetof(Run, mem_bytes)},
};

char *promRender(Service *svc, size_t *len) {
    PromBuf b = {malloc(8192), 0, 8192, 0};
    if (!b.data) return NULL;
    int64_t now = serviceNowNs();

    family(&b, "nsad_up", "gauge", "1 while nsad answers.");
    put(&b, "nsad_up 1\n");
    family(&b, "nsad_build_info", "gauge", "nsad's version, as a label.");
    put(&b, "nsad_build_info{version=\"%s\"} 1\n", NSA_VERSION);
    family(&b, "nsad_uptime_seconds", "gauge", "Seconds since nsad started.");
    put(&b, "nsad_uptime_seconds");
    value(&b, (double)(now - svc->started_ns) * 1e-9);

    pthread_mutex_lock(&svc->lock);
    size_t by_state[RUN_STATE_COUNT] = {0};
    for (size_t i = 0; i < svc->runs->n_runs; i++) by_state[svc->runs->runs[i]->state]++;
    family(&b, "nsad_runs", "gauge", "Stored runs by state.");
    for (int s = 0; s < RUN_STATE_COUNT; s++)
        put(&b, "nsad_runs{state=\"%s\"} %zu\n", runStateName((RunState)s), by_state[s]);

    /* the active run and the most recent other one */
    const Run *shown[2] = {NULL, NULL};
    int n_shown = 0;
    Run *active = runsFind(svc->runs, svc->active_id);
    if (active) shown[n_shown++] = active;
    for (size_t i = svc->runs->n_runs; i-- > 0;)
        if (svc->runs->runs[i] != active) {
            shown[n_shown++] = svc->runs->runs[i];
            break;
        }

    int busy = active != NULL;
    TrainPhase phase = busy ? (TrainPhase)atomic_load(&svc->mon.phase) : PHASE_IDLE;
    family(&b, "nsad_trainer_busy", "gauge", "1 while a run holds the trainer.");
    put(&b, "nsad_trainer_busy %d\n", busy);
    family(&b, "nsad_trainer_phase", "gauge", "1 for the phase the trainer is in.");
    for (int p = 0; p < PHASE_COUNT; p++)
        put(&b, "nsad_trainer_phase{phase=\"%s\"} %d\n", trainPhaseName((TrainPhase)p), p == (int)phase);
    if (busy) {
        family(&b, "nsad_trainer_phase_seconds", "gauge", "Seconds the trainer has been in its phase.");
        put(&b, "nsad_trainer_phase_seconds");
        value(&b, (double)(now - atomic_load(&svc->mon.phase_since_ns)) * 1e-9);
        family(&b, "nsad_heartbeat_age_seconds", "gauge", "Seconds since the trainer's last sign of life.");
        put(&b, "nsad_heartbeat_age_seconds");
        value(&b, (double)(now - atomic_load(&svc->mon.heartbeat_ns)) * 1e-9);
    }

    if (n_shown) {
        family(&b, "nsad_run_step", "gauge", "Last completed optimizer step.");
        for (int i = 0; i < n_shown; i++) runSample(&b, "nsad_run_step", shown[i], (double)shown[i]->step);
        family(&b, "nsad_run_total_steps", "gauge", "Optimizer steps the run is configured for.");
        for (int i = 0; i < n_shown; i++)
            runSample(&b, "nsad_run_total_steps", shown[i], (double)shown[i]->total_steps);
        for (size_t g = 0; g < sizeof run_gauges / sizeof run_gauges[0]; g++) {
            family(&b, run_gauges[g].name, "gauge", run_gauges[g].help);
            for (int i = 0; i < n_shown; i++) {
                double v = *(const double *)((const char *)shown[i] + run_gauges[g].offset);
                if (!isnan(v) || shown[i]->step > 0) runSample(&b, run_gauges[g].name, shown[i], v);
            }
        }
        family(&b, "nsad_run_eta_seconds", "gauge", "Estimated seconds until the active run completes.");
        if (active && isfinite(active->step_seconds) && active->total_steps >= active->step)
            runSample(&b, "nsad_run_eta_seconds", active,
                      (double)(active->total_steps - active->step) * active->step_seconds);
        family(&b, "nsad_run_state", "gauge", "1 for the run's state.");
        for (int i = 0; i < n_shown; i++)
            for (int s = 0; s < RUN_STATE_COUNT; s++)
                put(&b, "nsad_run_state{run_id=\"%s\",state=\"%s\"} %d\n", shown[i]->id,
                    runStateName((RunState)s), s == (int)shown[i]->state);
    }
    pthread_mutex_unlock(&svc->lock);

    family(&b, "nsad_watchdog_hangs_total", "counter", "Phases that overran their watchdog deadline.");
    put(&b, "nsad_watchdog_hangs_total %llu\n", (unsigned long long)atomic_load(&svc->hangs_total));
    family(&b, "nsad_anomalies_total", "counter", "Non-finite losses or gradients the NaN guard caught.");
    put(&b, "nsad_anomalies_total %llu\n", (unsigned long long)atomic_load(&svc->anomalies_total));
    family(&b, "nsad_http_requests_total", "counter", "HTTP requests answered, by status code.");
    for (int i = 0; i < SERVICE_HTTP_CODES && service_http_codes[i]; i++)
        put(&b, "nsad_http_requests_total{code=\"%d\"} %llu\n", service_http_codes[i],
            (unsigned long long)atomic_load(&svc->http_requests[i]));

    if (b.oom) {
        free(b.data);
        return NULL;
    }
    if (len) *len = b.len;
    return b.data;
}
