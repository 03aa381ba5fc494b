/* activation.c - elementwise SiLU, SwiGLU and sigmoid. */
#include "real.h"
#include "cpu_ops.h"

#include <math.h>

static inline real sigmoidOf(real a) { return (real)1 / ((real)1 + exp(-a)); }

/* silu(a) = a sigmoid(a) */
void FN(nsaCpuSiluForward)(real *out, const real *a, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] * sigmoidOf(a[i]);
}

/* silu'(a) = s (1 + a (1 - s)),  s = sigmoid(a) */
void FN(nsaCpuSiluBackward)(real *da, const real *dout, const real *a, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const real s = sigmoidOf(a[i]);
        da[i] += dout[i] * s * ((real)1 + a[i] * ((real)1 - s));
    }
}

/* out = silu(a) b */
void FN(nsaCpuSwigluForward)(real *out, const real *a, const real *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] * sigmoidOf(a[i]) * b[i];
}

/* da += dout b silu'(a);  db += dout silu(a) */
void FN(nsaCpuSwigluBackward)(real *da, real *db, const real *dout, const real *a, const real *b,
                              size_t n) {
    for (size_t i = 0; i < n; i++) {
        const real s = sigmoidOf(a[i]);
        da[i] += dout[i] * b[i] * s * ((real)1 + a[i] * ((real)1 - s));
        db[i] += dout[i] * a[i] * s;
    }
}

/* g = 1 / (1 + exp(-a)) */
void FN(nsaCpuSigmoidForward)(real *out, const real *a, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = sigmoidOf(a[i]);
}

/* da += dout g (1 - g), from the saved output g */
void FN(nsaCpuSigmoidBackward)(real *da, const real *dout, const real *g, size_t n) {
    for (size_t i = 0; i < n; i++) da[i] += dout[i] * g[i] * ((real)1 - g[i]);
}
