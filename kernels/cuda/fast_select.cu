/* fast_select.cu - selection scores and top-n, fused: only sel_idx reaches
 * memory (no S x Ns score matrix).
 *
 * One CTA per tile of whole tokens (64/hpg tokens x the hpg heads of group
 * g). It recomputes the compressed softmax from the forward's statistics,
 * p_i = exp2(s2_i - lse2), one tile of 64 pooled blocks at a time
 * (mma.sync), then folds p into the selection-block scores of each token
 *   s_j += sum_{i in tile} M_ij sum_{h in group} p_i(h)
 * in a ring of FAST_SCORE_RING open blocks per token. Once no later tile can
 * touch block j (j < floor(i_end d / l')) its score is final and the token's
 * thread offers it to a running top-K (K = n_sel - forced blocks), in
 * ascending j: a newcomer replaces the worst kept entry only when strictly
 * better, and the worst is the lowest score with the highest j, so ties go
 * to the lower block index exactly as the reference. Blocks no tile reaches
 * score 0. */
#include "fast_internal.cuh"

#define SEL_P_LD 68 /* fp32 P tile row stride (64 + 4 against bank conflicts) */

/* Shared memory of one CTA: Q, two key stages, the P tile, P summed over
 * the heads of each token, and per token its score ring and top-K. */
int fastSelectSmem(const FastCtx &c, int dk) {
    const int tpc = 64 / c.hpg;
    return 3 * 64 * (dk + 8) * 2 + 64 * SEL_P_LD * 4 + tpc * SEL_P_LD * 4 +
           tpc * FAST_SCORE_RING * 4 + tpc * FAST_MAX_SLOTS * 8;
}

/* The first and last compressed block overlapping selection block j. */
__device__ __forceinline__ int selFirstCmp(int j, int l_sel, int l, int d) {
    int lo = j * l_sel - l; /* i*d > j*l' - l */
    return lo < 0 ? 0 : lo / d + 1;
}
__device__ __forceinline__ int selLastCmp(int j, int l_sel, int d) { return ((j + 1) * l_sel - 1) / d; }

