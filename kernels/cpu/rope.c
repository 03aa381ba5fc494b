/* rope.c - rotary position embedding, split-halves pairing. */
#include "real.h"
#include "cpu_ops.h"

#include <math.h>

/* cos_sin[t][i] = (cos(t theta_i), sin(t theta_i)), theta_i = base^(-2i/dim);
 * angles in double so long sequences keep their phase. */
void FN(nsaCpuRopeTable)(real *cos_sin, int S_max, int dim, double base) {
    const int half = dim / 2;
    for (int t = 0; t < S_max; t++)
        for (int i = 0; i < half; i++) {
            double theta = pow(base, -2.0 * i / dim);
            double angle = (double)t * theta;
            cos_sin[((size_t)t * half + i) * 2] = (real)cos(angle);
            cos_sin[((size_t)t * half + i) * 2 + 1] = (real)sin(angle);
        }
}

/* Rotation by +angle (forward) or -angle (backward, the transpose). */
static void ropeRotate(real *x, const real *cos_sin, int B, int S, int heads, int dim,
                       real sign) {
    const int half = dim / 2;
    for (size_t row = 0; row < (size_t)B * S; row++) {
        const real *cs = cos_sin + (row % (size_t)S) * half * 2;
        real *xr = x + row * heads * dim;
        for (int h = 0; h < heads; h++) {
            real *a = xr + (size_t)h * dim, *b = a + half;
            for (int i = 0; i < half; i++) {
                const real c = cs[2 * i], s = sign * cs[2 * i + 1];
                const real x0 = a[i], x1 = b[i];
                a[i] = x0 * c - x1 * s;
                b[i] = x0 * s + x1 * c;
            }
        }
    }
}

/* (x_i, x_{i+dim/2}) <- (x_i cos - x_{i+dim/2} sin, x_i sin + x_{i+dim/2} cos) */
void FN(nsaCpuRopeForward)(real *x, const real *cos_sin, int B, int S, int heads, int dim) {
    ropeRotate(x, cos_sin, B, S, heads, dim, (real)1);
}

/* dx = R(t)^T dy = R(-t) dy, in place */
void FN(nsaCpuRopeBackward)(real *dx, const real *cos_sin, int B, int S, int heads, int dim) {
    ropeRotate(dx, cos_sin, B, S, heads, dim, (real)-1);
}
