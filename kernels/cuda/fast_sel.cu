/* fast_sel.cu - selected attention, group-centric (NSA paper, section 3.4).
 *
 * Forward and dQ: one CTA per 4 consecutive tokens of a KV group; warp w
 * owns token t0+w with the group's hpg heads as its 16 mma rows (padded).
 * The CTA merges the 4 tokens' sel_idx rows into their union (neighbours
 * share most blocks: the forced ones and usually the top ones) and streams
 * the union's keys through shared memory once, in tiles of 64 (cp.async
 * gather, double-buffered); a warp skips tiles holding no key its token
 * chose and masks the rest (block chosen by its token, u <= t). So every
 * selected block is read once per 4 tokens instead of once per token.
 *
 * dK/dV, deterministic: a stable counting sort builds, for every selection
 * block j, the ascending list of tokens that chose it (count per chunk of
 * tokens, exclusive scan, fill by one warp per chunk in token order). The
 * list is cut into work items of FAST_SEL_CHUNK entries; one CTA per item
 * runs the key-tile loop of fast_tile.cuh over the item's rows (all heads of
 * the group), writing the block's dK/dV directly when the list is one item
 * long, else an fp32 partial that a second kernel sums in item order. */
#include "fast_internal.cuh"

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
__device__ int selUnion(const FastCtx &c, const int32_t *sel_idx, int b, int g, int t0,
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
__device__ __forceinline__ long long selSlotKey(const FastCtx &c, const SelUnionSmem *u, int b,
                                                int g, int s, int nkeys) {
    if (s >= nkeys) return -1;
    int tok = u->blocks[s / c.sel_len] * c.sel_len + s % c.sel_len;
    return ((long long)b * c.S + tok) * c.G + g;
}

/* Loads one tile of 64 key slots (K, V) and its metadata into stage st. */
template <int DK, int DV>
__device__ __forceinline__ void selLoadTile(const FastCtx &c, SelUnionSmem *u, const bf16 *k,
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
selFwdKernel(FastCtx c, FastFwdIo io, const int32_t *sel_idx) {
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
            float muse[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float mn = fmaxf(m[i], fastQuadMax(mx[i]));
                muse[i] = mn == -INFINITY ? 0.f : mn;
                float corr = exp2f(m[i] - muse[i]);
                m[i] = mn;
                l[i] *= corr;
#pragma unroll
                for (int n = 0; n < DV / 8; n++) {
                    o[n][2 * i] *= corr;
                    o[n][2 * i + 1] *= corr;
                }
            }
#pragma unroll
            for (int n = 0; n < 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(s[n][e] - muse[e >> 1]);
                    s[n][e] = p;
                    l[e >> 1] += p;
                }
            }
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                uint32_t a[4];
                fastAFromC(a, s[2 * ks], s[2 * ks + 1]);
#pragma unroll
                for (int dp = 0; dp < DV / 16; dp++) {
                    uint32_t bb[4];
                    fastLoadBCols(bb, v_t, LDV, ks * 16, dp * 16);
                    fastMma(o[2 * dp], a, bb[0], bb[1]);
                    fastMma(o[2 * dp + 1], a, bb[2], bb[3]);
                }
            }
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
        float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
        for (int n = 0; n < DV / 8; n++)
            *(uint32_t *)(io.o + row * DV + n * 8 + quad * 2) =
                fastPack(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
        if (quad == 0) io.lse[row] = lsum > 0.f ? (m[i] + log2f(lsum)) * FAST_LN2 : -INFINITY;
    }
}

/* dQ of the selected branch, same CTA shape as the forward. */
template <int DK, int DV>
__global__ void __launch_bounds__(FAST_THREADS)
selDqKernel(FastCtx c, FastBwdIo io, const int32_t *sel_idx) {
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
#pragma unroll
            for (int kk = 0; kk < DK / 16; kk++) {
                uint32_t a[4];
                fastLoadA(a, sQ, LDK, warp * 16, kk * 16);
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t bb[4];
                    fastLoadBRows(bb, k_t, LDK, np * 16, kk * 16);
                    fastMma(s[2 * np], a, bb[0], bb[1]);
                    fastMma(s[2 * np + 1], a, bb[2], bb[3]);
                }
            }
