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
    extern __shared__ float smem[];
    const int warp = threadIdx.x >> 5;
    const AttnWarpSmem w = attnWarpSmem(smem, warp, d.d_k, d.d_v);
    AttnQueryRow qr;
    if (!attnQueryRowOf(d, warp, qr)) return;
    const size_t row = qr.row, bt = qr.bt;
    const int t = qr.t, b = qr.b, g = qr.g;
    warpStage(w.a, q + row * d.d_k, d.d_k);
    const int32_t *sel = sel_idx + (bt * d.G + g) * slots;
    const int lsel = d.sel_len;
    const float *K = attnGroupKeys(k, b, g, d.S, d.G, d.d_k);
    const float *V = attnGroupKeys(v, b, g, d.S, d.G, d.d_v);
    auto keyOf = [sel, lsel, t](int n) {
        int blk = sel[n / lsel];
        int tok = blk * lsel + n % lsel;
        return blk >= 0 && tok <= t ? tok : -1;
    };
    warpAttnRowForward(w, d.d_k, d.d_v, K, (size_t)d.G * d.d_k, V, (size_t)d.G * d.d_v,
                       slots * lsel, keyOf, scale, o + row * d.d_v, lse + row);
}

/* dq: one warp per query row, the same keys as the forward:
 * dq (+)= scale sum_j p_j (dO.v_j - delta) k_j, p_j = exp(scale q.k_j - lse), delta = dO.o. */
__global__ void selBackwardDqKernel(float *dq, int accumulate, const float *dout, const float *q,
                                    const float *k, const float *v, const int32_t *sel_idx,
                                    const float *lse, const float *delta, NsaAttnDims d,
                                    int slots, float scale) {
    extern __shared__ float smem[];
    const int warp = threadIdx.x >> 5;
    const AttnWarpSmem w = attnWarpSmem(smem, warp, d.d_k, d.d_v);
    AttnQueryRow qr;
    if (!attnQueryRowOf(d, warp, qr)) return;
    const size_t row = qr.row, bt = qr.bt;
    const int t = qr.t, b = qr.b, g = qr.g;
    warpStage(w.a, q + row * d.d_k, d.d_k);
    warpStage(w.b, dout + row * d.d_v, d.d_v);
    const int32_t *sel = sel_idx + (bt * d.G + g) * slots;
    const int lsel = d.sel_len;
    const float *K = attnGroupKeys(k, b, g, d.S, d.G, d.d_k);
    const float *V = attnGroupKeys(v, b, g, d.S, d.G, d.d_v);
    auto keyOf = [sel, lsel, t](int n) {
        int blk = sel[n / lsel];
        int tok = blk * lsel + n % lsel;
        return blk >= 0 && tok <= t ? tok : -1;
    };
    warpAttnRowBackwardDq(w, d.d_k, d.d_v, K, (size_t)d.G * d.d_k, V,
                          (size_t)d.G * d.d_v, slots * lsel, keyOf, scale, lse[row], delta[row],
                          dq + row * d.d_k, accumulate);
}

#define SEL_KEYS_PER_BLOCK 32
#define SEL_SCAN_THREADS (32 * ATTN_WARPS)
#define SEL_KEYS_PER_WARP (SEL_KEYS_PER_BLOCK / ATTN_WARPS)

/* Does row sel (ascending, -1 padded) hold block jb? */
__device__ __forceinline__ int selHolds(const int32_t *sel, int slots, int jb) {
    for (int s = 0; s < slots; s++) {
        int blk = sel[s];
        if (blk == jb) return 1;
        if (blk < 0 || blk > jb) return 0;
    }
    return 0;
}

/* Shared memory of selBackwardDkvKernel, in floats. */
static inline size_t selDkvSmemFloats(int dk, int dv) {
    return (size_t)SEL_KEYS_PER_BLOCK * (dk + dv) + (size_t)ATTN_WARPS * attnWarpFloats(dk, dv);
}

