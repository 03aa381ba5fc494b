/* attn_gate.c - the gated combination of the three branches, per head:
 *   y = g_cmp o_cmp + g_sel o_sel + g_win o_win
 * with gates [B][S][H][3] in branch order (cmp, sel, win), already passed
 * through the sigmoid by the caller. */
#include "real.h"
#include "cpu_ops.h"

void FN(nsaCpuGateCombineForward)(real *y, const real *gates, const real *o_cmp,
                                  const real *o_sel, const real *o_win, const NsaAttnDims *dims) {
    size_t rows = (size_t)dims->B * dims->S * dims->H;
    int dv = dims->d_v;
    for (size_t r = 0; r < rows; r++) {
        const real *g = gates + r * 3;
        for (int c = 0; c < dv; c++) {
            size_t i = r * dv + c;
            y[i] = g[0] * o_cmp[i] + g[1] * o_sel[i] + g[2] * o_win[i];
        }
    }
}

/* dg_c += dy.o_c;  do_c += g_c dy  for each branch c. */
void FN(nsaCpuGateCombineBackward)(real *dgates, real *do_cmp, real *do_sel, real *do_win,
                                   const real *dy, const real *gates, const real *o_cmp,
                                   const real *o_sel, const real *o_win, const NsaAttnDims *dims) {
    size_t rows = (size_t)dims->B * dims->S * dims->H;
    int dv = dims->d_v;
    for (size_t r = 0; r < rows; r++) {
        const real *g = gates + r * 3;
        real *dg = dgates + r * 3;
        for (int c = 0; c < dv; c++) {
            size_t i = r * dv + c;
            dg[0] += dy[i] * o_cmp[i];
            dg[1] += dy[i] * o_sel[i];
            dg[2] += dy[i] * o_win[i];
            do_cmp[i] += g[0] * dy[i];
            do_sel[i] += g[1] * dy[i];
            do_win[i] += g[2] * dy[i];
        }
    }
}
