/* cmd_train.c - `nsad train CONFIG [options]`: one training job in the
 * foreground, through the same trainerRun the daemon uses.
 *
 * Signals are taken by a dedicated thread (sigwait), never by handlers that
 * run in the middle of a step: SIGTERM/SIGINT ask the trainer to halt after
 * the current step (it checkpoints and exits 0); SIGUSR1 and SIGQUIT write
 * every registered thread's stack to OUT/stacks-<time>.txt and training
 * goes on; SIGHUP and the rest are logged and ignored (signals.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "config.h"
#include "flags.h"
#include "log.h"
#include "signals.h"
#include "stackdump.h"
#include "trainer.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: nsad train CONFIG.yaml [--steps N] [--out DIR] [--resume DIR|latest|latest-valid]\n"
            "                  [--device cpu|cuda] [--quiet]\n"
            "\n"
            "Runs one training job in the foreground and writes its artifacts (env.json,\n"
            "heartbeat_rank0.jsonl, training.csv, val.csv, metrics.json, checkpoints/) to\n"
            "the out_dir.\n"
            "\n"
            "  --steps N        train N optimizer steps (overrides train.steps)\n"
            "  --out DIR        write into DIR (overrides train.out_dir)\n"
            "  --resume SPEC    continue from a checkpoint: 'latest' (the out_dir's newest),\n"
            "                   'latest-valid' (the newest one whose checksums verify: a damaged\n"
            "                   newest one is skipped, and the log says so), a checkpoint\n"
            "                   directory, or another run's out_dir. A damaged checkpoint is\n"
            "                   refused, never trained on\n"
            "  --device D       cpu or cuda (overrides runtime.device)\n"
            "  --quiet          no progress line per log step on stdout\n"
            "\n"
            "Signals: SIGTERM/SIGINT finish the current step, checkpoint and exit 0;\n"
            "SIGUSR1/SIGQUIT write all threads' stacks to OUT/stacks-<time>.txt and the\n"
            "run goes on; SIGHUP and others are logged and ignored. Creating\n"
            "OUT/.HALT stops the run the same way as SIGTERM.\n"
            "Exit status: 0 completed or halted, 1 failure or NaN halt, 2 usage, 78 bad config.\n");
}

/* The signal thread's view of the run. */
typedef struct SignalCtx {
    TrainMonitor *mon;
    const char *out_dir;
    sigset_t set;
    _Atomic int done;
} SignalCtx;

static void writeStackFile(const char *out_dir, const char *reason) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char stamp[32], path[4096];
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%S", &tm);
    int n = snprintf(path, sizeof path, "%s/stacks-%s.%03ldZ.txt", out_dir, stamp,
                     ts.tv_nsec / 1000000);
    if (n < 0 || (size_t)n >= sizeof path) {
        logError("%s: out_dir path too long for a stack file", reason);
        return;
    }
    mkdir(out_dir, 0755);  /* the run may not have created it yet */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        logError("%s: create %s: %s", reason, path, strerror(errno));
        return;
    }
    if (stackdumpWrite(fd, reason) != 0) logError("%s: write %s: %s", reason, path, strerror(errno));
    else logNotice("%s: stacks written to %s", reason, path);
    close(fd);
}

static void *signalThread(void *arg) {
    SignalCtx *ctx = arg;
    stackdumpRegisterThread("signals");
    int halting = 0;
    for (;;) {
        int sig;
        if (sigwait(&ctx->set, &sig) != 0) continue;
        if (atomic_load(&ctx->done)) break;
        char buf[32];
        const char *name = signalsName(sig, buf, sizeof buf);
        switch (signalsAction(sig)) {
        case SIGNAL_DUMP_STACKS: writeStackFile(ctx->out_dir, name); break;
        case SIGNAL_RELOAD:
            logNotice("%s: nsad train has nothing to reload (ignored; SIGTERM stops the run)", name);
            break;
        case SIGNAL_IGNORE: logNotice("%s: ignored (nsad gives it no meaning)", name); break;
        case SIGNAL_STOP:
            if (!halting) {
                halting = 1;
                /* the step in progress (if any) finishes first; the trainer
                 * logs the step it stopped at */
                logNotice("%s: stopping after the step in progress (%" PRId64 " done), then checkpoint and "
                          "exit", name, atomic_load(&ctx->mon->step));
                atomic_store(&ctx->mon->halt_requested, trainHaltReasonOfSignal(sig));
            } else {
                logNotice("%s: already stopping after the step in progress", name);
            }
            break;
        }
    }
    stackdumpUnregisterThread();
    return NULL;
}

