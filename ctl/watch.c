/* watch.c - `nsactl watch ID`: polls a run until it ends and shows it live
 * (see ctlWatchRun in watch.h). */
#include "watch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "runview.h"

/* systemd restarts a crashed nsad after RestartSec=5 and it resumes the run;
 * a watcher should ride that out rather than give up on the first refused
 * connection. */
#define WATCH_RECONNECT_S 60.0

static double nowSeconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleepSeconds(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The exit code for a run that reached a final state, with a line on stderr
 * when it did not end well. */
static int finalExitCode(const cJSON *run, const char *id) {
    const char *state = ctlString(run, "state", "?");
    if (!strcmp(state, "failed")) {
        fprintf(stderr, "nsactl: run %s failed: %s\n", id, ctlString(run, "error", "(no error message)"));
        return CTL_EXIT_ERROR;
    }
    if (!strcmp(state, "nan_halted")) {
        fprintf(stderr, "nsactl: run %s was stopped by the NaN guard (%s); `nsactl resume %s` retries "
                        "from the last good checkpoint\n", id, ctlString(run, "anomaly", "non-finite values"), id);
        return CTL_EXIT_ERROR;
    }
    return CTL_OK;
}

int ctlWatchRun(Ctl *ctl, const char *run_id, double interval_s) {
    char path[256];
    snprintf(path, sizeof path, "/api/v1/runs/%s", run_id);
    char last_state[32] = "";
    double last_step = -1, lost_since = 0;
    int connected = 0, live_line = 0;
    for (;;) {
        CtlReply reply;
        char msg[HTTP_ERR_MAX * 2];
        int rc = ctlCallQuiet(ctl, "GET", path, NULL, 0, NULL, 0, &reply, msg, sizeof msg);
        double now = nowSeconds();
        int retryable = rc == CTL_EXIT_UNREACHABLE || (rc != CTL_OK && reply.http.status == 503);
        if (rc != CTL_OK) {
            if (!connected || !retryable) {
                if (live_line) putchar('\n');
                fprintf(stderr, "nsactl: %s\n", msg);
                return rc;
            }
            if (lost_since == 0) {
                lost_since = now;
                if (live_line) putchar('\n');
                live_line = 0;
                fflush(stdout);
                fprintf(stderr, "nsactl: lost nsad (%s); retrying for %.0f s\n", msg, WATCH_RECONNECT_S);
            } else if (now - lost_since > WATCH_RECONNECT_S) {
                fprintf(stderr, "nsactl: nsad did not come back within %.0f s: %s\n", WATCH_RECONNECT_S, msg);
                return rc;
            }
            sleepSeconds(interval_s);
            continue;
        }
        connected = 1;
        lost_since = 0;
        cJSON_DeleteItemFromObjectCaseSensitive(reply.json, "config");
        const char *state = ctlString(reply.json, "state", "?");
        double step = -1;
        ctlHasNumber(reply.json, "step", &step);
        int changed = strcmp(state, last_state) != 0 || step != last_step;
        snprintf(last_state, sizeof last_state, "%s", state);
        last_step = step;

        if (ctl->json) {
            if (changed) {
                char *text = cJSON_PrintUnformatted(reply.json);
                if (!text) {
                    fprintf(stderr, "nsactl: out of memory\n");
                    ctlReplyFree(&reply);
                    return CTL_EXIT_ERROR;
                }
                puts(text);
                free(text);
            }
        } else if (ctl->tty || changed) {
            char line[512];
            ctlRunLine(reply.json, line, sizeof line);
            if (ctl->tty) {
                printf("\r\033[K%s", line);
                live_line = 1;
            } else {
                puts(line);
            }
        }
        fflush(stdout);
        if (ctlRunStateFinal(state)) {
            if (live_line) putchar('\n');
            fflush(stdout);
            rc = finalExitCode(reply.json, run_id);
            ctlReplyFree(&reply);
            return rc;
        }
        ctlReplyFree(&reply);
        sleepSeconds(interval_s);
    }
}
