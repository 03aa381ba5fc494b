/* cmd_demo.c - `nsad demo [CONFIG] [flags]`: builds a model on the CPU
 * engine, runs one forward/backward on seeded random tokens and prints the
 * loss, which at init must be close to ln(V) (the logits start near zero).
 *
 * Without a CONFIG it builds a small model (the shape of configs/tiny-cpu.yaml:
 * dim 64, 2 layers, 4 heads, 2 groups, d_k = d_v = 16, V 256, l/d/l'/n/w =
 * 8/4/16/4/32, B 2 x S 128), which finishes in well under a second. The
 * production shape (--full: dim 768, 12 layers, 79M parameters with V 256)
 * needs 1.3 GB and 10-30 s for one step of 128 tokens on two busy cores, so
 * it is opt-in. With a CONFIG the model, batch_size,
 * seq_len and seed come from the file (configLoadFile); flags given after it
 * override. Exit 0 when the loss is finite and within 0.5 of ln(V), 1 if not
 * or on an engine error, 2 on a usage error, 78 on a bad config. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clockutil.h"
#include "commands.h"
#include "config.h"
#include "flags.h"
#include "nsa.h"
#include "nsa_rng.h"

typedef struct DemoOptions {
    NsaModelConfig model;
    int batch, seq_len;
    uint64_t seed;
    NsaPrecision precision;
    int threads;
} DemoOptions;

static void demoUsage(FILE *out) {
    fprintf(out, "usage: nsad demo [CONFIG.yaml] [--full] [--dim N] [--layers N] [--heads N]\n"
                 "                 [--groups N] [--dk N] [--dv N] [--vocab N] [--phi avg|mlp]\n"
                 "                 [--mlp silu|swiglu] [--batch N] [--seq N] [--seed N]\n"
                 "                 [--precision fp32|fp64] [--threads N]\n"
                 "\n"
                 "One forward/backward of a freshly initialised model on the CPU engine over\n"
                 "seeded random tokens; prints the loss (close to ln(V) at init) and the\n"
                 "gradient norm. Default: a small model (dim 64, 2 layers) that runs in well\n"
                 "under a second; --full builds the production shape (dim 768, 12 layers:\n"
                 "slow on a CPU). Flags after --full or CONFIG override single fields.\n");
}

static void demoDefaults(DemoOptions *d) {
    nsaModelConfigDefaults(&d->model);
    d->model.dim = 64;
    d->model.n_layers = 2;
    d->model.n_heads = 4;
    d->model.n_kv_groups = 2;
    d->model.d_k = 16;
    d->model.d_v = 16;
    d->model.cmp_len = 8;
    d->model.cmp_stride = 4;
    d->model.sel_len = 16;
    d->model.n_sel = 4;
    d->model.window = 32;
    d->batch = 2;
    d->seq_len = 128;
    d->seed = 1337;
    d->precision = NSA_PREC_F32;
    d->threads = 1;
}

/* Applies one "--flag value" pair. Returns 0, or an exit status. */
static int applyFlag(DemoOptions *d, const char *flag, const char *value) {
    long long v = 0;
    struct {
        const char *name;
        int *field;
        long long lo, hi;
    } ints[] = {
        {"--dim", &d->model.dim, 1, 65536},
        {"--layers", &d->model.n_layers, 1, 1024},
        {"--heads", &d->model.n_heads, 1, 1024},
        {"--groups", &d->model.n_kv_groups, 1, 1024},
        {"--dk", &d->model.d_k, 2, 1024},
        {"--dv", &d->model.d_v, 1, 1024},
        {"--vocab", &d->model.vocab_size, 2, 1 << 24},
        {"--batch", &d->batch, 1, 4096},
        {"--seq", &d->seq_len, 1, 1 << 20},
        {"--threads", &d->threads, 1, 256},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        if (strcmp(flag, ints[i].name)) continue;
        if (flagsInt("demo", flag, value, ints[i].lo, ints[i].hi, &v)) return EXIT_USAGE;
        *ints[i].field = (int)v;
        return 0;
    }
    if (!strcmp(flag, "--seed")) {
        if (flagsInt("demo", flag, value, 0, LLONG_MAX, &v)) return EXIT_USAGE;
        d->seed = (uint64_t)v;
    } else if (!strcmp(flag, "--phi")) {
        if (!strcmp(value, "avg"))
            d->model.phi = NSA_PHI_AVG;
        else if (!strcmp(value, "mlp"))
            d->model.phi = NSA_PHI_MLP;
        else
            goto bad_choice;
    } else if (!strcmp(flag, "--mlp")) {
        if (!strcmp(value, "silu"))
            d->model.mlp = NSA_MLP_SILU;
        else if (!strcmp(value, "swiglu"))
            d->model.mlp = NSA_MLP_SWIGLU;
        else
            goto bad_choice;
    } else if (!strcmp(flag, "--precision")) {
        if (!strcmp(value, "fp32"))
            d->precision = NSA_PREC_F32;
        else if (!strcmp(value, "fp64"))
            d->precision = NSA_PREC_F64;
        else
            goto bad_choice;
    } else {
        fprintf(stderr, "nsad demo: unknown option '%s'\n", flag);
        demoUsage(stderr);
        return EXIT_USAGE;
    }
    return 0;
bad_choice:
    fprintf(stderr, "nsad demo: %s '%s' is not allowed; allowed: %s\n", flag, value,
            !strcmp(flag, "--phi")   ? "avg or mlp"
            : !strcmp(flag, "--mlp") ? "silu or swiglu"
                                     : "fp32 or fp64");
    return EXIT_USAGE;
}

