/* linear.c - y = x W^T with W stored [out][in] (no bias), and the matrix
 * product the model runs it through.
 *
 * nsaCpuLinearForward/Backward are the plain definitions (dot products and
 * axpys). The model uses nsaCpuMatmul, a register-blocked product
 * y (+)= a b with b row-major [K][M]: forward y = x (W^T), dx += dy W and
 * dW += (dy^T) x are all of that form once W or dy is transposed
 * (nsaCpuTranspose, O(in*out) or O(N*out) against O(N*in*out) for the
 * product). The loops are written so the compiler vectorizes them without
 * reassociating sums (no -ffast-math): every output element is a sum over k
 * in increasing order, whichever rows a call covers, so a split of the rows
 * over threads gives the same bits. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif
#include "real.h"
#include "cpu_ops.h"

/* y += a x */
static void axpy(real *restrict y, const real *restrict x, real a, int n) {
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* y[n][o] = x[n] . W[o] */
void FN(nsaCpuLinearForward)(real *y, const real *x, const real *w, size_t N, int in, int out) {
    for (size_t n = 0; n < N; n++)
        for (int o = 0; o < out; o++) {
            const real *xr = x + n * in, *wr = w + (size_t)o * in;
            real s = 0;
            for (int i = 0; i < in; i++)
                s += xr[i] * wr[i];
            y[n * out + o] = s;
        }
}

/* dx[n] += sum_o dy[n][o] W[o] (skipped when dx is NULL);
 * dW[o] += sum_n dy[n][o] x[n] */
void FN(nsaCpuLinearBackward)(real *dx, real *dw, const real *dy, const real *x, const real *w,
                              size_t N, int in, int out) {
    for (size_t n = 0; n < N; n++)
        for (int o = 0; o < out; o++) {
            const real g = dy[n * out + o];
            if (dx) axpy(dx + n * in, w + (size_t)o * in, g, in);
            axpy(dw + (size_t)o * in, x + n * in, g, in);
        }
}

/* t[c][r] = a[r][c], in cache-sized tiles */
void FN(nsaCpuTranspose)(real *t, const real *a, size_t rows, int cols) {
    enum { TILE = 16 };
    for (size_t r0 = 0; r0 < rows; r0 += TILE)
        for (int c0 = 0; c0 < cols; c0 += TILE)
            for (size_t r = r0; r < r0 + TILE && r < rows; r++)
                for (int c = c0; c < c0 + TILE && c < cols; c++)
                    t[(size_t)c * rows + r] = a[r * cols + c];
}

#define COLS 8   /* output columns held in registers per row */

/* Four rows x COLS columns: acc_r[j] = sum_k a_r[k] b[k][m0 + j], then
 * stored or added. */
static void block4(real *y, const real *a, const real *b, int K, int M, int m0, int accumulate) {
    const real *a0 = a, *a1 = a + K, *a2 = a + 2 * (size_t)K, *a3 = a + 3 * (size_t)K;
    real c0[COLS] = {0}, c1[COLS] = {0}, c2[COLS] = {0}, c3[COLS] = {0};
    for (int k = 0; k < K; k++) {
        const real *br = b + (size_t)k * M + m0;
        const real v0 = a0[k], v1 = a1[k], v2 = a2[k], v3 = a3[k];
        for (int j = 0; j < COLS; j++) {
            c0[j] += v0 * br[j];
            c1[j] += v1 * br[j];
            c2[j] += v2 * br[j];
            c3[j] += v3 * br[j];
        }
    }
    real *y0 = y + m0, *y1 = y0 + M, *y2 = y1 + M, *y3 = y2 + M;
    for (int j = 0; j < COLS; j++) {
        y0[j] = accumulate ? y0[j] + c0[j] : c0[j];
        y1[j] = accumulate ? y1[j] + c1[j] : c1[j];
        y2[j] = accumulate ? y2[j] + c2[j] : c2[j];
        y3[j] = accumulate ? y3[j] + c3[j] : c3[j];
    }
}

/* One row x COLS columns, the same arithmetic as one row of block4. */
static void block1(real *y, const real *a, const real *b, int K, int M, int m0, int accumulate) {
    real c[COLS] = {0};
    for (int k = 0; k < K; k++) {
        const real *br = b + (size_t)k * M + m0;
        const real v = a[k];
        for (int j = 0; j < COLS; j++)
            c[j] += v * br[j];
    }
    for (int j = 0; j < COLS; j++)
        y[m0 + j] = accumulate ? y[m0 + j] + c[j] : c[j];
}

/* y[r][m] = (accumulate ? y[r][m] : 0) + sum_k a[r][k] b[k][m] for the
 * columns m_lo <= m < m_hi, a [rows][K], b [K][M], y [rows][M]. */
void FN(nsaCpuMatmulCols)(real *y, const real *a, const real *b, size_t rows, int K, int M,
                          int m_lo, int m_hi, int accumulate) {
    const int m_main = m_lo + (m_hi - m_lo) / COLS * COLS;
    size_t r = 0;
    for (; r + 4 <= rows; r += 4)
        for (int m0 = m_lo; m0 < m_main; m0 += COLS)
            block4(y + r * M, a + r * K, b, K, M, m0, accumulate);
    for (; r < rows; r++)
        for (int m0 = m_lo; m0 < m_main; m0 += COLS)
            block1(y + r * M, a + r * K, b, K, M, m0, accumulate);
    /* the last (m_hi - m_lo) % COLS columns, one element at a time */
    for (r = 0; r < rows; r++)
        for (int m = m_main; m < m_hi; m++) {
            real s = 0;
            for (int k = 0; k < K; k++)
                s += a[r * K + k] * b[(size_t)k * M + m];
            y[r * M + m] = accumulate ? y[r * M + m] + s : s;
        }
}

void FN(nsaCpuMatmul)(real *y, const real *a, const real *b, size_t rows, int K, int M,
                      int accumulate) {
    FN(nsaCpuMatmulCols)(y, a, b, rows, K, M, 0, M, accumulate);
}