template <int DK>
__global__ void __launch_bounds__(FAST_THREADS)
fastSelectKernel(FastCtx c, const bf16 *q, const bf16 *kc, const float *lse_cmp, int32_t *sel_idx) {
    constexpr int LDK = DK + 8;
    extern __shared__ __align__(16) unsigned char fast_smem[];
    bf16 *sQ = (bf16 *)fast_smem, *sK = sQ + 64 * LDK;
    const int hpg = c.hpg, tpc = 64 / hpg, t0 = blockIdx.x * tpc;
    float *sP = (float *)(sK + 2 * 64 * LDK);
    float *sPt = sP + 64 * SEL_P_LD; /* [tpc][SEL_P_LD]: P summed over the token's heads */
    float *sRing = sPt + tpc * SEL_P_LD;
    float *sTopS = sRing + tpc * FAST_SCORE_RING;
    int *sTopJ = (int *)(sTopS + tpc * FAST_MAX_SLOTS);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, grp = lane >> 2, quad = lane & 3;
    const int b = blockIdx.y / c.G, g = blockIdx.y % c.G;
    const int t_last = min(c.S, t0 + tpc) - 1;
    const int l = c.cmp_len, d = c.cmp_stride, l_sel = c.sel_len;
    auto rowToken = [&](int r) {
        int tok = t0 + r / hpg;
        return (r < tpc * hpg && tok < c.S) ? tok : -1;
    };
    auto rowIndex = [&](int r) -> size_t {
        return ((size_t)b * c.S + t0 + r / hpg) * c.H + (size_t)g * hpg + r % hpg;
    };
    fastLoadTile<64, DK>(sQ, [&](int r) -> const bf16 * {
        return rowToken(r) >= 0 ? q + rowIndex(r) * DK : nullptr;
    });
    const int nvis = t_last < l - 1 ? 0 : min(c.Nc, (t_last - l + 1) / d + 1);
    const int ntiles = (nvis + 63) / 64;
    auto loadK = [&](int it, int st) {
        const int i0 = it * 64;
        fastLoadTile<64, DK>(sK + st * 64 * LDK, [&](int r) -> const bf16 * {
            int i = i0 + r;
            return i < nvis ? kc + (((size_t)b * c.Nc + i) * c.G + g) * DK : nullptr;
        });
    };
    if (ntiles > 0) loadK(0, 0);
    fastCpCommit();
    for (int i = tid; i < tpc * FAST_SCORE_RING; i += FAST_THREADS) sRing[i] = 0.f;
    __syncthreads(); /* a token's thread reads its ring even when no tile runs */

    /* per-token top-K state, owned by thread tid < tpc */
    const int my_t = tid < tpc && t0 + tid < c.S ? t0 + tid : -1;
    const int cur = my_t >= 0 ? my_t / l_sel : 0;
    const int n_forced = 1 + (cur >= 1 ? 1 : 0) + (cur >= 2 ? 1 : 0);
    const int n_complete = my_t >= 0 ? (my_t + 1) / l_sel : 0;
    const int K = my_t >= 0 ? max(0, c.n_sel - n_forced) : 0;
    float *topS = sTopS + tid * FAST_MAX_SLOTS;
    int *topJ = sTopJ + tid * FAST_MAX_SLOTS;
    int count = 0, worst = 0;
    auto offer = [&](int j, float s) {
        if (j >= n_complete || j == 0 || j == cur || j == cur - 1 || K == 0) return;
        if (count < K) {
            topS[count] = s;
            topJ[count] = j;
            count++;
        } else if (s > topS[worst]) {
            topS[worst] = s;
            topJ[worst] = j;
        } else {
            return;
        }
        if (count == K) { /* worst: lowest score, then highest j */
            worst = 0;
            for (int e = 1; e < K; e++)
                if (topS[e] < topS[worst] || (topS[e] == topS[worst] && topJ[e] > topJ[worst]))
                    worst = e;
        }
    };

    const int rA = warp * 16 + grp, rB = rA + 8;
    int tok[2] = {rowToken(rA), rowToken(rB)};
    float lse2[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (tok[i] < 0) continue;
        float lse = lse_cmp[rowIndex(i ? rB : rA)];
        if (lse == -INFINITY) tok[i] = -1;
        else lse2[i] = lse * FAST_LOG2E;
    }
    uint32_t qf[DK / 16][4];
    int j_done = 0;
    for (int it = 0; it < ntiles; it++) {
        const int st = it & 1, i0 = it * 64;
        if (it + 1 < ntiles) loadK(it + 1, st ^ 1);
        fastCpCommit();
        fastCpWait<1>();
        __syncthreads();
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < DK / 16; kk++) fastLoadA(qf[kk], sQ, LDK, warp * 16, kk * 16);
        }
        const bf16 *k_t = sK + st * 64 * LDK;
        float s[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DK / 16; kk++) {
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t bb[4];
                fastLoadBRows(bb, k_t, LDK, np * 16, kk * 16);
                fastMma(s[2 * np], qf[kk], bb[0], bb[1]);
                fastMma(s[2 * np + 1], qf[kk], bb[2], bb[3]);
            }
        }