/* Takes model, batch shape and seed from a job config file. */
static int loadConfig(DemoOptions *d, const char *path) {
    JobConfig *job = malloc(sizeof(*job));
    if (!job) {
        fprintf(stderr, "nsad demo: out of memory\n");
        return 1;
    }
    configDefaults(job);
    NsaError err = {{0}};
    if (configLoadFile(job, path, &err)) {
        fprintf(stderr, "nsad demo: %s\n", err.message);
        free(job);
        return EXIT_CONFIG;
    }
    for (int i = 0; i < job->n_warnings; i++)
        fprintf(stderr, "nsad demo: warning: %s\n", job->warnings[i]);
    d->model = job->model;
    d->batch = job->train.batch_size;
    d->seq_len = job->train.seq_len;
    d->seed = job->train.seed;
    d->threads = job->runtime.threads > 0 ? job->runtime.threads : 1;
    if (job->runtime.precision == NSA_PREC_F64) {
        d->precision = NSA_PREC_F64;
    } else if (job->runtime.precision != NSA_PREC_F32) {
        /* the demo is the CPU engine's: say so rather than switch quietly */
        fprintf(stderr,
                "nsad demo: note: the config asks for %s; the demo runs the CPU engine in fp32\n",
                configPrecisionName(job->runtime.precision));
    }
    if (job->runtime.device != NSA_DEVICE_CPU)
        fprintf(stderr,
                "nsad demo: note: the config asks for device %s; the demo runs on the CPU\n",
                configDeviceName(job->runtime.device));
    free(job);
    return 0;
}