#pragma unroll
            for (int kk = 0; kk < DV / 16; kk++) {
                uint32_t a[4];
                fastLoadA(a, sdO, LDV, warp * 16, kk * 16);
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t bb[4];
                    fastLoadBRows(bb, v_t, LDV, np * 16, kk * 16);
                    fastMma(dp[2 * np], a, bb[0], bb[1]);
                    fastMma(dp[2 * np + 1], a, bb[2], bb[3]);
                }
            }
#pragma unroll
            for (int n = 0; n < 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int i = e >> 1;
                    bool ok = live[i] && visible(n * 8 + quad * 2 + (e & 1));
                    float p = ok ? exp2f(s[n][e] * c.scale_log2 - lse2[i]) : 0.f;
                    s[n][e] = gate[i] * p * (dp[n][e] - dsum[i]);
                }
            }
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                uint32_t a[4];
                fastAFromC(a, s[2 * ks], s[2 * ks + 1]);
#pragma unroll
                for (int dd = 0; dd < DK / 16; dd++) {
                    uint32_t bb[4];
                    fastLoadBCols(bb, k_t, LDK, ks * 16, dd * 16);
                    fastMma(dq[2 * dd], a, bb[0], bb[1]);
                    fastMma(dq[2 * dd + 1], a, bb[2], bb[3]);
                }
            }
        }
        __syncthreads();
    }
    fastCpWait<0>();
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int r = warp * 16 + grp + i * 8;
        if (!rowLive(r)) continue;
        size_t row = rowIndex(r);
#pragma unroll
        for (int n = 0; n < DK / 8; n++) {
            int col = n * 8 + quad * 2;
            float v0 = dq[n][2 * i] * c.scale, v1 = dq[n][2 * i + 1] * c.scale;
            float2 *acc = (float2 *)(io.dq_acc + row * DK + col);
            if (io.dq_mode == 0) {
                *acc = make_float2(v0, v1);
            } else {
                float2 prev = *acc;
                if (io.dq_mode == 1)
                    *acc = make_float2(prev.x + v0, prev.y + v1);
                else
                    *(uint32_t *)(io.dq_out + row * DK + col) = fastPack(prev.x + v0, prev.y + v1);
            }
        }
    }
}

/* ---- reverse index ---------------------------------------------------- */

/* offsets[bg][j][chunk] = how many tokens of the chunk chose block j. */
__global__ void selCountKernel(FastCtx c, const int32_t *sel_idx, int *offsets, int chunks) {
    extern __shared__ int hist[];
    const int bg = blockIdx.y, b = bg / c.G, g = bg % c.G, chunk = blockIdx.x;
    for (int j = threadIdx.x; j < c.Ns; j += blockDim.x) hist[j] = 0;
    __syncthreads();
    const int t0 = chunk * FAST_REV_TOKENS;
    for (int idx = threadIdx.x; idx < FAST_REV_TOKENS * c.slots; idx += blockDim.x) {
        int t = t0 + idx / c.slots;
        if (t >= c.S) break;
        int j = sel_idx[(((size_t)b * c.S + t) * c.G + g) * c.slots + idx % c.slots];
        if (j >= 0) atomicAdd(&hist[j], 1); /* integer: order-free */
    }
    __syncthreads();
    for (int j = threadIdx.x; j < c.Ns; j += blockDim.x)
        offsets[((size_t)bg * c.Ns + j) * chunks + chunk] = hist[j];
}

/* Exclusive scan of offsets[bg] (j-major), then per block j: list start,
 * work items (ceil(len / FAST_SEL_CHUNK), at least 1) and partial slots
 * (the items of blocks with more than one). One CTA of 1024 per (b, g). */
