/* adamw.c - global-norm helper and the AdamW update. */
#include "real.h"
#include "cpu_ops.h"

#include <math.h>

/* sum g_i^2, accumulated in double in index order (deterministic) */
double FN(nsaCpuSumSquares)(const real *g, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

/* m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 * p -= lr (m/bc1 / (sqrt(v/bc2) + eps) + wd p)   (decoupled decay, old p) */
void FN(nsaCpuAdamW)(real *p, const real *g, real *m, real *v, size_t n, double lr, double beta1,
                     double beta2, double eps, double weight_decay, double bc1, double bc2,
                     double grad_scale) {
    for (size_t i = 0; i < n; i++) {
        const double gi = (double)g[i] * grad_scale;
        const double mi = beta1 * m[i] + (1.0 - beta1) * gi;
        const double vi = beta2 * v[i] + (1.0 - beta2) * gi * gi;
        const double update = (mi / bc1) / (sqrt(vi / bc2) + eps);
        m[i] = (real)mi;
        v[i] = (real)vi;
        p[i] = (real)((double)p[i] - lr * (update + weight_decay * (double)p[i]));
    }
}