int cmdTrain(int argc, char **argv) {
    const char *config_path = NULL;
    TrainOptions opt = {.device_override = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            opt.quiet = 1;
        } else if (!strcmp(a, "--steps") && has_value) {
            long long steps;
            if (flagsInt("train", "--steps", argv[++i], 1, LLONG_MAX, &steps)) return EXIT_USAGE;
            opt.steps = steps;
        } else if (!strcmp(a, "--out") && has_value) {
            opt.out_dir = argv[++i];
        } else if (!strcmp(a, "--resume") && has_value) {
            opt.resume = argv[++i];
        } else if (!strcmp(a, "--device") && has_value) {
            const char *d = argv[++i];
            if (!strcmp(d, "cpu")) opt.device_override = NSA_DEVICE_CPU;
            else if (!strcmp(d, "cuda") || !strcmp(d, "gpu")) opt.device_override = NSA_DEVICE_CUDA;
            else {
                fprintf(stderr, "nsad train: --device: '%s' is not allowed; allowed: cpu, cuda\n", d);
                return EXIT_USAGE;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "nsad train: %s: %s\n\n", a,
                    has_value ? "unknown option" : "unknown option or missing value");
            usage(stderr);
            return EXIT_USAGE;
        } else if (!config_path) {
            config_path = a;
        } else {
            fprintf(stderr, "nsad train: unexpected argument '%s' (the config is %s)\n\n", a,
                    config_path);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (!config_path) {
        usage(stderr);
        return EXIT_USAGE;
    }

    JobConfig *cfg = malloc(sizeof *cfg);
    if (!cfg) {
        fprintf(stderr, "nsad train: out of memory\n");
        return 1;
    }
    configDefaults(cfg);
    NsaError err = {{0}};
    if (configLoadFile(cfg, config_path, &err) != 0) {
        fprintf(stderr, "nsad train: %s\n", err.message);
        free(cfg);
        return EXIT_CONFIG;
    }
    for (int i = 0; i < cfg->n_warnings; i++) logWarn("%s", cfg->warnings[i]);
    /* the overrides make a new config: check it here so a bad one is a
     * config error (78), not a failed run */
    if (trainerApplyOptions(cfg, &opt, &err) != 0) {
        fprintf(stderr, "nsad train: %s\n", err.message);
        free(cfg);
        return EXIT_CONFIG;
    }
    const char *out_dir = cfg->train.out_dir;

    /* Block the signals before any thread exists, so every thread the
     * trainer starts inherits the mask and only signalThread takes them. */
    TrainMonitor mon;
    trainMonitorInit(&mon);
    SignalCtx sctx = {.mon = &mon, .out_dir = out_dir};
    signalsTakenSet(&sctx.set);
    sigset_t old_mask;
    pthread_sigmask(SIG_BLOCK, &sctx.set, &old_mask);
    struct sigaction ign = {.sa_handler = SIG_IGN}, old_pipe;
    sigaction(SIGPIPE, &ign, &old_pipe); /* a closed stdout is an EPIPE, not a death */
    pthread_t sig_thread;
    int rc = pthread_create(&sig_thread, NULL, signalThread, &sctx);
    if (rc != 0) {
        fprintf(stderr, "nsad train: cannot start the signal thread: %s\n", strerror(rc));
        pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
        sigaction(SIGPIPE, &old_pipe, NULL);
        free(cfg);
        return 1;
    }
    if (stackdumpRegisterThread("trainer") != 0)
        logWarn("stack dumps will miss the trainer thread: %s", strerror(errno));

    TrainResult res;
    int run_rc = trainerRun(cfg, &opt, &mon, NULL, &res, &err);

    stackdumpUnregisterThread();
    atomic_store(&sctx.done, 1);
    pthread_kill(sig_thread, SIGTERM);
    pthread_join(sig_thread, NULL);
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    sigaction(SIGPIPE, &old_pipe, NULL);
    free(cfg);

    switch (res.outcome) {
    case TRAIN_COMPLETED:
        logNotice("train: completed %" PRId64 " steps, loss %.4f, val_loss %.4f", res.step,
                  res.last_loss, res.last_val_loss);
        return 0;
    case TRAIN_HALTED:
        logNotice("train: stopped by %s after step %" PRId64 " (checkpointed; --resume latest continues it)",
                  res.halt_reason[0] ? res.halt_reason : "a halt", res.step);
        return 0;
    case TRAIN_NAN_HALTED:
        fprintf(stderr, "nsad train: %s\n", err.message);
        return 1;
    default:
        fprintf(stderr, "nsad train: %s\n", run_rc ? err.message : "failed");
        return 1;
    }
}
