/* attn_cuda.h - the NSA attention ops of the CUDA engine (kernels/cuda/attn_ref/).
 *
 * Correct and O(S) in memory, not yet fast (CUDA cores, fp32; the step
 * time is far above the GEMM floor and these kernels are the likely cause,
 * not yet profiled; see docs/PERF.md): a warp per
 * (token, head) row streams over the keys it may see, 32 at a time staged
 * through shared memory, with an online softmax in fp32; the key/value
 * gradients are gathered key-centric (a warp per key walks the queries that
 * see it), so there are no float atomics and every result is
 * bit-reproducible. They are the engine's attention in f32 mode (the check
 * mode) and, in bf16/fp16 mode, for dims the fast bf16 tensor-core op
 * (fast_*.cu, nsaAttnForwardCuda) does not take; the engine reports which
 * path a model uses (cuda_engine.h, nsaCudaModelAttentionPath).
 *
 * Shapes are those of kernels/nsa.h and kernels/cpu/attn_decl.h, device
 * fp32, row-major:
 *   q [B][S][H][dk]; raw branch keys k [B][S][G][dk], values v [B][S][G][dv];
 *   pooled kc [B][Nc][G][dk], vc [B][Nc][G][dv];  o [B][S][H][dv];
 *   lse [B][S][H] (-INFINITY where nothing is visible);
 *   sel_idx [B][S][G][n_sel] ascending, -1 padded;  gates [B][S][H][3].
 * Backward launchers ADD into dk/dv-type outputs only where said; dq-type
 * outputs take an `accumulate` flag (0: overwrite, 1: add) so the three
 * branches can share one dq buffer without a memset.
 * Limits: dk, dv <= NSA_CUDA_ATTN_MAX_DIM. Every launcher enqueues on
 * stream and returns 0, or -1 with err (bad dims, launch failure). */
#ifndef NSA_CUDA_ATTN_H
#define NSA_CUDA_ATTN_H

#include <cuda_runtime.h>
#include <stdint.h>
#include "../../nsa.h"

#define NSA_CUDA_ATTN_MAX_DIM 128

/* Checks dims against what these kernels support (dk, dv bounds, and the
 * generic nsaAttnDimsValidate rules). */
int attnCudaCheckDims(const NsaAttnDims *dims, NsaError *err);

/* ---- compressed branch (attn_cmp.cu) ---- */
int attnPoolAvgForward(float *pooled, const float *x, int B, int S, int G, int dim, int cmp_len,
                       int cmp_stride, cudaStream_t stream, NsaError *err);
/* dx = (accumulate ? dx : 0) + pooling backward of dpooled. */
int attnPoolAvgBackward(float *dx, const float *dpooled, int B, int S, int G, int dim,
                        int cmp_len, int cmp_stride, int accumulate, cudaStream_t stream,
                        NsaError *err);
int attnCmpForward(float *o, float *lse, const float *q, const float *kc, const float *vc,
                   const NsaAttnDims *dims, cudaStream_t stream, NsaError *err);
/* delta [B][S][H] = rowwise dot(dout, o), computed by attnRowDelta first. */
int attnCmpBackward(float *dq, int dq_accumulate, float *dkc, float *dvc, const float *dout,
                    const float *q, const float *kc, const float *vc, const float *lse,
                    const float *delta, const NsaAttnDims *dims, cudaStream_t stream,
                    NsaError *err);

/* ---- selection (attn_select.cu) ---- */
/* Scores live in shared memory (O(S/l') per row); nothing S x S exists. */
int attnSelectBlocks(int32_t *sel_idx, const float *q, const float *kc, const float *lse_cmp,
                     const NsaAttnDims *dims, cudaStream_t stream, NsaError *err);

/* ---- selected branch (attn_sel.cu) ---- */
int attnSelForward(float *o, float *lse, const float *q, const float *k, const float *v,
                   const int32_t *sel_idx, const NsaAttnDims *dims, cudaStream_t stream,
                   NsaError *err);
int attnSelBackward(float *dq, int dq_accumulate, float *dk, float *dv, const float *dout,
                    const float *q, const float *k, const float *v, const int32_t *sel_idx,
                    const float *lse, const float *delta, const NsaAttnDims *dims,
                    cudaStream_t stream, NsaError *err);

/* ---- sliding window (attn_win.cu) ---- */
int attnWinForward(float *o, float *lse, const float *q, const float *k, const float *v,
                   const NsaAttnDims *dims, cudaStream_t stream, NsaError *err);
int attnWinBackward(float *dq, int dq_accumulate, float *dk, float *dv, const float *dout,
                    const float *q, const float *k, const float *v, const float *lse,
                    const float *delta, const NsaAttnDims *dims, cudaStream_t stream,
                    NsaError *err);

/* ---- gates (attn_gate.cu) ---- */
/* y = sum_c g_c o_c per head. */
int attnGateCombineForward(float *y, const float *gates, const float *o_cmp, const float *o_sel,
                           const float *o_win, const NsaAttnDims *dims, cudaStream_t stream,
                           NsaError *err);
/* Overwrites dgates, do_cmp, do_sel, do_win. */
int attnGateCombineBackward(float *dgates, float *do_cmp, float *do_sel, float *do_win,
                            const float *dy, const float *gates, const float *o_cmp,
                            const float *o_sel, const float *o_win, const NsaAttnDims *dims,
                            cudaStream_t stream, NsaError *err);
/* delta[r] = dot(dout[r], o[r]) over rows r of length dv (B*S*H rows). */
int attnRowDelta(float *delta, const float *dout, const float *o, size_t rows, int dv,
                 cudaStream_t stream, NsaError *err);

/* ---- the whole op (attn_op.cu), as nsaAttnForwardCpu on device pointers ----
 * workspace: attnOpWorkspaceFloats(dims) floats of device memory. */
size_t attnOpWorkspaceFloats(const NsaAttnDims *dims);
int attnOpForward(const NsaAttnDims *dims, const NsaAttnInputs *in, float *out, int32_t *sel_idx,
                  float *lse_cmp, float *workspace, cudaStream_t stream, NsaError *err);
/* grads are overwritten (not accumulated). sel_idx from the forward. */
int attnOpBackward(const NsaAttnDims *dims, const NsaAttnInputs *in, const float *dout,
                   const NsaAttnGrads *grads, float *workspace, cudaStream_t stream,
                   NsaError *err);

#endif
