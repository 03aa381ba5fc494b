/* fast_select.cu - selection scores and top-n, fused: only sel_idx reaches
 * memory (no S x Ns score matrix).
 *
 * One CTA per tile of whole tokens (16 * WARPS / rows-per-token tokens x
 * the hpg heads of group g, padded to 8 or 16 rows a token where hpg > 4;
 * WARPS = 8 at d_k >= 128, else 4). It recomputes the compressed softmax
 * from the forward's statistics, p_i = exp2(s2_i - lse2), one tile of 64
 * pooled blocks at a time (wgmma on sm_90, else mma.sync), sums it over
 * the heads of each token, then folds it into the selection-block scores
 *   s_j += sum_{i in tile} M_ij sum_{h in group} p_i(h)
 * in a ring of FAST_SCORE_RING open blocks per token. Once no later tile can
 * touch block j (j < floor(i_end d / l')) its score is final and is offered
 * to the token's running top-K (K = n_sel - forced blocks), kept sorted. A
 * warp serves a token, a lane per offered block: a ballot finds the
 * candidates that beat the worst kept key and only those are placed, at
 * their rank, so the set is exact under the key (score desc, block asc) -
 * ties go to the lower block index as in the reference - and no thread
 * walks the blocks alone. Blocks no tile reaches score 0. Where the heads
 * of a token are in one warp's rows, that warp sums, folds and offers them
 * and a tile needs one CTA barrier (its K tile landing); where, besides,
 * every tile folds alike (64 d a multiple of l'), the head sums and the
 * fold are one small product on tensor cores, M^T P^T (selFoldMma). */
#include "fast_host.h"
#include "tile_common.cuh"

#include <cuda_fp16.h>
#include <limits.h>

#define SEL_P_LD 68 /* fp32 P tile row stride (64 + 4 against bank conflicts) */
#define SEL_FOLD_TAPS 8 /* compressed blocks per selection block folded from registers */
/* Row stride of the head-summed P (sPt): the periodic fold reads taps
 * lo .. lo + SEL_FOLD_TAPS - 1 of a row at constant offsets from one
 * address, past column 63 for the last blocks (weight 0), so the row has
 * SEL_FOLD_TAPS zeroed columns behind its 64. */
#define SEL_PT_LD (64 + SEL_FOLD_TAPS)
/* Stages of pooled-key tiles. On wgmma they come through a TMA ring
 * (fast_tma.cuh): a warp releases its tile as soon as its scores are in
 * registers, so two stages let the next tile land while this one is folded,
 * and no CTA barrier per tile holds the warps together. */
#define SEL_STAGES 2

/* Query rows per token in a CTA's tile: with more than 4 heads per group a
 * token's heads are padded to 8 or 16 rows (padding rows load zeros and
 * score 0), so that a warp's 16 rows hold whole tokens and the heads are
 * summed in its registers (selSumHeads16 / selSumHeads8); that warp then
 * folds and offers those tokens, and no barrier stands between. With 4 or
 * fewer the rows stay packed and P goes through a shared fp32 tile. */
static __host__ __device__ int selRowsPerToken(int hpg) { return hpg > 8 ? 16 : hpg > 4 ? 8 : hpg; }
static __host__ __device__ bool selHeadsInWarp(int hpg) { return hpg > 4; }

/* The fold on tensor cores (heads in a warp, periodic tiles): the overlap
 * shares of a tile's 64 compressed blocks in its first 32 selection blocks,
 * M^T[32][64] in fp16, rows of 128 bytes with their 16-byte chunks rotated
 * by the row (chunk ^ row % 8), so that the eight rows of an ldmatrix phase
 * fall in distinct banks. It shares the space of the head-summed P, which
 * only the other folds use. */
#define SEL_FOLD_ROWS 32
static __host__ __device__ int selPtFloats(int tpc, bool heads_in_warp) {
    const int pt = tpc * SEL_PT_LD, fold = SEL_FOLD_ROWS * 64 / 2;
    return heads_in_warp && fold > pt ? fold : pt;
}

/* Per token of a CTA: its selection constants and its running top-K. */
struct SelTokenState {
    int cur, n_forced, n_complete, K; /* see SelToken */
    float worst_s;                    /* the worst kept key (score, block) */
    int worst_j;
};

/* Shared memory of one CTA of `warps` warps (16 query rows each): Q, two
 * key stages, the P tile (unless the heads sum in registers), P summed
 * over the heads of each token, and per token its score ring, top-K and
 * state. */
static int selectSmem(const FastCtx &c, int dk, int warps, bool wg) {
    const int rows = 16 * warps, tpc = rows / selRowsPerToken(c.hpg);
    const int p_rows = selHeadsInWarp(c.hpg) ? 0 : rows;
    return (rows + SEL_STAGES * 64) * (dk + (wg ? 0 : 8)) * 2 + (wg ? 2 * SEL_STAGES * 8 : 0) +
           p_rows * SEL_P_LD * 4 + selPtFloats(tpc, selHeadsInWarp(c.hpg)) * 4 +
           tpc * FAST_SCORE_RING * 4 + tpc * FAST_MAX_SLOTS * 8 +
           tpc * (int)sizeof(SelTokenState) + (wg ? 1024 : 0);
}

