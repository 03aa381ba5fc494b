/* attn_select.cu - choosing the selection blocks of each (query, KV group).
 *
 * Reuses the compressed softmax (no new softmax): with p_i = exp(scale
 * q_t.kc_i - lse_t) per head over the visible compressed blocks,
 *   s_j = sum_{h in group} sum_i M_ij p_i,   M_ij = |block i n block j| / l.
 * The set holds block 0, the current block floor(t/l') and the previous
 * one, then the complete blocks ((j+1)l' - 1 <= t) by s_j descending, ties
 * to the lower j, until n_sel blocks (the forced ones stay even when
 * n_sel < 3). Rows are written ascending, -1 padded, nsaNumSelSlots wide.
 * Selection is discrete: no backward. */
#include "attn_common.cuh"

#define SELECT_THREADS 128

/* One block per (b, t, g). Shared: the group's queries, their lse, the
 * per-compressed-block probability P_i (summed over the group's heads),
 * the scores s_j and the taken flags. */
__global__ void selectBlocksKernel(int32_t *sel_idx, const float *q, const float *kc,
                                   const float *lse_cmp, NsaAttnDims d, int Nc, int Ns,
                                   int slots, float scale) {
    extern __shared__ float smem[];
    const int hpg = d.H / d.G, dk = d.d_k;
    float *qs = smem;                 /* [hpg][dk] */
    float *ls = qs + hpg * dk;        /* [hpg] */
    float *P = ls + hpg;              /* [Nc] */
    float *sc = P + Nc;               /* [Ns] */
    int *taken = (int *)(sc + Ns);    /* [Ns] */
    float *tile = (float *)(taken + Ns);  /* [SELECT_THREADS][dk | 1] */
    const size_t row = blockIdx.x;    /* (b*S + t)*G + g */
    const int g = (int)(row % d.G);
    const size_t bt = row / d.G;
    const int t = (int)(bt % d.S), b = (int)(bt / d.S);
    const int l = d.cmp_len, cs = d.cmp_stride, lsel = d.sel_len;

    for (int e = threadIdx.x; e < hpg * dk; e += blockDim.x)
        qs[e] = q[(bt * d.H + (size_t)g * hpg) * dk + e];
    for (int hh = threadIdx.x; hh < hpg; hh += blockDim.x) ls[hh] = lse_cmp[bt * d.H + g * hpg + hh];
    __syncthreads();

    const int nvis = t < l - 1 ? 0 : min((t - l + 1) / cs + 1, Nc);
    /* kc rows are staged SELECT_THREADS at a time with coalesced loads, so
     * that each thread's dot products read shared memory */
    const int kst = dk | 1;
    for (int i0 = 0; i0 < nvis; i0 += SELECT_THREADS) {
        const int rows = min(SELECT_THREADS, nvis - i0);
        __syncthreads();
        for (int e = threadIdx.x; e < rows * dk; e += blockDim.x) {
            int r = e / dk, c = e % dk;
            tile[r * kst + c] = kc[(((size_t)b * Nc + i0 + r) * d.G + g) * dk + c];
        }
        __syncthreads();
        const int i = i0 + threadIdx.x;
        if (threadIdx.x < rows) {
            const float *krow = tile + threadIdx.x * kst;
            float acc = 0.0f;
            for (int hh = 0; hh < hpg; hh++) {
                float s = 0.0f;
                for (int c = 0; c < dk; c++) s = fmaf(qs[hh * dk + c], krow[c], s);
                acc += expf(scale * s - ls[hh]);
            }
            P[i] = acc;
        }
    }
    __syncthreads();

    const int n_complete = (t + 1) / lsel;
    const int current = t / lsel;
    for (int j = threadIdx.x; j < Ns; j += blockDim.x) {
        taken[j] = (j == 0 || j == current || j == current - 1) ? 1 : 0;
        float s = 0.0f;
        if (j < n_complete) {
            int lo = j * lsel - l < 0 ? 0 : (j * lsel - l) / cs + 1;
            int hi = ((j + 1) * lsel - 1) / cs;
            if (hi > nvis - 1) hi = nvis - 1;
            for (int i = lo; i <= hi; i++) {
                int first = i * cs, end = i * cs + l;
                int a = first > j * lsel ? first : j * lsel;
                int z = end < (j + 1) * lsel ? end : (j + 1) * lsel;
                s += (float)(z - a) / (float)l * P[i];
            }
        }
        sc[j] = s;
    }
    __syncthreads();

    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    int count = 1 + (current != 0 ? 1 : 0) + (current - 1 > 0 ? 1 : 0);
    while (count < d.n_sel) {
        float best_v = -INFINITY;
        int best_j = -1;
        for (int j = lane; j < n_complete; j += 32) {
            if (taken[j]) continue;
            float s = sc[j];
            if (best_j < 0 || s > best_v) { best_v = s; best_j = j; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best_v, o);
            int oj = __shfl_xor_sync(0xffffffffu, best_j, o);
            if (oj >= 0 && (best_j < 0 || ov > best_v || (ov == best_v && oj < best_j))) {
                best_v = ov;
                best_j = oj;
            }
        }
        if (best_j < 0) break;
        if (lane == 0) taken[best_j] = 1;
        __syncwarp();
        count++;
    }
    int32_t *out = sel_idx + row * slots;
    int written = 0;
    for (int base = 0; base <= current; base += 32) {
        int j = base + lane;
        int flag = j <= current && taken[j];
        unsigned ballot = __ballot_sync(0xffffffffu, flag);
        int pos = written + __popc(ballot & ((1u << lane) - 1u));
        if (flag && pos < slots) out[pos] = j;
        written += __popc(ballot);
    }
    for (int s = written + lane; s < slots; s += 32) out[s] = -1;
}

int attnSelectBlocks(int32_t *sel_idx, const float *q, const float *kc, const float *lse_cmp,
                     const NsaAttnDims *dims, cudaStream_t stream, NsaError *err) {
    if (attnCudaCheckDims(dims, err)) return -1;
    size_t rows = (size_t)dims->B * dims->S * dims->G;
    if (rows == 0) return 0;
    int Nc = nsaNumCmpBlocks(dims->S, dims->cmp_len, dims->cmp_stride);
    int Ns = nsaNumSelBlocks(dims->S, dims->sel_len);
    int hpg = dims->H / dims->G;
    size_t smem = ((size_t)hpg * dims->d_k + hpg + Nc + Ns) * sizeof(float) +
                  (size_t)Ns * sizeof(int) +
                  (size_t)SELECT_THREADS * (dims->d_k | 1) * sizeof(float);
    if (smem > 200 * 1024)
        return nsaErrorf(err,
                         "cuda: selection needs %zu bytes of shared memory per row (S = %d, "
                         "heads per group %d, d_k %d); allowed: up to 204800",
                         smem, dims->S, hpg, dims->d_k);
    CUDA_CHECK(cudaFuncSetAttribute(selectBlocksKernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err);
    float scale = 1.0f / sqrtf((float)dims->d_k);
    selectBlocksKernel<<<(unsigned)rows, SELECT_THREADS, smem, stream>>>(
        sel_idx, q, kc, lse_cmp, *dims, Nc, Ns, nsaNumSelSlots(dims->n_sel), scale);
    LAUNCH_CHECK("selectBlocksKernel", err);
    return 0;
}
