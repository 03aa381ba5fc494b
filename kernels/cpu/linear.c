/* linear.c - y = x W^T with W stored [out][in] (no bias).
 *
 * The hot loops are written so the compiler can vectorize them without
 * reassociating sums (no -ffast-math): dot products keep LANES independent
 * partial sums, and the backward is made of axpys. The summation order is
 * fixed, so results are deterministic run to run. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif
#include "real.h"
#include "cpu_ops.h"

#define LANES 8

/* sum_i a[i] b[i] with LANES partial sums, then the tail */
static real dotLanes(const real *restrict a, const real *restrict b, int n) {
    real acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += a[i + k] * b[i + k];
    real s = 0;
    for (int k = 0; k < LANES; k++) s += acc[k];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Four rows of x against one row of W: the W row is loaded once for four
 * dot products. Same lane order as dotLanes, so a row's result does not
 * depend on which rows it was grouped with. */
static void dot4Lanes(real *out, const real *restrict x0, const real *restrict x1,
                      const real *restrict x2, const real *restrict x3, const real *restrict w,
                      int n) {
    real a0[LANES] = {0}, a1[LANES] = {0}, a2[LANES] = {0}, a3[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) {
            const real wk = w[i + k];
            a0[k] += x0[i + k] * wk;
            a1[k] += x1[i + k] * wk;
            a2[k] += x2[i + k] * wk;
            a3[k] += x3[i + k] * wk;
        }
    real s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int k = 0; k < LANES; k++) {
        s0 += a0[k];
        s1 += a1[k];
        s2 += a2[k];
        s3 += a3[k];
    }
    for (; i < n; i++) {
        s0 += x0[i] * w[i];
        s1 += x1[i] * w[i];
        s2 += x2[i] * w[i];
        s3 += x3[i] * w[i];
    }
    out[0] = s0;
    out[1] = s1;
    out[2] = s2;
    out[3] = s3;
}

/* y += a x */
static void axpy(real *restrict y, const real *restrict x, real a, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* y[n][o] = x[n] . W[o] */
void FN(nsaCpuLinearForward)(real *y, const real *x, const real *w, size_t N, int in, int out) {
    size_t n = 0;
    for (; n + 4 <= N; n += 4) {
        const real *x0 = x + n * in;
        for (int o = 0; o < out; o++) {
            real s[4];
            dot4Lanes(s, x0, x0 + in, x0 + 2 * (size_t)in, x0 + 3 * (size_t)in,
                      w + (size_t)o * in, in);
            for (int r = 0; r < 4; r++) y[(n + r) * out + o] = s[r];
        }
    }
    for (; n < N; n++)
        for (int o = 0; o < out; o++) y[n * out + o] = dotLanes(x + n * in, w + (size_t)o * in, in);
}

/* wt[i][o] = w[o][i] */
void FN(nsaCpuTranspose)(real *wt, const real *w, int rows, int cols) {
    enum { TILE = 16 };
    for (int r0 = 0; r0 < rows; r0 += TILE)
        for (int c0 = 0; c0 < cols; c0 += TILE)
            for (int r = r0; r < r0 + TILE && r < rows; r++)
                for (int c = c0; c < c0 + TILE && c < cols; c++)
                    wt[(size_t)c * rows + r] = w[(size_t)r * cols + c];
}

#define OUT_BLOCK 8

/* y[n][o] = sum_i x[n][i] wt[i][o], the sum taken in i order for every
 * element: four rows times OUT_BLOCK outputs stay in registers while wt's
 * rows stream through, i.e. broadcast-multiply-add with no reductions. */
void FN(nsaCpuLinearForwardT)(real *y, const real *x, const real *wt, size_t N, int in, int out) {
    const int out_main = out / OUT_BLOCK * OUT_BLOCK;
    size_t n = 0;
    for (; n + 4 <= N; n += 4) {
        const real *x0 = x + n * in, *x1 = x0 + in, *x2 = x1 + in, *x3 = x2 + in;
        for (int ob = 0; ob < out_main; ob += OUT_BLOCK) {
            real a0[OUT_BLOCK] = {0}, a1[OUT_BLOCK] = {0}, a2[OUT_BLOCK] = {0}, a3[OUT_BLOCK] = {0};
            for (int i = 0; i < in; i++) {
                const real *wr = wt + (size_t)i * out + ob;
                const real v0 = x0[i], v1 = x1[i], v2 = x2[i], v3 = x3[i];
                for (int k = 0; k < OUT_BLOCK; k++) {
                    a0[k] += v0 * wr[k];
                    a1[k] += v1 * wr[k];
                    a2[k] += v2 * wr[k];
                    a3[k] += v3 * wr[k];
                }
            }
            for (int k = 0; k < OUT_BLOCK; k++) {
                y[n * out + ob + k] = a0[k];
                y[(n + 1) * out + ob + k] = a1[k];
                y[(n + 2) * out + ob + k] = a2[k];
                y[(n + 3) * out + ob + k] = a3[k];
            }
        }
        for (int r = 0; r < 4; r++)
            for (int o = out_main; o < out; o++) {
                real acc = 0;
                for (int i = 0; i < in; i++) acc += x[(n + r) * in + i] * wt[(size_t)i * out + o];
                y[(n + r) * out + o] = acc;
            }
    }
    for (; n < N; n++) {
        real *yr = y + n * out;
        for (int o = 0; o < out; o++) yr[o] = 0;
        for (int i = 0; i < in; i++) axpy(yr, wt + (size_t)i * out, x[n * in + i], out);
    }
}

/* One part of the backward, for the thread pool: rows [N*part/parts, ...)
 * of dx and output rows [out*part/parts, ...) of dW, so parts write
 * disjoint memory and each element sums in the same order for any parts.
 *   dx[n] += sum_o dy[n][o] W[o]  (row axpys: i-k-j order, contiguous)
 *   dW[o] += sum_n dy[n][o] x[n]   (W's row stays hot while x streams) */
void FN(nsaCpuLinearBackwardPart)(real *dx, real *dw, const real *dy, const real *x, const real *w,
                                  size_t N, int in, int out, int part, int parts) {
    if (dx) {
        const size_t lo = N * part / parts, hi = N * (part + 1) / parts;
        for (size_t n = lo; n < hi; n++) {
            real *dxr = dx + n * in;
            const real *dyr = dy + n * out;
            for (int o = 0; o < out; o++)
                if (dyr[o] != 0) axpy(dxr, w + (size_t)o * in, dyr[o], in);
        }
    }
    const int olo = (int)((size_t)out * part / parts), ohi = (int)((size_t)out * (part + 1) / parts);
    for (int o = olo; o < ohi; o++) {
        real *dwr = dw + (size_t)o * in;
        for (size_t n = 0; n < N; n++) {
            const real g = dy[n * out + o];
            if (g != 0) axpy(dwr, x + n * in, g, in);
        }
    }
}

void FN(nsaCpuLinearBackward)(real *dx, real *dw, const real *dy, const real *x, const real *w,
                              size_t N, int in, int out) {
    FN(nsaCpuLinearBackwardPart)(dx, dw, dy, x, w, N, in, out, 0, 1);
}
