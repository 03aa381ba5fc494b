/* attn_win.cu - sliding-window attention, forward and backward.
 *
 * O_win(t) = softmax_j(scale q_t.k_j) v_j over j in [max(0, t-w+1), t]. */
#include "attn_common.cuh"

/* Forward: one warp per query row (b, t, h), keys t-w+1..t of group g. */
__global__ void winForwardKernel(float *o, float *lse, const float *q, const float *k,
                                 const float *v, NsaAttnDims d, float scale) {
    extern __shared__ float smem[];
    const int warp = threadIdx.x >> 5;
    const AttnWarpSmem w = attnWarpSmem(smem, warp, d.d_k, d.d_v);
    AttnQueryRow qr;
    if (!attnQueryRowOf(d, warp, qr)) return;
    const size_t row = qr.row;
    const int t = qr.t, b = qr.b, g = qr.g;
    warpStage(w.a, q + row * d.d_k, d.d_k);
    const int start = t - d.window + 1 > 0 ? t - d.window + 1 : 0;
    const float *K = attnGroupKeys(k, b, g, d.S, d.G, d.d_k);
    const float *V = attnGroupKeys(v, b, g, d.S, d.G, d.d_v);
    auto keyOf = [start](int n) { return start + n; };
    warpAttnRowForward(w, d.d_k, d.d_v, K, (size_t)d.G * d.d_k, V, (size_t)d.G * d.d_v,
                       t - start + 1, keyOf, scale, o + row * d.d_v, lse + row);
}

/* dq: one warp per query row, the same keys as the forward. */
__global__ void winBackwardDqKernel(float *dq, int accumulate, const float *dout, const float *q,
                                    const float *k, const float *v, const float *lse,
                                    const float *delta, NsaAttnDims d, float scale) {
    extern __shared__ float smem[];
    const int warp = threadIdx.x >> 5;
    const AttnWarpSmem w = attnWarpSmem(smem, warp, d.d_k, d.d_v);
    AttnQueryRow qr;
    if (!attnQueryRowOf(d, warp, qr)) return;
    const size_t row = qr.row;
    const int t = qr.t, b = qr.b, g = qr.g;
    warpStage(w.a, q + row * d.d_k, d.d_k);
    warpStage(w.b, dout + row * d.d_v, d.d_v);
    const int start = t - d.window + 1 > 0 ? t - d.window + 1 : 0;
    const float *K = attnGroupKeys(k, b, g, d.S, d.G, d.d_k);
    const float *V = attnGroupKeys(v, b, g, d.S, d.G, d.d_v);
    auto keyOf = [start](int n) { return start + n; };
    warpAttnRowBackwardDq(w, d.d_k, d.d_v, K, (size_t)d.G * d.d_k, V,
                          (size_t)d.G * d.d_v, t - start + 1, keyOf, scale, lse[row], delta[row],
                          dq + row * d.d_k, accumulate);
}

/* dk, dv: one warp per key (b, j, g); the query rows that see key j are
 * t in [j, j+w-1] for each head of group g. Overwrites dk, dv. */
__global__ void winBackwardDkvKernel(float *dk, float *dv, const float *dout, const float *q,
                                     const float *k, const float *v, const float *lse,
                                     const float *delta, NsaAttnDims d, float scale) {
    extern __shared__ float smem[];
    const int warp = threadIdx.x >> 5;
    const AttnWarpSmem w = attnWarpSmem(smem, warp, d.d_k, d.d_v);
    const size_t key_row = (size_t)blockIdx.x * ATTN_WARPS + warp;  /* (b*S + j)*G + g */
    if (key_row >= (size_t)d.B * d.S * d.G) return;
    const int g = (int)(key_row % d.G);
    const size_t bj = key_row / d.G;
    const int j = (int)(bj % d.S), b = (int)(bj / d.S);
    const int hpg = d.H / d.G;
    warpStage(w.a, k + key_row * d.d_k, d.d_k);
    warpStage(w.b, v + key_row * d.d_v, d.d_v);
    int t_last = j + d.window - 1 < d.S - 1 ? j + d.window - 1 : d.S - 1;
    const int n_cand = (t_last - j + 1) * hpg;
    const size_t row0 = ((size_t)b * d.S + j) * d.H + (size_t)g * hpg;
    const int H = d.H;
    auto rowOf = [row0, hpg, H](int n) { return (long long)(row0 + (size_t)(n / hpg) * H + n % hpg); };
    float acc_dk[ATTN_DIM_REGS], acc_dv[ATTN_DIM_REGS];
#pragma unroll
    for (int i = 0; i < ATTN_DIM_REGS; i++) acc_dk[i] = acc_dv[i] = 0.0f;
    warpAttnKeyBackward(w, d.d_k, d.d_v, q, dout, lse, delta, n_cand, rowOf,
                        scale, acc_dk, acc_dv);
    attnStoreKeyGrads(dk, dv, key_row, d.d_k, d.d_v, scale, acc_dk, acc_dv);
}

int attnWinForward(float *o, float *lse, const float *q, const float *k, const float *v,
                   const NsaAttnDims *dims, cudaStream_t stream, NsaError *err) {
    if (attnCudaCheckDims(dims, err)) return -1;
    size_t rows = (size_t)dims->B * dims->S * dims->H;
    if (rows == 0) return 0;
    float scale = 1.0f / sqrtf((float)dims->d_k);
    ATTN_LAUNCH_WARPS(winForwardKernel, rows, dims, stream, err,
                      o, lse, q, k, v, *dims, scale);
    return 0;
}

int attnWinBackward(float *dq, int dq_accumulate, float *dk, float *dv, const float *dout,
                    const float *q, const float *k, const float *v, const float *lse,
                    const float *delta, const NsaAttnDims *dims, cudaStream_t stream,
                    NsaError *err) {
    if (attnCudaCheckDims(dims, err)) return -1;
    size_t rows = (size_t)dims->B * dims->S * dims->H;
    size_t keys = (size_t)dims->B * dims->S * dims->G;
    if (rows == 0) return 0;
    float scale = 1.0f / sqrtf((float)dims->d_k);
    ATTN_LAUNCH_WARPS(winBackwardDqKernel, rows, dims, stream, err,
                      dq, dq_accumulate, dout, q, k, v, lse, delta, *dims, scale);
    ATTN_LAUNCH_WARPS(winBackwardDkvKernel, keys, dims, stream, err,
                      dk, dv, dout, q, k, v, lse, delta, *dims, scale);
    return 0;
}
