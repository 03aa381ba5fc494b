/* gpu_util.h - small helpers shared by the GPU test, bench and train
 * programs: a TAP-style result table, seeded random fills, error norms,
 * device buffers. Header-only (static functions); tests/gpu only. */
#ifndef NSA_GPU_UTIL_H
#define NSA_GPU_UTIL_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "nsa.h"
#include "nsa_rng.h"

/* ---- results table ---- */
#define MAX_RESULTS 256
typedef struct Result {
    char name[96];
    char detail[160];
    int ok;
    double seconds;
} Result;
typedef struct Results {
    Result r[MAX_RESULTS];
    int n;
} Results;

static inline double nowSeconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void report(Results *res, int ok, double seconds, const char *name, const char *fmt, ...) {
    int i = res->n < MAX_RESULTS ? res->n++ : MAX_RESULTS - 1;
    Result *r = &res->r[i];
    snprintf(r->name, sizeof(r->name), "%s", name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof(r->detail), fmt, ap);
    va_end(ap);
    r->ok = ok;
    r->seconds = seconds;
    printf("%s %d - %s: %s\n", ok ? "ok" : "not ok", i + 1, name, r->detail);
    fflush(stdout);
}

static inline int printTable(const Results *res) {
    int passed = 0, failed = 0;
    printf("\n%-4s %-44s %-6s %7s  %s\n", "#", "test", "result", "seconds", "detail");
    for (int i = 0; i < res->n; i++) {
        const Result *r = &res->r[i];
        printf("%-4d %-44s %-6s %7.2f  %s\n", i + 1, r->name, r->ok ? "PASS" : "FAIL", r->seconds,
               r->detail);
        if (r->ok) passed++; else failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed;
}

/* ---- random ---- */
static inline void fillUniform(float *x, size_t n, uint64_t seed, uint64_t stream, float lo, float hi) {
    NsaRng rng;
    nsaRngSeed(&rng, seed, stream);
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)nsaRngUniform(&rng);
}

static inline void fillTokens(int32_t *x, size_t n, uint64_t seed, uint64_t stream, int V) {
    NsaRng rng;
    nsaRngSeed(&rng, seed, stream);
    for (size_t i = 0; i < n; i++) x[i] = (int32_t)nsaRngBelow(&rng, (uint32_t)V);
}

/* ||a - b|| / max(||b||, tiny); NaN anywhere gives +inf. */
static inline double relErr(const float *a, const float *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (den < 1e-300) return sqrt(num) < 1e-12 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

static inline double relErrD(const float *a, const double *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    if (den < 1e-300) return sqrt(num) < 1e-12 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

/* ---- device buffers (abort the program on failure: test code only) ---- */
#define GPU_OK(call)                                                                  \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,       \
                    cudaGetErrorString(e_));                                          \
            exit(2);                                                                  \
        }                                                                             \
    } while (0)

static inline void *devAlloc(size_t bytes) {
    void *p = NULL;
    GPU_OK(cudaMalloc(&p, bytes ? bytes : 16));
    /* poison: NaN floats, so unwritten outputs fail the comparisons */
    GPU_OK(cudaMemset(p, 0xff, bytes ? bytes : 16));
    return p;
}

static inline float *devFrom(const float *h, size_t n) {
    float *d = (float *)devAlloc(n * sizeof(float));
    GPU_OK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static inline void toHost(void *h, const void *d, size_t bytes) {
    GPU_OK(cudaDeviceSynchronize());
    GPU_OK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

static inline float *hostAlloc(size_t n) {
    float *p = (float *)calloc(n ? n : 1, sizeof(float));
    if (!p) { fprintf(stderr, "FATAL: out of host memory (%zu floats)\n", n); exit(2); }
    return p;
}

#endif
