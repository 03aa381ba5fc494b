/* fast_sel_forced.cu - the forced blocks of the selected branch, forward,
 * one token block per CTA (wgmma, l' = 64).
 *
 * Every token t of selection block jb = t / 64 has blocks 0, jb - 1 and jb
 * in its selected set - the selection always keeps block 0, the token's own
 * block and the one before (proto/model.md, Selection) - the same three for
 * all 64 tokens of the block. Where the block-centric forward leaves them out of its work items
 * (FastSelBlock.skip_forced), their merged partial goes straight into o_sel,
 * lse_sel (the combine merges it as slot 0):
 *   o = sum_{u in F(t), u <= t} p_u v_u / l,  lse = m + ln l,
 *   F(t) = blocks {0, jb - 1, jb},  p_u = exp(scale q.k_u - m).
 * A CTA holds those (at most) three key tiles of one group in shared memory
 * and streams the 64 * hpg query rows of the block's tokens past them, a
 * 64-row tile per warpgroup at a time: the K/V load, the CTA's start and the
 * tile loop's ramp are paid once per 64 tokens. Only the last key tile (the
 * token's own block) needs the causal mask; the others are past for every
 * row. The forward tile kernel with SelForcedPolicy did the same work in
 * 12-token query tiles, each loading 3-4 key tiles and paying its own start
 * and epilogue at one CTA per SM (fast_sel_block.cu runs that one where l'
 * is another multiple of 64). The pass reads all of q and writes o_sel:
 * it is bound by those bytes. */
#include "fast_host.h"
#include "fast_policy.cuh"

/* Consumer warpgroups per CTA: three, as the forward tile kernel's 384
 * threads. Four would split a paper-shape block's 16 row tiles evenly, but
 * at 128 registers a thread ptxas spills 250-336 bytes (d = 128). */
#define SEL_FORCED_THREADS (128 * SEL_FORCED_WGS)

/* Shared layout: K tiles [3][64][DK], V tiles [3][64][DV] (swizzled 64-row
 * panels, as the TMA ring lays them), then per warpgroup QST stages of 64
 * query rows (the staged o of its epilogue reuses them: DV <= DK), then the
 * barriers: the K/V tiles' full barrier and each warpgroup stage's. QST = 2
 * where it fits (the next tile's rows land while this one computes), else 1
 * (d_k = 192). */
template <int DK, int DV>
struct SelForcedShape {
    static_assert(DV <= DK, "o is staged in a q stage");
    static constexpr int KV = 3 * 64 * (DK + DV) * 2;
    static constexpr int QBYTES = 64 * DK * 2;
    static constexpr int bytes(int qst) {
        return 1024 + KV + SEL_FORCED_WGS * qst * QBYTES + 8 * (1 + SEL_FORCED_WGS * qst);
    }
    static constexpr int QST = bytes(2) <= 227 * 1024 ? 2 : 1;
    static constexpr int SMEM = bytes(QST);
};

/* Named barrier of the 128 threads of warpgroup wg (ids 1..: 0 is
 * __syncthreads). */
__device__ __forceinline__ void selForcedWgSync(int wg) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 1) : "memory");
}

/* Grid (ceil(S / 64), B*G), SEL_FORCED_THREADS threads. q_map: io.q as
 * boxes of tpt tokens' hpg heads (tpt = 64 / hpg); kv: io.k, io.v in
 * 64-key boxes. Writes o, lse of every row of the block's tokens. */