#pragma unroll
        for (int n = 0; n < 8; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int col = n * 8 + quad * 2 + (e & 1), i = i0 + col;
                int t = tok[e >> 1];
                bool ok = t >= 0 && i * d + l - 1 <= t;
                float p = ok ? exp2f(s[n][e] * c.scale_log2 - lse2[e >> 1]) : 0.f;
                sP[(e < 2 ? rA : rB) * SEL_P_LD + col] = p;
            }
        }
        __syncthreads();
        for (int idx = tid; idx < tpc * 64; idx += FAST_THREADS) {
            int tk = idx >> 6, col = idx & 63;
            float acc = 0.f;
            for (int h = 0; h < hpg; h++) acc += sP[(tk * hpg + h) * SEL_P_LD + col];
            sPt[tk * SEL_P_LD + col] = acc;
        }
        __syncthreads();
        /* fold the tile into the open selection blocks of each token */
        const int jlo = (i0 * d) / l_sel;
        const int jhi = min(c.Ns - 1, ((i0 + 63) * d + l - 1) / l_sel);
        const int nj = jhi - jlo + 1;
        for (int pair = tid; pair < tpc * nj; pair += FAST_THREADS) {
            int tk = pair / nj, j = jlo + pair % nj;
            if (t0 + tk >= c.S) continue;
            int ilo = max(i0, selFirstCmp(j, l_sel, l, d));
            int ihi = min(min(i0 + 63, nvis - 1), selLastCmp(j, l_sel, d));
            float acc = 0.f;
            for (int i = ilo; i <= ihi; i++) {
                int lo = max(i * d, j * l_sel), hi = min(i * d + l, (j + 1) * l_sel);
                acc += (float)(hi - lo) / (float)l * sPt[tk * SEL_P_LD + (i - i0)];
            }
            sRing[tk * FAST_SCORE_RING + j % FAST_SCORE_RING] += acc;
        }
        __syncthreads();
        /* blocks no later tile touches are final */
        const int j_end = min(c.Ns, ((i0 + 64) * d) / l_sel);
        if (my_t >= 0) {
            for (int j = j_done; j < j_end; j++) {
                float *slot = sRing + tid * FAST_SCORE_RING + j % FAST_SCORE_RING;
                offer(j, *slot);
                *slot = 0.f;
            }
        }
        j_done = max(j_done, j_end);
    }
    fastCpWait<0>();
    if (my_t < 0) return;
    for (int j = j_done; j < n_complete; j++) {
        float *slot = sRing + tid * FAST_SCORE_RING + j % FAST_SCORE_RING;
        offer(j, *slot);
        *slot = 0.f;
    }
    /* forced blocks + the kept top-K, ascending, -1 padded */
    int chosen[FAST_MAX_SLOTS];
    int n = 0;
    chosen[n++] = 0;
    if (cur >= 1) chosen[n++] = cur;
    if (cur >= 2) chosen[n++] = cur - 1;
    for (int e = 0; e < count; e++) chosen[n++] = topJ[e];
    for (int a = 1; a < n; a++) { /* insertion sort, n <= 32 */
        int v = chosen[a], k = a - 1;
        while (k >= 0 && chosen[k] > v) {
            chosen[k + 1] = chosen[k];
            k--;
        }
        chosen[k + 1] = v;
    }
    int32_t *row = sel_idx + (((size_t)b * c.S + my_t) * c.G + g) * c.slots;
    for (int e = 0; e < c.slots; e++) row[e] = e < n ? chosen[e] : -1;
}

template <int DK>
static cudaError_t selectLaunch(const FastCtx &c, const bf16 *q, const bf16 *kc,
                                const float *lse_cmp, int32_t *sel_idx, cudaStream_t stream) {
    auto kernel = fastSelectKernel<DK>;
    const int smem = fastSelectSmem(c, DK);
    cudaError_t e = fastSetSmem(kernel, smem);
    if (e != cudaSuccess) return e;
    const int tpc = 64 / c.hpg;
    kernel<<<dim3((c.S + tpc - 1) / tpc, c.B * c.G), FAST_THREADS, smem, stream>>>(c, q, kc,
                                                                                   lse_cmp, sel_idx);
    return cudaGetLastError();
}

cudaError_t fastSelect(const FastCtx &c, int dk, const bf16 *q, const bf16 *kc,
                       const float *lse_cmp, int32_t *sel_idx, cudaStream_t stream) {
    /* the score pass reads keys only: one instantiation per d_k */
    if (dk == 64) return selectLaunch<64>(c, q, kc, lse_cmp, sel_idx, stream);
    if (dk == 128) return selectLaunch<128>(c, q, kc, lse_cmp, sel_idx, stream);
    if (dk == 192) return selectLaunch<192>(c, q, kc, lse_cmp, sel_idx, stream);
    return cudaErrorInvalidValue;
}