/* dk, dv of up to 32 keys of selection block jb for group g. The block
 * scans the queries t >= its first key in tiles, keeps (in order) those
 * whose selected set holds jb, and each warp folds them, 32 (query, head)
 * pairs at a time staged in shared memory, into the gradients of its 8
 * keys (registers; one owner per key, no atomics). Overwrites dk, dv. */
__global__ void selBackwardDkvKernel(float *dk, float *dv, const float *dout, const float *q,
                                     const float *k, const float *v, const int32_t *sel_idx,
                                     const float *lse, const float *delta, NsaAttnDims d,
                                     int slots, int Ns, int subtiles, float scale) {
    extern __shared__ float smem[];
    __shared__ int members[SEL_SCAN_THREADS];
    __shared__ int warp_counts[ATTN_WARPS];
    const int dk_ = d.d_k, dv_ = d.d_v;
    const int kst = attnTileStride(dk_), vst = attnTileStride(dv_);
    float *ks = smem;                                   /* [32][dk] */
    float *vs = ks + SEL_KEYS_PER_BLOCK * dk_;          /* [32][dv] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const AttnWarpSmem w = attnWarpSmem(vs + SEL_KEYS_PER_BLOCK * dv_, warp, dk_, dv_);
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

    for (int e = threadIdx.x; e < SEL_KEYS_PER_BLOCK * dk_; e += blockDim.x) {
        int kk = e / dk_, c = e % dk_;
        ks[e] = kk < nkeys ? k[(((size_t)b * d.S + key0 + kk) * d.G + g) * dk_ + c] : 0.0f;
    }
    for (int e = threadIdx.x; e < SEL_KEYS_PER_BLOCK * dv_; e += blockDim.x) {
        int kk = e / dv_, c = e % dv_;
        vs[e] = kk < nkeys ? v[(((size_t)b * d.S + key0 + kk) * d.G + g) * dv_ + c] : 0.0f;
    }
    const int my_first = warp * SEL_KEYS_PER_WARP;   /* this warp's keys: kk = my_first + u */
    float acc_dk[SEL_KEYS_PER_WARP][ATTN_DIM_REGS], acc_dv[SEL_KEYS_PER_WARP][ATTN_DIM_REGS];
#pragma unroll
    for (int u = 0; u < SEL_KEYS_PER_WARP; u++)
#pragma unroll
        for (int r = 0; r < ATTN_DIM_REGS; r++) acc_dk[u][r] = acc_dv[u][r] = 0.0f;
    __syncthreads();

    for (int t0 = key0; t0 < d.S; t0 += SEL_SCAN_THREADS) {
        const int t = t0 + threadIdx.x;
        int flag = t < d.S && selHolds(sel_idx + (((size_t)b * d.S + t) * d.G + g) * slots, slots, jb);
        unsigned ballot = __ballot_sync(0xffffffffu, flag);
        if (lane == 0) warp_counts[warp] = __popc(ballot);
        __syncthreads();
        int offset = 0, total = 0;
        for (int wi = 0; wi < ATTN_WARPS; wi++) {
            if (wi < warp) offset += warp_counts[wi];
            total += warp_counts[wi];
        }
        if (flag) members[offset + __popc(ballot & ((1u << lane) - 1u))] = t;
        __syncthreads();
        const int n_pairs = total * hpg;
        for (int base = 0; base < n_pairs && my_first < nkeys; base += 32) {
            const int n = base + lane;
            const int tq = n < n_pairs ? members[n / hpg] : -1;
            const long long r = tq >= 0 ? (long long)(((size_t)b * d.S + tq) * d.H +
                                                      (size_t)g * hpg + n % hpg)
                                        : -1LL;
            warpStageRows(w.ta, dk_, q, (size_t)dk_, r);
            warpStageRows(w.tb, dv_, dout, (size_t)dv_, r);
            const float row_lse = r >= 0 ? lse[r] : 0.0f, row_delta = r >= 0 ? delta[r] : 0.0f;
            float p[SEL_KEYS_PER_WARP], ds[SEL_KEYS_PER_WARP];
#pragma unroll
            for (int u = 0; u < SEL_KEYS_PER_WARP; u++) {
                const int kk = my_first + u, j = key0 + kk;
                p[u] = ds[u] = 0.0f;
                if (r >= 0 && kk < nkeys && tq >= j) {
                    float s = scale * dotShared(ks + kk * dk_, w.ta + lane * kst, dk_);
                    p[u] = expf(s - row_lse);
                    float dp = dotShared(vs + kk * dv_, w.tb + lane * vst, dv_);
                    ds[u] = p[u] * (dp - row_delta);
                }
            }
            for (int jj = 0; jj < 32; jj++) {
                if (__shfl_sync(0xffffffffu, (int)(r >= 0), jj) == 0) continue;
                float qv[ATTN_DIM_REGS], dov[ATTN_DIM_REGS];
#pragma unroll
                for (int i = 0; i < ATTN_DIM_REGS; i++) {
                    int c = lane + 32 * i;
                    qv[i] = c < dk_ ? w.ta[jj * kst + c] : 0.0f;
                    dov[i] = c < dv_ ? w.tb[jj * vst + c] : 0.0f;
                }
#pragma unroll
                for (int u = 0; u < SEL_KEYS_PER_WARP; u++) {
                    float pj = __shfl_sync(0xffffffffu, p[u], jj);
                    float dsj = __shfl_sync(0xffffffffu, ds[u], jj);
#pragma unroll
                    for (int i = 0; i < ATTN_DIM_REGS; i++) {
                        acc_dk[u][i] = fmaf(dsj, qv[i], acc_dk[u][i]);
                        acc_dv[u][i] = fmaf(pj, dov[i], acc_dv[u][i]);
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < SEL_KEYS_PER_WARP; u++) {
        const int kk = my_first + u;
        if (kk >= nkeys) continue;
        const size_t key_row = ((size_t)b * d.S + key0 + kk) * d.G + g;
        attnStoreKeyGrads(dk, dv, key_row, dk_, dv_, scale, acc_dk[u], acc_dv[u]);
    }
}

int attnSelForward(float *o, float *lse, const float *q, const float *k, const float *v,
                   const int32_t *sel_idx, const NsaAttnDims *dims, cudaStream_t stream,
                   NsaError *err) {
    if (attnCudaCheckDims(dims, err)) return -1;
    size_t rows = (size_t)dims->B * dims->S * dims->H;
    if (rows == 0) return 0;
    float scale = 1.0f / sqrtf((float)dims->d_k);
    ATTN_LAUNCH_WARPS(selForwardKernel, rows, dims, stream, err,
                      o, lse, q, k, v, sel_idx, *dims, nsaNumSelSlots(dims->n_sel), scale);
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
    ATTN_LAUNCH_WARPS(selBackwardDqKernel, rows, dims, stream, err,
                      dq, dq_accumulate, dout, q, k, v, sel_idx, lse, delta, *dims, slots, scale);
    int Ns = nsaNumSelBlocks(dims->S, dims->sel_len);
    int subtiles = (dims->sel_len + SEL_KEYS_PER_BLOCK - 1) / SEL_KEYS_PER_BLOCK;
    size_t blocks = (size_t)dims->B * dims->G * Ns * subtiles;
    size_t smem = selDkvSmemFloats(dims->d_k, dims->d_v) * sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute(selBackwardDkvKernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err);
    selBackwardDkvKernel<<<(unsigned)blocks, SEL_SCAN_THREADS, smem, stream>>>(
        dk, dv, dout, q, k, v, sel_idx, lse, delta, *dims, slots, Ns, subtiles, scale);
    LAUNCH_CHECK("selBackwardDkvKernel", err);
    return 0;
}
