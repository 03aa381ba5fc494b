/* bench_train.cu - the CUDA engine's whole training step on the production
 * config (byte vocab, dim 768, 12 layers, 12 heads, 2 KV groups, d 64, 4x
 * SiLU MLP, l/d/l'/n/w = 32/16/64/16/512): tokens/s, MFU, the step's phases
 * and peak memory, for bench/train/run_all.sh (`make bench-train`).
 *
 *   bench_train --seq S [--batch B] [--steps N] [--warmup W] [--profile]
 *               [--recompute | --selective-recompute]
 *   bench_train --largest-seq [--recompute | --selective-recompute]
 *
 * --batch 0 (the default) takes the largest batch the engine's memory plan
 * says fits. A step is what the trainer runs: ZeroGrad, Forward, Backward,
 * OptimizerStep, StepStats (which waits for the device); its tokens are drawn
 * fresh from a seed each step. The wall time of each timed step is taken on
 * the host; CUDA events on the engine's stream split it into the forward,
 * the backward and the optimizer, and their sum against the wall time shows
 * what the host costs. --profile runs one more step between
 * cudaProfilerStart and cudaProfilerStop, for Nsight Compute's per-kernel
 * breakdown (bench/train/breakdown.py).
 *
 * --recompute builds the engine with layer activation recompute,
 * --selective-recompute with selective (NsaEngineOptions.recompute). Prints
 * one JSON line (impl "nsa", "nsa-recompute" or "nsa-selective"): S, B,
 * ms_step (median), tok_s, the phases' medians, peak_gb, flops_per_token
 * (nsaModelFlopsPerToken), loss.
 *
 * --largest-seq finds the longest sequence that trains at B = 1: the
 * largest multiple of 4096 the engine's memory plan fits (bisection), then
 * steps there (stepping down 4096 at a time while creation fails), and
 * prints {"impl": "nsa-largest", "recompute" (0 none, 1 layer, 2
 * selective), "S", "ms_step", "tok_s", "peak_gb"}. Exits 1 on any engine error or a non-finite loss. */
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_engine.h"
#include "nsa.h"
#include "nsa_rng.h"

#define CHECK(call)                                                                    \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "bench_train: %s: %s\n", #call, cudaGetErrorString(e_));   \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static double nowSeconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmpDouble(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof(double), cmpDouble);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static void drawBatch(int32_t *tok, int32_t *tgt, size_t n, int V, uint64_t step) {
    NsaRng rng;
    nsaRngSeed(&rng, 1234, step);
    for (size_t i = 0; i < n; i++) tok[i] = (int32_t)nsaRngBelow(&rng, (uint32_t)V);
    for (size_t i = 0; i < n; i++) tgt[i] = (int32_t)nsaRngBelow(&rng, (uint32_t)V);
}

static void usage(void) {
    fprintf(stderr, "usage: bench_train --seq S [--batch B] [--steps N] [--warmup W] [--profile] "
                    "[--recompute | --selective-recompute]\n"
                    "       bench_train --largest-seq [--recompute | --selective-recompute]\n");
    exit(2);
}

static NsaEngineOptions engineOptions(int B, int S, int recompute) {
    NsaEngineOptions o;
    memset(&o, 0, sizeof(o));
    o.device = NSA_DEVICE_CUDA;
    o.precision = NSA_PREC_BF16;
    o.max_batch = B;
    o.max_seq_len = S;
    o.recompute = recompute;
    return o;
}

/* 1 when the memory plan fits one sequence of S tokens. */
static int fitsOne(const NsaModelConfig *c, int S, int recompute) {
    NsaEngineOptions o = engineOptions(1, S, recompute);
    NsaCudaMemoryPlan plan;
    NsaError err = {{0}};
    return nsaCudaMemoryPlanFor(c, &o, &plan, &err) == 0 && plan.max_batch_that_fits >= 1;
}

