/* fast_sel_union.cu - selected attention forward and dQ for short sequences:
 * the union-of-4-tokens design (the first fast version of issue 7).
 *
 * One CTA per 4 consecutive tokens of a KV group; warp w owns token t0+w
 * with the group's hpg heads as its 16 mma rows (padded). The CTA merges
 * the 4 tokens' sel_idx rows into their union and streams the union's keys
 * through shared memory once, in tiles of 64 (cp.async gather,
 * double-buffered); a warp skips tiles holding no key its token chose and
 * masks the rest (block chosen by its token, u <= t).
 *
 * Why two designs: at short S a token chooses a large share of all blocks
 * (16 of 32 at S = 2048, l' = 64), neighbours share most of them, and one
 * pass over the union beats a pass per token; at long S random selections
 * share few blocks and the union's CTA barriers leave three warps in four
 * idle, so the block-centric passes (fast_sel_block.cu) or, for the dQ,
 * fast_sel.cu's warp per token win. Which one runs at which shape is
 * decided in fast_attn.cu (fastSelDesign; docs/FAST_ATTN.md has the table);
 * NsaAttnCudaOptions.sel forces one (the tests run each). */
#include "fast_host.h"
#include "tile_dq.cuh"

#define SEL_TOKENS 4 /* consecutive tokens per CTA, one warp (16 mma rows) each */

/* Shared-memory state of a CTA's union of selected blocks. */
struct SelUnionSmem {
    int rows[SEL_TOKENS * FAST_MAX_SLOTS]; /* the 4 sel_idx rows */
    int blocks[SEL_TOKENS * FAST_MAX_SLOTS]; /* their union, ascending */
    int bits[SEL_TOKENS * FAST_MAX_SLOTS]; /* which of the 4 tokens chose it */
    int count;
    int key_tok[2][64];  /* per tile stage: token index of each key slot, -1 none */
    int key_bits[2][64]; /* and the membership bits of its block */
};

template <int DK, int DV, bool BWD>
constexpr int selSmem() {
    return (64 * (DK + 8) + (BWD ? 64 * (DV + 8) : 0) + 2 * 64 * (DK + 8) + 2 * 64 * (DV + 8)) * 2 +
           (int)sizeof(SelUnionSmem);
}

/* Loads the sel_idx rows of tokens t0..t0+3 and merges them (4-way, the
 * rows are ascending) into the union with per-block token bits. Returns the
 * number of key slots: all tokens of the union's blocks up to the last
 * token t_last (the last block is t_last's current block, the highest). */
static __device__ int selUnion(const FastCtx &c, const int32_t *sel_idx, int b, int g, int t0,
                        SelUnionSmem *u) {
    const int tid = threadIdx.x;
    if (tid < SEL_TOKENS * FAST_MAX_SLOTS) {
        int tk = tid / FAST_MAX_SLOTS, e = tid % FAST_MAX_SLOTS, t = t0 + tk;
        u->rows[tid] = (t < c.S && e < c.slots)
                           ? sel_idx[(((size_t)b * c.S + t) * c.G + g) * c.slots + e]
                           : -1;
    }
    __syncthreads();
    if (tid == 0) {
        int at[SEL_TOKENS] = {0, 0, 0, 0}, n = 0;
        for (;;) {
            int m = 0x7fffffff;
            for (int k = 0; k < SEL_TOKENS; k++) {
                int v = at[k] < c.slots ? u->rows[k * FAST_MAX_SLOTS + at[k]] : -1;
                if (v >= 0 && v < m) m = v;
            }
            if (m == 0x7fffffff) break;
            int bits = 0;
            for (int k = 0; k < SEL_TOKENS; k++) {
                if (at[k] < c.slots && u->rows[k * FAST_MAX_SLOTS + at[k]] == m) {
                    bits |= 1 << k;
                    at[k]++;
                }
            }
            u->blocks[n] = m;
            u->bits[n] = bits;
            n++;
        }
        u->count = n;
    }
    __syncthreads();
    const int n = u->count, t_last = min(c.S, t0 + SEL_TOKENS) - 1;
    return n == 0 ? 0 : (n - 1) * c.sel_len + t_last % c.sel_len + 1;
}