/* floor(n / d) for 0 <= n < 2^31 by a multiply and a shift (Granlund and
 * Montgomery: m = ceil(2^(31 + s) / d), s = ceil(log2 d), is exact over that
 * range) - the per-tile block bounds would otherwise be ~25-instruction
 * integer divisions by runtime block sizes. */
struct SelDivider {
    unsigned long long m;
    int shift;
    __device__ explicit SelDivider(int d) {
        int s = 0;
        while ((1 << s) < d) s++;
        shift = 31 + s;
        m = ((1ull << shift) + (unsigned long long)d - 1) / (unsigned long long)d;
    }
    __device__ __forceinline__ int operator()(int n) const {
        return (int)(((unsigned long long)(unsigned)n * m) >> shift);
    }
};

/* The first and last compressed block overlapping selection block j. */
__device__ __forceinline__ int selFirstCmp(int j, int l_sel, int l, const SelDivider &div_d) {
    int lo = j * l_sel - l; /* i*d > j*l' - l */
    return lo < 0 ? 0 : div_d(lo) + 1;
}
__device__ __forceinline__ int selLastCmp(int j, int l_sel, const SelDivider &div_d) {
    return div_d((j + 1) * l_sel - 1);
}

/* Key order of the top-K: higher score first, then the lower block index
 * (the reference's tie rule). Every key in a merge is distinct: real blocks
 * have distinct j, empty slots get distinct sentinel j. */
__device__ __forceinline__ bool selBetter(float s1, int j1, float s2, int j2) {
    return s1 > s2 || (s1 == s2 && j1 < j2);
}
#define SEL_EMPTY_J (INT_MAX - 64) /* j at or above: an empty slot, not a block */

/* Merges one candidate per lane (valid or not) into a token's top-K kept in
 * topS/topJ[0..K) (K <= 31) sorted best first, warp-wide, given the worst
 * kept key (ws, wj) = entry K - 1, which it updates. The candidates that
 * beat the worst are placed all at once: a candidate's rank in the merged
 * list is the kept keys better than it (K less those it beats: one ballot)
 * plus the other such candidates better than it, and a kept key moves down
 * by the candidates better than it. One pass over those candidates, whose
 * comparisons do not wait on each other - placed one at a time, each
 * insertion waited on the last one's shuffles. Keys ranked K or worse drop
 * out, so the kept set is the K best keys seen, whatever the order of the
 * offers; after the first few tiles a candidate rarely gets in, so the
 * common case is one compare and one ballot. Every key is distinct (a
 * block is offered once; empty slots hold -inf with ascending sentinel
 * blocks, which is sorted), so the ranks are a permutation. */
__device__ __forceinline__ void selTopkMerge(float *topS, int *topJ, int K, float cs, int cj,
                                             bool valid, float &ws, int &wj) {
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const bool mine = valid && selBetter(cs, cj, ws, wj);
    const unsigned in = __ballot_sync(full, mine);
    if (!in) return;
    const bool kept = lane < K;
    const float os = kept ? topS[lane] : -INFINITY;
    const int oj = kept ? topJ[lane] : SEL_EMPTY_J + lane;
    int old_rank = lane, new_rank = 0;
    for (unsigned bits = in; bits; bits &= bits - 1) {
        const int src = __ffs(bits) - 1;
        const float xs = __shfl_sync(full, cs, src);
        const int xj = __shfl_sync(full, cj, src);
        const bool beats_kept = selBetter(xs, xj, os, oj);
        old_rank += beats_kept;
        new_rank += selBetter(xs, xj, cs, cj);
        const int beaten = __popc(__ballot_sync(full, kept && beats_kept));
        if (lane == src) new_rank += K - beaten;
    }
    __syncwarp();
    if (kept && old_rank < K) topS[old_rank] = os, topJ[old_rank] = oj;
    if (mine && new_rank < K) topS[new_rank] = cs, topJ[new_rank] = cj;
    __syncwarp();
    ws = topS[K - 1];
    wj = topJ[K - 1];
}

/* One token's view of the selection: its current block, the forced blocks
 * (0, cur, cur - 1) and how many it may choose freely. */
struct SelToken {
    int t, cur, n_forced, n_complete, K;
    __device__ SelToken(int t_, int l_sel, int n_sel) : t(t_) {
        cur = t / l_sel;
        n_forced = 1 + (cur >= 1) + (cur >= 2);
        n_complete = (t + 1) / l_sel;
        K = max(0, n_sel - n_forced);
    }
};
__device__ __forceinline__ bool selEligible(const SelTokenState &ts, int j) {
    return j < ts.n_complete && j != 0 && j != ts.cur && j != ts.cur - 1;
}

/* One exchange of a reduce-scatter: v[0 .. 2 HALF) with the lane `mask`
 * away; this lane keeps (and sums into v[0 .. HALF)) the upper half if
 * `upper`, the lower half otherwise. */
