/* fast_sel.cu - selected attention (NSA paper, section 3.4): the dQ one
 * warp per token, the reverse index and the unfused dK/dV.
 *
 * dQ, token-per-warp: warp w of a CTA owns token t0+w of KV group g, its
 * hpg heads as the 16 mma rows (padded). The warp walks the keys of the
 * blocks its own sel_idx row chose (ascending, so the last one is the
 * token's current block, cut at u = t) in tiles of SEL_KT keys, gathered
 * with 16-byte cp.async into its own two shared-memory stages: the next
 * tile is in flight while the current one is computed, and the warps never
 * wait for each other (no CTA barrier; CTA-wide stages of 4 tokens' union
 * left three warps in four waiting at every barrier on random selections).
 *
 * Which dQ runs is decided per call in fast_attn.cu (fastSelDesign, by S,
 * head dims and tensor-core path; docs/FAST_ATTN.md has the table): this
 * one for the long-S dQ on wgmma at d_k >= 128 where l' > 64 (from S =
 * 8192), and on mma.sync from S = 4096, except at d_k = 64 from S = 8192.
 *
 * dK/dV, deterministic: a stable counting sort builds, for every selection
 * block j, the ascending list of tokens that chose it (count per chunk of
 * tokens, exclusive scans along each block's chunks and over the blocks,
 * fill in token order per chunk). The
 * list is cut into work items of rev.item_entries entries (at most
 * FAST_SEL_CHUNK; fewer at short S, where fast_attn.cu keeps the groups
 * whose rows the CTAs in flight read within L2); one CTA per item
 * runs the key-tile loop of tile_dkdv.cuh over the item's rows (all heads of
 * the group), writing the block's dK/dV directly when the list is one item
 * long, else an fp32 partial that a second kernel sums in item order. */
#include "fast_host.h"
#include "tile_dq.cuh"
#include "tile_dkdv.cuh"

#define SEL_WARPS 2 /* tokens per CTA, one warp each; 2 packs the SMs' shared memory best */
#define SEL_KT 16   /* key slots per warp tile: small stages let 8-16 warps share an SM */

/* Shared memory of one warp: its Q rows (and dO rows for the dQ pass), two
 * K/V stages, and its sel_idx row. Every part is a multiple of 16 bytes. */
template <int DK, int DV, bool BWD>
constexpr int selWarpSmem() {
    return (16 * (DK + 8) + (BWD ? 16 * (DV + 8) : 0) + 2 * SEL_KT * (DK + 8) +
            2 * SEL_KT * (DV + 8)) * 2 +
           FAST_MAX_SLOTS * 4;
}

/* One warp's view of its token: where its shared memory lies, which row of
 * sel_idx it follows and how many key slots that row covers. */
template <int DK, int DV, bool BWD>
struct SelWarp {
    static constexpr int LDK = DK + 8, LDV = DV + 8;
    bf16 *sQ, *sdO, *sK, *sV;
    int *blocks; /* the token's sel_idx row, -1 padded */
    int b, g, t; /* t = -1: past the sequence end, the warp has no work */
    int nkeys;   /* key slots: all of every chosen block, the last cut at t */