__global__ void __launch_bounds__(1024) selScanKernel(FastCtx c, FastRevIndex rev) {
    __shared__ int sums[1024];
    const int bg = blockIdx.x, n = c.Ns * rev.chunks;
    int *a = rev.offsets + (size_t)bg * n;
    const int per = (n + 1023) / 1024, lo = min(n, threadIdx.x * per), hi = min(n, lo + per);
    int local = 0;
    for (int i = lo; i < hi; i++) local += a[i];
    sums[threadIdx.x] = local;
    __syncthreads();
    for (int off = 1; off < 1024; off <<= 1) { /* Hillis-Steele inclusive scan */
        int v = threadIdx.x >= off ? sums[threadIdx.x - off] : 0;
        __syncthreads();
        sums[threadIdx.x] += v;
        __syncthreads();
    }
    int run = sums[threadIdx.x] - local;
    for (int i = lo; i < hi; i++) {
        int v = a[i];
        a[i] = run;
        run += v;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int *bs = rev.block_start + (size_t)bg * (c.Ns + 1);
        int *is = rev.item_start + (size_t)bg * (c.Ns + 1);
        int *ps = rev.part_start + (size_t)bg * (c.Ns + 1);
        int total = sums[1023];
        is[0] = ps[0] = 0;
        for (int j = 0; j < c.Ns; j++) {
            int start = a[(size_t)j * rev.chunks];
            int end = j + 1 < c.Ns ? a[(size_t)(j + 1) * rev.chunks] : total;
            int items = max(1, (end - start + FAST_SEL_CHUNK - 1) / FAST_SEL_CHUNK);
            bs[j] = start;
            is[j + 1] = is[j] + items;
            ps[j + 1] = ps[j] + (items > 1 ? items : 0);
        }
        bs[c.Ns] = total;
    }
}

/* One warp per chunk of tokens, in token order: entry of (t, j) goes to
 * offsets[j][chunk] + (earlier tokens of the chunk that chose j). A row's
 * blocks are distinct, so the lanes never share a counter. */
__global__ void selFillKernel(FastCtx c, const int32_t *sel_idx, FastRevIndex rev) {
    extern __shared__ int seen[];
    const int bg = blockIdx.y, b = bg / c.G, g = bg % c.G, chunk = blockIdx.x;
    const int lane = threadIdx.x;
    for (int j = lane; j < c.Ns; j += 32) seen[j] = 0;
    __syncwarp();
    const int *off = rev.offsets + (size_t)bg * c.Ns * rev.chunks;
    int *entries = rev.entries + (size_t)bg * c.S * c.slots;
    const int t_end = min(c.S, (chunk + 1) * FAST_REV_TOKENS);
    for (int t = chunk * FAST_REV_TOKENS; t < t_end; t++) {
        int j = lane < c.slots ? sel_idx[(((size_t)b * c.S + t) * c.G + g) * c.slots + lane] : -1;
        if (j >= 0) {
            entries[off[(size_t)j * rev.chunks + chunk] + seen[j]] = t;
            seen[j]++;
        }
        __syncwarp();
    }
}