template <int HALF, int N>
__device__ __forceinline__ void selHalve(float (&v)[N], bool upper, int mask) {
#pragma unroll
    for (int k = 0; k < HALF; k++) {
        const float send = upper ? v[k] : v[k + HALF];
        const float keep = upper ? v[k + HALF] : v[k];
        v[k] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
    }
}

/* Sums a warp's 16 rows (the 16 heads of one token) of a 16 x 64 P tile in
 * C-fragment layout and writes the 64 column sums to pt: the two row
 * halves in registers, then a reduce-scatter across the 8 row groups
 * (lanes with the same quad) in three halving exchanges - 14 shuffles
 * instead of the 48 of three full butterflies. */
__device__ __forceinline__ void selSumHeads16(const float (&s)[8][4], float *pt) {
    const int lane = threadIdx.x & 31, grp = lane >> 2, quad = lane & 3;
    float v[16]; /* v[2n + e] = column n * 8 + quad * 2 + e */
#pragma unroll
    for (int n = 0; n < 8; n++) {
        v[2 * n] = s[n][0] + s[n][2];
        v[2 * n + 1] = s[n][1] + s[n][3];
    }
    selHalve<8>(v, grp & 1, 4);
    selHalve<4>(v, (grp >> 1) & 1, 8);
    selHalve<2>(v, (grp >> 2) & 1, 16);
    /* v[0..1] hold v-index (grp&1)*8 + (grp>>1&1)*4 + (grp>>2)*2 + {0, 1}:
     * n = (grp&1)*4 + (grp>>1&1)*2 + (grp>>2) */
    const int n = (grp & 1) * 4 + ((grp >> 1) & 1) * 2 + (grp >> 2);
    *(float2 *)(pt + n * 8 + quad * 2) = make_float2(v[0], v[1]);
}

/* The same for two tokens of 8 rows each (5 to 8 heads, padded): rows
 * 0-7 (the row-half-0 entries) are token 0, rows 8-15 token 1. One
 * reduce-scatter over the 32 entries of both leaves each lane four sums:
 * token (grp & 1), columns of n = (grp >> 1 & 1) * 4 + (grp >> 2) * 2 + {0, 1}.
 * pt0 is token 0's row of the summed tile, token 1's is pt1_off further. */
__device__ __forceinline__ void selSumHeads8(const float (&s)[8][4], float *pt0, int pt1_off) {
    const int lane = threadIdx.x & 31, grp = lane >> 2, quad = lane & 3;
    float v[32]; /* v[16 h + 2n + e] = row half h, column n * 8 + quad * 2 + e */
#pragma unroll
    for (int n = 0; n < 8; n++) {
        v[2 * n] = s[n][0];
        v[2 * n + 1] = s[n][1];
        v[16 + 2 * n] = s[n][2];
        v[16 + 2 * n + 1] = s[n][3];
    }
    selHalve<16>(v, grp & 1, 4);
    selHalve<8>(v, (grp >> 1) & 1, 8);
    selHalve<4>(v, (grp >> 2) & 1, 16);
    const int n0 = ((grp >> 1) & 1) * 4 + (grp >> 2) * 2;
    float *pt = pt0 + (grp & 1) * pt1_off;
    *(float2 *)(pt + n0 * 8 + quad * 2) = make_float2(v[0], v[1]);
    *(float2 *)(pt + (n0 + 1) * 8 + quad * 2) = make_float2(v[2], v[3]);
}

/* Two values as the fp16 pair of an mma.sync operand register (lo first). */
__device__ __forceinline__ uint32_t selPackF16(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&v;
}

/* The periodic fold on tensor cores, for a warp whose 16 rows are whole
 * tokens' heads (rpt 8: rows 0-7 one token, 8-15 the next; rpt 16, one_token:
 * all 16 one token's):
 *   Y^T = M^T P^T   (selection blocks x rows; M^T from `fold`, 64 columns),
 * then each token's rows summed across the quad. s holds the tile's P in
 * C-fragment layout, which is already the B fragment of P^T. A reduce-
 * scatter over the quad leaves this lane one block per token: on return
 * sum[h] is the score share of block 16 (quad & 1) + grp + 8 (quad >> 1 & 1)
 * of the token of row half h (with one_token, sum[0] is the token's). The
 * second m-tile (blocks 16-31) runs only where a tile reaches them. */
