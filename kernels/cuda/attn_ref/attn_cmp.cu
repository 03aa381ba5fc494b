/* attn_cmp.cu - the compressed branch: avg pooling of keys/values into
 * blocks and attention over the visible blocks, forward and backward.
 *
 * Block i covers tokens [i*d, i*d + l) and is visible at t when
 * i*d + l - 1 <= t. kc_i = mean of k over the block (phi = avg).
 * O_cmp(t) = softmax_i(scale q_t.kc_i) vc_i over visible i; 0 if none. */
#include "attn_common.cuh"

/* Number of blocks visible at t. */
__device__ __forceinline__ int cmpVisible(int t, int l, int d, int Nc) {
    if (t < l - 1) return 0;
    int n = (t - l + 1) / d + 1;
    return n < Nc ? n : Nc;
}

/* pooled[b][i][g][c] = (1/l) sum_{u<l} x[b][i*d+u][g][c]. A thread per output. */
__global__ void poolAvgForwardKernel(float *pooled, const float *x, int B, int S, int G, int dim,
                                     int l, int d, int Nc) {
    size_t total = (size_t)B * Nc * G * dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(e % dim);
        size_t r = e / dim;
        int g = (int)(r % G);
        r /= G;
        int i = (int)(r % Nc), b = (int)(r / Nc);
        const float *src = x + (((size_t)b * S + (size_t)i * d) * G + g) * dim + c;
        float acc = 0.0f;
        for (int u = 0; u < l; u++) acc += src[(size_t)u * G * dim];
        pooled[e] = acc / (float)l;
    }
}

/* dx[b][t][g][c] (+)= (1/l) sum over blocks i containing t of dpooled[b][i][g][c]
 * (a gather: no atomics). */
__global__ void poolAvgBackwardKernel(float *dx, const float *dpooled, int B, int S, int G,
                                      int dim, int l, int d, int Nc, int accumulate) {
    size_t total = (size_t)B * S * G * dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(e % dim);
        size_t r = e / dim;
        int g = (int)(r % G);
        r /= G;
        int t = (int)(r % S), b = (int)(r / S);
        int i_lo = t - l + 1 > 0 ? (t - l + 1 + d - 1) / d : 0;
        int i_hi = t / d;
        if (i_hi > Nc - 1) i_hi = Nc - 1;
        float acc = 0.0f;
        for (int i = i_lo; i <= i_hi; i++)
            acc += dpooled[(((size_t)b * Nc + i) * G + g) * dim + c];
        acc /= (float)l;
        dx[e] = accumulate ? dx[e] + acc : acc;
    }
}

/* Forward: one warp per query row (b, t, h) over the blocks i < cmpVisible(t) of group g:
 * o = sum_i p_i vc_i, p_i = softmax_i(scale q_t.kc_i), lse = log sum_i exp(scale q_t.kc_i)
 * (o = 0, lse = -inf when no block is visible). */
__global__ void cmpForwardKernel(float *o, float *lse, const float *q, const float *kc,
                                 const float *vc, NsaAttnDims d, int Nc, float scale) {
    extern __shared__ float smem[];
    const int warp = threadIdx.x >> 5;
    const AttnWarpSmem w = attnWarpSmem(smem, warp, d.d_k, d.d_v);
    AttnQueryRow qr;
    if (!attnQueryRowOf(d, warp, qr)) return;
    const size_t row = qr.row;
    const int t = qr.t, b = qr.b, g = qr.g;
    warpStage(w.a, q + row * d.d_k, d.d_k);
    const float *K = attnGroupKeys(kc, b, g, Nc, d.G, d.d_k);
    const float *V = attnGroupKeys(vc, b, g, Nc, d.G, d.d_v);
    auto keyOf = [](int n) { return n; };
    warpAttnRowForward(w, d.d_k, d.d_v, K, (size_t)d.G * d.d_k, V, (size_t)d.G * d.d_v,
                       cmpVisible(t, d.cmp_len, d.cmp_stride, Nc), keyOf, scale,
                       o + row * d.d_v, lse + row);
}

/* dq: one warp per query row, the same blocks as the forward:
 * dq (+)= scale sum_i p_i (dO.vc_i - delta) kc_i, p_i = exp(scale q.kc_i - lse), delta = dO.o. */
__global__ void cmpBackwardDqKernel(float *dq, int accumulate, const float *dout, const float *q,
                                    const float *kc, const float *vc, const float *lse,
                                    const float *delta, NsaAttnDims d, int Nc, float scale) {
    extern __shared__ float smem[];
    const int warp = threadIdx.x >> 5;
    const AttnWarpSmem w = attnWarpSmem(smem, warp, d.d_k, d.d_v);
    AttnQueryRow qr;
    if (!attnQueryRowOf(d, warp, qr)) return;
    const size_t row = qr.row;
    const int t = qr.t, b = qr.b, g = qr.g;
    warpStage(w.a, q + row * d.d_k, d.d_k);
    warpStage(w.b, dout + row * d.d_v, d.d_v);
    const float *K = attnGroupKeys(kc, b, g, Nc, d.G, d.d_k);
    const float *V = attnGroupKeys(vc, b, g, Nc, d.G, d.d_v);
    auto keyOf = [](int n) { return n; };
    warpAttnRowBackwardDq(w, d.d_k, d.d_v, K, (size_t)d.G * d.d_k, V,
                          (size_t)d.G * d.d_v, cmpVisible(t, d.cmp_len, d.cmp_stride, Nc), keyOf,
                          scale, lse[row], delta[row], dq + row * d.d_k, accumulate);
}

