/* attn_sel.cu - selected-block attention, forward and backward.
 *
 * O_sel(t) = softmax_j(scale q_t.k_j) v_j over the tokens j <= t of the
 * selection blocks in sel_idx[b][t][g] (shared by the heads of group g). */
#include "attn_common.cuh"

/* Forward: one warp per query row (b, t, h); slot n is token n % l' of
 * the (n / l')-th selected block. */
__global__ void selForwardKernel(float *o, float *lse, const float *q, const float *k,
                                 const float *v, const int32_t *sel_idx, NsaAttnDims d,
                                 int slots, float scale) {
    __shared__ float qs[ATTN_WARPS][NSA_CUDA_ATTN_MAX_DIM];
    const int warp = threadIdx.x >> 5;
    const size_t row = (size_t)blockIdx.x * ATTN_WARPS + warp;
    if (row >= (size_t)d.B * d.S * d.H) return;
    const int h = (int)(row % d.H);
    const size_t bt = row / d.H;
    const int t = (int)(bt % d.S), b = (int)(bt / d.S);
    const int g = h / (d.H / d.G);
    warpStage(qs[warp], q + row * d.d_k, d.d_k);
    const int32_t *sel = sel_idx + (bt * d.G + g) * slots;
    const int lsel = d.sel_len;
    const float *K = k + ((size_t)b * d.S * d.G + g) * d.d_k;
    const float *V = v + ((size_t)b * d.S * d.G + g) * d.d_v;
    auto keyOf = [sel, lsel, t](int n) {
        int blk = sel[n / lsel];
        int tok = blk * lsel + n % lsel;
        return blk >= 0 && tok <= t ? tok : -1;
    };
    warpAttnRowForward(qs[warp], d.d_k, d.d_v, K, (size_t)d.G * d.d_k, V, (size_t)d.G * d.d_v,
                       slots * lsel, keyOf, scale, o + row * d.d_v, lse + row);
}

__global__ void selBackwardDqKernel(float *dq, int accumulate, const float *dout, const float *q,
                                    const float *k, const float *v, const int32_t *sel_idx,
                                    const float *lse, const float *delta, NsaAttnDims d,
                                    int slots, float scale) {
    __shared__ float qs[ATTN_WARPS][NSA_CUDA_ATTN_MAX_DIM];
    __shared__ float dos[ATTN_WARPS][NSA_CUDA_ATTN_MAX_DIM];
    const int warp = threadIdx.x >> 5;
    const size_t row = (size_t)blockIdx.x * ATTN_WARPS + warp;
    if (row >= (size_t)d.B * d.S * d.H) return;
    const int h = (int)(row % d.H);
    const size_t bt = row / d.H;
    const int t = (int)(bt % d.S), b = (int)(bt / d.S);
    const int g = h / (d.H / d.G);
    warpStage(qs[warp], q + row * d.d_k, d.d_k);
    warpStage(dos[warp], dout + row * d.d_v, d.d_v);
    const int32_t *sel = sel_idx + (bt * d.G + g) * slots;
    const int lsel = d.sel_len;
    const float *K = k + ((size_t)b * d.S * d.G + g) * d.d_k;
    const float *V = v + ((size_t)b * d.S * d.G + g) * d.d_v;
    auto keyOf = [sel, lsel, t](int n) {
        int blk = sel[n / lsel];
        int tok = blk * lsel + n % lsel;
        return blk >= 0 && tok <= t ? tok : -1;
    };
    warpAttnRowBackwardDq(qs[warp], dos[warp], d.d_k, d.d_v, K, (size_t)d.G * d.d_k, V,
                          (size_t)d.G * d.d_v, slots * lsel, keyOf, scale, lse[row], delta[row],
                          dq + row * d.d_k, accumulate);
}

#define SEL_KEYS_PER_BLOCK 32
#define SEL_SCAN_THREADS (32 * ATTN_WARPS)

