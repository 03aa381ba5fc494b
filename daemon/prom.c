/* prom.c - Prometheus text exposition; see prom.h. */
#include "prom.h"
#include "clockutil.h"
#include "mfu.h"
#include "strbuf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nsa.h"

static void family(StrBuf *b, const char *name, const char *type, const char *help) {
    strbufPrintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A sample value in the format's float syntax (NaN and +Inf spelled its way). */
static void value(StrBuf *b, double v) {
    if (isnan(v))
        strbufPrintf(b, " NaN\n");
    else if (isinf(v))
        strbufPrintf(b, v > 0 ? " +Inf\n" : " -Inf\n");
    else
        strbufPrintf(b, " %.17g\n", v);
}

/* Run ids and state names are [A-Za-z0-9_-]: nothing to escape in labels. */
static void runSample(StrBuf *b, const char *name, const Run *run, double v) {
    strbufPrintf(b, "%s{run_id=\"%s\"}", name, run->id);
    value(b, v);
}

typedef struct RunGauge {
    const char *name, *help;
    size_t offset; /* of a double in Run */
} RunGauge;

static const RunGauge run_gauges[] = {
    {"nsad_run_loss", "Training loss at the last logged step.", offsetof(Run, loss)},
    {"nsad_run_val_loss", "Validation loss at the last evaluation.", offsetof(Run, val_loss)},
    {"nsad_run_val_bpb", "Validation loss in bits per byte (bpb) at the last evaluation.",
     offsetof(Run, bits_per_byte)},
    {"nsad_run_tokens_per_second", "Training throughput at the last logged step.", offsetof(Run, toks_per_s)},
    {"nsad_run_learning_rate", "Learning rate at the last logged step.", offsetof(Run, lr)},
    {"nsad_run_grad_norm", "Global gradient norm at the last logged step.", offsetof(Run, grad_norm)},
    {"nsad_run_memory_bytes", "Device (or host) memory the run uses.", offsetof(Run, mem_bytes)},
};

/* A data-parallel rank's figures, per rank of the active run. */
typedef struct RankGauge {
    const char *name, *help;
    size_t offset; /* of a double in TrainRankStatus */
} RankGauge;

static const RankGauge rank_gauges[] = {
    {"nsad_rank_step_seconds", "Wall time of the rank's last logged step.",
     offsetof(TrainRankStatus, step_seconds)},
    {"nsad_rank_comm_seconds", "The rank's gradient reduce-scatters in its last logged step.",
     offsetof(TrainRankStatus, comm_seconds)},
    {"nsad_rank_comm_exposed_seconds",
     "Of those, the time after the backward's compute had ended (not hidden).",
     offsetof(TrainRankStatus, exposed_seconds)},
    {"nsad_rank_overlap_ratio", "Share of the rank's reductions the backward hid.",
     offsetof(TrainRankStatus, overlap)},
    {"nsad_rank_gather_seconds", "The weights' all-gather of the rank's last logged step.",
     offsetof(TrainRankStatus, gather_seconds)},
};

char *promRender(Service *svc, size_t *len) {
    StrBuf b;
    if (strbufInit(&b, 8192) != 0) return NULL;
    int64_t now = clockMonotonicNs();

    family(&b, "nsad_up", "gauge", "1 while nsad answers.");
    strbufPrintf(&b, "nsad_up 1\n");
    family(&b, "nsad_build_info", "gauge", "nsad's version, as a label.");
    strbufPrintf(&b, "nsad_build_info{version=\"%s\"} 1\n", NSA_VERSION);
    family(&b, "nsad_uptime_seconds", "gauge", "Seconds since nsad started.");
    strbufPrintf(&b, "nsad_uptime_seconds");
    value(&b, (double)(now - svc->started_ns) * 1e-9);

    pthread_mutex_lock(&svc->lock);
    size_t by_state[RUN_STATE_COUNT] = {0};
    for (size_t i = 0; i < svc->runs->n_runs; i++) by_state[svc->runs->runs[i]->state]++;
    family(&b, "nsad_runs", "gauge", "Stored runs by state.");
    for (int s = 0; s < RUN_STATE_COUNT; s++)
        strbufPrintf(&b, "nsad_runs{state=\"%s\"} %zu\n", runStateName((RunState)s), by_state[s]);

    /* the active runs (one per busy trainer) and the most recent other one */
    const Run *shown[SERVICE_MAX_TRAINERS + 1];
    int n_shown = 0, n_active = 0;
    for (size_t i = svc->runs->n_runs; i-- > 0 && n_shown < SERVICE_MAX_TRAINERS;)
        if (serviceTrainerOf(svc, svc->runs->runs[i]->id)) shown[n_shown++] = svc->runs->runs[i];
    n_active = n_shown;
    for (size_t i = svc->runs->n_runs; i-- > 0;)
        if (!serviceTrainerOf(svc, svc->runs->runs[i]->id)) {
            shown[n_shown++] = svc->runs->runs[i];
            break;
        }

    /* the trainers together: how many are busy, the phases they are in, and
     * the longest phase and heartbeat age among them (what an alert wants) */
    int busy = 0, in_phase[PHASE_COUNT] = {0};
    double phase_s = 0, heartbeat_s = 0;
    for (int i = 0; i < svc->n_trainers; i++) {
        const ServiceTrainer *t = &svc->trainers[i];
        if (!t->active_id[0]) continue;
        busy++;
        const int p = atomic_load(&t->mon.phase);
        if (p >= 0 && p < PHASE_COUNT) in_phase[p] = 1;
        const double ps = (double)(now - atomic_load(&t->mon.phase_since_ns)) * 1e-9;
        const double hs = (double)(now - atomic_load(&t->mon.heartbeat_ns)) * 1e-9;
        if (ps > phase_s) phase_s = ps;
        if (hs > heartbeat_s) heartbeat_s = hs;
    }
    if (!busy) in_phase[PHASE_IDLE] = 1;
    family(&b, "nsad_trainer_busy", "gauge", "Trainers holding a run (each on the GPUs or the CPU engine its run claims).");
    strbufPrintf(&b, "nsad_trainer_busy %d\n", busy);
    family(&b, "nsad_trainers", "gauge", "Trainer threads this nsad runs (1 + min(GPUs, 16)); each takes any run.");
    strbufPrintf(&b, "nsad_trainers %d\n", svc->n_trainers);
    family(&b, "nsad_trainer_phase", "gauge", "1 for each phase a busy trainer is in (idle when none is busy).");
    for (int p = 0; p < PHASE_COUNT; p++)
        strbufPrintf(&b, "nsad_trainer_phase{phase=\"%s\"} %d\n", trainPhaseName((TrainPhase)p), in_phase[p]);
    if (busy) {
        family(&b, "nsad_trainer_phase_seconds", "gauge", "Seconds the longest-running busy trainer has been in its phase.");
        strbufPrintf(&b, "nsad_trainer_phase_seconds");
        value(&b, phase_s);
        family(&b, "nsad_heartbeat_age_seconds", "gauge", "Seconds since the quietest busy trainer's last sign of life.");
        strbufPrintf(&b, "nsad_heartbeat_age_seconds");
        value(&b, heartbeat_s);
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
        family(&b, "nsad_run_mfu", "gauge",
               "Model FLOPs utilisation at the last logged step (0-1; GPU runs in bf16/fp16 only).");
        for (int i = 0; i < n_shown; i++) {
            double mfu = mfuOf(shown[i]->toks_per_s, shown[i]->flops_per_token,
                              mfuWorldPeak(shown[i]->peak_flops, shown[i]->world, shown[i]->n_ranks));
            if (isfinite(mfu)) runSample(&b, "nsad_run_mfu", shown[i], mfu);
        }
        family(&b, "nsad_run_eta_seconds", "gauge", "Estimated seconds until an active run completes.");
        for (int i = 0; i < n_active; i++)
            if (isfinite(runsEtaSeconds(shown[i], clockUnixSeconds())))
                runSample(&b, "nsad_run_eta_seconds", shown[i], runsEtaSeconds(shown[i], clockUnixSeconds()));
        /* data parallelism: the active runs' ranks on this node */
        int any_ranks = 0;
        for (int i = 0; i < n_active; i++) any_ranks |= shown[i]->n_ranks > 0;
        if (any_ranks)
            for (size_t g = 0; g < sizeof rank_gauges / sizeof rank_gauges[0]; g++) {
                family(&b, rank_gauges[g].name, "gauge", rank_gauges[g].help);
                for (int i = 0; i < n_active; i++)
                    for (int r = 0; r < shown[i]->n_ranks; r++) {
                        strbufPrintf(&b, "%s{run_id=\"%s\",rank=\"%d\"}", rank_gauges[g].name, shown[i]->id,
                                     shown[i]->ranks[r].rank);
                        value(&b, *(const double *)((const char *)&shown[i]->ranks[r] + rank_gauges[g].offset));
                    }
            }
        family(&b, "nsad_run_state", "gauge", "1 for the run's state.");
        for (int i = 0; i < n_shown; i++)
            for (int s = 0; s < RUN_STATE_COUNT; s++)
                strbufPrintf(&b, "nsad_run_state{run_id=\"%s\",state=\"%s\"} %d\n", shown[i]->id,
                    runStateName((RunState)s), s == (int)shown[i]->state);
    }
    pthread_mutex_unlock(&svc->lock);

    family(&b, "nsad_watchdog_hangs_total", "counter", "Phases that overran their watchdog deadline.");
    strbufPrintf(&b, "nsad_watchdog_hangs_total %llu\n", (unsigned long long)atomic_load(&svc->hangs_total));
    family(&b, "nsad_anomalies_total", "counter", "Non-finite losses or gradients the NaN guard caught.");
    strbufPrintf(&b, "nsad_anomalies_total %llu\n", (unsigned long long)atomic_load(&svc->anomalies_total));
    family(&b, "nsad_http_requests_total", "counter", "HTTP requests answered, by status code.");
    for (int i = 0; i < SERVICE_HTTP_CODES && service_http_codes[i]; i++)
        strbufPrintf(&b, "nsad_http_requests_total{code=\"%d\"} %llu\n", service_http_codes[i],
                     (unsigned long long)atomic_load(&svc->http_requests[i]));

    size_t n = b.len;
    char *text = strbufTake(&b);
    if (text && len) *len = n;
    return text;
}