template <int DK, int DV>
__global__ void __launch_bounds__(FAST_THREADS)
selDkdvKernel(FastCtx c, FastBwdIo io, FastRevIndex rev, bf16 *dk_out, bf16 *dv_out) {
    const int bg = blockIdx.z, b = bg / c.G, g = bg % c.G, sub = blockIdx.y;
    const int *is = rev.item_start + (size_t)bg * (c.Ns + 1);
    const int item = blockIdx.x;
    if (item >= is[c.Ns]) return;
    int lo = 0, hi = c.Ns - 1; /* the block j with is[j] <= item < is[j+1] */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (is[mid] <= item) lo = mid;
        else hi = mid - 1;
    }
    const int j = lo, chunk = item - is[j], items = is[j + 1] - is[j];
    const int l_sel = c.sel_len;
    const int u0 = j * l_sel + sub * 64;
    const int khi = min(min(c.S, (j + 1) * l_sel), u0 + 64);
    if (u0 >= khi) return;
    const int *bs = rev.block_start + (size_t)bg * (c.Ns + 1);
    const int e0 = bs[j] + chunk * FAST_SEL_CHUNK, e1 = min(bs[j + 1], e0 + FAST_SEL_CHUNK);
    const int tpr = FAST_DKDV_ROWS / c.hpg;
    const int ntiles = e1 > e0 ? (e1 - e0 + tpr - 1) / tpr : 0;
    const int *entries = rev.entries + (size_t)bg * c.S * c.slots;
    const int subtiles = gridDim.y;
    const int slot = rev.part_start[(size_t)bg * (c.Ns + 1) + j] + chunk;
    float *pk = rev.part_k + (((size_t)bg * rev.max_parts + slot) * subtiles + sub) * 64 * DK;
    float *pv = rev.part_v + (((size_t)bg * rev.max_parts + slot) * subtiles + sub) * 64 * DV;
    const int S = c.S, G = c.G;
    fastDkdvCore<DK, DV>(
        c, io, b, g, u0, khi, ntiles,
        [=](int it, int s) {
            int e = e0 + it * tpr + s;
            return e < e1 ? entries[e] : -1;
        },
        [=](int t, int u) { return u <= t; },
        [=](int it) { /* entries ascend: the tile's first token is its smallest */
            int e = e0 + it * tpr;
            return e + tpr <= e1 && u0 + 63 <= entries[e];
        },
        [=](int u, bool is_k, int col, float v0, float v1) {
            if (items == 1) {
                size_t key = ((size_t)b * S + u) * G + g;
                if (is_k)
                    *(uint32_t *)(dk_out + key * DK + col) = fastPack(v0, v1);
                else
                    *(uint32_t *)(dv_out + key * DV + col) = fastPack(v0, v1);
            } else if (is_k) {
                *(float2 *)(pk + (size_t)(u - u0) * DK + col) = make_float2(v0, v1);
            } else {
                *(float2 *)(pv + (size_t)(u - u0) * DV + col) = make_float2(v0, v1);
            }
        });
}

/* Sums the item partials of blocks with several items, in item order. */
template <int DK, int DV>
__global__ void selReduceKernel(FastCtx c, FastRevIndex rev, bf16 *dk_out, bf16 *dv_out) {
    const int bg = blockIdx.z, b = bg / c.G, g = bg % c.G, sub = blockIdx.y, j = blockIdx.x;
    const int *is = rev.item_start + (size_t)bg * (c.Ns + 1);
    const int items = is[j + 1] - is[j];
    if (items <= 1) return;
    const int first = rev.part_start[(size_t)bg * (c.Ns + 1) + j], subtiles = gridDim.y;
    const int u0 = j * c.sel_len + sub * 64;
    const int khi = min(min(c.S, (j + 1) * c.sel_len), u0 + 64);
    for (int idx = threadIdx.x; idx < 64 * (DK + DV); idx += blockDim.x) {
        bool is_k = idx < 64 * DK;
        int dim = is_k ? DK : DV, rel = is_k ? idx : idx - 64 * DK;
        int r = rel / dim, col = rel % dim;
        if (u0 + r >= khi) continue;
        const float *part = is_k ? rev.part_k : rev.part_v;
        float acc = 0.f;
        for (int p = 0; p < items; p++)
            acc += part[((((size_t)bg * rev.max_parts + first + p) * subtiles + sub) * 64 + r) * dim + col];
        size_t key = ((size_t)b * c.S + u0 + r) * c.G + g;
        (is_k ? dk_out : dv_out)[key * dim + col] = __float2bfloat16(acc);
    }
}

