/* runview.c - see runview.h. */
#include "runview.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include "format.h"

int ctlRunStateFinal(const char *state) {
    return !strcmp(state, "halted") || !strcmp(state, "completed") || !strcmp(state, "failed") ||
           !strcmp(state, "nan_halted");
}

void ctlRunDevice(const cJSON *run, char *buf, size_t cap) {
    const char *device = ctlString(run, "device", "-");
    const cJSON *gpus = cJSON_GetObjectItemCaseSensitive(run, "gpus"), *g;
    size_t n = (size_t)snprintf(buf, cap, "%s", device);
    if (!cJSON_IsArray(gpus) || cJSON_GetArraySize(gpus) == 0) return;
    cJSON_ArrayForEach(g, gpus) if (n < cap && cJSON_IsNumber(g))
        n += (size_t)snprintf(buf + n, cap - n, "%c%d", g == gpus->child ? ':' : ',', g->valueint);
}

void ctlRunLine(const cJSON *run, char *buf, size_t cap) {
    double step = 0, total = 0, loss = 0, val = 0, tps = 0, eta = -1, age = 0;
    int have_step = ctlHasNumber(run, "step", &step);
    int have_total = ctlHasNumber(run, "total_steps", &total);
    int have_loss = ctlHasNumber(run, "loss", &loss);
    int have_val = ctlHasNumber(run, "val_loss", &val);
    int have_tps = ctlHasNumber(run, "toks_per_s", &tps);
    ctlHasNumber(run, "eta_s", &eta);
    const char *state = ctlString(run, "state", "?");
    char loss_s[32], val_s[32], tps_s[32], eta_s[32], phase_s[96] = "", anomaly_s[96] = "", mfu_s[32] = "";
    double mfu = 0;
    if (ctlHasNumber(run, "mfu", &mfu)) snprintf(mfu_s, sizeof mfu_s, " (MFU %.1f%%)", 100.0 * mfu);

    const char *phase = ctlString(run, "phase", NULL);
    double position = 0;
    if (!strcmp(state, "queued") && ctlHasNumber(run, "queue_position", &position))
        snprintf(phase_s, sizeof phase_s, " #%.0f", position);
    if (!strcmp(state, "hung") && phase && ctlHasNumber(run, "phase_age_s", &age)) {
        char age_s[32];
        snprintf(phase_s, sizeof phase_s, " (%s for %s)", phase, formatDuration(age, age_s, sizeof age_s));
    }
    const char *anomaly = ctlString(run, "anomaly", NULL);
    if (anomaly) snprintf(anomaly_s, sizeof anomaly_s, "  anomaly %s", anomaly);

    char progress[96];
    if (have_step && have_total && total > 0)
        snprintf(progress, sizeof progress, "step %.0f/%.0f (%.0f%%)", step, total,
                 floor(100.0 * step / total));
    else if (have_step)
        snprintf(progress, sizeof progress, "step %.0f", step);
    else
        snprintf(progress, sizeof progress, "step -");

    int active = !ctlRunStateFinal(state);
    /* where a CUDA run trains (several may train at once on one node) */
    char gpus_s[112] = "", where[96];
    ctlRunDevice(run, where, sizeof where);
    if (active && strchr(where, ':')) snprintf(gpus_s, sizeof gpus_s, "  on %s", where);
    snprintf(buf, cap, "%s  %s%s  %s  loss %s  val %s  %s tok/s%s%s%s%s%s",
             ctlString(run, "id", "?"), state, phase_s, progress,
             formatLoss(loss, have_loss, loss_s, sizeof loss_s),
             formatLoss(val, have_val, val_s, sizeof val_s),
             have_tps ? formatSi(tps, tps_s, sizeof tps_s) : "-", mfu_s,
             active ? "  ETA " : "", active ? formatDuration(eta, eta_s, sizeof eta_s) : "",
             gpus_s, anomaly_s);
}