/* Key slot s of the union -> key row index (b, u, g), or -1 past the end. */
static __device__ __forceinline__ long long selSlotKey(const FastCtx &c, const SelUnionSmem *u, int b,
                                                int g, int s, int nkeys) {
    if (s >= nkeys) return -1;
    int tok = u->blocks[s / c.sel_len] * c.sel_len + s % c.sel_len;
    return ((long long)b * c.S + tok) * c.G + g;
}

/* Loads one tile of 64 key slots (K, V) and its metadata into stage st. */
template <int DK, int DV>
static __device__ __forceinline__ void selLoadTile(const FastCtx &c, SelUnionSmem *u, const bf16 *k,
                                            const bf16 *v, bf16 *sK, bf16 *sV, int b, int g,
                                            int it, int st, int nkeys) {
    constexpr int LDK = DK + 8, LDV = DV + 8;
    fastLoadTile<64, DK>(sK + st * 64 * LDK, [&](int r) -> const bf16 * {
        long long key = selSlotKey(c, u, b, g, it * 64 + r, nkeys);
        return key >= 0 ? k + (size_t)key * DK : nullptr;
    });
    fastLoadTile<64, DV>(sV + st * 64 * LDV, [&](int r) -> const bf16 * {
        long long key = selSlotKey(c, u, b, g, it * 64 + r, nkeys);
        return key >= 0 ? v + (size_t)key * DV : nullptr;
    });
    if (threadIdx.x < 64) {
        int s = it * 64 + threadIdx.x;
        bool ok = s < nkeys;
        u->key_tok[st][threadIdx.x] = ok ? u->blocks[s / c.sel_len] * c.sel_len + s % c.sel_len : -1;
        u->key_bits[st][threadIdx.x] = ok ? u->bits[s / c.sel_len] : 0;
    }
}

/* Forward, group-centric: one CTA per 4 consecutive tokens of group g; the
 * union of their selected blocks is streamed once through shared memory;
 * warp w computes token t0+w (its hpg heads as the mma rows) over the keys
 * of the blocks that token chose, u <= t, and skips tiles holding none. */