    /* Carves the warp's shared memory, reads its sel_idx row (all lanes
     * call it) and counts its key slots. */
    __device__ void init(unsigned char *smem, const FastCtx &c, const int32_t *sel_idx) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        unsigned char *base = smem + (size_t)warp * selWarpSmem<DK, DV, BWD>();
        sQ = (bf16 *)base;
        sdO = sQ + 16 * LDK;
        sK = sdO + (BWD ? 16 * LDV : 0);
        sV = sK + 2 * SEL_KT * LDK;
        blocks = (int *)(sV + 2 * SEL_KT * LDV);
        b = blockIdx.y / c.G;
        g = blockIdx.y % c.G;
        const int tok = blockIdx.x * SEL_WARPS + warp;
        t = tok < c.S ? tok : -1;
        int j = (t >= 0 && lane < c.slots)
                    ? sel_idx[(((size_t)b * c.S + t) * c.G + g) * c.slots + lane]
                    : -1;
        blocks[lane] = j;
        const int n = __popc(__ballot_sync(0xffffffffu, j >= 0)); /* -1 padding trails */
        __syncwarp();
        nkeys = 0;
        if (n > 0) {
            const int last = blocks[n - 1];
            nkeys = (n - 1) * c.sel_len + max(0, min(c.sel_len, t - last * c.sel_len + 1));
        }
    }

    /* Token of key slot s (< nkeys); rows ascend, so slot order is key order. */
    __device__ __forceinline__ int slotToken(const FastCtx &c, int s) const {
        return blocks[s / c.sel_len] * c.sel_len + s % c.sel_len;
    }

    /* Row of head h of the token in [B][S][H][*]. */
    __device__ __forceinline__ size_t rowIndex(const FastCtx &c, int h) const {
        return ((size_t)b * c.S + t) * c.H + (size_t)g * c.hpg + h;
    }

    /* Starts the copy of 16 rows of D bf16 (row r from src(r), NULL for a
     * zero row) into dst[16][D + 8]: lane pair (2r, 2r+1) owns row r, so
     * each lane forms one address and every 32-byte sector is used whole.
     * via_l1 (this lane's row): copy through L1 rather than L2 only. */
    template <int D, class Src>
    __device__ __forceinline__ void load16(bf16 *dst, Src src, bool via_l1 = false) const {
        constexpr int LD = D + 8;
        const int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
        const bf16 *row = src(r);
#pragma unroll
        for (int k = half; k < D / 8; k += 2) {
            const bf16 *from = row ? row + k * 8 : (const bf16 *)0;
            if (via_l1) fastCpAsync16L1(dst + r * LD + k * 8, from);
            else fastCpAsync16(dst + r * LD + k * 8, from);
        }
    }

    /* Starts the copy of key tile it (slots it*SEL_KT ...) into stage st and
     * returns this lane's slot token (lane pair 2r, 2r+1: slot r), -1 when
     * the slot is past nkeys. The forced blocks (0, the current one and the
     * one before) come through L1: block 0 is every token's, the other two
     * are shared by the 64 tokens around, so warps on one SM often want
     * the same rows at nearly the same time, while the freely chosen
     * blocks (random on the benchmark's inputs) rarely repeat and stay out
     * of L1. Every gather through L1 gained less. */
    __device__ __forceinline__ int loadTile(const FastCtx &c, const bf16 *k, const bf16 *v, int it,
                                            int st) const {
        static_assert(SEL_KT == 16, "one slot per lane pair");
        const int s = it * SEL_KT + ((threadIdx.x & 31) >> 1);
        const int tok = s < nkeys ? slotToken(c, s) : -1;
        const size_t key = ((size_t)b * c.S + (tok < 0 ? 0 : tok)) * c.G + g;
        const int blk = tok / c.sel_len, cur = t / c.sel_len;
        const bool forced = tok >= 0 && (blk == 0 || blk >= cur - 1);
        load16<DK>(sK + st * SEL_KT * LDK,
                   [&](int) -> const bf16 * { return tok >= 0 ? k + key * DK : nullptr; }, forced);
        load16<DV>(sV + st * SEL_KT * LDV,
                   [&](int) -> const bf16 * { return tok >= 0 ? v + key * DV : nullptr; }, forced);
        return tok;
    }
};

/* Token of key column col of the current tile, from the lane pair that
 * loaded it; visible to the warp's token when it is a real key u <= t. */
__device__ __forceinline__ bool selVisible(int lane_tok, int col, int t) {
    int u = __shfl_sync(0xffffffffu, lane_tok, col * 2);
    return u >= 0 && u <= t;
}