__device__ __forceinline__ void selFoldMma(const float (&s)[8][4], const __half *fold,
                                           bool two_mtiles, bool one_token, float (&sum)[2]) {
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, quad = lane & 3;
    float y[2][2][4] = {}; /* [m-tile][row half][C fragment] */
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t bf[2][2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            bf[h][0] = selPackF16(s[2 * kk][2 * h], s[2 * kk][2 * h + 1]);
            bf[h][1] = selPackF16(s[2 * kk + 1][2 * h], s[2 * kk + 1][2 * h + 1]);
        }
#pragma unroll
        for (int m = 0; m < 2; m++) {
            if (m == 1 && !two_mtiles) break;
            const int row = 16 * m + (lane & 15), chunk = 2 * kk + (lane >> 4);
            uint32_t a[4];
            fastLdsm4(a[0], a[1], a[2], a[3],
                      (const bf16 *)(fold + row * 64 + ((chunk ^ (row & 7)) << 3)));
#pragma unroll
            for (int h = 0; h < 2; h++) fastMmaF16(y[m][h], a, bf[h][0], bf[h][1]);
        }
    }
    const bool up1 = quad & 1, up2 = (quad >> 1) & 1;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (one_token && h == 1) {
            sum[1] = 0.f;
            break;
        }
        float v[2][2]; /* [m][e]: block 16 m + grp + 8 e, this lane's two rows (or four) */
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                v[m][e] = y[m][h][2 * e] + y[m][h][2 * e + 1];
                if (one_token) v[m][e] += y[m][1][2 * e] + y[m][1][2 * e + 1];
            }
        float w[2];
#pragma unroll
        for (int e = 0; e < 2; e++)
            w[e] = (up1 ? v[1][e] : v[0][e]) + __shfl_xor_sync(full, up1 ? v[0][e] : v[1][e], 1);
        sum[h] = (up2 ? w[1] : w[0]) + __shfl_xor_sync(full, up2 ? w[0] : w[1], 2);
    }
}

/* WG: the scores on wgmma (swizzled tiles, a warpgroup per 64 rows). On
 * wgmma 24 warps an SM fit the shared memory at d_k 64; the register bound
 * keeps the tensor-core fold's accumulators from taking that occupancy
 * away (88 registers unbounded: 20 warps). */
