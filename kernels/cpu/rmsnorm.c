/* rmsnorm.c - RMSNorm with a learned weight. */
#include "real.h"
#include "cpu_ops.h"

#include <math.h>

/* y = x * rstd * w,  rstd = 1 / sqrt(mean_c x_c^2 + eps)  (the mean in double) */
void FN(nsaCpuRmsNormForward)(real *y, real *rstd, const real *x, const real *w, size_t N, int C,
                              double eps) {
    for (size_t n = 0; n < N; n++) {
        const real *xr = x + n * C;
        real *yr = y + n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        real r = (real)(1.0 / sqrt(ss / C + eps));
        rstd[n] = r;
        for (int c = 0; c < C; c++) yr[c] = xr[c] * r * w[c];
    }
}

/* With u = w * dy:  dx = rstd * u - x * rstd^3 * mean_c(u_c x_c);
 * dw += dy * x * rstd (summed over rows). */
void FN(nsaCpuRmsNormBackward)(real *dx, real *dw, const real *dy, const real *x, const real *w,
                               const real *rstd, size_t N, int C) {
    for (size_t n = 0; n < N; n++) {
        const real *xr = x + n * C, *dyr = dy + n * C;
        real *dxr = dx + n * C;
        const real r = rstd[n];
        double dot = 0.0;
        for (int c = 0; c < C; c++) dot += (double)w[c] * dyr[c] * xr[c];
        const real k = (real)(dot / C * (double)r * r * r);
        for (int c = 0; c < C; c++) {
            dxr[c] += r * w[c] * dyr[c] - xr[c] * k;
            dw[c] += dyr[c] * xr[c] * r;
        }
    }
}
