/* testutil.h - small helpers shared by the unit tests (linked into every
 * test binary). Allocation failures abort the test program: a test has no
 * useful way to go on without its buffers. */
#ifndef NSA_TESTUTIL_H
#define NSA_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include "nsa.h"
#include "nsa_rng.h"

/* calloc that aborts with a message instead of returning NULL, and never
 * returns NULL for n == 0. The caller frees. */
void *testAlloc(size_t n, size_t size);

/* Fills x[0..n) with independent uniform draws from [lo, hi). */
void testFillF32(NsaRng *rng, float *x, size_t n, double lo, double hi);
void testFillF64(NsaRng *rng, double *x, size_t n, double lo, double hi);

/* ||got - want|| / ||want|| in the 2-norm; 0 when both are all zero and
 * +INFINITY when only want is. A NaN anywhere gives NaN. */
double testRelErrF64(const double *got, const double *want, size_t n);
double testRelErrF32(const float *got, const double *want, size_t n);

/* A new double copy of x (testAlloc'd; the caller frees). */
double *testWidenF32(const float *x, size_t n);

/* 1 if every element is finite. */
int testAllFiniteF32(const float *x, size_t n);
int testAllFiniteF64(const double *x, size_t n);

/* A new empty directory /tmp/nsad-test-TAG-XXXXXX (mkdtemp); aborts the
 * test program when it cannot be made. The caller frees the string. */
char *testTempDir(const char *tag);
/* Removes dir and everything below it (no symlink is followed); a missing
 * dir is fine. */
void testRemoveTree(const char *dir);

/* Runs fn(arg) with stdout and stderr sent to one temporary file and
 * returns fn's result; what they wrote is left in out, NUL-terminated and
 * cut at cap - 1 bytes. Aborts the test program when the file cannot be
 * made. */
int testCaptureOutput(int (*fn)(void *), void *arg, char *out, size_t cap);

/* The tiny model of the CPU model and decoder tests: V 11, C 8, 2 layers,
 * 4 query heads in 2 groups, d_k 4 != d_v 6, MLP 16, compressed blocks of
 * 4 every 2, selection blocks of 4 (3 of them), window 5; phi and the MLP
 * as given, the rest nsaModelConfigDefaults'. */
NsaModelConfig testTinyModelConfig(NsaPhi phi, NsaMlpKind mlp);

/* Replaces a CPU model's master weights with seeded draws far larger than
 * the init's (matrices in [-0.6, 0.6), norm weights and other vectors in
 * [0.8, 1.2)), so softmaxes, gates, activations and the block selection are
 * far from uniform and linear (a wrong position or block changes the
 * result). The draws are fp32 values for every precision, so an F64 model
 * and anything loaded from it through fp32 hold the same weights. Aborts
 * the test program when a tensor cannot be set. */
void testScrambleWeights(NsaModel *m, uint64_t seed);

#endif
