/* attn_gate.cu - the gate combine of the three branches, forward and
 * backward, the row deltas of the attention backward, and the dims check
 * shared by every attention launcher.
 *
 * y[t][h] = g_cmp o_cmp + g_sel o_sel + g_win o_win (per head, gates
 * post-sigmoid). Backward: do_c = g_c dy; dg_c = dy . o_c. */
#include "attn_common.cuh"

int attnCudaCheckDims(const NsaAttnDims *dims, NsaError *err) {
    if (nsaAttnDimsValidate(dims, err)) return -1;
    if (dims->d_k > NSA_CUDA_ATTN_MAX_DIM)
        return nsaErrorf(err, "cuda attention: d_k = %d; allowed: 2 to %d on the CUDA engine",
                         dims->d_k, NSA_CUDA_ATTN_MAX_DIM);
    if (dims->d_v > NSA_CUDA_ATTN_MAX_DIM)
        return nsaErrorf(err, "cuda attention: d_v = %d; allowed: 1 to %d on the CUDA engine",
                         dims->d_v, NSA_CUDA_ATTN_MAX_DIM);
    return 0;
}

/* A thread per output element (row, c). */
__global__ void gateCombineForwardKernel(float *y, const float *gates, const float *o_cmp,
                                         const float *o_sel, const float *o_win, size_t rows,
                                         int dv) {
    size_t total = rows * dv;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t row = e / dv;
        const float *g = gates + row * 3;
        y[e] = g[0] * o_cmp[e] + g[1] * o_sel[e] + g[2] * o_win[e];
    }
}

/* A warp per row: the three dots for dgates, then do_c = g_c dy. */
__global__ void gateCombineBackwardKernel(float *dgates, float *do_cmp, float *do_sel,
                                          float *do_win, const float *dy, const float *gates,
                                          const float *o_cmp, const float *o_sel,
                                          const float *o_win, size_t rows, int dv) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * ATTN_WARPS + warp;
    if (row >= rows) return;
    const size_t base = row * dv;
    const float g0 = gates[row * 3], g1 = gates[row * 3 + 1], g2 = gates[row * 3 + 2];
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f;
    for (int c = lane; c < dv; c += 32) {
        float d = dy[base + c];
        s0 = fmaf(d, o_cmp[base + c], s0);
        s1 = fmaf(d, o_sel[base + c], s1);
        s2 = fmaf(d, o_win[base + c], s2);
        do_cmp[base + c] = g0 * d;
        do_sel[base + c] = g1 * d;
        do_win[base + c] = g2 * d;
    }
    s0 = warpSum(s0);
    s1 = warpSum(s1);
    s2 = warpSum(s2);
    if (lane == 0) {
        dgates[row * 3] = s0;
        dgates[row * 3 + 1] = s1;
        dgates[row * 3 + 2] = s2;
    }
}

/* A warp per row: delta = dout . o. */
__global__ void rowDeltaKernel(float *delta, const float *dout, const float *o, size_t rows,
                               int dv) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * ATTN_WARPS + warp;
    if (row >= rows) return;
    float s = 0.0f;
    for (int c = lane; c < dv; c += 32) s = fmaf(dout[row * dv + c], o[row * dv + c], s);
    s = warpSum(s);
    if (lane == 0) delta[row] = s;
}

int attnGateCombineForward(float *y, const float *gates, const float *o_cmp, const float *o_sel,
                           const float *o_win, const NsaAttnDims *dims, cudaStream_t stream,
                           NsaError *err) {
    size_t rows = (size_t)dims->B * dims->S * dims->H;
    size_t total = rows * dims->d_v;
    if (total == 0) return 0;
    gateCombineForwardKernel<<<gridFor(total, 256), 256, 0, stream>>>(y, gates, o_cmp, o_sel,
                                                                      o_win, rows, dims->d_v);
    LAUNCH_CHECK("gateCombineForwardKernel", err);
    return 0;
}

int attnGateCombineBackward(float *dgates, float *do_cmp, float *do_sel, float *do_win,
                            const float *dy, const float *gates, const float *o_cmp,
                            const float *o_sel, const float *o_win, const NsaAttnDims *dims,
                            cudaStream_t stream, NsaError *err) {
    size_t rows = (size_t)dims->B * dims->S * dims->H;
    if (rows == 0) return 0;
    gateCombineBackwardKernel<<<ceilDiv(rows, ATTN_WARPS), 32 * ATTN_WARPS, 0, stream>>>(
        dgates, do_cmp, do_sel, do_win, dy, gates, o_cmp, o_sel, o_win, rows, dims->d_v);
    LAUNCH_CHECK("gateCombineBackwardKernel", err);
    return 0;
}

int attnRowDelta(float *delta, const float *dout, const float *o, size_t rows, int dv,
                 cudaStream_t stream, NsaError *err) {
    if (rows == 0) return 0;
    rowDeltaKernel<<<ceilDiv(rows, ATTN_WARPS), 32 * ATTN_WARPS, 0, stream>>>(delta, dout, o,
                                                                             rows, dv);
    LAUNCH_CHECK("rowDeltaKernel", err);
    return 0;
}
