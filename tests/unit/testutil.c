/* testutil.c - see testutil.h. */
#define _XOPEN_SOURCE 700
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <ftw.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void *testAlloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "testAlloc: out of memory for %zu x %zu bytes\n", n, size);
        abort();
    }
    return p;
}

void testFillF32(NsaRng *rng, float *x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * nsaRngUniform(rng));
}

void testFillF64(NsaRng *rng, double *x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * nsaRngUniform(rng);
}

static double relErr(double diff_sq, double want_sq) {
    if (isnan(diff_sq) || isnan(want_sq)) return NAN;
    if (want_sq == 0) return diff_sq == 0 ? 0 : INFINITY;
    return sqrt(diff_sq / want_sq);
}

double testRelErrF64(const double *got, const double *want, size_t n) {
    double diff_sq = 0, want_sq = 0;
    for (size_t i = 0; i < n; i++) {
        double d = got[i] - want[i];
        diff_sq += d * d;
        want_sq += want[i] * want[i];
    }
    return relErr(diff_sq, want_sq);
}

double testRelErrF32(const float *got, const double *want, size_t n) {
    double diff_sq = 0, want_sq = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        diff_sq += d * d;
        want_sq += want[i] * want[i];
    }
    return relErr(diff_sq, want_sq);
}

double *testWidenF32(const float *x, size_t n) {
    double *y = testAlloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

int testAllFiniteF32(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

int testAllFiniteF64(const double *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static int removeEntry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

char *testTempDir(const char *tag) {
    char *dir = testAlloc(strlen(tag) + 32, 1);
    sprintf(dir, "/tmp/nsad-test-%s-XXXXXX", tag);
    if (!mkdtemp(dir)) {
        fprintf(stderr, "testTempDir: mkdtemp %s: %s\n", dir, strerror(errno));
        abort();
    }
    return dir;
}

void testRemoveTree(const char *dir) { nftw(dir, removeEntry, 16, FTW_DEPTH | FTW_PHYS); }

NsaModelConfig testTinyModelConfig(NsaPhi phi, NsaMlpKind mlp) {
    NsaModelConfig c;
    nsaModelConfigDefaults(&c);
    c.vocab_size = 11, c.dim = 8, c.n_layers = 2;
    c.n_heads = 4, c.n_kv_groups = 2, c.d_k = 4, c.d_v = 6;
    c.mlp = mlp, c.mlp_hidden = 16;
    c.phi = phi, c.cmp_len = 4, c.cmp_stride = 2;
    c.sel_len = 4, c.n_sel = 3, c.window = 5;
    return c;
}

void testScrambleWeights(NsaModel *m, uint64_t seed) {
    NsaRng rng;
    nsaRngSeed(&rng, seed, 7);
    NsaError err = {{0}};
    for (int i = 0; i < nsaModelNumTensors(m); i++) {
        const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
        float *w = testAlloc(ti->numel, sizeof(float));
        testFillF32(&rng, w, ti->numel, ti->ndim == 1 ? 0.8 : -0.6, ti->ndim == 1 ? 1.2 : 0.6);
        if (nsaModelSetTensor(m, NSA_ARENA_PARAMS, i, w, &err)) {
            fprintf(stderr, "testScrambleWeights: %s: %s\n", ti->name, err.message);
            abort();
        }
        free(w);
    }
}

int testCaptureOutput(int (*fn)(void *), void *arg, char *out, size_t cap) {
    char path[] = "/tmp/nsad-test-output-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) {
        fprintf(stderr, "testCaptureOutput: mkstemp: %s\n", strerror(errno));
        abort();
    }
    fflush(stdout);
    fflush(stderr);
    const int saved_out = dup(1), saved_err = dup(2);
    dup2(fd, 1);
    dup2(fd, 2);
    const int rc = fn(arg);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
    const ssize_t n = pread(fd, out, cap - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return rc;
}
