/* cmd_eval.c - `nsad eval CHECKPOINT --data PATH [...]`: held-out loss and
 * bits per byte of a checkpoint on a text, jsonl or shard file, in the
 * foreground (daemon/evaluate.c), progress on stderr, the result on stdout
 * (one line, or one JSON object with --json). Exit 0 on success, 1 on a
 * failure (one line naming it), 2 on a usage error. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clockutil.h"
#include "commands.h"
#include "config.h"
#include "evaluate.h"
#include "flags.h"
#include "weights.h"

static void evalUsage(FILE *out) {
    fprintf(out,
            "usage: nsad eval CHECKPOINT --data PATH [--seq-len N] [--batch N] [--max-tokens N]\n"
            "                 [--device cpu|cuda] [--precision fp32|bf16] [--threads N] [--json]\n"
            "\n"
            "Scores every next-token prediction of PATH (.txt, .jsonl, a directory of them, or\n"
            "llm.c .bin shards) in consecutive windows of seq_len + 1 tokens and prints the mean\n"
            "loss (nats/token) and bits per byte. CHECKPOINT: a checkpoint directory or a run's\n"
            "out_dir. Defaults: the run's seq_len, batch min(batch_size, 4), device and\n"
            "precision; the whole file.\n");
}

typedef struct Ticker {
    double last;
} Ticker;

static int printProgress(void *ctx, int64_t done, int64_t total, double loss) {
    Ticker *tk = ctx;
    const double now = clockMonotonicSeconds();
    if (done == total || now - tk->last >= 1.0) {
        fprintf(stderr, "eval: %5.1f%% (%lld of %lld tokens), loss %.4f\n", 100.0 * done / total,
                (long long)done, (long long)total, loss);
        tk->last = now;
    }
    return 0;
}

int cmdEval(int argc, char **argv) {
    const char *spec = NULL, *data = NULL, *device = NULL, *precision = NULL;
    long long seq_len = 0, batch = 0, max_tokens = 0, threads = -1;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            evalUsage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (v && !strcmp(a, "--data")) {
            data = argv[++i];
        } else if (v && !strcmp(a, "--device")) {
            device = argv[++i];
        } else if (v && !strcmp(a, "--precision")) {
            precision = argv[++i];
        } else if (v && !strcmp(a, "--seq-len")) {
            if (flagsInt("eval", a, argv[++i], 1, 1 << 24, &seq_len)) return EXIT_USAGE;
        } else if (v && !strcmp(a, "--batch")) {
            if (flagsInt("eval", a, argv[++i], 1, 4096, &batch)) return EXIT_USAGE;
        } else if (v && !strcmp(a, "--max-tokens")) {
            if (flagsInt("eval", a, argv[++i], 1, (long long)1 << 50, &max_tokens)) return EXIT_USAGE;
        } else if (v && !strcmp(a, "--threads")) {
            if (flagsInt("eval", a, argv[++i], 1, 256, &threads)) return EXIT_USAGE;
        } else if (a[0] == '-') {
            fprintf(stderr, "nsad eval: unknown option or missing value: '%s'\n", a);
            evalUsage(stderr);
            return EXIT_USAGE;
        } else if (spec) {
            fprintf(stderr, "nsad eval: one CHECKPOINT only (got '%s' and '%s')\n", spec, a);
            return EXIT_USAGE;
        } else {
            spec = a;
        }
    }
    if (!spec || !data) {
        fprintf(stderr, "nsad eval: %s is required\n", spec ? "--data PATH" : "CHECKPOINT");
        evalUsage(stderr);
        return EXIT_USAGE;
    }
    NsaError err = {{0}};
    Weights w;
    if (weightsOpen(spec, &w, &err)) {
        fprintf(stderr, "nsad eval: %s\n", err.message);
        return 1;
    }
    EvalOptions o = {.seq_len = (int)seq_len, .batch = (int)batch, .max_tokens = max_tokens,
                     .device = w.job.runtime.device, .precision = w.job.runtime.precision,
                     .threads = threads > 0 ? (int)threads : weightsCpuThreads(&w)};
    evalOptionsFromPath(&o, data);
    int rc = 0;
    if (device && strcmp(device, "cpu") && strcmp(device, "cuda")) {
        fprintf(stderr, "nsad eval: --device '%s'; allowed: cpu or cuda\n", device);
        rc = EXIT_USAGE;
    } else if (device) {
        o.device = !strcmp(device, "cuda") ? NSA_DEVICE_CUDA : NSA_DEVICE_CPU;
        o.precision = configAutoPrecision(o.device);
    }
    if (rc == 0 && precision) {
        if (!strcmp(precision, "fp32")) o.precision = NSA_PREC_F32;
        else if (!strcmp(precision, "bf16")) o.precision = NSA_PREC_BF16;
        else {
            fprintf(stderr, "nsad eval: --precision '%s'; allowed: fp32 or bf16\n", precision);
            rc = EXIT_USAGE;
        }
    }
    if (rc == 0) {
        Ticker tk = {clockMonotonicSeconds()};
        EvalResult r;
        if (evalRun(&w, &o, printProgress, &tk, &r, &err)) {
            fprintf(stderr, "nsad eval: %s\n", err.message);
            rc = 1;
        } else if (json) {
            cJSON *o = cJSON_CreateObject();
            evalResultToJson(o, &w, data, &r);
            char *text = cJSON_PrintUnformatted(o);
            if (text) printf("%s\n", text);
            free(text);
            cJSON_Delete(o);
        } else {
            printf("%s (step %lld) on %s: loss %.4f nats/token", w.dir, (long long)w.state.step, data,
                   r.loss);
            if (isfinite(r.bits_per_byte)) printf(", %.4f bits/byte", r.bits_per_byte);
            printf(" over %lld tokens (%lld windows of %d)\n", (long long)r.tokens,
                   (long long)r.windows, r.seq_len);
        }
    }
    weightsClose(&w);
    return rc;
}