/* dQ of the selected branch, one warp per token:
 * dq = scale * sum_u gate p_u (dp_u - dsum) k_u, p_u = exp(s_u - lse),
 * dp_u = dout . v_u; written per io.dq_mode. */
template <int DK, int DV>
/* The explicit 1 lifts ptxas's default register target, which spilled the
 * (64,64) instance; shared memory, not registers, sets the CTAs per SM. */
__global__ void __launch_bounds__(32 * SEL_WARPS, 1)
selDqKernel(FastCtx c, FastBwdIo io, const int32_t *sel_idx) {
    using W = SelWarp<DK, DV, true>;
    constexpr int LDK = W::LDK, LDV = W::LDV;
    extern __shared__ __align__(16) unsigned char fast_smem[];
    W w;
    w.init(fast_smem, c, sel_idx);
    if (w.t < 0) return;
    const int lane = threadIdx.x & 31, grp = lane >> 2, quad = lane & 3;
    w.template load16<DK>(w.sQ, [&](int h) -> const bf16 * {
        return h < c.hpg ? io.q + w.rowIndex(c, h) * DK : nullptr;
    });
    w.template load16<DV>(w.sdO, [&](int h) -> const bf16 * {
        return h < c.hpg ? io.dout + w.rowIndex(c, h) * DV : nullptr;
    });
    const int ntiles = (w.nkeys + SEL_KT - 1) / SEL_KT;
    int tok_cur = ntiles > 0 ? w.loadTile(c, io.k, io.v, 0, 0) : -1;
    fastCpCommit();

    float lse2[2], dsum[2], gate[2];
    bool live[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int h = grp + i * 8;
        live[i] = false;
        lse2[i] = dsum[i] = gate[i] = 0.f;
        if (h < c.hpg) {
            size_t row = w.rowIndex(c, h);
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
        const int tok_next = it + 1 < ntiles ? w.loadTile(c, io.k, io.v, it + 1, st ^ 1) : -1;
        fastCpCommit();
        fastCpWait<1>();
        __syncwarp();
        const bf16 *k_t = w.sK + st * SEL_KT * LDK, *v_t = w.sV + st * SEL_KT * LDV;
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        float dp[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        fastMmaAZt<2, DK>(s, w.sQ, LDK, 0, k_t, LDK);
        fastMmaAZt<2, DV>(dp, w.sdO, LDV, 0, v_t, LDV);
#pragma unroll
        for (int n = 0; n < 2; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = e >> 1;
                bool vis = selVisible(tok_cur, n * 8 + quad * 2 + (e & 1), w.t);
                float p = live[i] && vis ? fastExp2(s[n][e] * c.scale_log2 - lse2[i]) : 0.f;
                s[n][e] = gate[i] * p * (dp[n][e] - dsum[i]);
            }
        }
        fastMmaPZ<2, DK>(dq, s, k_t, LDK);
        __syncwarp();
        tok_cur = tok_next;
    }
    fastCpWait<0>();
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int h = grp + i * 8;
        if (h >= c.hpg) continue;
        fastStoreDqRow<DK>(c, io, w.rowIndex(c, h), i, dq);
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

/* Warp-wide inclusive scan of v (lanes in order). */
__device__ __forceinline__ int selWarpScan(int v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, v, off);
        if (lane >= off) v += u;
    }
    return v;
}

/* Per (b, g) and block j, a warp each: offsets[bg][j][chunk] becomes the
 * entries of j from the chunks before `chunk` (an exclusive scan along the
 * row), and block_start[bg][j] j's whole count, which selBlockScanKernel
 * turns into the list start. Rows are independent, so this runs on every
 * SM: one CTA per (b, g) that scanned all Ns x chunks counts in order and
 * then walked the blocks on one thread had been most of the index's time
 * (B x G is a few CTAs).
 * Grid (ceil(Ns / 8), B*G), 256 threads. */