/* dkc, dvc: one warp per pooled block (b, i, g); it is seen by every t >=
 * i*d + l - 1, each head of group g. Overwrites. */
__global__ void cmpBackwardDkvKernel(float *dkc, float *dvc, const float *dout, const float *q,
                                     const float *kc, const float *vc, const float *lse,
                                     const float *delta, NsaAttnDims d, int Nc, float scale) {
    extern __shared__ float smem[];
    const int warp = threadIdx.x >> 5;
    const AttnWarpSmem w = attnWarpSmem(smem, warp, d.d_k, d.d_v);
    const size_t key_row = (size_t)blockIdx.x * ATTN_WARPS + warp;  /* (b*Nc + i)*G + g */
    if (key_row >= (size_t)d.B * Nc * d.G) return;
    const int g = (int)(key_row % d.G);
    const size_t bi = key_row / d.G;
    const int i = (int)(bi % Nc), b = (int)(bi / Nc);
    const int hpg = d.H / d.G;
    warpStage(w.a, kc + key_row * d.d_k, d.d_k);
    warpStage(w.b, vc + key_row * d.d_v, d.d_v);
    const int t0 = i * d.cmp_stride + d.cmp_len - 1;
    const int n_cand = t0 < d.S ? (d.S - t0) * hpg : 0;
    const size_t row0 = ((size_t)b * d.S + t0) * d.H + (size_t)g * hpg;
    const int H = d.H;
    auto rowOf = [row0, hpg, H](int n) { return (long long)(row0 + (size_t)(n / hpg) * H + n % hpg); };
    float acc_dk[ATTN_DIM_REGS], acc_dv[ATTN_DIM_REGS];
#pragma unroll
    for (int r = 0; r < ATTN_DIM_REGS; r++) acc_dk[r] = acc_dv[r] = 0.0f;
    warpAttnKeyBackward(w, d.d_k, d.d_v, q, dout, lse, delta, n_cand, rowOf,
                        scale, acc_dk, acc_dv);
    attnStoreKeyGrads(dkc, dvc, key_row, d.d_k, d.d_v, scale, acc_dk, acc_dv);
}

int attnPoolAvgForward(float *pooled, const float *x, int B, int S, int G, int dim, int cmp_len,
                       int cmp_stride, cudaStream_t stream, NsaError *err) {
    int Nc = nsaNumCmpBlocks(S, cmp_len, cmp_stride);
    size_t total = (size_t)B * Nc * G * dim;
    if (total == 0) return 0;
    poolAvgForwardKernel<<<gridFor(total, 256), 256, 0, stream>>>(pooled, x, B, S, G, dim,
                                                                  cmp_len, cmp_stride, Nc);
    LAUNCH_CHECK("poolAvgForwardKernel", err);
    return 0;
}

int attnPoolAvgBackward(float *dx, const float *dpooled, int B, int S, int G, int dim,
                        int cmp_len, int cmp_stride, int accumulate, cudaStream_t stream,
                        NsaError *err) {
    int Nc = nsaNumCmpBlocks(S, cmp_len, cmp_stride);
    size_t total = (size_t)B * S * G * dim;
    if (total == 0) return 0;
    poolAvgBackwardKernel<<<gridFor(total, 256), 256, 0, stream>>>(
        dx, dpooled, B, S, G, dim, cmp_len, cmp_stride, Nc, accumulate);
    LAUNCH_CHECK("poolAvgBackwardKernel", err);
    return 0;
}

int attnCmpForward(float *o, float *lse, const float *q, const float *kc, const float *vc,
                   const NsaAttnDims *dims, cudaStream_t stream, NsaError *err) {
    if (attnCudaCheckDims(dims, err)) return -1;
    size_t rows = (size_t)dims->B * dims->S * dims->H;
    if (rows == 0) return 0;
    int Nc = nsaNumCmpBlocks(dims->S, dims->cmp_len, dims->cmp_stride);
    float scale = 1.0f / sqrtf((float)dims->d_k);
    ATTN_LAUNCH_WARPS(cmpForwardKernel, rows, dims, stream, err,
                      o, lse, q, kc, vc, *dims, Nc, scale);
    return 0;
}

int attnCmpBackward(float *dq, int dq_accumulate, float *dkc, float *dvc, const float *dout,
                    const float *q, const float *kc, const float *vc, const float *lse,
                    const float *delta, const NsaAttnDims *dims, cudaStream_t stream,
                    NsaError *err) {
    if (attnCudaCheckDims(dims, err)) return -1;
    size_t rows = (size_t)dims->B * dims->S * dims->H;
    if (rows == 0) return 0;
    int Nc = nsaNumCmpBlocks(dims->S, dims->cmp_len, dims->cmp_stride);
    float scale = 1.0f / sqrtf((float)dims->d_k);
    ATTN_LAUNCH_WARPS(cmpBackwardDqKernel, rows, dims, stream, err,
                      dq, dq_accumulate, dout, q, kc, vc, lse, delta, *dims, Nc, scale);
    size_t keys = (size_t)dims->B * Nc * dims->G;
    if (keys == 0) return 0;
    ATTN_LAUNCH_WARPS(cmpBackwardDkvKernel, keys, dims, stream, err,
                      dkc, dvc, dout, q, kc, vc, lse, delta, *dims, Nc, scale);
    return 0;
}