template <int DK, int DV>
__global__ void __launch_bounds__(FAST_THREADS)
selFwdUnionKernel(FastCtx c, FastFwdIo io, const int32_t *sel_idx) {
    constexpr int LDK = DK + 8, LDV = DV + 8;
    extern __shared__ __align__(16) unsigned char fast_smem[];
    bf16 *sQ = (bf16 *)fast_smem, *sK = sQ + 64 * LDK, *sV = sK + 2 * 64 * LDK;
    SelUnionSmem *u = (SelUnionSmem *)(sV + 2 * 64 * LDV);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 2, quad = lane & 3;
    const int b = blockIdx.y / c.G, g = blockIdx.y % c.G, t0 = blockIdx.x * SEL_TOKENS;
    const int my_t = t0 + warp < c.S ? t0 + warp : -1;
    auto rowIndex = [&](int r) -> size_t {
        return ((size_t)b * c.S + t0 + r / 16) * c.H + (size_t)g * c.hpg + r % 16;
    };
    auto rowLive = [&](int r) { return r % 16 < c.hpg && t0 + r / 16 < c.S; };
    fastLoadTile<64, DK>(sQ, [&](int r) -> const bf16 * {
        return rowLive(r) ? io.q + rowIndex(r) * DK : nullptr;
    });
    const int nkeys = selUnion(c, sel_idx, b, g, t0, u);
    const int ntiles = (nkeys + 63) / 64;
    if (ntiles > 0) selLoadTile<DK, DV>(c, u, io.k, io.v, sK, sV, b, g, 0, 0, nkeys);
    fastCpCommit();

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float o[DV / 8][4];
#pragma unroll
    for (int n = 0; n < DV / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    uint32_t qf[DK / 16][4];
    bool have_q = false;
    for (int it = 0; it < ntiles; it++) {
        const int st = it & 1;
        if (it + 1 < ntiles) selLoadTile<DK, DV>(c, u, io.k, io.v, sK, sV, b, g, it + 1, st ^ 1, nkeys);
        fastCpCommit();
        fastCpWait<1>();
        __syncthreads();
        auto visible = [&](int col) {
            int tok = u->key_tok[st][col];
            return my_t >= 0 && tok >= 0 && tok <= my_t && ((u->key_bits[st][col] >> warp) & 1);
        };
        if (__any_sync(0xffffffffu, visible(lane) || visible(lane + 32))) {
            if (!have_q) {
#pragma unroll
                for (int kk = 0; kk < DK / 16; kk++) fastLoadA(qf[kk], sQ, LDK, warp * 16, kk * 16);
                have_q = true;
            }
            const bf16 *k_t = sK + st * 64 * LDK, *v_t = sV + st * 64 * LDV;
            float s[8][4];
#pragma unroll
            for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
            fastMmaFragZt<8, DK>(s, qf, k_t, LDK);
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = visible(n * 8 + quad * 2 + (e & 1)) ? s[n][e] * c.scale_log2 : -INFINITY;
                    s[n][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
            }
            fastSoftmaxStep<8, DV>(s, mx, m, l, o);
            fastMmaPZ<8, DV>(o, s, v_t, LDV);
        }
        __syncthreads();
    }
    fastCpWait<0>();
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float lsum = fastQuadSum(l[i]);
        int r = warp * 16 + grp + i * 8;
        if (!rowLive(r)) continue;
        size_t row = rowIndex(r);
        fastStoreOutRow<DV>(io.o + row * DV, io.lse + row, o, i, m[i], lsum, quad);
    }
}

/* dQ of the selected branch, same CTA shape as the forward. */
template <int DK, int DV>
__global__ void __launch_bounds__(FAST_THREADS)
selDqUnionKernel(FastCtx c, FastBwdIo io, const int32_t *sel_idx) {
    constexpr int LDK = DK + 8, LDV = DV + 8;
    extern __shared__ __align__(16) unsigned char fast_smem[];
    bf16 *sQ = (bf16 *)fast_smem, *sdO = sQ + 64 * LDK, *sK = sdO + 64 * LDV,
         *sV = sK + 2 * 64 * LDK;
    SelUnionSmem *u = (SelUnionSmem *)(sV + 2 * 64 * LDV);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 2, quad = lane & 3;
    const int b = blockIdx.y / c.G, g = blockIdx.y % c.G, t0 = blockIdx.x * SEL_TOKENS;
    const int my_t = t0 + warp < c.S ? t0 + warp : -1;
    auto rowIndex = [&](int r) -> size_t {
        return ((size_t)b * c.S + t0 + r / 16) * c.H + (size_t)g * c.hpg + r % 16;
    };
    auto rowLive = [&](int r) { return r % 16 < c.hpg && t0 + r / 16 < c.S; };
    fastLoadTile<64, DK>(sQ, [&](int r) -> const bf16 * {
        return rowLive(r) ? io.q + rowIndex(r) * DK : nullptr;
    });
    fastLoadTile<64, DV>(sdO, [&](int r) -> const bf16 * {
        return rowLive(r) ? io.dout + rowIndex(r) * DV : nullptr;
    });
    const int nkeys = selUnion(c, sel_idx, b, g, t0, u);
    const int ntiles = (nkeys + 63) / 64;
    if (ntiles > 0) selLoadTile<DK, DV>(c, u, io.k, io.v, sK, sV, b, g, 0, 0, nkeys);
    fastCpCommit();

    float lse2[2], dsum[2], gate[2];
    bool live[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int r = warp * 16 + grp + i * 8;
        live[i] = false;
        lse2[i] = dsum[i] = gate[i] = 0.f;
        if (rowLive(r)) {
            size_t row = rowIndex(r);
            float lse = io.lse[row];
            live[i] = lse != -INFINITY;
            lse2[i] = live[i] ? lse * FAST_LOG2E : 0.f;
            dsum[i] = io.dsum[row * 3 + io.branch];
            gate[i] = __bfloat162float(io.gates[row * 3 + io.branch]);
        }
    }
    float dq[DK / 8][4];
#pragma unroll
    for (int n = 0; n < DK / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
    for (int it = 0; it < ntiles; it++) {
        const int st = it & 1;
        if (it + 1 < ntiles) selLoadTile<DK, DV>(c, u, io.k, io.v, sK, sV, b, g, it + 1, st ^ 1, nkeys);
        fastCpCommit();
        fastCpWait<1>();
        __syncthreads();
        auto visible = [&](int col) {
            int tok = u->key_tok[st][col];
            return my_t >= 0 && tok >= 0 && tok <= my_t && ((u->key_bits[st][col] >> warp) & 1);
        };
        if (__any_sync(0xffffffffu, visible(lane) || visible(lane + 32))) {
            const bf16 *k_t = sK + st * 64 * LDK, *v_t = sV + st * 64 * LDV;
            float s[8][4], dp[8][4];
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.f;
            fastMmaAZt<8, DK>(s, sQ, LDK, warp * 16, k_t, LDK);
            fastMmaAZt<8, DV>(dp, sdO, LDV, warp * 16, v_t, LDV);
#pragma unroll
            for (int n = 0; n < 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int i = e >> 1;
                    bool ok = live[i] && visible(n * 8 + quad * 2 + (e & 1));
                    float p = ok ? fastExp2(s[n][e] * c.scale_log2 - lse2[i]) : 0.f;
                    s[n][e] = gate[i] * p * (dp[n][e] - dsum[i]);
                }
            }
            fastMmaPZ<8, DK>(dq, s, k_t, LDK);
        }
        __syncthreads();
    }
    fastCpWait<0>();
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int r = warp * 16 + grp + i * 8;
        if (!rowLive(r)) continue;
        fastStoreDqRow<DK>(c, io, rowIndex(r), i, dq);
    }
}