template <int DK, int DV>
static cudaError_t selForward(const FastCtx &c, const FastFwdIo &io, const int32_t *sel_idx,
                              cudaStream_t stream) {
    auto kernel = selFwdKernel<DK, DV>;
    constexpr int smem = selSmem<DK, DV, false>();
    cudaError_t e = fastSetSmem(kernel, smem);
    if (e != cudaSuccess) return e;
    kernel<<<dim3((c.S + SEL_TOKENS - 1) / SEL_TOKENS, c.B * c.G), FAST_THREADS, smem, stream>>>(
        c, io, sel_idx);
    return cudaGetLastError();
}

template <int DK, int DV>
static cudaError_t selBackward(const FastCtx &c, const FastBwdIo &io, const int32_t *sel_idx,
                               const FastRevIndex &rev, bf16 *dk_out, bf16 *dv_out,
                               cudaStream_t stream, const FastMarks *marks) {
    cudaError_t e;
    if ((e = fastMark(marks, "bwd.sel.dkdv")) != cudaSuccess) return e;
    const int subtiles = (c.sel_len + 63) / 64;
    auto dkdv = selDkdvKernel<DK, DV>;
    const int smem_kv = fastDkdvSmem(DK, DV);
    if ((e = fastSetSmem(dkdv, smem_kv)) != cudaSuccess) return e;
    dkdv<<<dim3(rev.max_items, subtiles, c.B * c.G), FAST_THREADS, smem_kv, stream>>>(
        c, io, rev, dk_out, dv_out);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if ((e = fastMark(marks, "bwd.sel.reduce")) != cudaSuccess) return e;
    selReduceKernel<DK, DV><<<dim3(c.Ns, subtiles, c.B * c.G), 256, 0, stream>>>(c, rev, dk_out,
                                                                                 dv_out);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    auto dq = selDqKernel<DK, DV>;
    constexpr int smem_q = selSmem<DK, DV, true>();
    if ((e = fastSetSmem(dq, smem_q)) != cudaSuccess) return e;
    if ((e = fastMark(marks, "bwd.sel.dq")) != cudaSuccess) return e;
    dq<<<dim3((c.S + SEL_TOKENS - 1) / SEL_TOKENS, c.B * c.G), FAST_THREADS, smem_q, stream>>>(
        c, io, sel_idx);
    return cudaGetLastError();
}

cudaError_t fastSelForward(const FastCtx &c, int dk, int dv, const FastFwdIo &io,
                           const int32_t *sel_idx, cudaStream_t stream) {
    FAST_DISPATCH(dk, dv, selForward, c, io, sel_idx, stream);
}

cudaError_t fastSelBuildIndex(const FastCtx &c, const int32_t *sel_idx, const FastRevIndex &rev,
                              cudaStream_t stream) {
    const size_t hist = (size_t)c.Ns * sizeof(int);
    cudaError_t e;
    if (hist > 48 * 1024) {
        if ((e = cudaFuncSetAttribute(selCountKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)hist)) != cudaSuccess)
            return e;
        if ((e = cudaFuncSetAttribute(selFillKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)hist)) != cudaSuccess)
            return e;
    }
    selCountKernel<<<dim3(rev.chunks, c.B * c.G), 256, hist, stream>>>(c, sel_idx, rev.offsets,
                                                                      rev.chunks);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    selScanKernel<<<c.B * c.G, 1024, 0, stream>>>(c, rev);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    selFillKernel<<<dim3(rev.chunks, c.B * c.G), 32, hist, stream>>>(c, sel_idx, rev);
    return cudaGetLastError();
}

cudaError_t fastSelBackward(const FastCtx &c, int dk, int dv, const FastBwdIo &io,
                            const int32_t *sel_idx, const FastRevIndex &rev, bf16 *dk_out,
                            bf16 *dv_out, cudaStream_t stream, const FastMarks *marks) {
    FAST_DISPATCH(dk, dv, selBackward, c, io, sel_idx, rev, dk_out, dv_out, stream, marks);
}