/* Times `steps` steps at B = 1, S after one warm-up; 0 on success. */
static int timeOne(const NsaModelConfig *c, int S, int recompute, int steps, double *ms,
                   double *peak_gb, NsaError *err) {
    NsaEngineOptions o = engineOptions(1, S, recompute);
    NsaCudaModel *m = nsaCudaModelCreate(c, &o, err);
    if (!m) return -1;
    int rc = nsaCudaModelInit(m, 1, err);
    int32_t *tok = (int32_t *)malloc((size_t)S * sizeof(int32_t));
    int32_t *tgt = (int32_t *)malloc((size_t)S * sizeof(int32_t));
    NsaOptimConfig oc = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                         .weight_decay = 0.1f, .grad_clip = 1.0f};
    NsaStepStats stats;
    double best = 0;
    for (int s = 0; !rc && s < steps + 1; s++) {
        drawBatch(tok, tgt, (size_t)S, c->vocab_size, (uint64_t)s);
        double t0 = nowSeconds();
        rc = nsaCudaModelZeroGrad(m, err) || nsaCudaModelForward(m, tok, tgt, 1, S, 1.0f, err) ||
             nsaCudaModelBackward(m, err) || nsaCudaModelOptimizerStep(m, &oc, s + 1, err) ||
             nsaCudaModelStepStats(m, &stats, err);
        double t = (nowSeconds() - t0) * 1e3;
        if (!rc && !isfinite(stats.loss)) rc = nsaErrorf(err, "non-finite loss at S = %d", S);
        if (s > 0 && (best == 0 || t < best)) best = t;
    }
    *ms = best;
    *peak_gb = (double)nsaCudaModelPeakDeviceBytes(m) / 1e9;
    nsaCudaModelFree(m);
    free(tok);
    free(tgt);
    return rc;
}

static int largestSeq(const NsaModelConfig *c, int recompute) {
    const int step = 4096;
    int lo = 0, hi = (1 << 30) / step;   /* in units of step: lo fits, hi does not */
    if (!fitsOne(c, step, recompute)) {
        fprintf(stderr, "bench_train: not even S = %d fits\n", step);
        return 1;
    }
    lo = 1;
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (fitsOne(c, mid * step, recompute)) lo = mid;
        else hi = mid;
    }
    NsaError err = {{0}};
    for (int units = lo; units >= 1; units--) {
        double ms = 0, peak = 0;
        if (timeOne(c, units * step, recompute, 2, &ms, &peak, &err) == 0) {
            printf("{\"impl\": \"nsa-largest\", \"recompute\": %d, \"S\": %d, "
                   "\"plan_S\": %d, \"ms_step\": %.1f, \"tok_s\": %.0f, \"peak_gb\": %.2f}\n",
                   recompute, units * step, lo * step, ms, units * step / (ms * 1e-3), peak);
            return 0;
        }
        fprintf(stderr, "bench_train: S = %d at B = 1 does not train: %s\n", units * step,
                err.message);
        cudaGetLastError();
    }
    return 1;
}