__global__ void __launch_bounds__(256) selRowScanKernel(FastCtx c, FastRevIndex rev) {
    constexpr int V = 4; /* 32-entry pieces per round: their loads in flight together */
    const int bg = blockIdx.y, j = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (j >= c.Ns) return;
    int *row = rev.offsets + ((size_t)bg * c.Ns + j) * rev.chunks;
    int carry = 0;
    for (int base = 0; base < rev.chunks; base += 32 * V) {
        int v[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            const int i = base + k * 32 + lane;
            v[k] = i < rev.chunks ? row[i] : 0;
        }
#pragma unroll
        for (int k = 0; k < V; k++) {
            const int i = base + k * 32 + lane, incl = selWarpScan(v[k]);
            if (i < rev.chunks) row[i] = carry + incl - v[k];
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    if (lane == 0) rev.block_start[(size_t)bg * (c.Ns + 1) + j] = carry;
}

/* Per (b, g), over its blocks j in order: from j's count (block_start[j],
 * selRowScanKernel), the list start block_start[j], the first work item
 * item_start[j] (ceil(count / rev.item_entries) items, at least 1) and the
 * first partial slot part_start[j] (the items of blocks with more than
 * one) - exclusive scans, each array's entry Ns the total. A tile of 1024
 * blocks at a time, a thread each. One CTA of 1024 per (b, g). */
__global__ void __launch_bounds__(1024) selBlockScanKernel(FastCtx c, FastRevIndex rev) {
    __shared__ int warp_sums[3][32];
    const int bg = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int *bs = rev.block_start + (size_t)bg * (c.Ns + 1);
    int *is = rev.item_start + (size_t)bg * (c.Ns + 1);
    int *ps = rev.part_start + (size_t)bg * (c.Ns + 1);
    int run[3] = {0, 0, 0}; /* entries, items, partial slots before this tile */
    for (int j0 = 0; j0 < c.Ns; j0 += 1024) {
        const int j = j0 + tid;
        const int count = j < c.Ns ? bs[j] : 0;
        const int items =
            j < c.Ns ? max(1, (count + rev.item_entries - 1) / rev.item_entries) : 0;
        const int v[3] = {count, items, items > 1 ? items : 0};
        int incl[3];
#pragma unroll
        for (int a = 0; a < 3; a++) {
            incl[a] = selWarpScan(v[a]);
            if (lane == 31) warp_sums[a][warp] = incl[a];
        }
        __syncthreads();
        if (warp == 0)
#pragma unroll
            for (int a = 0; a < 3; a++) warp_sums[a][lane] = selWarpScan(warp_sums[a][lane]);
        __syncthreads();
        int excl[3];
#pragma unroll
        for (int a = 0; a < 3; a++)
            excl[a] = run[a] + (warp ? warp_sums[a][warp - 1] : 0) + incl[a] - v[a];
        if (j < c.Ns) bs[j] = excl[0], is[j] = excl[1], ps[j] = excl[2];
#pragma unroll
        for (int a = 0; a < 3; a++) run[a] += warp_sums[a][31];
        __syncthreads(); /* warp_sums is rewritten by the next tile */
    }
    if (tid == 0) bs[c.Ns] = run[0], is[c.Ns] = run[1], ps[c.Ns] = run[2];
}

/* Tokens of a chunk whose sel_idx rows selFillKernel stages at a time. */
#define SEL_FILL_TOKENS 64

/* One CTA per chunk of tokens: the entry of (t, j) goes to j's list start
 * + the entries of earlier chunks + those of earlier tokens of this chunk,
 * with the slot of j in t's row beside it. The CTA forms every block's next
 * position once (pos[j]) and stages the chunk's sel_idx rows in shared
 * memory; warp 0 then walks the tokens in order, a lane per slot - a row's
 * blocks are distinct, so the lanes never share a counter, and each
 * block's entries stay in token order (the sort is stable). The one warp
 * per chunk that read each row and its blocks' offsets from global memory
 * token by token was latency-bound. */
__global__ void __launch_bounds__(256) selFillKernel(FastCtx c, const int32_t *sel_idx,
                                                     FastRevIndex rev) {
    extern __shared__ int fill_smem[];
    int *pos = fill_smem, *rows = fill_smem + c.Ns; /* [Ns], [SEL_FILL_TOKENS][slots] */
    const int bg = blockIdx.y, b = bg / c.G, g = bg % c.G, chunk = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, slots = c.slots;
    const int *off = rev.offsets + (size_t)bg * c.Ns * rev.chunks;
    const int *bs = rev.block_start + (size_t)bg * (c.Ns + 1);
    int *entries = rev.entries + (size_t)bg * c.S * slots;
    int *entry_slot = rev.entry_slot + (size_t)bg * c.S * slots;
    for (int j = tid; j < c.Ns; j += blockDim.x) pos[j] = bs[j] + off[(size_t)j * rev.chunks + chunk];
    const int t_begin = chunk * FAST_REV_TOKENS, t_end = min(c.S, t_begin + FAST_REV_TOKENS);
    for (int t0 = t_begin; t0 < t_end; t0 += SEL_FILL_TOKENS) {
        const int nt = min(SEL_FILL_TOKENS, t_end - t0);
        __syncthreads(); /* pos is set; warp 0 is done with the previous rows */
        for (int i = tid; i < nt * slots; i += blockDim.x)
            rows[i] = sel_idx[(((size_t)b * c.S + t0 + i / slots) * c.G + g) * slots + i % slots];
        __syncthreads();
        if (tid >= 32) continue;
        for (int k = 0; k < nt; k++) {
            const int j = lane < slots ? rows[k * slots + lane] : -1;
            if (j >= 0) {
                const int at = pos[j];
                pos[j] = at + 1;
                entries[at] = t0 + k;
                entry_slot[at] = lane;
            }
            __syncwarp();
        }
    }
}

/* At d_k = 64, three CTAs per SM, as the fused backward's (fast_sel_block.cu):
 * 168 registers instead of 200 and a few bytes spilled on wgmma, for more
 * CTAs to hide the gathers' latency. */
template <int DK, int DV, bool WG, bool RING>
__global__ void __launch_bounds__(FAST_THREADS, DK == 64 ? SEL_DKDV_MIN_CTAS_D64 : 1)
selDkdvKernel(FastCtx c, FastBwdIo io, FastRevIndex rev, bf16 *dk_out, bf16 *dv_out,
              const __grid_constant__ FastRowMaps maps) {
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
    const int e0 = bs[j] + chunk * rev.item_entries, e1 = min(bs[j + 1], e0 + rev.item_entries);
    const int tpr = FAST_DKDV_ROWS / c.hpg;
    const int ntiles = e1 > e0 ? (e1 - e0 + tpr - 1) / tpr : 0;
    const int *entries = rev.entries + (size_t)bg * c.S * c.slots;
    const int subtiles = gridDim.y;
    const int slot = rev.part_start[(size_t)bg * (c.Ns + 1) + j] + chunk;
    float *pk = rev.part_k + (((size_t)bg * rev.max_parts + slot) * subtiles + sub) * 64 * DK;
    float *pv = rev.part_v + (((size_t)bg * rev.max_parts + slot) * subtiles + sub) * 64 * DV;
    const int S = c.S, G = c.G;
    auto visible = [=](int t, int u) { return u <= t; };
    auto seesAny = [=](int, int, int) { return true; }; /* every listed token chose the block */
    auto tileFull = [=](int it, int t_first, int ka) { /* entries ascend: the first token is the smallest */
        return e0 + (it + 1) * tpr <= e1 && ka + 63 <= t_first;
    };
    auto store = [=](int u, bool is_k, int col, float v0, float v1) {
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
    };
    if constexpr (WG && RING) {
        fastDkdvRingCore<DK, DV, 1, true>(
            c, io, maps, b, g, u0, khi, ntiles,
            [=](int it, int s) -> const int * {
                const int e = e0 + it * tpr + s;
                return e < e1 ? entries + e : nullptr;
            },
            visible, seesAny, tileFull, store);
    } else {
        fastDkdvCore<DK, DV, WG, 1>(
            c, io, b, g, u0, khi, ntiles,
            [=](int it, int s, int *dst) {
                int e = e0 + it * tpr + s;
                if (e < e1) fastCpAsync4(dst, entries + e);
                else *dst = -1;
            },
            visible, seesAny, tileFull, store);
    }
}

/* Sums the item partials of blocks with several items, in item order
 * (acc = ((p0 + p1) + p2) + ...: the same sums whatever the unrolling). A
 * thread per four columns: 16-byte streaming loads (the partials are read
 * once), four items' loads in flight - at short S, where the items are
 * short (fastSelItemEntries), this pass reads the most partials and is
 * bound by DRAM.
 * Grid (Ns, subtiles, B*G), 256 threads. */
template <int DK, int DV>
__global__ void __launch_bounds__(256) selReduceKernel(FastCtx c, FastRevIndex rev, bf16 *dk_out,
                                                      bf16 *dv_out) {
    const int bg = blockIdx.z, b = bg / c.G, g = bg % c.G, sub = blockIdx.y, j = blockIdx.x;
    const int *is = rev.item_start + (size_t)bg * (c.Ns + 1);
    const int items = is[j + 1] - is[j];
    if (items <= 1) return;
    const int first = rev.part_start[(size_t)bg * (c.Ns + 1) + j], subtiles = gridDim.y;
    const int u0 = j * c.sel_len + sub * 64;
    const int khi = min(min(c.S, (j + 1) * c.sel_len), u0 + 64);
    for (int idx = threadIdx.x * 4; idx < 64 * (DK + DV); idx += blockDim.x * 4) {
        const bool is_k = idx < 64 * DK;
        const int dim = is_k ? DK : DV, rel = is_k ? idx : idx - 64 * DK;
        const int r = rel / dim, col = rel % dim; /* dim % 4 == 0: the four share a row */
        if (u0 + r >= khi) continue;
        const size_t stride = (size_t)subtiles * 64 * dim / 4; /* one item, in float4 */
        const float4 *src = (const float4 *)((is_k ? rev.part_k : rev.part_v) +
                                             (((size_t)bg * rev.max_parts + first) * subtiles + sub) *
                                                 64 * dim + (size_t)r * dim + col);
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        auto add = [&](const float4 v) { acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w; };
        int p = 0;
        for (; p + 4 <= items; p += 4) {
            const float4 v0 = __ldcs(src + p * stride), v1 = __ldcs(src + (p + 1) * stride);
            const float4 v2 = __ldcs(src + (p + 2) * stride), v3 = __ldcs(src + (p + 3) * stride);
            add(v0), add(v1), add(v2), add(v3);
        }
        for (; p < items; p++) add(__ldcs(src + p * stride));
        const size_t key = ((size_t)b * c.S + u0 + r) * c.G + g;
        *(uint2 *)((is_k ? dk_out : dv_out) + key * dim + col) =
            make_uint2(fastPack(acc.x, acc.y), fastPack(acc.z, acc.w));
    }
}

template <int DK, int DV>
static cudaError_t selBackward(const FastCtx &c, const FastBwdIo &io, const int32_t *sel_idx,
                               const FastRevIndex &rev, const FastSelBlock *sb_dq, bf16 *dk_out,
                               bf16 *dv_out, cudaStream_t stream, const FastMarks *marks) {
    cudaError_t e;
    if ((e = fastMark(marks, "bwd.sel.dkdv")) != cudaSuccess) return e;
    const int subtiles = (c.sel_len + 63) / 64;
    const bool ring = c.wgmma && fastSelRowRing(c.hpg);
    FastRowMaps maps = {};
    if (ring && (e = fastDkdvRowMaps(c, io, DK, DV, true, &maps)) != cudaSuccess) return e;
    auto dkdv = ring ? selDkdvKernel<DK, DV, true, true>
                     : c.wgmma ? selDkdvKernel<DK, DV, true, false> : selDkdvKernel<DK, DV, false, false>;
    const int smem_kv = ring ? FastDkdvRing<DK, DV, 1, true>::SMEM : fastDkdvSmem(DK, DV, c.wgmma);
    if ((e = fastSetSmem(dkdv, smem_kv)) != cudaSuccess) return e;
    dkdv<<<dim3(rev.max_items, subtiles, c.B * c.G), FAST_THREADS, smem_kv, stream>>>(
        c, io, rev, dk_out, dv_out, maps);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if ((e = fastMark(marks, "bwd.sel.reduce")) != cudaSuccess) return e;
    selReduceKernel<DK, DV><<<dim3(c.Ns, subtiles, c.B * c.G), 256, 0, stream>>>(c, rev, dk_out,
                                                                                 dv_out);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    /* masked dense: its dQ ran in the window and compressed dQ pass */
    if (c.sel_dq == FastSelDq::DENSE) return cudaSuccess;
    if ((e = fastMark(marks, "bwd.sel.dq")) != cudaSuccess) return e;
    if (c.sel_dq == FastSelDq::UNION) return fastSelUnionDq(c, DK, DV, io, sel_idx, stream);
    if (c.sel_dq == FastSelDq::BLOCK) {
        if (!sb_dq) return cudaErrorInvalidValue;
        return fastSelBlockDq(c, DK, DV, io, sel_idx, rev, *sb_dq, NULL, stream);
    }
    auto dq = selDqKernel<DK, DV>;
    constexpr int smem_q = SEL_WARPS * selWarpSmem<DK, DV, true>();
    if ((e = fastSetSmem(dq, smem_q)) != cudaSuccess) return e;
    dq<<<dim3((c.S + SEL_WARPS - 1) / SEL_WARPS, c.B * c.G), 32 * SEL_WARPS, smem_q, stream>>>(
        c, io, sel_idx);
    return cudaGetLastError();
}

cudaError_t fastSelBuildIndex(const FastCtx &c, const int32_t *sel_idx, const FastRevIndex &rev,
                              cudaStream_t stream) {
    const size_t hist = (size_t)c.Ns * sizeof(int);
    const size_t fill = hist + (size_t)SEL_FILL_TOKENS * c.slots * sizeof(int);
    cudaError_t e;
    if (hist > 48 * 1024 &&
        (e = cudaFuncSetAttribute(selCountKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)hist)) != cudaSuccess)
        return e;
    if (fill > 48 * 1024 &&
        (e = cudaFuncSetAttribute(selFillKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)fill)) != cudaSuccess)
        return e;
    const int BG = c.B * c.G;
    selCountKernel<<<dim3(rev.chunks, BG), 256, hist, stream>>>(c, sel_idx, rev.offsets, rev.chunks);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    selRowScanKernel<<<dim3((c.Ns + 7) / 8, BG), 256, 0, stream>>>(c, rev);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    selBlockScanKernel<<<BG, 1024, 0, stream>>>(c, rev);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    selFillKernel<<<dim3(rev.chunks, BG), 256, fill, stream>>>(c, sel_idx, rev);
    return cudaGetLastError();
}

cudaError_t fastSelBackward(const FastCtx &c, int dk, int dv, const FastBwdIo &io,
                            const int32_t *sel_idx, const FastRevIndex &rev,
                            const FastSelBlock *sb_dq, bf16 *dk_out, bf16 *dv_out,
                            cudaStream_t stream, const FastMarks *marks) {
    FAST_DISPATCH(dk, dv, selBackward, c, io, sel_idx, rev, sb_dq, dk_out, dv_out, stream,
                  marks);
}