template <int DK, int WARPS, bool WG>
__global__ void __launch_bounds__(32 * WARPS, WG ? 24 / WARPS : 1)
fastSelectKernel(FastCtx c, const bf16 *q, const bf16 *kc, const float *lse_cmp, int32_t *sel_idx,
                 const __grid_constant__ FastKvMaps maps) {
    constexpr int LDK = DK + (WG ? 0 : 8), SCORE_ROWS = 16 * WARPS, SCORE_THREADS = 32 * WARPS;
    bf16 *sQ = fastTileBase<WG>(), *sK = sQ + SCORE_ROWS * LDK;
    /* WG: the pooled-key tiles (maps.k), released right after their scores */
    using Ring = FastKvRing<64, DK, 0, SEL_STAGES, 1>;
    const Ring ring = Ring::at(sK);
    const int hpg = c.hpg, rpt = selRowsPerToken(hpg), tpc = SCORE_ROWS / rpt;
    const int t0 = blockIdx.x * tpc;
    const bool heads_in_warp = selHeadsInWarp(hpg);
    float *sP = (float *)((char *)sK + (WG ? Ring::BYTES : SEL_STAGES * 64 * LDK * 2));
    float *sPt = sP + (heads_in_warp ? 0 : SCORE_ROWS * SEL_P_LD); /* [tpc][SEL_PT_LD]: P summed over heads */
    float *sRing = sPt + selPtFloats(tpc, heads_in_warp);
    __half *sFold = (__half *)sPt; /* the tensor-core fold's M^T (SEL_FOLD_ROWS) */
    float *sTopS = sRing + tpc * FAST_SCORE_RING;
    int *sTopJ = (int *)(sTopS + tpc * FAST_MAX_SLOTS);
    SelTokenState *sTok = (SelTokenState *)(sTopJ + tpc * FAST_MAX_SLOTS);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, grp = lane >> 2, quad = lane & 3;
    const int b = blockIdx.y / c.G, g = blockIdx.y % c.G;
    const int t_last = min(c.S, t0 + tpc) - 1;
    const int n_tok = t_last - t0 + 1; /* tokens of this CTA inside the sequence */
    const int l = c.cmp_len, d = c.cmp_stride, l_sel = c.sel_len;
    const SelDivider div_d(d), div_sel(l_sel);
    /* row r: the CTA's token (tk) and head of it, or false for a padding
     * row. Warp w owns tokens w, w + WARPS, ... (it folds, offers and
     * writes them); with 8 rows per token its row halves are tokens w and
     * w + WARPS, so that its heads are in its own registers. */
    auto rowSlot = [&](int r, int &tk, int &head) {
        if (rpt == 16) tk = r >> 4, head = r & 15;
        else if (rpt == 8) tk = (r >> 4) + ((r >> 3) & 1) * WARPS, head = r & 7;
        else tk = r / hpg, head = r % hpg;
        return r < tpc * rpt && head < hpg;
    };
    auto rowToken = [&](int r) {
        int tk, head;
        return rowSlot(r, tk, head) && t0 + tk < c.S ? t0 + tk : -1;
    };
    auto rowIndex = [&](int r) -> size_t {
        int tk, head;
        rowSlot(r, tk, head);
        return ((size_t)b * c.S + t0 + tk) * c.H + (size_t)g * hpg + head;
    };
    fastLoadTileFor<WG, SCORE_ROWS, DK, SCORE_THREADS>(sQ, [&](int r) -> const bf16 * {
        return rowToken(r) >= 0 ? q + rowIndex(r) * DK : nullptr;
    });
    const int nvis = t_last < l - 1 ? 0 : min(c.Nc, (t_last - l + 1) / d + 1);
    const int ntiles = (nvis + 63) / 64;
    auto loadK = [&](int it, int st) {
        const int i0 = it * 64;
        fastLoadTileFor<WG, 64, DK, SCORE_THREADS>(sK + st * 64 * LDK, [&](int r) -> const bf16 * {
            int i = i0 + r;
            return i < nvis ? kc + (((size_t)b * c.Nc + i) * c.G + g) * DK : nullptr;
        });
    };
    if constexpr (WG) {
        if (tid == 0) ring.init(WARPS);
    } else if (ntiles > 0) {
        loadK(0, 0);
    }
    fastCpCommit();
    /* Where 64 compressed blocks span a whole number of selection blocks
     * (64 d % l' == 0, as in every configuration the paper uses), tile it
     * folds exactly as tile 0 does, shifted by it * 64 d / l' blocks (d
     * divides l and l', so positions i d - j l' are tile-invariant). */
    const int fold_nj = div_sel(63 * d + l - 1) + 1; /* blocks a tile touches */
    const int fold_step = (64 * d) / l_sel;               /* blocks a tile completes (periodic) */
    const int fold_carry = max(0, fold_nj - fold_step);    /* blocks it hands to the next */
    const bool tile_periodic = (64 * d) % l_sel == 0 && fold_nj <= SEL_FOLD_ROWS;
    const bool fold_mma = heads_in_warp && tile_periodic;
    for (int i = tid; i < tpc * FAST_SCORE_RING; i += SCORE_THREADS) sRing[i] = 0.f;
    if (fold_mma) {
        /* M^T[jj][i]: the share of compressed block i (tokens [i d, i d + l))
         * inside selection block jj (tokens [jj l', (jj + 1) l')), over l */
        const float share = 1.f / (float)l;
        for (int e = tid; e < SEL_FOLD_ROWS * 8; e += SCORE_THREADS) { /* a 16-byte chunk each */
            const int jj = e >> 3, i0 = (e & 7) * 8, ju = jj * l_sel, ju_end = ju + l_sel;
            uint32_t w[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int ia = (i0 + 2 * k) * d, ib = ia + d;
                const int na = min(ia + l, ju_end) - max(ia, ju), nb = min(ib + l, ju_end) - max(ib, ju);
                w[k] = selPackF16(na > 0 ? (float)na * share : 0.f, nb > 0 ? (float)nb * share : 0.f);
            }
            *(uint4 *)(sFold + jj * 64 + (((e & 7) ^ (jj & 7)) << 3)) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    } else {
        for (int i = tid; i < tpc * SEL_FOLD_TAPS; i += SCORE_THREADS) /* sPt's padding columns */
            sPt[(i / SEL_FOLD_TAPS) * SEL_PT_LD + 64 + i % SEL_FOLD_TAPS] = 0.f;
    }
    for (int i = tid; i < tpc * FAST_MAX_SLOTS; i += SCORE_THREADS) {
        sTopS[i] = -INFINITY;
        sTopJ[i] = SEL_EMPTY_J + i % FAST_MAX_SLOTS;
    }
    for (int tk = tid; tk < n_tok; tk += SCORE_THREADS) {
        const SelToken tok(t0 + tk, l_sel, c.n_sel);
        /* the worst of the K empty slots: score -inf, the highest sentinel */
        sTok[tk] = SelTokenState{tok.cur, tok.n_forced, tok.n_complete, tok.K, -INFINITY,
                                 SEL_EMPTY_J + max(tok.K, 1) - 1};
    }
    __syncthreads(); /* rings, top-K slots and token states are read even when no tile runs */
    if constexpr (WG)
        if (tid == 0)
            for (int j = 0; j <= Ring::AHEAD && j < ntiles; j++)
                ring.produce(maps, j, b, g, j * 64);

    /* Offers the final scores of blocks [j_from, j_to) to the top-K of each
     * token: warp w serves tokens w, w + WARPS, ..., a lane per block - the
     * same warp that folds them, so no barrier stands between. Block j's
     * score is in ring slot j % FAST_SCORE_RING, or with carry_from >= 0 (the
     * periodic fold, whose ring holds only the carries) in slot j -
     * carry_from for the first n_carry blocks and 0 past them. Every slot
     * read is cleared for the block that will reuse it. */
    auto offerRange = [&](int j_from, int j_to, int carry_from, int n_carry) {
        for (int tk = warp; tk < n_tok; tk += WARPS) {
            SelTokenState ts = sTok[tk];
            float *ring = sRing + tk * FAST_SCORE_RING;
            for (int j0 = j_from; j0 < j_to; j0 += 32) {
                const int j = j0 + lane;
                float s = 0.f;
                if (j < j_to) {
                    const int slot = carry_from < 0 ? j % FAST_SCORE_RING : j - carry_from;
                    if (carry_from < 0 || slot < n_carry) {
                        s = ring[slot];
                        ring[slot] = 0.f;
                    }
                }
                if (ts.K > 0)
                    selTopkMerge(sTopS + tk * FAST_MAX_SLOTS, sTopJ + tk * FAST_MAX_SLOTS, ts.K, s,
                                 j, j < j_to && selEligible(ts, j), ts.worst_s, ts.worst_j);
            }
            if (lane == 0) sTok[tk].worst_s = ts.worst_s, sTok[tk].worst_j = ts.worst_j;
            __syncwarp();
        }
    };

    /* The periodic folds' offer: acc is this lane's share of block bl of
     * tile it (j = it * fold_step + bl) for token tk. Blocks below
     * (it + 1) * fold_step are final once this tile is in (the next tile
     * starts at that block), so blocks bl < fold_step add the previous
     * tile's carry and are offered from registers; blocks fold_step ..
     * fold_nj - 1 leave theirs in the ring's first slots as the next tile's
     * carry. The ring is not walked and the offers need no second pass
     * (ring updates and offers had been a large share of the kernel's
     * instructions). */
    auto offerFolded = [&](int tk, int it, int bl, float acc) {
        float *carry = sRing + tk * FAST_SCORE_RING;
        if (bl < fold_carry) acc += carry[bl];
        __syncwarp();
        if (bl >= fold_step && bl < fold_nj) carry[bl - fold_step] = acc;
        const int j = it * fold_step + bl;
        SelTokenState ts = sTok[tk];
        if (ts.K > 0) {
            selTopkMerge(sTopS + tk * FAST_MAX_SLOTS, sTopJ + tk * FAST_MAX_SLOTS, ts.K, acc, j,
                         bl < fold_step && j < c.Ns && selEligible(ts, j), ts.worst_s,
                         ts.worst_j);
            if (lane == 0) sTok[tk].worst_s = ts.worst_s, sTok[tk].worst_j = ts.worst_j;
        }
        __syncwarp();
    };

    const int rA = warp * 16 + grp, rB = rA + 8;
    int tok[2] = {rowToken(rA), rowToken(rB)};
    float lse2[2] = {INFINITY, INFINITY};
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (tok[i] < 0) continue;
        float lse = lse_cmp[rowIndex(i ? rB : rA)];
        if (lse == -INFINITY) tok[i] = -1;
        else lse2[i] = lse * FAST_LOG2E;
    }
    uint32_t qf[WG ? 1 : DK / 16][4]; /* mma.sync: the warp's q fragments, loaded once */
    const float inv_l = 1.f / (float)l;
    /* Periodic tiles with the heads in a warp fold on tensor cores
     * (fold_mma); with packed rows lane jj's weights and columns are formed
     * once here, within SEL_FOLD_TAPS taps a block. Elsewhere they are
     * formed per tile. Taps past the last visible block need no bound: their
     * P is 0. */
    float fold_w[SEL_FOLD_TAPS];
    int fold_lo; /* the lane's first tap column: taps fold_lo + k, k < SEL_FOLD_TAPS */
    bool periodic;
    {
        const int lo_rel = max(0, (lane * l_sel - l) / d + 1); /* multiples of d: exact */
        const int hi_rel = min(63, ((lane + 1) * l_sel - 1) / d);
        const bool lane_live = lane < fold_nj;
        periodic = fold_mma ||
                   (__all_sync(0xffffffffu, !lane_live || hi_rel - lo_rel < SEL_FOLD_TAPS) &&
                    tile_periodic);
#pragma unroll
        for (int k = 0; k < SEL_FOLD_TAPS; k++) {
            const int i = lo_rel + k;
            const int lo = max(i * d, lane * l_sel), hi = min(i * d + l, (lane + 1) * l_sel);
            fold_w[k] = lane_live && i <= hi_rel ? (float)(hi - lo) * inv_l : 0.f;
        }
        fold_lo = min(lo_rel, 64); /* idle lanes: zero weights, reads stay in the row's padding */
    }
    int j_done = 0;
    for (int it = 0; it < ntiles; it++) {
        const int st = it & 1, i0 = it * 64;
        const bf16 *k_t = sK + st * 64 * LDK;
        float s[8][4];
        if constexpr (WG) {
            if (it == 0) { /* q landed */
                fastCpWait<0>();
                fastTileBarrier<WG>();
            } else if (tid == 0 && it + Ring::AHEAD < ntiles) {
                ring.produce(maps, it + Ring::AHEAD, b, g, (it + Ring::AHEAD) * 64);
            }
            ring.wait(it);
            fastWgRun(
                [&] {
                    fastWgIssueAZt<8, DK>(s, sQ, SCORE_ROWS, (warp >> 2) * 64, ring.k(it), 64, 0);
                },
                s);
            ring.release(it);
        } else {
            /* tile it has landed and every warp is past tile it - 1, whose
             * stage the next load reuses */
            fastCpWait<0>();
            __syncthreads();
            if (it + 1 < ntiles) loadK(it + 1, st ^ 1);
            fastCpCommit();
            if (it == 0) {
#pragma unroll
                for (int kk = 0; kk < DK / 16; kk++) fastLoadA(qf[kk], sQ, LDK, warp * 16, kk * 16);
            }
#pragma unroll
            for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
            fastMmaFragZt<8, DK>(s, qf, k_t, LDK);
        }
        /* p = exp2(s2 - lse2); rows without a token carry lse2 = +inf (p = 0).
         * Interior tiles (every token sees all 64 blocks) skip the mask. */
        const bool full = i0 + 64 <= nvis && (i0 + 63) * d + l - 1 <= t0;
#pragma unroll
        for (int n = 0; n < 8; n++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int col = n * 8 + quad * 2, i = i0 + col;
                float p0 = fastExp2(fmaf(s[n][2 * h], c.scale_log2, -lse2[h]));
                float p1 = fastExp2(fmaf(s[n][2 * h + 1], c.scale_log2, -lse2[h]));
                if (!full) {
                    const int t = tok[h];
                    if (t < 0 || i * d + l - 1 > t) p0 = 0.f;
                    if (t < 0 || (i + 1) * d + l - 1 > t) p1 = 0.f;
                }
                s[n][2 * h] = p0;
                s[n][2 * h + 1] = p1;
            }
        }
        if (fold_mma) {
            /* the warp's 16 rows are its own tokens' heads (rpt 16: token
             * `warp`; rpt 8: tokens warp and warp + WARPS): no barrier */
            float sum[2];
            selFoldMma(s, sFold, fold_nj > 16, rpt == 16, sum);
            const int bl = 16 * (quad & 1) + grp + 8 * ((quad >> 1) & 1);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int tk = warp + h * WARPS;
                if ((rpt == 16 && h == 1) || tk >= n_tok) break;
                offerFolded(tk, it, bl, sum[h]);
            }
            j_done = min(c.Ns, (it + 1) * fold_step);
            continue;
        }
        if (heads_in_warp) {
            /* the warp's own tokens' heads, summed in its registers */
            if (rpt == 16) selSumHeads16(s, sPt + warp * SEL_PT_LD);
            else selSumHeads8(s, sPt + warp * SEL_PT_LD, WARPS * SEL_PT_LD);
            __syncwarp();
        } else {
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    *(float2 *)(sP + (h ? rB : rA) * SEL_P_LD + n * 8 + quad * 2) =
                        make_float2(s[n][2 * h], s[n][2 * h + 1]);
            __syncthreads();
            for (int idx = tid; idx < tpc * 64; idx += SCORE_THREADS) {
                int tk = idx >> 6, col = idx & 63;
                const float *p = sP + tk * hpg * SEL_P_LD + col;
                float acc = 0.f;
                for (int h = 0; h < hpg; h++) acc += p[h * SEL_P_LD];
                sPt[tk * SEL_PT_LD + col] = acc;
            }
            __syncthreads();
        }
        /* fold the tile into the open selection blocks of each token: a
         * lane per selection block, a warp per token */
        if (periodic) {
            /* lane r folds block it * fold_step + r from its taps */
            for (int tk = warp; tk < n_tok; tk += WARPS) {
                const float *pt = sPt + tk * SEL_PT_LD + fold_lo;
                float acc = 0.f;
#pragma unroll
                for (int k = 0; k < SEL_FOLD_TAPS; k++) acc = fmaf(fold_w[k], pt[k], acc);
                offerFolded(tk, it, lane, acc);
            }
            j_done = min(c.Ns, (it + 1) * fold_step);
        } else {
        /* the overlap weights formed once per tile and lane (the first
         * SEL_FOLD_TAPS in registers) */
        const int jlo = div_sel(i0 * d);
        const int jhi = min(c.Ns - 1, div_sel((i0 + 63) * d + l - 1));
        const int i_last = min(i0 + 63, nvis - 1);
        for (int j = jlo + lane; j - lane <= jhi; j += 32) {
            const bool live = j <= jhi;
            const int ilo = max(i0, selFirstCmp(j, l_sel, l, div_d));
            const int ihi = min(i_last, selLastCmp(j, l_sel, div_d));
            const int ju = j * l_sel, ju_end = ju + l_sel;
            float w[SEL_FOLD_TAPS];
#pragma unroll
            for (int k = 0; k < SEL_FOLD_TAPS; k++) {
                const int i = ilo + k, lo = max(i * d, ju), hi = min(i * d + l, ju_end);
                w[k] = live && i <= ihi ? (float)(hi - lo) * inv_l : 0.f;
            }
            /* taps past i_last have weight 0 and read column 63 instead
             * (written, finite), so every read stays inside the row */
            int col[SEL_FOLD_TAPS];
#pragma unroll
            for (int k = 0; k < SEL_FOLD_TAPS; k++) col[k] = min(ilo - i0 + k, 63);
            for (int tk = warp; tk < n_tok; tk += WARPS) {
                const float *pt = sPt + tk * SEL_PT_LD;
                float acc = 0.f;
#pragma unroll
                for (int k = 0; k < SEL_FOLD_TAPS; k++) acc = fmaf(w[k], pt[col[k]], acc);
                for (int i = ilo + SEL_FOLD_TAPS; live && i <= ihi; i++) {
                    const int lo = max(i * d, ju), hi = min(i * d + l, ju_end);
                    acc += (float)(hi - lo) * inv_l * sPt[tk * SEL_PT_LD + i - i0];
                }
                if (live) sRing[tk * FAST_SCORE_RING + j % FAST_SCORE_RING] += acc;
            }
        }
            __syncwarp();
            /* blocks no later tile touches are final */
            const int j_end = min(c.Ns, div_sel((i0 + 64) * d));
            if (j_end > j_done) offerRange(j_done, j_end, -1, 0);
            j_done = max(j_done, j_end);
        } /* periodic */
    }
    fastCpWait<0>();
    /* blocks past the last tile's reach hold what the tiles left (or 0):
     * the periodic fold's carries sit in the ring's first fold_carry slots */
    int j_all = 0;
    for (int tk = 0; tk < n_tok; tk++) j_all = max(j_all, sTok[tk].n_complete);
    if (j_all > j_done) offerRange(j_done, j_all, periodic ? j_done : -1, periodic ? fold_carry : 0);

    /* forced blocks + the kept top-K, ascending, -1 padded: a lane per
     * entry, placed by its rank (entries are distinct) */
    for (int tk = warp; tk < n_tok; tk += WARPS) {
        const SelTokenState ts = sTok[tk];
        int v = INT_MAX;
        if (lane < ts.K) {
            int j = sTopJ[tk * FAST_MAX_SLOTS + lane];
            if (j < SEL_EMPTY_J) v = j;
        } else if (lane - ts.K < ts.n_forced) {
            const int f = lane - ts.K;
            v = f == 0 ? 0 : f == 1 ? ts.cur : ts.cur - 1;
        }
        const int n = __popc(__ballot_sync(0xffffffffu, v != INT_MAX));
        int rank = 0;
        for (int src = 0; src < 32; src++) rank += __shfl_sync(0xffffffffu, v, src) < v;
        int32_t *row = sel_idx + (((size_t)b * c.S + t0 + tk) * c.G + g) * c.slots;
        if (v != INT_MAX) row[rank] = v;
        if (lane >= n && lane < c.slots) row[lane] = -1; /* ranks are < n: no overlap */
    }
}