/* Builds, runs and reports; returns the exit status. */
static int runDemo(const DemoOptions *d) {
    const NsaModelConfig *mc = &d->model;
    NsaEngineOptions opt = {.device = NSA_DEVICE_CPU,
                            .precision = d->precision,
                            .max_batch = d->batch,
                            .max_seq_len = d->seq_len,
                            .threads = d->threads};
    NsaError err = {{0}};
    double t0 = clockMonotonicSeconds();
    NsaModel *m = nsaModelCreate(mc, &opt, &err);
    if (!m) {
        fprintf(stderr, "nsad demo: %s\n", err.message);
        return EXIT_CONFIG;
    }
    int status = 1;
    const size_t N = (size_t)d->batch * d->seq_len;
    int32_t *tokens = malloc(N * sizeof(int32_t)), *targets = malloc(N * sizeof(int32_t));
    float *grad = NULL;
    if (!tokens || !targets) {
        fprintf(stderr, "nsad demo: out of memory for %zu tokens\n", N);
        goto done;
    }
    if (nsaModelInit(m, d->seed, &err)) goto engine_error;
    /* next-token targets over one random stream per sequence */
    NsaRng rng;
    nsaRngSeed(&rng, d->seed, 0xDE30);
    for (int b = 0; b < d->batch; b++) {
        int32_t *tok = tokens + (size_t)b * d->seq_len, *tgt = targets + (size_t)b * d->seq_len;
        tok[0] = (int32_t)nsaRngBelow(&rng, (uint32_t)mc->vocab_size);
        for (int t = 0; t < d->seq_len; t++) {
            tgt[t] = (int32_t)nsaRngBelow(&rng, (uint32_t)mc->vocab_size);
            if (t + 1 < d->seq_len) tok[t + 1] = tgt[t];
        }
    }
    double t_build = clockMonotonicSeconds() - t0;
    t0 = clockMonotonicSeconds();
    if (nsaModelZeroGrad(m, &err) ||
        nsaModelForwardBackward(m, tokens, targets, d->batch, d->seq_len, 1.0f, &err))
        goto engine_error;
    double t_step = clockMonotonicSeconds() - t0;

    /* the loss through a forward-only pass (the same batch, same weights) */
    double loss = 0;
    if (nsaModelEvalLoss(m, tokens, targets, d->batch, d->seq_len, &loss, &err)) goto engine_error;
    size_t largest = 0;
    for (int i = 0; i < nsaModelNumTensors(m); i++)
        if (nsaModelTensorInfo(m, i)->numel > largest) largest = nsaModelTensorInfo(m, i)->numel;
    grad = malloc(largest * sizeof(float));
    if (!grad) {
        fprintf(stderr, "nsad demo: out of memory\n");
        goto done;
    }
    double sum_sq = 0;
    size_t n_params = 0;
    for (int i = 0; i < nsaModelNumTensors(m); i++) {
        const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
        if (nsaModelGetTensor(m, NSA_ARENA_GRADS, i, grad, &err)) goto engine_error;
        for (size_t j = 0; j < ti->numel; j++)
            sum_sq += (double)grad[j] * grad[j];
        n_params += ti->numel;
    }
    NsaMemoryReport mem;
    nsaModelMemoryReport(m, &mem);
    const double ln_v = log((double)mc->vocab_size);
    printf("model: dim %d, layers %d, heads %d, groups %d, d_k %d, d_v %d, mlp %s F %d, V %d\n",
           mc->dim, mc->n_layers, mc->n_heads, mc->n_kv_groups, mc->d_k, mc->d_v,
           mc->mlp == NSA_MLP_SWIGLU ? "swiglu" : "silu",
           mc->mlp_hidden ? mc->mlp_hidden : 4 * mc->dim, mc->vocab_size);
    printf("nsa:   l %d, d %d, l' %d, n_sel %d, w %d, phi %s\n", mc->cmp_len, mc->cmp_stride,
           mc->sel_len, mc->n_sel, mc->window, mc->phi == NSA_PHI_MLP ? "mlp" : "avg");
    printf("engine: cpu %s, %d thread%s, %zu parameters in %d tensors, %.1f MiB in all\n",
           d->precision == NSA_PREC_F64 ? "fp64" : "fp32", d->threads, d->threads > 1 ? "s" : "",
           n_params, nsaModelNumTensors(m), mem.total / 1048576.0);
    printf("batch: %d x %d random tokens, seed %llu\n", d->batch, d->seq_len,
           (unsigned long long)d->seed);
    printf("loss %.6f  (ln V = %.6f, diff %+.6f)\n", loss, ln_v, loss - ln_v);
    printf("grad norm %.6g\n", sqrt(sum_sq));
    printf("time: build+init %.3f s, forward+backward %.3f s (%.0f tokens/s)\n", t_build, t_step,
           (double)N / t_step);
    if (!isfinite(loss) || fabs(loss - ln_v) > 0.5 || !isfinite(sum_sq)) {
        fprintf(stderr, "nsad demo: the loss at init is not close to ln(V): %.6f vs %.6f\n", loss,
                ln_v);
        goto done;
    }
    status = 0;
    goto done;
engine_error:
    fprintf(stderr, "nsad demo: %s\n", err.message);
done:
    free(grad);
    free(tokens);
    free(targets);
    nsaModelFree(m);
    return status;
}

int cmdDemo(int argc, char **argv) {
    DemoOptions d;
    demoDefaults(&d);
    int i = 1;
    if (i < argc && (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))) {
        demoUsage(stdout);
        return 0;
    }
    if (i < argc && argv[i][0] != '-') {
        int rc = loadConfig(&d, argv[i]);
        if (rc) return rc;
        i++;
    }
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            demoUsage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--full")) {
            nsaModelConfigDefaults(&d.model);
            fprintf(stderr, "nsad demo: note: the production shape on the CPU reference needs "
                            "about 1.3 GB and tens of seconds per step\n");
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "nsad demo: option '%s' needs a value\n", argv[i]);
            demoUsage(stderr);
            return EXIT_USAGE;
        }
        int rc = applyFlag(&d, argv[i], argv[i + 1]);
        if (rc) return rc;
        i++;
    }
    NsaError err = {{0}};
    if (nsaModelConfigValidate(&d.model, &err)) {
        fprintf(stderr, "nsad demo: %s\n", err.message);
        return EXIT_CONFIG;
    }
    return runDemo(&d);
}