template <int DK, int DV>
__global__ void __launch_bounds__(SEL_FORCED_THREADS, 1)
selForcedFwdKernel(FastCtx c, FastFwdIo io, const __grid_constant__ CUtensorMap q_map,
                   const __grid_constant__ FastKvMaps kv) {
    using Shape = SelForcedShape<DK, DV>;
    constexpr int QST = Shape::QST, NT = 8; /* 64-key tiles: 8 n-tiles of scores */
    const int jb = blockIdx.x, b = blockIdx.y / c.G, g = blockIdx.y % c.G;
    const int hpg = c.hpg, tpt = 64 / hpg; /* tokens per 64-row tile */
    const int t_blk = jb * 64, n_tok = min(64, c.S - t_blk); /* the block's tokens */
    const int ntiles = (n_tok + tpt - 1) / tpt;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int grp = lane >> 2, quad = lane & 3, row0 = (warp & 3) * 16;
    /* key tiles: block 0, then (jb >= 2) jb - 1, then jb (jb >= 1); the
     * last one is the diagonal */
    const int nkt = min(jb, 2) + 1;
    auto keyBlock = [&](int k) { return k == 0 ? 0 : jb - nkt + 1 + k; };

    bf16 *sK = fastTileBase<true>(), *sV = sK + 3 * 64 * DK, *sQ = sV + 3 * 64 * DV;
    uint64_t *kv_full = (uint64_t *)(sQ + SEL_FORCED_WGS * QST * 64 * DK);
    uint64_t *q_full = kv_full + 1 + wg * QST; /* this warpgroup's stages */
    bf16 *myQ = sQ + wg * QST * 64 * DK;
    const int rows = tpt * hpg; /* rows a box fills; 64 - rows padding rows */
    if (rows < 64) { /* padding rows: never written by a box, read by the products */
        for (int i = tid; i < SEL_FORCED_WGS * QST * (DK / 64) * (64 - rows) * 8;
             i += SEL_FORCED_THREADS) {
            const int chunk = i % 8, r = rows + (i / 8) % (64 - rows), panel = i / (8 * (64 - rows));
            *(uint4 *)(sQ + (size_t)panel * 64 * 64 + r * 64 + chunk * 8) = make_uint4(0, 0, 0, 0);
        }
    }
    if (tid == 0) {
        fastMbarInit(kv_full, 1);
        for (int s = 0; s < SEL_FORCED_WGS * QST; s++) fastMbarInit(kv_full + 1 + s, 1);
        fastMbarInitFence();
    }
    fastWgProxyFence(); /* the zeroed rows, before the async proxy reads them */
    __syncthreads();
    const uint32_t q_bytes = (uint32_t)rows * 128 * (DK / 64);
    /* this warpgroup's i-th tile (tile wg + i * WGS of the block) into stage
     * i % QST; its leader issues, once the stage's previous tile is out */
    auto issueQ = [&](int i) {
        const int st = i % QST, ti = wg + i * SEL_FORCED_WGS;
        fastMbarArriveTx(&q_full[st], q_bytes);
#pragma unroll
        for (int p = 0; p < DK / 64; p++)
            fastTmaLoad4(myQ + st * 64 * DK + p * 64 * 64, &q_map, p * 64, g * hpg, t_blk + ti * tpt,
                         b, &q_full[st]);
    };
    const int my_tiles = ntiles > wg ? (ntiles - wg + SEL_FORCED_WGS - 1) / SEL_FORCED_WGS : 0;
    if (tid == 0) {
        fastMbarArriveTx(kv_full, (uint32_t)nkt * 64 * (DK + DV) * 2);
        for (int k = 0; k < nkt; k++) {
            const int u0 = keyBlock(k) * 64;
#pragma unroll
            for (int p = 0; p < DK / 64; p++)
                fastTmaLoad4(sK + k * 64 * DK + p * 64 * 64, &kv.k, p * 64, g, u0, b, kv_full);
#pragma unroll
            for (int p = 0; p < DV / 64; p++)
                fastTmaLoad4(sV + k * 64 * DV + p * 64 * 64, &kv.v, p * 64, g, u0, b, kv_full);
        }
    }
    if ((tid & 127) == 0)
        for (int i = 0; i < QST && i < my_tiles; i++) issueQ(i);
    if (my_tiles > 0) fastMbarWait(kv_full, 0);

    for (int i = 0; i < my_tiles; i++) {
        const int st = i % QST, ti = wg + i * SEL_FORCED_WGS;
        bf16 *q_st = myQ + st * 64 * DK;
        fastMbarWait(&q_full[st], (uint32_t)(i / QST) & 1u);
        __syncwarp();
        /* this thread's two rows: their token (-1: padding, not stored) */
        int tok[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = row0 + grp + 8 * h, slot = ti * tpt + r / hpg;
            tok[h] = r < rows && slot < n_tok ? t_blk + slot : -1;
        }
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, corr[2];
        float o[DV / 8][4], s[NT][4];
        uint32_t a[NT / 2][4];
#pragma unroll
        for (int n = 0; n < DV / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
        /* scores of key tile k to P (the diagonal masked: key u visible at
         * u <= t; padding rows see everything, finite and never stored) */
        auto scoresToP = [&](int k) {
            const bool diag = k == nkt - 1;
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int u = t_blk + n * 8 + quad * 2 + (e & 1), t = tok[e >> 1];
                    const float v = diag && t >= 0 && u > t ? -INFINITY : s[n][e] * c.scale_log2;
                    s[n][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
            fastSoftmaxScores<NT>(s, mx, m, l, corr);
        };
        /* the forward tile loop's pipeline: tile k's scores issue before
         * P.V of tile k - 1 */
        fastWgRun([&] { fastWgIssueAZt<NT, DK>(s, q_st, 64, 0, sK, 64, 0); }, s);
        scoresToP(0);
        fastWgAFromC<NT>(a, s);
        for (int k = 1; k < nkt; k++) {
            fastWgArrive();
            fastWgIssueAZt<NT, DK>(s, q_st, 64, 0, sK + k * 64 * DK, 64, 0);
            fastWgCommit();
            fastRescaleRows<DV>(o, corr);
            fastWgFenceAcc(o);
            fastWgArrive();
            fastWgIssuePZ<NT, DV>(o, a, sV + (k - 1) * 64 * DV, 64, 0);
            fastWgCommit();
            fastWgWait<1>();
            fastWgFenceAcc(s);
            scoresToP(k);
            fastWgWait<0>();
            fastWgFenceAcc(o);
            fastWgAFromC<NT>(a, s);
        }
        fastRescaleRows<DV>(o, corr);
        fastWgRun([&] { fastWgIssuePZ<NT, DV>(o, a, sV + (nkt - 1) * 64 * DV, 64, 0); }, o);

        /* epilogue: lse, and o normalised through the warp's own 16 rows of
         * the q stage (every product reading it is done) as 16-byte rows */
        float inv[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float lsum = fastQuadSum(l[h]);
            inv[h] = lsum > 0.f ? 1.f / lsum : 0.f;
            const int head = (row0 + grp + 8 * h) % hpg;
            if (tok[h] >= 0 && quad == 0)
                io.lse[((size_t)b * c.S + tok[h]) * c.H + (size_t)g * hpg + head] =
                    fastLse(m[h], lsum);
        }
#pragma unroll
        for (int h = 0; h < DV / 64; h++)
            fastStagePut64<64>(q_st, row0, h * 64, fastPanel64(o, h), inv[0], inv[1]);
        __syncwarp();
        constexpr int CH = DV / 8; /* 16-byte chunks per row */
#pragma unroll 2
        for (int idx = lane; idx < 16 * CH; idx += 32) {
            const int r = row0 + idx / CH, k = idx % CH, slot = ti * tpt + r / hpg;
            if (r >= rows || slot >= n_tok) continue;
            const size_t row = ((size_t)b * c.S + t_blk + slot) * c.H + (size_t)g * hpg + r % hpg;
            *(uint4 *)(io.o + row * DV + k * 8) = fastStageChunk<64>(q_st, r, k);
        }
        /* the stage refills for tile i + QST once all four warps read it:
         * their generic-proxy reads and writes before the TMA's */
        if (i + QST < my_tiles) {
            fastWgProxyFence();
            selForcedWgSync(wg);
            if ((tid & 127) == 0) issueQ(i + QST);
        }
    }
}

template <int DK, int DV>
static cudaError_t selForcedForward(const FastCtx &c, const FastFwdIo &io, cudaStream_t stream) {
    if (!fastSelForcedOwnPass(c)) return cudaErrorInvalidValue;
    CUtensorMap q_map;
    FastKvMaps kv;
    cudaError_t e =
        fastTmaEncodeRows(c.tma_encode, &q_map, io.q, c.B, c.S, c.H, DK, c.hpg, 64 / c.hpg);
    if (e == cudaSuccess)
        e = fastTmaEncodeKv(c.tma_encode, &kv, io.k, io.v, c.B, io.nkeys, c.G, DK, DV, 64);
    if (e != cudaSuccess) return e;
    auto kernel = selForcedFwdKernel<DK, DV>;
    constexpr int smem = SelForcedShape<DK, DV>::SMEM;
    if ((e = fastSetSmem(kernel, smem)) != cudaSuccess) return e;
    kernel<<<dim3((c.S + 63) / 64, c.B * c.G), SEL_FORCED_THREADS, smem, stream>>>(c, io, q_map,
                                                                                    kv);
    return cudaGetLastError();
}

cudaError_t fastSelForcedForward(const FastCtx &c, int dk, int dv, const FastFwdIo &io,
                                 cudaStream_t stream) {
    FAST_DISPATCH(dk, dv, selForcedForward, c, io, stream);
}