template <int DK, int WARPS>
static cudaError_t selectLaunchWarps(const FastCtx &c, const bf16 *q, const bf16 *kc,
                                     const float *lse_cmp, int32_t *sel_idx, cudaStream_t stream) {
    auto kernel = c.wgmma ? fastSelectKernel<DK, WARPS, true> : fastSelectKernel<DK, WARPS, false>;
    const int smem = selectSmem(c, DK, WARPS, c.wgmma);
    cudaError_t e = fastSetSmem(kernel, smem);
    if (e != cudaSuccess) return e;
    FastKvMaps maps = {};
    if (c.wgmma) {
        e = fastTmaEncodeK(c.tma_encode, &maps, kc, c.B, c.Nc, c.G, DK, 64);
        if (e != cudaSuccess) return e;
    }
    const int tpc = 16 * WARPS / selRowsPerToken(c.hpg);
    kernel<<<dim3((c.S + tpc - 1) / tpc, c.B * c.G), 32 * WARPS, smem, stream>>>(c, q, kc, lse_cmp,
                                                                                sel_idx, maps);
    return cudaGetLastError();
}

/* For d_k >= 128, 128 query rows per CTA (8 warps) share each tile of
 * pooled keys: 64 rows pulled twice the key bytes from L2 per row. d_k =
 * 64 keys are half the bytes and 4 warps stay faster.
 * Where the per-token state of 128 rows does not fit (one head per
 * group) it is 4 warps too. */
template <int DK>
static cudaError_t selectLaunch(const FastCtx &c, const bf16 *q, const bf16 *kc,
                                const float *lse_cmp, int32_t *sel_idx, cudaStream_t stream) {
    if (DK >= 128 && selectSmem(c, DK, 8, c.wgmma) <= c.smem_max)
        return selectLaunchWarps<DK, 8>(c, q, kc, lse_cmp, sel_idx, stream);
    return selectLaunchWarps<DK, 4>(c, q, kc, lse_cmp, sel_idx, stream);
}

cudaError_t fastSelect(const FastCtx &c, int dk, const bf16 *q, const bf16 *kc,
                       const float *lse_cmp, int32_t *sel_idx, cudaStream_t stream) {
    /* the score pass reads keys only: one instantiation per d_k */
    if (dk == 64) return selectLaunch<64>(c, q, kc, lse_cmp, sel_idx, stream);
    if (dk == 128) return selectLaunch<128>(c, q, kc, lse_cmp, sel_idx, stream);
    if (dk == 192) return selectLaunch<192>(c, q, kc, lse_cmp, sel_idx, stream);
    return cudaErrorInvalidValue;
}