/* Does row sel (ascending, -1 padded) hold block jb? */
__device__ __forceinline__ int selHolds(const int32_t *sel, int slots, int jb) {
    for (int s = 0; s < slots; s++) {
        int blk = sel[s];
        if (blk == jb) return 1;
        if (blk < 0 || blk > jb) return 0;
    }
    return 0;
}

/* dk, dv of up to 32 keys of selection block jb for group g. The block
 * scans the queries t >= first key in tiles, keeps (in order) those whose
 * selected set holds jb, and each warp folds them into the gradients of its
 * keys (accumulated in shared memory, one owner per key: no atomics).
 * Overwrites dk, dv of its keys. */
__global__ void selBackwardDkvKernel(float *dk, float *dv, const float *dout, const float *q,
                                     const float *k, const float *v, const int32_t *sel_idx,
                                     const float *lse, const float *delta, NsaAttnDims d,
                                     int slots, int Ns, int subtiles, float scale) {
    extern __shared__ float smem[];
    __shared__ int members[SEL_SCAN_THREADS];
    __shared__ int warp_counts[ATTN_WARPS];
    const int dk_ = d.d_k, dv_ = d.d_v;
    float *ks = smem;                                   /* [32][dk] */
    float *vs = ks + SEL_KEYS_PER_BLOCK * dk_;          /* [32][dv] */
    float *adk = vs + SEL_KEYS_PER_BLOCK * dv_;         /* [32][dk] */
    float *adv = adk + SEL_KEYS_PER_BLOCK * dk_;        /* [32][dv] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    size_t bid = blockIdx.x;
    const int sub = (int)(bid % subtiles);
    bid /= subtiles;
    const int jb = (int)(bid % Ns);
    bid /= Ns;
    const int g = (int)(bid % d.G), b = (int)(bid / d.G);
    const int key0 = jb * d.sel_len + sub * SEL_KEYS_PER_BLOCK;
    int key_end = (jb + 1) * d.sel_len < d.S ? (jb + 1) * d.sel_len : d.S;
    if (key0 + SEL_KEYS_PER_BLOCK < key_end) key_end = key0 + SEL_KEYS_PER_BLOCK;
    const int nkeys = key_end - key0;
    if (nkeys <= 0) return;
    const int hpg = d.H / d.G;

    for (int e = threadIdx.x; e < nkeys * dk_; e += blockDim.x) {
        int kk = e / dk_, c = e % dk_;
        ks[e] = k[(((size_t)b * d.S + key0 + kk) * d.G + g) * dk_ + c];
        adk[e] = 0.0f;
    }
    for (int e = threadIdx.x; e < nkeys * dv_; e += blockDim.x) {
        int kk = e / dv_, c = e % dv_;
        vs[e] = v[(((size_t)b * d.S + key0 + kk) * d.G + g) * dv_ + c];
        adv[e] = 0.0f;
    }
    __syncthreads();

    for (int t0 = key0; t0 < d.S; t0 += SEL_SCAN_THREADS) {
        const int t = t0 + threadIdx.x;
        int flag = t < d.S && selHolds(sel_idx + (((size_t)b * d.S + t) * d.G + g) * slots, slots, jb);
        unsigned ballot = __ballot_sync(0xffffffffu, flag);
        if (lane == 0) warp_counts[warp] = __popc(ballot);
        __syncthreads();
        int offset = 0, total = 0;
        for (int w = 0; w < ATTN_WARPS; w++) {
            if (w < warp) offset += warp_counts[w];
            total += warp_counts[w];
        }
        if (flag) members[offset + __popc(ballot & ((1u << lane) - 1u))] = t;
        __syncthreads();
        if (total > 0) {
            for (int kk = warp; kk < nkeys; kk += ATTN_WARPS) {
                const int j = key0 + kk;
                const int H = d.H, S = d.S;
                const int *mem = members;
                auto rowOf = [mem, hpg, H, S, b, g, j](int n) {
                    int tq = mem[n / hpg];
                    if (tq < j) return -1LL;
                    return (long long)((((size_t)b * S + tq) * H) + (size_t)g * hpg + n % hpg);
                };
                float acc_dk[ATTN_DIM_REGS], acc_dv[ATTN_DIM_REGS];
#pragma unroll
                for (int r = 0; r < ATTN_DIM_REGS; r++) acc_dk[r] = acc_dv[r] = 0.0f;
                warpAttnKeyBackward(ks + kk * dk_, vs + kk * dv_, dk_, dv_, q, dout, lse, delta,
                                    total * hpg, rowOf, scale, acc_dk, acc_dv);
#pragma unroll
                for (int r = 0; r < ATTN_DIM_REGS; r++) {
                    int c = lane + 32 * r;
                    if (c < dk_) adk[kk * dk_ + c] += acc_dk[r];
                    if (c < dv_) adv[kk * dv_ + c] += acc_dv[r];
                }
            }
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < nkeys * dk_; e += blockDim.x) {
        int kk = e / dk_, c = e % dk_;
        dk[(((size_t)b * d.S + key0 + kk) * d.G + g) * dk_ + c] = scale * adk[e];
    }
    for (int e = threadIdx.x; e < nkeys * dv_; e += blockDim.x) {
        int kk = e / dv_, c = e % dv_;
        dv[(((size_t)b * d.S + key0 + kk) * d.G + g) * dv_ + c] = adv[e];
    }
}

int attnSelForward(float *o, float *lse, const float *q, const float *k, const float *v,
                   const int32_t *sel_idx, const NsaAttnDims *dims, cudaStream_t stream,
                   NsaError *err) {
    if (attnCudaCheckDims(dims, err)) return -1;
    size_t rows = (size_t)dims->B * dims->S * dims->H;
    if (rows == 0) return 0;
    float scale = 1.0f / sqrtf((float)dims->d_k);
    selForwardKernel<<<ceilDiv(rows, ATTN_WARPS), 32 * ATTN_WARPS, 0, stream>>>(
        o, lse, q, k, v, sel_idx, *dims, nsaNumSelSlots(dims->n_sel), scale);
    LAUNCH_CHECK("selForwardKernel", err);
    return 0;
}

int attnSelBackward(float *dq, int dq_accumulate, float *dk, float *dv, const float *dout,
                    const float *q, const float *k, const float *v, const int32_t *sel_idx,
                    const float *lse, const float *delta, const NsaAttnDims *dims,
                    cudaStream_t stream, NsaError *err) {
    if (attnCudaCheckDims(dims, err)) return -1;
    size_t rows = (size_t)dims->B * dims->S * dims->H;
    if (rows == 0) return 0;
    float scale = 1.0f / sqrtf((float)dims->d_k);
    int slots = nsaNumSelSlots(dims->n_sel);
    selBackwardDqKernel<<<ceilDiv(rows, ATTN_WARPS), 32 * ATTN_WARPS, 0, stream>>>(
        dq, dq_accumulate, dout, q, k, v, sel_idx, lse, delta, *dims, slots, scale);
    LAUNCH_CHECK("selBackwardDqKernel", err);
    int Ns = nsaNumSelBlocks(dims->S, dims->sel_len);
    int subtiles = (dims->sel_len + SEL_KEYS_PER_BLOCK - 1) / SEL_KEYS_PER_BLOCK;
    size_t blocks = (size_t)dims->B * dims->G * Ns * subtiles;
    size_t smem = (size_t)SEL_KEYS_PER_BLOCK * 2 * (dims->d_k + dims->d_v) * sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute(selBackwardDkvKernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err);
    selBackwardDkvKernel<<<(unsigned)blocks, SEL_SCAN_THREADS, smem, stream>>>(
        dk, dv, dout, q, k, v, sel_idx, lse, delta, *dims, slots, Ns, subtiles, scale);
    LAUNCH_CHECK("selBackwardDkvKernel", err);
    return 0;
}
