/* attn_decl.h - CPU reference NSA attention ops (one file each under
 * kernels/cpu/attn_*.c). Included per precision by cpu_ops_decl.h; no guard.
 *
 * Shapes (row-major; see kernels/nsa.h for the conventions):
 *   q [B][S][H][dk]; raw branch keys k [B][S][G][dk], values v [B][S][G][dv];
 *   pooled compressed kc [B][Nc][G][dk], vc [B][Nc][G][dv], Nc = nsaNumCmpBlocks;
 *   per-branch outputs o [B][S][H][dv]; lse [B][S][H];
 *   sel_idx [B][S][G][nsaNumSelSlots(n_sel)] ascending, -1 padded;
 *   gates [B][S][H][3].
 * Backward functions ADD into their gradient outputs (callers zero them),
 * so the model can accumulate the gradient of shared inputs. */

/* Compressed-block pooling, phi = avg: kc_i = mean of x over [i*d, i*d+l). */
void FN(nsaCpuPoolAvgForward)(real *pooled, const real *x, int B, int S, int G, int dim,
                              int cmp_len, int cmp_stride);
void FN(nsaCpuPoolAvgBackward)(real *dx, const real *dpooled, int B, int S, int G, int dim,
                               int cmp_len, int cmp_stride);

/* Compressed-block pooling, phi = mlp (shared by the G groups of a layer):
 *   pooled_i = mean_j x_j + W2 silu(W1 vec(X_i + P))
 * X_i the l x dim block, P [l][dim], W1 [dim][l*dim], W2 [dim][dim].
 * hidden [B][Nc][G][dim] saves W1 vec(X_i + P) (pre-activation) for backward. */
void FN(nsaCpuPoolMlpForward)(real *pooled, real *hidden, const real *x, const real *pos,
                              const real *w1, const real *w2, int B, int S, int G, int dim,
                              int cmp_len, int cmp_stride);
void FN(nsaCpuPoolMlpBackward)(real *dx, real *dpos, real *dw1, real *dw2, const real *dpooled,
                               const real *hidden, const real *x, const real *pos,
                               const real *w1, const real *w2, int B, int S, int G, int dim,
                               int cmp_len, int cmp_stride);

/* Compressed attention: o_t = softmax_i(scale q_t.kc_i) vc_i over blocks i
 * with i*d + l - 1 <= t; o = 0 and lse = -INFINITY when none is visible. */
void FN(nsaCpuCmpAttnForward)(real *o, real *lse, const real *q, const real *kc, const real *vc,
                              const NsaAttnDims *dims);
void FN(nsaCpuCmpAttnBackward)(real *dq, real *dkc, real *dvc, const real *dout, const real *q,
                               const real *kc, const real *vc, const real *o, const real *lse,
                               const NsaAttnDims *dims);

/* Selection: p_i = exp(scale q.kc_i - lse) per head (the compressed softmax),
 * s_j = sum over the group's heads, sum_i M_ij p_i with M_ij the fraction of
 * compressed block i inside selection block j; forced blocks 0, floor(t/l')
 * and floor(t/l')-1, then complete blocks (j+1)*l'-1 <= t by s_j descending,
 * ties to the lower j, until n_sel (the forced blocks stay even when
 * n_sel < 3). sel_idx rows hold nsaNumSelSlots(n_sel) entries, ascending,
 * -1 padded. scores (optional, [B][S][G][Ns], Ns = nsaNumSelBlocks) receives s.
 * Returns 0, or -1 when Ns exceeds 65536 (its O(Ns) scratch is on the stack). */
int FN(nsaCpuSelectBlocks)(int32_t *sel_idx, real *scores, const real *q, const real *kc,
                           const real *lse, const NsaAttnDims *dims);

/* Selected attention over the tokens <= t of the blocks in sel_idx. */
void FN(nsaCpuSelAttnForward)(real *o, real *lse, const real *q, const real *k, const real *v,
                              const int32_t *sel_idx, const NsaAttnDims *dims);
void FN(nsaCpuSelAttnBackward)(real *dq, real *dk, real *dv, const real *dout, const real *q,
                               const real *k, const real *v, const int32_t *sel_idx,
                               const real *o, const real *lse, const NsaAttnDims *dims);

/* Sliding window attention over [max(0, t-w+1), t]. */
void FN(nsaCpuWinAttnForward)(real *o, real *lse, const real *q, const real *k, const real *v,
                              const NsaAttnDims *dims);
void FN(nsaCpuWinAttnBackward)(real *dq, real *dk, real *dv, const real *dout, const real *q,
                               const real *k, const real *v, const real *o, const real *lse,
                               const NsaAttnDims *dims);

/* y = g_cmp o_cmp + g_sel o_sel + g_win o_win per head. */
void FN(nsaCpuGateCombineForward)(real *y, const real *gates, const real *o_cmp,
                                  const real *o_sel, const real *o_win, const NsaAttnDims *dims);
void FN(nsaCpuGateCombineBackward)(real *dgates, real *do_cmp, real *do_sel, real *do_win,
                                   const real *dy, const real *gates, const real *o_cmp,
                                   const real *o_sel, const real *o_win, const NsaAttnDims *dims);