/* ---- reverse index ---------------------------------------------------- */

template <int DK, int DV>
static cudaError_t selUnionForward(const FastCtx &c, const FastFwdIo &io, const int32_t *sel_idx,
                                   cudaStream_t stream) {
    auto kernel = selFwdUnionKernel<DK, DV>;
    constexpr int smem = selSmem<DK, DV, false>();
    cudaError_t e = fastSetSmem(kernel, smem);
    if (e != cudaSuccess) return e;
    kernel<<<dim3((c.S + SEL_TOKENS - 1) / SEL_TOKENS, c.B * c.G), FAST_THREADS, smem, stream>>>(
        c, io, sel_idx);
    return cudaGetLastError();
}

template <int DK, int DV>
static cudaError_t selUnionDq(const FastCtx &c, const FastBwdIo &io, const int32_t *sel_idx,
                              cudaStream_t stream) {
    auto dq = selDqUnionKernel<DK, DV>;
    constexpr int smem_q = selSmem<DK, DV, true>();
    cudaError_t e = fastSetSmem(dq, smem_q);
    if (e != cudaSuccess) return e;
    dq<<<dim3((c.S + SEL_TOKENS - 1) / SEL_TOKENS, c.B * c.G), FAST_THREADS, smem_q, stream>>>(
        c, io, sel_idx);
    return cudaGetLastError();
}

cudaError_t fastSelUnionForward(const FastCtx &c, int dk, int dv, const FastFwdIo &io,
                                const int32_t *sel_idx, cudaStream_t stream) {
    FAST_DISPATCH(dk, dv, selUnionForward, c, io, sel_idx, stream);
}

cudaError_t fastSelUnionDq(const FastCtx &c, int dk, int dv, const FastBwdIo &io,
                           const int32_t *sel_idx, cudaStream_t stream) {
    FAST_DISPATCH(dk, dv, selUnionDq, c, io, sel_idx, stream);
}