int main(int argc, char **argv) {
    int S = 0, B = 0, steps = 10, warmup = 3, profile = 0, recompute = 0, largest = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seq") && i + 1 < argc) S = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--profile")) profile = 1;
        else if (!strcmp(argv[i], "--recompute")) recompute = NSA_RECOMPUTE_LAYER;
        else if (!strcmp(argv[i], "--selective-recompute")) recompute = NSA_RECOMPUTE_SELECTIVE;
        else if (!strcmp(argv[i], "--largest-seq")) largest = 1;
        else usage();
    }
    NsaModelConfig c;
    nsaModelConfigDefaults(&c);
    if (largest) return largestSeq(&c, recompute);
    if (S < 1 || B < 0 || steps < 1 || warmup < 0) usage();

    NsaEngineOptions o = engineOptions(B > 0 ? B : 1, S, recompute);
    NsaError err = {{0}};
    NsaCudaMemoryPlan plan;
    if (nsaCudaMemoryPlanFor(&c, &o, &plan, &err)) {
        fprintf(stderr, "bench_train: plan: %s\n", err.message);
        return 1;
    }
    if (B == 0) {
        B = plan.max_batch_that_fits;
        if (B < 1) {
            fprintf(stderr, "bench_train: not one sequence of S = %d fits\n", S);
            return 1;
        }
        o.max_batch = B;
    }
    NsaFlops flops;
    if (nsaModelFlopsPerToken(&c, S, &flops, &err)) {
        fprintf(stderr, "bench_train: flops: %s\n", err.message);
        return 1;
    }
    NsaCudaModel *m = nsaCudaModelCreate(&c, &o, &err);
    if (!m || nsaCudaModelInit(m, 1, &err)) {
        fprintf(stderr, "bench_train: create S=%d B=%d: %s\n", S, B, err.message);
        return 1;
    }
    cudaStream_t st = (cudaStream_t)nsaCudaModelStream(m);
    cudaEvent_t ev[4];
    for (int i = 0; i < 4; i++) CHECK(cudaEventCreate(&ev[i]));

    const size_t N = (size_t)B * S;
    int32_t *tok = (int32_t *)malloc(N * sizeof(int32_t));
    int32_t *tgt = (int32_t *)malloc(N * sizeof(int32_t));
    double *wall = (double *)calloc((size_t)steps, sizeof(double));
    double *fwd = (double *)calloc((size_t)steps, sizeof(double));
    double *bwd = (double *)calloc((size_t)steps, sizeof(double));
    double *opt = (double *)calloc((size_t)steps, sizeof(double));
    if (!tok || !tgt || !wall || !fwd || !bwd || !opt) {
        fprintf(stderr, "bench_train: out of host memory\n");
        return 1;
    }
    NsaOptimConfig oc = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                         .weight_decay = 0.1f, .grad_clip = 1.0f};
    NsaStepStats stats;
    memset(&stats, 0, sizeof(stats));
    const int total = warmup + steps + (profile ? 1 : 0);
    for (int s = 0; s < total; s++) {
        const int timed = s >= warmup && s < warmup + steps;
        const int profiled = s == warmup + steps;
        drawBatch(tok, tgt, N, c.vocab_size, (uint64_t)s);
        if (profiled) CHECK(cudaProfilerStart());
        double t0 = nowSeconds();
        int rc = nsaCudaModelZeroGrad(m, &err);
        if (!rc) rc = cudaEventRecord(ev[0], st) != cudaSuccess;
        if (!rc) rc = nsaCudaModelForward(m, tok, tgt, B, S, 1.0f, &err);
        if (!rc) rc = cudaEventRecord(ev[1], st) != cudaSuccess;
        if (!rc) rc = nsaCudaModelBackward(m, &err);
        if (!rc) rc = cudaEventRecord(ev[2], st) != cudaSuccess;
        if (!rc) rc = nsaCudaModelOptimizerStep(m, &oc, s + 1, &err);
        if (!rc) rc = cudaEventRecord(ev[3], st) != cudaSuccess;
        if (!rc) rc = nsaCudaModelStepStats(m, &stats, &err);
        double t1 = nowSeconds();
        if (profiled) CHECK(cudaProfilerStop());
        if (rc) {
            fprintf(stderr, "bench_train: step %d: %s\n", s, err.message[0] ? err.message : "event");
            return 1;
        }
        if (!isfinite(stats.loss) || !stats.applied) {
            fprintf(stderr, "bench_train: step %d: loss %g, applied %d\n", s, stats.loss,
                    stats.applied);
            return 1;
        }
        if (!timed) continue;
        const int k = s - warmup;
        float ms;
        wall[k] = (t1 - t0) * 1e3;
        CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        fwd[k] = ms;
        CHECK(cudaEventElapsedTime(&ms, ev[1], ev[2]));
        bwd[k] = ms;
        CHECK(cudaEventElapsedTime(&ms, ev[2], ev[3]));
        opt[k] = ms;
    }
    const double ms_step = median(wall, steps);
    const char *impl = recompute == NSA_RECOMPUTE_LAYER       ? "nsa-recompute"
                       : recompute == NSA_RECOMPUTE_SELECTIVE ? "nsa-selective"
                                                              : "nsa";
    const double tok_s = (double)N / (ms_step * 1e-3);
    NsaMemoryReport mr;
    nsaCudaModelMemoryReport(m, &mr);
    printf("{\"impl\": \"%s\", \"S\": %d, \"B\": %d, \"steps\": %d, \"ms_step\": %.3f, "
           "\"tok_s\": %.0f, \"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"opt_ms\": %.3f, "
           "\"peak_gb\": %.3f, \"flops_per_token\": %.6g, \"matmul_flops_per_token\": %.6g, "
           "\"attention_flops_per_token\": %.6g, \"loss\": %.5f, \"attention\": \"%.4s\"}\n",
           impl, S, B, steps, ms_step, tok_s, median(fwd, steps), median(bwd, steps),
           median(opt, steps), (double)nsaCudaModelPeakDeviceBytes(m) / 1e9, flops.total,
           flops.matmul, flops.attention, stats.loss, mr.attention_path);
    for (int i = 0; i < 4; i++) cudaEventDestroy(ev[i]);
    nsaCudaModelFree(m);
    free(tok); free(tgt); free(wall); free(fwd); free(bwd); free(opt);
    return 0;
}
