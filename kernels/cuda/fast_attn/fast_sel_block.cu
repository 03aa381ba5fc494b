/* fast_sel_block.cu - selected attention forward for long sequences,
 * block-centric (one of the selected forward's three designs, FastSelFwd;
 * fastSelDesign in fast_attn.cu picks one per call).
 *
 * Gathering the chosen blocks' K and V for every token (the dropped
 * warp-per-token forward) moves 32 KB per (token, block) pair at the paper
 * shape, fetched from L2 at random addresses, at the L2 bandwidth. Here a CTA
 * holds one selection block's K and V in shared memory and streams the
 * query rows of the tokens that chose it (the block's ascending token list
 * of the reverse index), writing for each (token, block) pair a partial
 * normalised within the block:
 *   o_k = sum_{u in block, u <= t} p_u v_u / l_k,  lse_k = m_k + ln l_k.
 * A combine kernel then merges a token's partials in slot order:
 *   lse = ln sum_k exp(lse_k),  o = sum_k exp(lse_k - lse) o_k.
 * Per pair that moves the token's query rows (4 KB) and the partial (4 KB
 * out, 4 KB back) instead of 32 KB of gathered keys. The partials of every
 * pair would be S * G * slots * hpg * dv values (17 GB at paper 64k), so
 * the tokens go in chunks (FastSelBlock) through one buffer.
 *
 * Three of a token's blocks are forced (block 0, its own and the previous
 * one: the selection always keeps them, proto/model.md), the same for
 * every token of a block. Where l' is a multiple of 64
 * (fastSelForcedApplies) and the block kernel runs on wgmma (d_v = 64 or
 * l' = 64) the forward's work items skip them: a pass of their own writes their merged partial straight into
 * o_sel, lse_sel - at l' = 64 one CTA per token block holding the three
 * key tiles (fast_sel_forced.cu), at other multiples of 64 the forward
 * tile kernel over the query tiles (SelForcedPolicy: block 0 as lead
 * tiles, then the tile's own blocks) - and the combine merges that one in
 * place of three: a sixteenth of the partials' bytes instead of three
 * sixteenths at the paper's n = 16. The
 * fused backward (below) at d_k >= 128 likewise leaves their dq to the
 * window + compressed dQ pass (FastSelBlock.forced_dq_apart): it still
 * forms their dK/dV, but no dq partial.
 *
 * The partials (about 1 GB per chunk) are stored and read back with the
 * streaming cache hint (st.global.cs / ld.global.cs; the forward at 16
 * heads per group stores them by TMA, marked evict-first), so that they pass
 * through L2 ahead of the chunk's query and dout rows, which each of a
 * token's blocks reads again (faster at the paper and proto shapes; smaller
 * chunks were slower: tuning.h).
 *
 * The dQ pass has the same shape: a CTA holds block j's K/V, streams the
 * query and dout rows of its tokens and writes per pair the partial
 *   dq_k = sum_{u in j, u <= t} g p_u (dp_u - delta) k_u,
 * accumulated in fp32 and stored in bf16; the combine sums a token's
 * partials in slot order, in fp32, into the branches' running dq
 * (FastBwdIo.dq_mode). Both passes share the chunk buffer.
 *
 * Why bf16 partials: they are most of the dQ pass's memory traffic (each
 * is written once and read once, from DRAM: a chunk's partials are a GB,
 * L2 is 50 MB), and each carries one bf16 rounding (relative 2^-9) before
 * an fp32 sum of at most `slots` of them - the order of the rounding of
 * the bf16 dq the engine keeps anyway. The forward's partials were bf16
 * from the start. */
#include "fast_host.h"
#include "fast_policy.cuh"
#include "tile_fwd.cuh"
#include "tile_dkdv.cuh"

#define SELB_WARPS 8  /* 16 query rows each: 128 rows per row tile */
#define SELB_ROWS (16 * SELB_WARPS)
/* Row tiles per work item: a block's K/V load serves up to 8 tiles (64
 * tokens at 16 heads per group; SELB_TILES). */

/* Tokens of one work item: SELB_TILES row tiles of SELB_ROWS / hpg tokens. */
static __host__ __device__ int selBlockItemTokens(int hpg) { return SELB_TILES * (SELB_ROWS / hpg); }

/* The entries [e_lo, e_hi) of block j's token list (reverse index of (b, g)
 * = bg) that fall in token chunk `chunk` - with sb.skip_forced, only those
 * that chose j beyond the forced blocks. Block j is forced for exactly the
 * tokens [j l', (j + 2) l') (its own and the next block's; block 0 for
 * every token) and no earlier token lists it, so those are the first
 * entries of its ascending list. */
template <bool SKIP = true> /* false: a kernel that never skips (no code for it) */
static __device__ void selBlockRange(const FastCtx &c, const FastRevIndex &rev,
                                     const FastSelBlock &sb, int bg, int j, int chunk, int &e_lo,
                                     int &e_hi) {
    const int *off = rev.offsets + ((size_t)bg * c.Ns + j) * rev.chunks;
    const int *bs = rev.block_start + (size_t)bg * (c.Ns + 1);
    const int ch0 = chunk * sb.chunk_revs, ch1 = min(rev.chunks, ch0 + sb.chunk_revs);
    e_lo = bs[j] + off[ch0];
    e_hi = ch1 < rev.chunks ? bs[j] + off[ch1] : bs[j + 1];
    if (SKIP && sb.skip_forced)
        e_lo = j == 0 ? e_hi : min(e_hi, max(e_lo, bs[j] + min(c.S - j * c.sel_len, 2 * c.sel_len)));
}

/* Work items of every token chunk: for each (chunk, b, g) and block j,
 * ceil(entries / per_item) items, exclusive-scanned into item_start, and
 * each item's block in item_block (max_items per (chunk, bg)) - a CTA reads
 * its block with one load, where a binary search over item_start was ten
 * dependent ones (a visible share of the block-centric forward's
 * stalls); with part_start (the fused backward), also the first item
 * partial of each block, counting the items of blocks that have more than
 * one. One CTA of 1024 per (chunk, bg). */
__global__ void __launch_bounds__(1024) selBlockPlanKernel(FastCtx c, FastRevIndex rev,
                                                           FastSelBlock sb, int per_item,
                                                           int *item_start, int *item_block,
                                                           int max_items, int *part_start) {
    __shared__ int sums[2][1024];
    const int chunk = blockIdx.x, bg = blockIdx.y, tid = threadIdx.x;
    auto items = [&](int j) {
        int lo, hi;
        selBlockRange(c, rev, sb, bg, j, chunk, lo, hi);
        return (hi - lo + per_item - 1) / per_item;
    };
    auto parts = [](int n) { return n > 1 ? n : 0; };
    const int per = (c.Ns + 1023) / 1024, lo = min(c.Ns, tid * per), hi = min(c.Ns, lo + per);
    int local = 0, local_parts = 0;
    for (int j = lo; j < hi; j++) {
        const int n = items(j);
        local += n;
        local_parts += parts(n);
    }
    sums[0][tid] = local;
    sums[1][tid] = local_parts;
    __syncthreads();
    for (int off = 1; off < 1024; off <<= 1) { /* Hillis-Steele inclusive scans */
        const int v = tid >= off ? sums[0][tid - off] : 0;
        const int w = tid >= off ? sums[1][tid - off] : 0;
        __syncthreads();
        sums[0][tid] += v;
        sums[1][tid] += w;
        __syncthreads();
    }
    const size_t at = ((size_t)chunk * gridDim.y + bg) * (c.Ns + 1);
    int *is = item_start + at, *ps = part_start ? part_start + at : NULL;
    int *blk = item_block + ((size_t)chunk * gridDim.y + bg) * max_items;
    int run = sums[0][tid] - local, run_parts = sums[1][tid] - local_parts;
    for (int j = lo; j < hi; j++) {
        const int n = items(j);
        is[j] = run;
        for (int k = 0; k < n; k++) blk[run + k] = j;
        run += n;
        if (ps) ps[j] = run_parts;
        run_parts += parts(n);
    }
    if (tid == 1023) {
        is[c.Ns] = sums[0][1023];
        if (ps) ps[c.Ns] = sums[1][1023];
    }
}

/* A CTA's work item: grid (max_items, B*G) over the items of `chunk`
 * (selBlockPlanKernel), block j, its entries [e0, e1) = up to SELB_TILES
 * row tiles of SELB_ROWS / hpg tokens, and the keys of j. */
struct SelBlockItem {
    int j, e0, e1, ntiles, u_lo, u_hi, nsub;

    /* Finds the item of this CTA (false: past the chunk's last item; the
     * whole CTA returns) and copies its tokens and j's slot in each one's
     * sel_idx row into tok[], slot[] (`entries` of each, SELB_TILES *
     * SELB_ROWS unless the caller knows hpg: SELB_TILES * SELB_ROWS / hpg;
     * -1 past the end) - one round trip for the whole item. Every thread of
     * the CTA calls it; the caller's next barrier publishes tok and slot. */
    template <bool SKIP>
    __device__ bool init(const FastCtx &c, const FastRevIndex &rev, const FastSelBlock &sb,
                         int chunk, int *tok, int *slot, int threads,
                         int entries = SELB_TILES * SELB_ROWS) {
        const int bg = blockIdx.y, item = blockIdx.x;
        const size_t plan = (size_t)chunk * gridDim.y + bg;
        const int *is = sb.item_start + plan * (c.Ns + 1);
        if (item >= is[c.Ns]) return false;
        j = sb.item_block[plan * sb.max_items + item];
        const int tpt = SELB_ROWS / c.hpg, per_item = SELB_TILES * tpt;
        int e_lo, e_hi;
        selBlockRange<SKIP>(c, rev, sb, bg, j, chunk, e_lo, e_hi);
        e0 = e_lo + (item - is[j]) * per_item;
        e1 = min(e_hi, e0 + per_item);
        ntiles = (e1 - e0 + tpt - 1) / tpt;
        u_lo = j * c.sel_len;
        u_hi = min(c.S, u_lo + c.sel_len);
        nsub = (u_hi - u_lo + 63) / 64;
        const size_t ent0 = (size_t)bg * c.S * c.slots;
        for (int i = threadIdx.x; i < entries; i += threads) {
            const int e = e0 + i;
            const bool ok = i < per_item && e < e1;
            tok[i] = ok ? rev.entries[ent0 + e] : -1;
            slot[i] = ok ? rev.entry_slot[ent0 + e] : -1;
        }
        return true;
    }

    /* Starts the async copy of key sub-tile `sub` (64 keys of block j,
     * zero rows past its end) of k, v [B][S][G][D] into sK, sV (padded
     * tiles, or swizzled for WG). */
    template <int DK, int DV, int THREADS, bool WG>
    __device__ void loadKV(const FastCtx &c, const bf16 *k, const bf16 *v, int b, int g, int sub,
                           bf16 *sK, bf16 *sV) const {
        fastLoadKeyTile<WG, 64, DK, DV, THREADS>(sK, sV, k, v, c.S, c.G, b, g, u_lo + sub * 64, u_hi);
    }

    /* Row r of a row tile: its token's place in the tile (r / hpg, -1 for
     * a padding row) and head (r % hpg). A thread copies the same rows in
     * every tile (fastTileRowOf), so it forms these once: two divisions by
     * the runtime hpg per row and tile otherwise. */
    struct Slot {
        int k, head;
    };
    __device__ __forceinline__ static Slot slotOf(const FastCtx &c, int r) {
        const int k = r / c.hpg;
        return Slot{k < SELB_ROWS / c.hpg ? k : -1, r % c.hpg};
    }
    /* The row at slot s of row tile rt as an index into [B][S][H]; false
     * for a padding row. tok: init's tokens. */
    __device__ __forceinline__ bool row(const FastCtx &c, const int *tok, int b, int g, int rt,
                                        Slot s, size_t &at) const {
        const int t = s.k >= 0 ? tok[rt * (SELB_ROWS / c.hpg) + s.k] : -1;
        if (t < 0) return false;
        at = ((size_t)b * c.S + t) * c.H + (size_t)g * c.hpg + s.head;
        return true;
    }
};

/* Partials leave the wgmma kernels through shared memory. A warp's 16
 * rows of a C-fragment tile (D columns, bf16) go to the same rows of the q
 * stage the tile was computed from - free once the warp's scores are done,
 * and laid out as that stage (64-column panels of SELB_ROWS rows of 128
 * bytes), with each row's 16-byte chunks XOR-swizzled by the row so that a
 * fragment store touches 32 distinct banks. The warp then stores whole
 * 16-byte chunks: a (token, slot)'s hpg rows lie together in the partial
 * buffer, so it writes whole 128-byte lines, where the fragments' 4-byte
 * stores wrote each 32-byte sector in two 16-byte halves.
 *
 * fastStagePut64 (fast_wgmma.cuh) stages them: four stmatrix per 64 columns
 * in place of 16 4-byte stores and their address arithmetic (the staging
 * had been a sixth of the block-centric kernels' instructions). */
/* Stores the warp's staged rows (after a __syncwarp that follows the last
 * fastStagePut64): row r to dst + row_at[r] * D, rows with row_at[r] < 0 not
 * at all. */
template <int D, int ROWS = SELB_ROWS>
__device__ __forceinline__ void selStageStore(const bf16 *stage, const long long *row_at,
                                              bf16 *dst, int warp, int lane) {
    constexpr int CH = D / 8; /* 16-byte chunks per row */
#pragma unroll 2
    for (int i = lane; i < 16 * CH; i += 32) {
        const int r = warp * 16 + i / CH, k = i % CH;
        const long long at = row_at[r];
        if (at < 0) continue;
        const uint4 v = fastStageChunk<ROWS>(stage, r, k);
        __stcs((uint4 *)(dst + (size_t)at * D + k * 8), v);
    }
}

/* selStageStore by TMA where a warp's 16 staged rows are one (token, slot)
 * pair's 16 heads (hpg 16): rows row_at[warp * 16] .. + 15 of the matrix
 * `map` describes (none when that is -1), one bulk tensor store per
 * 64-column panel of the stage (ROWS rows, fastStagePut64's swizzle - the
 * map's), issued by lane 0 after the warp's staging stores are fenced
 * for the async proxy; returns once the stores have read the stage, or
 * (DEFER) at once - the caller waits for their reads before the stage is
 * reused (fastDkdvRingCore's defer_release). */
template <int D, int ROWS, bool DEFER = false>
__device__ __forceinline__ void selStageStoreTma(const CUtensorMap *map, const bf16 *stage,
                                                 const long long *row_at, int warp, int lane) {
    fastWgProxyFence();
    __syncwarp();
    const long long at = row_at[warp * 16];
    if (lane == 0 && at >= 0) {
#pragma unroll
        for (int p = 0; p < D / 64; p++)
            fastTmaStore2(map, stage + p * ROWS * 64 + warp * 16 * 64, p * 64, (int)at);
        fastBulkCommit();
        if (!DEFER) fastBulkWaitRead();
    }
    __syncwarp();
}

/* One 64-column panel of partial rows, staged by fastStagePut64 at column
 * 0 of `stage`, out to columns col0 .. col0 + 63 of the matrix `map`
 * describes, as selStageStoreTma does; returns once the store has read the
 * stage. */
__device__ __forceinline__ void selStageStoreTmaCols(const CUtensorMap *map, const bf16 *stage,
                                                     int col0, const long long *row_at, int warp,
                                                     int lane) {
    fastWgProxyFence();
    __syncwarp();
    const long long at = row_at[warp * 16];
    if (lane == 0 && at >= 0) {
        fastTmaStore2(map, stage + warp * 16 * 64, col0, (int)at);
        fastBulkCommit();
        fastBulkWaitRead();
    }
    __syncwarp();
}

/* q row stages of the block-centric forward on the q ring: at d_k = 192 two
 * stages (48 KB each) left one CTA of 8 warps per SM (150 KB: low
 * occupancy, DRAM half idle); one stage fits two CTAs, each waiting for its
 * next tile while the other computes (SELB_RING_STAGES_WIDE). */
template <int DK>
constexpr int selBlockQStages() { return DK > 128 ? SELB_RING_STAGES_WIDE : SELB_RING_STAGES; }
/* With one q stage the forward's tile loop was serial per CTA: the next
 * tile's q could only be fetched once the partials staged in the stage had
 * been read out by their bulk stores. Here (selBlockOutStage) a stage is
 * released as soon as the tile's scores are formed - warp 0 then fetches the
 * next tile under this one's softmax, P.V and stores - and the partials go
 * out through a 64-column buffer of their own (16 KB), one half of d_v at
 * a time; the q ring's token lists shrink to the 64 entries of 16 heads a
 * group to make room for it at two CTAs per SM. At d_k = 128 it would
 * need the one q stage (SELB_RING_STAGES = 1), which is slower there. */
template <int DK, int DV>
constexpr bool selBlockOutStage() { return DV > 64 && selBlockQStages<DK>() == 1; }
/* Entries of the item's token and slot lists: the q ring runs at 16 heads
 * a group only (8 tokens a row tile). */
template <bool RING>
constexpr int selBlockListEntries() { return SELB_TILES * SELB_ROWS / (RING ? 16 : 1); }
/* Shared memory of the block-centric kernels: K, V, two stages of q (and
 * of dout for dQ) rows - RING (the forward's q ring): selBlockQStages;
 * the wgmma dQ at d_k = 128: one (SelBlockDqShape) - their metadata (dQ:
 * lse, delta, gate), the item's tokens and slots and (WG) the partial
 * rows' destinations. WG tiles are swizzled, 1024-byte aligned. */
template <int DK, int DV, bool WG, bool DQ, bool RING = false>
constexpr int selBlockSmem() {
    constexpr int P = WG ? 0 : 8;
    constexpr int ST = DQ && WG && DK == 128 ? 1 : RING && !DQ ? selBlockQStages<DK>() : 2;
    constexpr bool OUT = RING && !DQ && selBlockOutStage<DK, DV>();
    return (64 * (DK + P) + 64 * (DV + P) + ST * SELB_ROWS * (DK + P) +
            (DQ ? ST * SELB_ROWS * (DV + P) : 0) + (OUT ? SELB_ROWS * 64 : 0)) * 2 +
           (DQ ? 3 * ST * SELB_ROWS * 4 : 0) + 2 * selBlockListEntries<RING && !DQ>() * 4 +
           (WG ? SELB_ROWS * 8 + 1024 : 0) + (WG && !DQ ? 4 * 8 : 0) /* the q ring's barriers */;
}

/* The block-centric forward's TMA maps where it runs on the q ring (16
 * heads per group, l' <= 64): q as one box of a token's 16 heads per
 * panel, and the chunk's partials part_o as rows of d_v, boxes of 16 rows
 * x 64 columns - a warp's staged rows are one (token, slot) pair's 16
 * heads, stored by one bulk tensor copy per panel. */
struct SelBlockFwdMaps {
    CUtensorMap q, part_o;
};

/* One work item: block j's K/V (its first 64 keys per key sub-tile) against
 * up to SELB_TILES row tiles of the tokens that chose j in this chunk:
 * partial o_k (bf16, normalised) and lse_k (ln, -inf: no visible key) per
 * (token, slot of j in the token's row, head). Keys u <= t only. WG: the
 * products on wgmma, a warpgroup per 64 rows; at d_v = 128 the output is
 * formed in two 64-column halves so that two CTAs per SM fit in registers
 * (the whole 64 x 128 accumulator needed 164 registers, one CTA per SM, and
 * was slower than mma.sync) - which
 * needs one key sub-tile per block (l' <= 64; the host checks).
 * Grid (max_items, B*G), 32 * SELB_WARPS threads. */
template <int DK, int DV, bool WG, bool RING>
__global__ void __launch_bounds__(32 * SELB_WARPS, 2)
selBlockFwdKernel(FastCtx c, FastFwdIo io, FastRevIndex rev, FastSelBlock sb, int chunk,
                  const __grid_constant__ SelBlockFwdMaps maps) {
    static_assert(!RING || WG, "the q ring feeds wgmma");
    constexpr int LDK = DK + (WG ? 0 : 8), LDV = DV + (WG ? 0 : 8), R = SELB_ROWS,
                  THREADS = 32 * SELB_WARPS;
    constexpr bool HALVES = WG && DV > 64;
    constexpr int QS = RING ? selBlockQStages<DK>() : 2; /* q row stages */
    /* RING: partials staged apart, the q stage released after the scores */
    constexpr bool OUT = RING && HALVES && selBlockOutStage<DK, DV>();
    constexpr int NLIST = selBlockListEntries<RING>();
    bf16 *sK = fastTileBase<WG>(), *sV = sK + 64 * LDK, *sQ = sV + 64 * LDV; /* sQ [QS][R] */
    bf16 *sOut = sQ + QS * R * LDK;                       /* OUT: [R][64], 1024-aligned */
    int *sTok = (int *)(sOut + (OUT ? R * 64 : 0));       /* [NLIST]: the item's tokens */
    int *sSlot = sTok + NLIST;                            /* and j's slot in each one's row */
    long long *sAt = (long long *)(sSlot + NLIST);        /* WG: [R] partial row, -1 none */
    uint64_t *full = (uint64_t *)(sAt + R), *empty = full + QS; /* RING: the q stages' barriers */
    const int bg = blockIdx.y, b = bg / c.G, g = bg % c.G, hpg = c.hpg, tpt = R / hpg;
    SelBlockItem it{};
    if (!it.init<WG>(c, rev, sb, chunk, sTok, sSlot, THREADS, NLIST)) return;
    if (RING && threadIdx.x == 0) {
        for (int st = 0; st < QS; st++) {
            fastMbarInit(&full[st], 1);
            fastMbarInit(&empty[st], SELB_WARPS);
        }
        fastMbarInitFence();
    }
    const int ntiles = it.ntiles, u_lo = it.u_lo, u_hi = it.u_hi, nsub = it.nsub;
    const int CT = sb.chunk_revs * FAST_REV_TOKENS, t_base = chunk * CT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 2, quad = lane & 3;
    if ((HALVES || RING) && nsub > 1) __trap(); /* launches the host must not make */
    if (RING && hpg != 16) __trap();

    auto loadKV = [&](int sub) { it.loadKV<DK, DV, THREADS, WG>(c, io.k, io.v, b, g, sub, sK, sV); };
    const SelBlockItem::Slot ld_slot = SelBlockItem::slotOf(c, fastTileRowOf<R, THREADS>());
    auto issueQ = [&](int rt, int st) {
        fastLoadTileFor<WG, R, DK, THREADS>(sQ + st * R * LDK, [&](int) -> const bf16 * {
            size_t row;
            return it.row(c, sTok, b, g, rt, ld_slot, row) ? io.q + row * DK : nullptr;
        });
    };

    /* RING: warp 0 issues row tile rt into stage rt % QS as one TMA box per
     * token (hpg rows; a token past the list reads past S: zeros) once
     * every warp has released the stage's previous tile */
    auto produceQ = [&](int rt) {
        const int st = rt % QS;
        if (lane == 0) {
            if (rt >= QS) fastMbarWait(&empty[st], (uint32_t)(rt / QS + 1) & 1u);
            fastMbarArriveTx(&full[st], (uint32_t)tpt * hpg * 128 * (DK / 64));
        }
        __syncwarp();
        if (lane < tpt) {
            const int t = sTok[rt * tpt + lane];
#pragma unroll
            for (int p = 0; p < DK / 64; p++)
                fastTmaLoad4(sQ + st * R * LDK + p * R * 64 + lane * hpg * 64, &maps.q, p * 64,
                             g * hpg, t >= 0 ? t : c.S, b, &full[st]);
        }
    };

    /* the warp's staged partial rows (fastStagePut64) out to part_o: RING
     * one bulk tensor store per panel - the rows are one pair's 16 heads,
     * or none (sAt -1) - whose reads of the stage complete before the
     * stage is released; else 16-byte stores per row */
    auto storeOut = [&](const bf16 *stage) {
        if constexpr (RING) {
            selStageStoreTma<DV, R>(&maps.part_o, stage, sAt, warp, lane);
        } else {
            __syncwarp();
            selStageStore<DV>(stage, sAt, sb.part_o, warp, lane);
        }
    };

    if (nsub == 1) loadKV(0);
    __syncthreads(); /* the item's tokens (and RING: the barriers) */
    if constexpr (RING) {
        if (warp == 0) produceQ(0);
        fastCpCommit();
        fastCpWait<0>();
        fastWgProxyFence();
        __syncthreads(); /* K/V landed */
    } else {
        issueQ(0, 0);
        fastCpCommit();
    }

    const int rA = warp * 16 + grp, rB = rA + 8;
    const SelBlockItem::Slot slot_ab[2] = {SelBlockItem::slotOf(c, rA), SelBlockItem::slotOf(c, rB)};
    for (int rt = 0; rt < ntiles; rt++) {
        const int st = rt % QS;
        if constexpr (RING) {
            /* QS - 1 tiles ahead (one stage: this tile, once every warp
             * released the last) */
            const int next = rt + QS - 1; /* (OUT: fetched under the last tile) */
            if (!OUT && warp == 0 && next > 0 && next < ntiles) produceQ(next);
            fastMbarWait(&full[st], (uint32_t)(rt / QS) & 1u);
            __syncwarp();
        } else {
            if (rt + 1 < ntiles) issueQ(rt + 1, st ^ 1);
            fastCpCommit();
            fastCpWait<1>();
            fastTileBarrier<WG>(); /* q of rt (and K/V) landed */
        }
        int tok[2];
#pragma unroll
        for (int i = 0; i < 2; i++) tok[i] = slot_ab[i].k >= 0 ? sTok[rt * tpt + slot_ab[i].k] : -1;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
        /* s = the scores of key sub-tile sub, log2 domain, masked (-inf) */
        auto scores = [&](float (&s)[8][4], int sub, float mx[2]) {
            if constexpr (WG) {
                fastWgRun(
                    [&] {
                        fastWgIssueAZt<8, DK>(s, sQ + st * R * LDK, R, (warp >> 2) * 64, sK, 64, 0);
                    },
                    s);
            } else {
#pragma unroll
                for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
                fastMmaAZt<8, DK>(s, sQ + st * R * LDK, LDK, warp * 16, sK, LDK);
            }
            /* key u0 + x is visible to row half i iff x <= last[i] (keys u <= t
             * and u < u_hi; -1: none): one compare per score */
            const int u0 = u_lo + sub * 64 + quad * 2;
            int last[2];
#pragma unroll
            for (int i = 0; i < 2; i++) last[i] = tok[i] >= 0 ? min(tok[i], u_hi - 1) - u0 : -1;
            mx[0] = mx[1] = -INFINITY;
#pragma unroll
            for (int n = 0; n < 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float v = n * 8 + (e & 1) <= last[e >> 1] ? s[n][e] * c.scale_log2 : -INFINITY;
                    s[n][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
            }
        };
        /* row half i's partial: its index into part_o / part_lse (false:
         * a padding row), 1 / l, and lse_k written */
        auto finishRow = [&](int i, size_t &idx, float &inv) {
            const float lsum = fastQuadSum(l[i]);
            const int r = i ? rB : rA, k = r / hpg;
            const int slot = k < tpt ? sSlot[rt * tpt + k] : -1;
            if (tok[i] < 0 || slot < 0) return false;
            const size_t pair = (((size_t)b * CT + (tok[i] - t_base)) * c.G + g) * c.slots + slot;
            idx = pair * hpg + r % hpg;
            inv = lsum > 0.f ? 1.f / lsum : 0.f;
            if (quad == 0)
                __stcs(sb.part_lse + idx, fastLse(m[i], lsum));
            return true;
        };
        bf16 *stage = sQ + st * R * LDK; /* WG: the partials' way out (selStagePut) */
        if constexpr (HALVES) {
            /* one key sub-tile (l' <= 64, checked by the host): P once, then
             * o in two 64-column halves, each staged as soon as it is done */
            float s[8][4], mx[2], corr[2];
            scores(s, 0, mx);
            if constexpr (OUT) { /* the stage is read: the next tile may come */
                __syncwarp();
                if (lane == 0) fastMbarArrive(&empty[st]);
                if (warp == 0 && rt + QS < ntiles) produceQ(rt + QS);
            }
            fastSoftmaxScores<8>(s, mx, m, l, corr);
            uint32_t a[4][4];
            fastWgAFromC<8>(a, s);
            float inv[2] = {0.f, 0.f};
#pragma unroll
            for (int i = 0; i < 2; i++) {
                size_t idx = 0;
                const bool has = finishRow(i, idx, inv[i]);
                if (quad == 0) sAt[i ? rB : rA] = has ? (long long)idx : -1;
            }
            fastWgPZParts<DV>(a, sV, [&](int h, const float (&oh)[8][4]) {
                if constexpr (OUT) { /* each half out before the next is staged */
                    fastStagePut64<SELB_ROWS>(sOut, warp * 16, 0, oh, inv[0], inv[1]);
                    selStageStoreTmaCols(&maps.part_o, sOut, h * 64, sAt, warp, lane);
                } else {
                    fastStagePut64<SELB_ROWS>(stage, warp * 16, h * 64, oh, inv[0], inv[1]);
                }
            });
            if constexpr (!OUT) storeOut(stage);
        } else {
            float o[DV / 8][4];
#pragma unroll
            for (int n = 0; n < DV / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
            for (int sub = 0; sub < nsub; sub++) {
                if (nsub > 1) { /* blocks longer than 64 keys: one sub-tile at a time */
                    __syncthreads();
                    loadKV(sub);
                    fastCpCommit();
                    fastCpWait<0>();
                    fastTileBarrier<WG>();
                }
                float s[8][4], mx[2];
                scores(s, sub, mx);
                fastSoftmaxStep<8, DV>(s, mx, m, l, o);
                if constexpr (WG) {
                    uint32_t a[4][4];
                    fastWgAFromC<8>(a, s);
                    fastWgRun([&] { fastWgIssuePZ<8, DV>(o, a, sV, 64, 0); }, o);
                } else {
                    fastMmaPZ<8, DV>(o, s, sV, LDV);
                }
            }
            float inv_rows[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                size_t idx = 0;
                float inv = 0.f;
                const bool has = finishRow(i, idx, inv);
                inv_rows[i] = inv;
                if constexpr (WG) {
                    if (quad == 0) sAt[i ? rB : rA] = has ? (long long)idx : -1;
                } else if (has) { /* mma.sync: the stage's rows are padded and shared */
#pragma unroll
                    for (int n = 0; n < DV / 8; n++)
                        __stcs((unsigned *)(sb.part_o + idx * DV + n * 8 + quad * 2),
                               fastPack(o[n][2 * i] * inv, o[n][2 * i + 1] * inv));
                }
            }
            if constexpr (WG) {
#pragma unroll
                for (int h = 0; h < DV / 64; h++)
                    fastStagePut64<SELB_ROWS>(stage, warp * 16, h * 64, fastPanel64(o, h),
                                              inv_rows[0], inv_rows[1]);
                storeOut(stage);
            }
        }
        if constexpr (RING && !OUT) { /* this warp's rows of stage st are free; the TMA writes them next */
            fastWgProxyFence();
            __syncwarp();
            if (lane == 0) fastMbarArrive(&empty[st]);
        } else {
            __syncthreads(); /* stage st is refilled by the next iteration */
        }
    }
    fastCpWait<0>();
}

/* a[0..7] += weight(k) * the eight bf16 values at src(k), over the slots k
 * in order (fp32; weight 0: an unused slot, never read). Four slots'
 * 16-byte loads are in flight at a time: the combines only stream the
 * partials, so what they need is bytes in flight. */
template <class Weight, class Src>
__device__ __forceinline__ void selSumPartials(float (&a)[8], Src src, int slots, Weight weight) {
    constexpr int GROUP = 4;
    for (int s0 = 0; s0 < slots; s0 += GROUP) {
        uint4 raw[GROUP];
        float ws[GROUP];
#pragma unroll
        for (int k = 0; k < GROUP; k++) {
            ws[k] = s0 + k < slots ? weight(s0 + k) : 0.f;
            raw[k] = ws[k] != 0.f ? __ldcs((const uint4 *)src(s0 + k)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < GROUP; k++) {
            const __nv_bfloat162 *v2 = (const __nv_bfloat162 *)&raw[k];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 v = __bfloat1622float2(v2[e]);
                a[2 * e] = fmaf(ws[k], v.x, a[2 * e]);
                a[2 * e + 1] = fmaf(ws[k], v.y, a[2 * e + 1]);
            }
        }
    }
}

/* Merges the partials of one (b, t, g) in slot order into o_sel, lse_sel:
 *   lse = ln sum_k exp(lse_k),  o = sum_k exp(lse_k - lse) o_k.
 * A warp per head forms the weights, a lane per slot (max and sum by
 * shuffles); then each thread sums eight columns of one head over the
 * slots with 16-byte loads, four slots' loads in flight at a time. This
 * pass only streams the partials, so what it needs is bytes in flight:
 * the earlier thread-per-head weights and 4-byte loads left the DRAM
 * idle half the time. A CTA takes `tpc` consecutive tokens of the
 * chunk (selCombineTokens): one where a token's heads x 16-byte columns
 * fill its threads, more where they would leave most of them idle.
 * Grid (chunk tokens / tpc, B*G), 128 threads. */
#define SEL_COMBINE_MAX_TPC 4
/* Work item idx of a combine CTA whose tokens start at chunk-local lt0,
 * with d values a partial row: token i of the CTA (t in the sequence),
 * head h, columns col .. col + 7, the token's first partial pair in the
 * chunk buffer and its first output row. */
struct SelCombineItem {
    int i, h, col, t;
    size_t pair0, row0;
};
__device__ __forceinline__ SelCombineItem selCombineItem(const FastCtx &c, int idx, int d, int b,
                                                         int g, int chunk, int CT, int lt0) {
    SelCombineItem it;
    const int per_token = c.hpg * (d / 8);
    it.i = idx / per_token;
    it.h = (idx % per_token) / (d / 8);
    it.col = (idx % (d / 8)) * 8;
    it.t = chunk * CT + lt0 + it.i;
    it.pair0 = (((size_t)b * CT + lt0 + it.i) * c.G + g) * c.slots;
    it.row0 = ((size_t)b * c.S + it.t) * c.H + (size_t)g * c.hpg;
    return it;
}
static int selCombineTokens(int hpg, int d) {
    const int per_token = hpg * (d / 8);
    const int tpc = per_token >= 128 ? 1 : 128 / per_token;
    return tpc < SEL_COMBINE_MAX_TPC ? tpc : SEL_COMBINE_MAX_TPC;
}
/* Dynamic shared memory of the forward combine: its weights per (token,
 * head, slot). */
static int selCombineSmem(int tpc, int hpg) { return tpc * hpg * FAST_MAX_SLOTS * 4; }
/* Forward combine of chunk `chunk`: for each token t of the CTA's tpc and head h of group g,
 * lse = ln sum_k exp(lse_k), o = sum_k exp(lse_k - lse) o_k over its used slots k in order, into
 * io.o (bf16), io.lse (o = 0, lse = -inf where none). SKIP: slot 0 is the forced blocks' partial
 * already in io.o, io.lse; t's own and previous block have no slot of their own.
 * Grid (chunk tokens / tpc, B*G). */
template <int DV, bool SKIP> /* SKIP: sb.skip_forced */
__global__ void __launch_bounds__(128)
selBlockCombineKernel(FastCtx c, FastFwdIo io, const int32_t *sel_idx, FastSelBlock sb, int chunk,
                      int tpc) {
    /* [tpc][hpg][FAST_MAX_SLOTS] (selCombineSmem): 2 KB at the paper shape,
     * which leaves this CTA room beside two of the next chunk's forward
     * CTAs (2 x 109 KB) where the 8 KB of the largest shape did not */
    extern __shared__ float w[];
    const int CT = sb.chunk_revs * FAST_REV_TOKENS, lt0 = blockIdx.x * tpc;
    const int bg = blockIdx.y, b = bg / c.G, g = bg % c.G, hpg = c.hpg, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    /* the CTA's tokens: chunk-local lt0 + i, none past the chunk or S */
    const int ntok = min(tpc, min(CT - lt0, c.S - chunk * CT - lt0));
    for (int p = warp; p < ntok * hpg; p += 4) {
        const int i = p / hpg, h = p % hpg, t = chunk * CT + lt0 + i;
        const int32_t *row = sel_idx + (((size_t)b * c.S + t) * c.G + g) * c.slots;
        const size_t pair0 = (((size_t)b * CT + lt0 + i) * c.G + g) * c.slots;
        const size_t out0 = ((size_t)b * c.S + t) * c.H + (size_t)g * hpg;
        bool used = lane < c.slots && row[lane] >= 0; /* slots <= FAST_MAX_SLOTS = 32 */
        float lse_k;
        if constexpr (SKIP) {
            /* slot 0 (block 0: rows ascend) stands for the forced blocks'
             * partial in o, lse; the token's and the previous block have
             * no partial of their own */
            const int j = used ? row[lane] : -1, cur = t / c.sel_len;
            if (lane > 0 && (j == cur || j == cur - 1)) used = false;
            lse_k = !used      ? -INFINITY
                    : lane == 0 ? io.lse[out0 + h]
                                : __ldcs(sb.part_lse + (pair0 + lane) * hpg + h);
        } else {
            lse_k = used ? __ldcs(sb.part_lse + (pair0 + lane) * hpg + h) : -INFINITY;
        }
        float mx = lse_k;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float e = used && mx != -INFINITY ? expf(lse_k - mx) : 0.f;
        float sum = e;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        w[(i * hpg + h) * FAST_MAX_SLOTS + lane] = sum > 0.f ? e / sum : 0.f;
        if (lane == 0) io.lse[out0 + h] = sum > 0.f ? mx + logf(sum) : -INFINITY;
    }
    __syncthreads();
    constexpr int VEC = 8; /* bf16 per load */
    for (int idx = tid; idx < ntok * hpg * (DV / VEC); idx += blockDim.x) {
        const SelCombineItem it = selCombineItem(c, idx, DV, b, g, chunk, CT, lt0);
        const int h = it.h, col = it.col;
        float a[VEC] = {};
        const bf16 *part = sb.part_o + (it.pair0 * hpg + h) * DV + col;
        const bf16 *o_row = io.o + (it.row0 + h) * DV + col; /* SKIP: the forced blocks' partial */
        const size_t stride = (size_t)hpg * DV;
        selSumPartials(
            a, [&](int k) { return SKIP && k == 0 ? o_row : part + k * stride; }, c.slots,
            [&](int k) { return w[(it.i * hpg + h) * FAST_MAX_SLOTS + k]; });
        uint4 out;
        uint32_t *o32 = (uint32_t *)&out;
#pragma unroll
        for (int e = 0; e < VEC / 2; e++) o32[e] = fastPack(a[2 * e], a[2 * e + 1]);
        *(uint4 *)(io.o + (it.row0 + h) * DV + col) = out;
    }
}

/* dQ partials of one work item (see the file comment): per (token, slot
 * of j, head) the unscaled dq_k, in bf16. Rows come two tiles deep: q and dout
 * by 16-byte async copies, lse, delta and gate by 4-byte ones. WG: the
 * products on wgmma; at d_k = 128 dq is formed in 64-column parts, each
 * written when done, and the rows come one tile deep, so that registers
 * (119) and shared memory (103 KB) leave two CTAs per SM - the other CTA
 * hides the loads; this needs one key sub-tile per block (l' <= 64; the
 * host checks). (d_k = 64 keeps one CTA of 182 registers: at 128 it spills;
 * d_k = 192 keeps one CTA: two would need 242 KB.)
 * Grid (max_items, B*G), 32 * SELB_WARPS threads. */
template <int DK, bool WG>
struct SelBlockDqShape {
    static constexpr bool PARTS = WG && DK == 128;
    static constexpr int STAGES = PARTS ? 1 : 2, CTAS = PARTS ? 2 : 1;
};
template <int DK, int DV, bool WG>
__global__ void __launch_bounds__(32 * SELB_WARPS, SelBlockDqShape<DK, WG>::CTAS)
selBlockDqKernel(FastCtx c, FastBwdIo io, FastRevIndex rev, FastSelBlock sb, int chunk) {
    constexpr int LDK = DK + (WG ? 0 : 8), LDV = DV + (WG ? 0 : 8), R = SELB_ROWS,
                  THREADS = 32 * SELB_WARPS;
    constexpr int ST = SelBlockDqShape<DK, WG>::STAGES;
    constexpr bool PARTS = SelBlockDqShape<DK, WG>::PARTS;
    bf16 *sK = fastTileBase<WG>(), *sV = sK + 64 * LDK, *sQ = sV + 64 * LDV; /* sQ [ST][R] */
    bf16 *sdO = sQ + ST * R * LDK;                                            /* [ST][R] */
    float *sL = (float *)(sdO + ST * R * LDV), *sD = sL + ST * R, *sG = sD + ST * R; /* [ST][R] */
    int *sTok = (int *)(sG + ST * R), *sSlot = sTok + SELB_TILES * R;
    long long *sAt = (long long *)(sSlot + SELB_TILES * R); /* WG: [R] partial row, -1 none */
    const int bg = blockIdx.y, b = bg / c.G, g = bg % c.G, hpg = c.hpg, tpt = R / hpg;
    SelBlockItem it{};
    if (!it.init<false>(c, rev, sb, chunk, sTok, sSlot, THREADS)) return;
    const int ntiles = it.ntiles, u_lo = it.u_lo, u_hi = it.u_hi, nsub = it.nsub;
    const int CT = sb.chunk_revs * FAST_REV_TOKENS, t_base = chunk * CT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 2, quad = lane & 3;
    if (PARTS && nsub > 1) __trap(); /* a launch the host must not make */

    auto loadKV = [&](int sub) { it.loadKV<DK, DV, THREADS, WG>(c, io.k, io.v, b, g, sub, sK, sV); };
    /* the row this thread copies and its metadata row (threadIdx.x) */
    const SelBlockItem::Slot ld_slot = SelBlockItem::slotOf(c, fastTileRowOf<R, THREADS>()),
                             md_slot = SelBlockItem::slotOf(c, (int)threadIdx.x);
    auto rowOf = [&](int rt, SelBlockItem::Slot sl, size_t &row) {
        return it.row(c, sTok, b, g, rt, sl, row);
    };
    auto issueRows = [&](int rt, int st) {
        fastLoadTileFor<WG, R, DK, THREADS>(sQ + st * R * LDK, [&](int) -> const bf16 * {
            size_t row;
            return rowOf(rt, ld_slot, row) ? io.q + row * DK : nullptr;
        });
        fastLoadTileFor<WG, R, DV, THREADS>(sdO + st * R * LDV, [&](int) -> const bf16 * {
            size_t row;
            return rowOf(rt, ld_slot, row) ? io.dout + row * DV : nullptr;
        });
        if ((int)threadIdx.x < R) {
            const int r = threadIdx.x;
            size_t row = 0;
            const bool ok = rowOf(rt, md_slot, row);
            fastCpAsync4(sL + st * R + r, ok ? io.lse + row : nullptr);
            fastCpAsync4(sD + st * R + r, ok ? io.dsum + row * 3 + io.branch : nullptr);
            fastCpAsync4(sG + st * R + r, ok ? io.gate_f + row * 3 + io.branch : nullptr);
        }
    };

    if (nsub == 1) loadKV(0);
    __syncthreads();
    issueRows(0, 0);
    fastCpCommit();

    const int rA = warp * 16 + grp, rB = rA + 8;
    const SelBlockItem::Slot slot_ab[2] = {SelBlockItem::slotOf(c, rA), SelBlockItem::slotOf(c, rB)};
    for (int rt = 0; rt < ntiles; rt++) {
        const int st = ST == 1 ? 0 : rt & 1;
        if (ST == 2 && rt + 1 < ntiles) issueRows(rt + 1, st ^ 1);
        if (ST == 1 && rt > 0) issueRows(rt, 0); /* the stage was freed by the last barrier */
        fastCpCommit();
        if (ST == 2) fastCpWait<1>();
        else fastCpWait<0>();
        fastTileBarrier<WG>(); /* rows of rt (and K/V) landed */
        int tok[2];
        float lse2[2], dsum[2], gate[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = i ? rB : rA, k = slot_ab[i].k;
            const float lse = sL[st * R + r];
            tok[i] = k >= 0 ? sTok[rt * tpt + k] : -1;
            if (lse == -INFINITY) tok[i] = -1; /* sees nothing: no gradient, never NaN */
            lse2[i] = tok[i] >= 0 ? lse * FAST_LOG2E : 0.f;
            dsum[i] = sD[st * R + r];
            gate[i] = sG[st * R + r];
        }
        /* the partial's destination of row half i (NULL: a padding row) */
        /* the partial row of row half i in part_dq (-1: a padding row) */
        auto partAt = [&](int i) -> long long {
            const int k = slot_ab[i].k;
            const int t = k >= 0 ? sTok[rt * tpt + k] : -1;
            const int slot = k >= 0 ? sSlot[rt * tpt + k] : -1;
            if (t < 0 || slot < 0) return -1; /* rows that see nothing still write their zeros */
            const size_t pair = (((size_t)b * CT + (t - t_base)) * c.G + g) * c.slots + slot;
            return (long long)(pair * hpg + slot_ab[i].head);
        };
        bf16 *stage = sQ + st * R * LDK; /* WG: the partials' way out (selStagePut) */
        if (WG && quad == 0) {
            sAt[rA] = partAt(0);
            sAt[rB] = partAt(1);
        }
        float dq[PARTS ? 1 : DK / 8][4];
#pragma unroll
        for (int n = 0; n < (PARTS ? 1 : DK / 8); n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
        for (int sub = 0; sub < nsub; sub++) {
            if (nsub > 1) { /* blocks longer than 64 keys: one sub-tile at a time */
                __syncthreads();
                loadKV(sub);
                fastCpCommit();
                fastCpWait<0>();
                fastTileBarrier<WG>();
            }
            float s[8][4], dp[8][4];
            if constexpr (WG) {
                const int wg_row0 = (warp >> 2) * 64;
                fastWgRun(
                    [&] {
                        fastWgIssueAZt<8, DK>(s, sQ + st * R * LDK, R, wg_row0, sK, 64, 0);
                        fastWgIssueAZt<8, DV>(dp, sdO + st * R * LDV, R, wg_row0, sV, 64, 0);
                    },
                    s, dp);
            } else {
#pragma unroll
                for (int n = 0; n < 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.f;
                fastMmaAZt<8, DK>(s, sQ + st * R * LDK, LDK, warp * 16, sK, LDK);
                fastMmaAZt<8, DV>(dp, sdO + st * R * LDV, LDV, warp * 16, sV, LDV);
            }
            /* key u0 + x is visible to row half i iff x <= last[i] */
            const int u0 = u_lo + sub * 64 + quad * 2;
            int last[2];
#pragma unroll
            for (int i = 0; i < 2; i++) last[i] = tok[i] >= 0 ? min(tok[i], u_hi - 1) - u0 : -1;
#pragma unroll
            for (int n = 0; n < 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1;
                    const bool ok = n * 8 + (e & 1) <= last[i];
                    const float p = ok ? fastExp2(s[n][e] * c.scale_log2 - lse2[i]) : 0.f;
                    s[n][e] = gate[i] * p * (dp[n][e] - dsum[i]);
                }
            }
            if constexpr (PARTS) {
                /* one sub-tile (checked above): dS.K in 64-column parts of
                 * K, each staged as soon as it is done */
                uint32_t a[4][4];
                fastWgAFromC<8>(a, s);
                fastWgPZParts<DK>(a, sK, [&](int h, const float (&dqh)[8][4]) {
                    fastStagePut64<SELB_ROWS>(stage, warp * 16, h * 64, dqh, 1.f, 1.f);
                });
            } else if constexpr (WG) {
                uint32_t a[4][4];
                fastWgAFromC<8>(a, s);
                fastWgRun([&] { fastWgIssuePZ<8, DK>(dq, a, sK, 64, 0); }, dq);
            } else {
                fastMmaPZ<8, DK>(dq, s, sK, LDK);
            }
        }
        if constexpr (WG) {
            if constexpr (!PARTS)
#pragma unroll
                for (int h = 0; h < DK / 64; h++)
                    fastStagePut64<SELB_ROWS>(stage, warp * 16, h * 64, fastPanel64(dq, h), 1.f,
                                              1.f);
            __syncwarp();
            selStageStore<DK>(stage, sAt, sb.part_dq, warp, lane);
        } else {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const long long at = partAt(i);
                if (at < 0) continue;
                bf16 *dst = sb.part_dq + (size_t)at * DK;
#pragma unroll
                for (int n = 0; n < DK / 8; n++)
                    __stcs((unsigned *)(dst + n * 8 + quad * 2), fastPack(dq[n][2 * i], dq[n][2 * i + 1]));
            }
        }
        __syncthreads(); /* stage st is refilled by the next iteration */
    }
    fastCpWait<0>();
}

/* Sums the bf16 dQ partials of one (b, t, g) in slot order, in fp32, times
 * the softmax scale, into the branches' running dq as io.dq_mode says
 * (fastStoreDqRow's rule). Each thread sums eight columns of one head over
 * the slots with 16-byte loads, four slots' loads in flight at a time (the
 * pass only streams the partials); `tpc` tokens a CTA as in the forward's
 * combine. Grid (chunk tokens / tpc, B*G), 128 threads. */
template <int DK>
__global__ void __launch_bounds__(128)
selBlockDqCombineKernel(FastCtx c, FastBwdIo io, const int32_t *sel_idx, FastSelBlock sb,
                        int chunk, int tpc) {
    __shared__ int slot_used[SEL_COMBINE_MAX_TPC][FAST_MAX_SLOTS];
    const int CT = sb.chunk_revs * FAST_REV_TOKENS, lt0 = blockIdx.x * tpc;
    const int bg = blockIdx.y, b = bg / c.G, g = bg % c.G, hpg = c.hpg, tid = threadIdx.x;
    const int ntok = min(tpc, min(CT - lt0, c.S - chunk * CT - lt0));
    for (int p = tid; p < ntok * c.slots; p += blockDim.x) {
        const int i = p / c.slots, k = p % c.slots, t = chunk * CT + lt0 + i;
        const int j = sel_idx[(((size_t)b * c.S + t) * c.G + g) * c.slots + k];
        const int cur = t / c.sel_len; /* forced: 0, cur - 1, cur (their dq came with the window's) */
        slot_used[i][k] = j >= 0 && !(sb.forced_dq_apart && (j == 0 || j >= cur - 1));
    }
    __syncthreads();
    constexpr int VEC = 8; /* bf16 per load */
    for (int idx = tid; idx < ntok * hpg * (DK / VEC); idx += blockDim.x) {
        const SelCombineItem it = selCombineItem(c, idx, DK, b, g, chunk, CT, lt0);
        const int h = it.h, col = it.col;
        float a[VEC] = {}; /* weight 1: fmaf(1, v, a) is a + v exactly */
        const bf16 *part = sb.part_dq + (it.pair0 * hpg + h) * DK + col;
        selSumPartials(
            a, [&](int k) { return part + (size_t)k * hpg * DK; }, c.slots,
            [&](int k) { return slot_used[it.i][k] ? 1.f : 0.f; });
#pragma unroll
        for (int e = 0; e < VEC; e++) a[e] *= c.scale;
        const size_t at = (it.row0 + h) * DK + col;
        float4 *acc = (float4 *)(io.dq_acc + at);
#pragma unroll
        for (int v4 = 0; v4 < VEC / 4; v4++) {
            float *x = a + 4 * v4;
            if (io.dq_mode == FastDqMode::ACC) {
                acc[v4] = make_float4(x[0], x[1], x[2], x[3]);
            } else {
                const float4 prev = acc[v4];
                x[0] += prev.x, x[1] += prev.y, x[2] += prev.z, x[3] += prev.w;
            }
        }
        if (io.dq_mode == FastDqMode::ACC_OUT) {
            uint4 out;
            uint32_t *o32 = (uint32_t *)&out;
#pragma unroll
            for (int e = 0; e < VEC / 2; e++) o32[e] = fastPack(a[2 * e], a[2 * e + 1]);
            *(uint4 *)(io.dq_out + at) = out;
        }
    }
}

cudaError_t fastDrainBeforePass(const FastDrain *drain, int chunk, cudaStream_t stream) {
    if (!drain || chunk < FAST_SEL_BLOCK_BUFFERS) return cudaSuccess;
    return cudaStreamWaitEvent(stream, drain->drained[chunk % FAST_SEL_BLOCK_BUFFERS], 0);
}

cudaError_t fastDrainAfterPass(const FastDrain *drain, int chunk, cudaStream_t stream,
                               cudaStream_t *combine_stream) {
    *combine_stream = drain ? drain->stream : stream;
    if (!drain) return cudaSuccess;
    cudaEvent_t made = drain->made[chunk % FAST_SEL_BLOCK_BUFFERS];
    cudaError_t e = cudaEventRecord(made, stream);
    return e == cudaSuccess ? cudaStreamWaitEvent(drain->stream, made, 0) : e;
}

cudaError_t fastDrainAfterCombine(const FastDrain *drain, int chunk) {
    if (!drain) return cudaSuccess;
    return cudaEventRecord(drain->drained[chunk % FAST_SEL_BLOCK_BUFFERS], drain->stream);
}

cudaError_t fastDrainEnd(const FastDrain *drain, int nchunks, cudaStream_t stream) {
    if (!drain || nchunks < 1) return cudaSuccess;
    /* the drain runs its combines in order: the last one's event covers all */
    return cudaStreamWaitEvent(stream, drain->drained[(nchunks - 1) % FAST_SEL_BLOCK_BUFFERS], 0);
}

/* sb.buffers within what the maps are sized for, and a drain only with
 * the FAST_SEL_BLOCK_BUFFERS (> 1) buffers its events count in: a buffer
 * to fill while another drains. */
static bool selBuffersValid(const FastSelBlock &sb, const FastDrain *drain) {
    return sb.buffers >= 1 && sb.buffers <= FAST_SEL_BLOCK_BUFFERS &&
           (!drain || (sb.buffers == FAST_SEL_BLOCK_BUFFERS && sb.buffers > 1));
}

/* Enqueues one block-centric pass (the forward or the dQ): the work-item
 * plan of every chunk, then per chunk the pass kernel (pass(sb of the
 * chunk's buffer, chunk) launches it on `stream`) and the combine that
 * merges its partials - on the drain's stream where drain is not NULL, so
 * that it reads one buffer while the next chunk's pass fills the other.
 * Returns the first attribute, event or launch error; never synchronises. */
template <class Kernel, class Pass, class Combine, class Io>
static cudaError_t selBlockRun(const FastCtx &c, Kernel kernel, int smem, Pass pass,
                               Combine combine, int tpc, int combine_smem, const Io &io,
                               const int32_t *sel_idx,
                               const FastRevIndex &rev, const FastSelBlock &sb,
                               const FastDrain *drain, cudaStream_t stream) {
    if (!selBuffersValid(sb, drain)) return cudaErrorInvalidValue;
    cudaError_t e = fastSetSmem(kernel, smem);
    if (e != cudaSuccess) return e;
    const int BG = c.B * c.G;
    selBlockPlanKernel<<<dim3(sb.nchunks, BG), 1024, 0, stream>>>(
        c, rev, sb, selBlockItemTokens(c.hpg), sb.item_start, sb.item_block, sb.max_items, NULL);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    const int CT = sb.chunk_revs * FAST_REV_TOKENS;
    for (int chunk = 0; chunk < sb.nchunks; chunk++) {
        const FastSelBlock at = fastSelBlockBuffer(sb, chunk);
        if ((e = fastDrainBeforePass(drain, chunk, stream)) != cudaSuccess) return e;
        pass(at, chunk);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        cudaStream_t combine_stream;
        if ((e = fastDrainAfterPass(drain, chunk, stream, &combine_stream)) != cudaSuccess) return e;
        combine<<<dim3((CT + tpc - 1) / tpc, BG), 128, combine_smem, combine_stream>>>(
            c, io, sel_idx, at, chunk, tpc);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        if ((e = fastDrainAfterCombine(drain, chunk)) != cudaSuccess) return e;
    }
    return fastDrainEnd(drain, sb.nchunks, stream);
}

template <int DK, int DV>
static cudaError_t selBlockForward(const FastCtx &c, const FastFwdIo &io, const int32_t *sel_idx,
                                   const FastRevIndex &rev, const FastSelBlock &sb,
                                   const FastDrain *drain, cudaStream_t stream) {
    /* the wgmma kernel forms a d_v = 128 output in halves, one key
     * sub-tile per block only */
    const bool wg = c.wgmma && (DV <= 64 || c.sel_len <= 64);
    /* q rows in and partials out by TMA where a warp's rows are one token's
     * 16 heads (2 KB boxes, fastSelRowRing) and a block is one key sub-tile */
    const bool ring = wg && c.sel_len <= 64 && c.hpg == 16 && fastSelRowRing(c.hpg);
    if (!selBuffersValid(sb, drain)) return cudaErrorInvalidValue;
    SelBlockFwdMaps maps[FAST_SEL_BLOCK_BUFFERS] = {};
    if (ring) {
        const size_t rows = (size_t)c.B * sb.chunk_revs * FAST_REV_TOKENS * c.G * c.slots * c.hpg;
        for (int i = 0; i < sb.buffers; i++) {
            const FastSelBlock at = fastSelBlockBuffer(sb, i);
            cudaError_t e =
                fastTmaEncodeRows(c.tma_encode, &maps[i].q, io.q, c.B, c.S, c.H, DK, c.hpg, 1);
            if (e == cudaSuccess)
                e = fastTmaEncodeMatrix(c.tma_encode, &maps[i].part_o, at.part_o, rows, DV, 16);
            if (e != cudaSuccess) return e;
        }
    }
    auto kernel = ring ? selBlockFwdKernel<DK, DV, true, true>
                       : wg ? selBlockFwdKernel<DK, DV, true, false> : selBlockFwdKernel<DK, DV, false, false>;
    const int smem = ring ? selBlockSmem<DK, DV, true, false, true>()
                     : wg ? selBlockSmem<DK, DV, true, false>()
                          : selBlockSmem<DK, DV, false, false>();
    /* the forced blocks' partial straight into o, lse where it applies
     * and the block kernel runs on wgmma (the mma.sync one has no
     * registers for the skip); the combine merges it with the others */
    FastSelBlock run = sb;
    run.skip_forced = fastSelForcedApplies(c) && wg;
    if (run.skip_forced) {
        /* (on the drain's stream, beside the first chunk's pass - only the
         * combines read its o, lse - it was no faster) */
        cudaError_t e = fastSelForcedOwnPass(c)
                            ? fastSelForcedForward(c, DK, DV, io, stream)
                            : fastLaunchForward<DK, DV, SelForcedPolicy, false>(
                                  c, io, fastSelForcedPolicy(c), stream);
        if (e != cudaSuccess) return e;
    }
    const int BG = c.B * c.G, tpc = selCombineTokens(c.hpg, DV);
    auto pass = [&](const FastSelBlock &at, int chunk) {
        kernel<<<dim3(run.max_items, BG), 32 * SELB_WARPS, smem, stream>>>(
            c, io, rev, at, chunk, maps[chunk % sb.buffers]);
    };
    return run.skip_forced
               ? selBlockRun(c, kernel, smem, pass, selBlockCombineKernel<DV, true>, tpc,
                             selCombineSmem(tpc, c.hpg), io, sel_idx, rev, run, drain, stream)
               : selBlockRun(c, kernel, smem, pass, selBlockCombineKernel<DV, false>, tpc,
                             selCombineSmem(tpc, c.hpg), io, sel_idx, rev, run, drain, stream);
}

FastSelBlock fastSelBlockShape(int B, int S, int Ns, int slots, int hpg, int budget_tokens) {
    FastSelBlock sb = {};
    sb.buffers = 1;
    const int rev_chunks = (S + FAST_REV_TOKENS - 1) / FAST_REV_TOKENS;
    const int per = budget_tokens / (B * FAST_REV_TOKENS);
    sb.chunk_revs = per < 1 ? 1 : (per > rev_chunks ? rev_chunks : per);
    sb.nchunks = (rev_chunks + sb.chunk_revs - 1) / sb.chunk_revs;
    const long long CT = (long long)sb.chunk_revs * FAST_REV_TOKENS;
    const int per_item = selBlockItemTokens(hpg);
    /* sum_j ceil(len_j / per_item) <= Ns + (entries of one (b, g) in a chunk) / per_item */
    sb.max_items = (int)(Ns + (CT * slots + per_item - 1) / per_item);
    return sb;
}

cudaError_t fastSelBlockForward(const FastCtx &c, int dk, int dv, const FastFwdIo &io,
                                const int32_t *sel_idx, const FastRevIndex &rev,
                                const FastSelBlock &sb, const FastDrain *drain,
                                cudaStream_t stream) {
    FAST_DISPATCH(dk, dv, selBlockForward, c, io, sel_idx, rev, sb, drain, stream);
}

template <int DK, int DV>
static cudaError_t selBlockDq(const FastCtx &c, const FastBwdIo &io, const int32_t *sel_idx,
                              const FastRevIndex &rev, const FastSelBlock &sb,
                              const FastDrain *drain, cudaStream_t stream) {
    /* the wgmma kernel forms a d_k = 128 dq in parts, one key sub-tile per
     * block only */
    const bool wg = c.wgmma && (DK != 128 || c.sel_len <= 64);
    auto kernel = wg ? selBlockDqKernel<DK, DV, true> : selBlockDqKernel<DK, DV, false>;
    const int smem = wg ? selBlockSmem<DK, DV, true, true>() : selBlockSmem<DK, DV, false, true>();
    const int BG = c.B * c.G;
    auto pass = [&](const FastSelBlock &at, int chunk) {
        kernel<<<dim3(sb.max_items, BG), 32 * SELB_WARPS, smem, stream>>>(c, io, rev, at, chunk);
    };
    return selBlockRun(c, kernel, smem, pass, selBlockDqCombineKernel<DK>,
                       selCombineTokens(c.hpg, DK), 0, io, sel_idx, rev, sb, drain, stream);
}

cudaError_t fastSelBlockDq(const FastCtx &c, int dk, int dv, const FastBwdIo &io,
                           const int32_t *sel_idx, const FastRevIndex &rev, const FastSelBlock &sb,
                           const FastDrain *drain, cudaStream_t stream) {
    FAST_DISPATCH(dk, dv, selBlockDq, c, io, sel_idx, rev, sb, drain, stream);
}

/* ---- The fused selected backward (wgmma, l' <= 64) ----
 *
 * The dK/dV pass (fast_sel.cu) and the block-centric dQ above each stream,
 * per (token, block) pair, the token's q and dout rows (8 KB at the paper
 * shape) and recompute its scores and dP. Here one pass does both: a CTA
 * holds block j's K/V, walks the q / dout rows of the tokens of one chunk
 * that chose j with the dK/dV core (tile_dkdv_ring.cuh), and after each stage's
 * dK/dV products (stageOut) writes that stage's dS to shared memory and
 * forms the pairs' dq partials dS.K from it - one product more per stage
 * instead of a second pass over the rows.
 *
 * The dq partials need the token chunks of the dQ (FastSelBlock), so dK/dV
 * are formed per chunk and add up across chunks in fp32 (FastSelFused.acc)
 * in chunk order: a block whose tokens in the chunk fit one work item adds
 * its sums directly; one with more items (block 0, every token's) writes a
 * partial per item, which a second kernel adds in item order. No atomics:
 * bit-reproducible like the passes it replaces. */

/* Shared memory: the dK/dV core's (cp.async: then a ring of the slots of
 * the ring of tokens, [4][rows]), then the stage rows' partial rows
 * ([2][rows] by tile parity, -1: none). */
/* The fused kernel's TMA maps on the row ring: q and dout (a box per
 * token), and at 16 heads per group the chunk's dq partials part_dq as
 * rows of d_k in 16 x 64 boxes (one (token, slot) pair's heads per warp,
 * as the forward's SelBlockFwdMaps.part_o). */
struct SelFusedMaps {
    FastRowMaps rows;
    CUtensorMap part_dq;
};
/* Row warpgroups of the fused kernel on the row ring (FastDkdvRing's RWG):
 * at d_k = 192 one CTA's shared memory (K/V 40 KB, 40 KB a row stage)
 * leaves room for one CTA of 4 warps per SM, and the kernel waited on its
 * chain of products; two warpgroups that share the K/V tile and take its
 * row tiles in turn run 8 warps (SEL_FUSED_ROW_WGS_WIDE). SEL_FUSED_ROW_WGS:
 * the same at d_k = 128, where two CTAs fit: no faster, off. */
template <int DK, int DV>
constexpr int selFusedRowWgs() {
    return DK + DV > 256 ? SEL_FUSED_ROW_WGS_WIDE : DK >= 128 ? SEL_FUSED_ROW_WGS : 1;
}
/* Rows per wgmma pass of the fused kernel's ring core where d_k or d_v is
 * above 128 (FAST_DKDV_WG_ROWS elsewhere): its dq stage keeps registers of
 * its own beside the pass's, and 64-row passes spill (with the scores and
 * dP^T side by side, and more probabilities first), no faster. */
template <int DK, int DV>
constexpr int selFusedPassRows() {
    return DK > 128 || DV > 128 ? SEL_FUSED_WIDE_PASS_ROWS : FAST_DKDV_WG_ROWS;
}
/* the dq rows' destinations, [2][rows] per row warpgroup by tile parity */
constexpr int selFusedExtra(int rwg) { return 2 * rwg * FAST_DKDV_ROWS * 8; }
template <int DK, int DV, bool RING, int RWG>
constexpr int selFusedSmem() {
    return RING ? FastDkdvRing<DK, DV, 1, true, true, selFusedExtra(RWG), RWG>::SMEM
                : fastDkdvSmem(DK, DV, true, 1) + 4 * FAST_DKDV_ROWS * 4 + selFusedExtra(1);
}

/* One work item of a chunk: block j's keys (one 64-key tile) against the
 * rows of up to f.item_tokens of the chunk's tokens that chose j
 * (fastSelFusedShape). dK/dV (dK times the scale) add to f.acc, or go to the item's
 * partial when j has several items in this chunk; per pair the unscaled dq
 * partial in bf16 to sb.part_dq, laid out as selBlockDqKernel's.
 * Grid (f.max_items, B*G), FAST_THREADS * RWG threads (RWG row warpgroups
 * on the ring: selFusedRowWgs). */
/* On the ring, lane 0 of each warp waits for its stage's dq bulk stores to
 * have read the stage only in the next stage, under its first products,
 * before the ring's producer refills it (the wait right after the stores
 * had been a visible share of the kernel's stalls). */
/* At d_k = 64, three CTAs per SM: the registers capped at 168 (201
 * uncapped, two CTAs) with no spills; the kernel waits on its chain of five
 * small products per stage, which a third CTA overlaps. */
/* (At d_k >= 128 the kernel's 255 registers leave two CTAs no room for a
 * CTA of the previous chunk's dq combine beside them on the drain; capped
 * at 232 so that one fits, it spilled and was slower.) */
template <int DK, int DV, bool RING, int RWG>
__global__ void __launch_bounds__(FAST_THREADS * RWG, DK == 64 ? SEL_FUSED_MIN_CTAS_D64 : 1)
selFusedBwdKernel(FastCtx c, FastBwdIo io, FastRevIndex rev, FastSelBlock sb, FastSelFused f,
                  int chunk, const __grid_constant__ SelFusedMaps maps) {
    static_assert(RING || RWG == 1, "row warpgroups take their tiles from the row ring");
    constexpr int R = FAST_DKDV_ROWS, EXTRA = selFusedExtra(RWG);
    const int bg = blockIdx.y, b = bg / c.G, g = bg % c.G, item = blockIdx.x;
    const size_t plan = ((size_t)chunk * gridDim.y + bg) * (c.Ns + 1);
    const int *is = f.item_start + plan;
    if (item >= is[c.Ns]) return;
    const int j = f.item_block[((size_t)chunk * gridDim.y + bg) * f.max_items + item];
    const int k_item = item - is[j], items = is[j + 1] - is[j];
    int e_lo, e_hi;
    selBlockRange<false>(c, rev, sb, bg, j, chunk, e_lo, e_hi);
    const int hpg = c.hpg, tpr = R / hpg, per_item = f.item_tokens;
    const int e0 = e_lo + k_item * per_item, e1 = min(e_hi, e0 + per_item);
    const int ntiles = (e1 - e0 + tpr - 1) / tpr;
    const int u0 = j * c.sel_len, khi = min(c.S, u0 + c.sel_len);
    const size_t ent0 = (size_t)bg * c.S * c.slots;
    const int *entries = rev.entries + ent0, *entry_slot = rev.entry_slot + ent0;
    bf16 *sK = fastTileBase<true>(); /* both cores' layouts start with K */
    constexpr int EXTRA_AT = RING ? FastDkdvRing<DK, DV, 1, true, true, EXTRA, RWG>::EXTRA_AT
                                  : fastDkdvSmem(DK, DV, true, 1) - 1024;
    int *sSlot = (int *)((char *)sK + EXTRA_AT); /* cp.async core: [4][R] */
    long long *sAt = (long long *)((char *)sK + EXTRA_AT + (RING ? 0 : 4 * R * 4)); /* [RWG][2][R] */
    const int CT = sb.chunk_revs * FAST_REV_TOKENS, t_base = chunk * CT;
    const int part = items > 1 ? f.part_start[plan + j] + k_item : -1;
    float *pk = f.part_k + ((size_t)bg * f.max_parts + (part < 0 ? 0 : part)) * 64 * DK;
    float *pv = f.part_v + ((size_t)bg * f.max_parts + (part < 0 ? 0 : part)) * 64 * DV;
    float *acc_k = f.acc_k, *acc_v = f.acc_v;
    bf16 *part_dq = sb.part_dq;
    const int S = c.S, G = c.G, slots = c.slots;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* this thread's row warpgroup, and its warp and thread in it */
    const int rwg = warp / 4, gwarp = warp % 4, gtid = threadIdx.x % FAST_THREADS;
    auto visible = [=](int t, int u) { return u <= t; };
    auto seesAny = [=](int, int, int) { return true; }; /* every listed token chose the block */
    auto tileFull = [=](int it, int t_first, int ka) { /* entries ascend: the first token is the smallest */
        return e0 + (it + 1) * tpr <= e1 && ka + 63 <= t_first;
    };
    auto store = [=](int u, bool is_k, int col, float v0, float v1) {
        const int D = is_k ? DK : DV;
        float2 *to = part >= 0 ? (float2 *)((is_k ? pk : pv) + (size_t)(u - u0) * D + col)
                               : (float2 *)((is_k ? acc_k : acc_v) +
                                            (((size_t)b * S + u) * G + g) * D + col);
        if (part >= 0) {
            *to = make_float2(v0, v1);
        } else {
            const float2 was = *to;
            *to = make_float2(was.x + v0, was.y + v1);
        }
    };
    /* after a pass's dK/dV products: dS to the dout stage, then (last pass
     * of the stage) dq = dS.K staged in the q stage and stored per row;
     * row(r) = (token, j's slot in its sel_idx row) of stage row r, -1: none */
    /* at 16 heads per group a warp's 16 staged dq rows are one (token,
     * slot) pair's: they leave by bulk tensor stores */
    const bool tma_out = RING && hpg == 16;
    auto dqOut = [&](int it, int half, const auto &ads, bf16 *q_stage, bf16 *do_stage, auto row) {
        constexpr int KS = sizeof(ads) / sizeof(ads[0]), RH = 16 * KS;
        /* a warp may start its warpgroup's next tile's before all read this */
        long long *at = sAt + (rwg * 2 + ((it / RWG) & 1)) * R;
        if (half == 0 && gtid < R) { /* where each row's partial goes */
            const int r = gtid;
            const int2 ts = row(r);
            /* j (keys from u0) is forced for exactly its own and the next
             * block's tokens, block 0 for all */
            const bool apart = DK >= 128 && sb.forced_dq_apart && /* fastSelForcedDqApplies */
                               (u0 == 0 || ts.x < u0 + 2 * c.sel_len);
            at[r] = ts.x >= 0 && ts.y >= 0 && !apart
                        ? (long long)(((((size_t)b * CT + (ts.x - t_base)) * G + g) * slots + ts.y) *
                                          hpg +
                                      r % hpg)
                        : -1;
        }
        /* dS (rows x keys) into the dout stage's first panel: this
         * pass's products were the last to read those rows */
#pragma unroll
        for (int ks = 0; ks < KS; ks++) fastStoreAT(do_stage, R, ads[ks], gwarp * 16, half * RH + 16 * ks);
        if (half + 1 < R / RH) return;
        fastWgProxyFence();
        /* dS whole, at[] written; every warp of the warpgroup is past the
         * stage's products. A stage whose rows all leave their dq to the
         * forced pass (block 0's, and the first 2 l' tokens of every block)
         * forms none. */
        if constexpr (DK >= 128) {
            if (!fastGroupSyncOr<RWG>(gtid < R && at[gtid] >= 0)) return;
        } else { /* the skip's branch cost the three-CTA kernel spills */
            fastGroupSync<RWG>();
        }
#pragma unroll 1
        for (int h = 0; h < DK / 64; h++) {
            float dq[8][4];
            fastWgRun([&] { fastWgIssueSZ<64>(dq, do_stage, sK + h * 64 * 64, 64); }, dq);
            fastStagePut64<R>(q_stage, gwarp * 16, h * 64, dq, 1.f, 1.f);
        }
        if (tma_out) { /* its reads done before the ring releases the stage */
            selStageStoreTma<DK, R, true>(&maps.part_dq, q_stage, at, gwarp, lane);
        } else {
            __syncwarp();
            selStageStore<DK, R>(q_stage, at, part_dq, gwarp, lane);
        }
    };
    /* On the row ring the block's sums leave through shared memory (the
     * drained ring: K/V and the stages), a row of fp32 per thread added to
     * f.acc in L2 (or copied to the item's partial) by a bulk operation,
     * rather than by store() - loads of the old sums and stores, one
     * round trip to DRAM after another at the CTA's end, which nothing of
     * the CTA overlaps at one CTA per SM. One add per element as before:
     * the same bits. (The old sums' lines prefetched to L2 at the CTA's
     * start instead gained nothing; loaded and stored with the streaming
     * hint the kernel was far slower.) Rows
     * padded by 8 floats so that a warp's stores of its fragments meet
     * each bank twice at most. */
    auto sumsOut = [&](const float (&dk)[DK / 8][4], const float (&dv)[DV / 8][4]) {
        constexpr int LK = DK + 8, LV = DV + 8;
        static_assert(64 * (LK + LV) * 4 <= FastDkdvRing<DK, DV, 1, true, true, EXTRA, RWG>::EXTRA_AT,
                      "the staged sums fit the ring's tiles");
        float *stg = (float *)sK, *stg_v = stg + 64 * LK;
        fastGroupSync<RWG>(); /* the warpgroup is past its last reads of the ring */
        const int quad = lane & 3, key_a = gwarp * 16 + (lane >> 2);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = key_a + 8 * i;
#pragma unroll
            for (int n = 0; n < DK / 8; n++)
                *(float2 *)(stg + r * LK + n * 8 + quad * 2) =
                    make_float2(dk[n][2 * i] * c.scale, dk[n][2 * i + 1] * c.scale);
#pragma unroll
            for (int n = 0; n < DV / 8; n++)
                *(float2 *)(stg_v + r * LV + n * 8 + quad * 2) = make_float2(dv[n][2 * i], dv[n][2 * i + 1]);
        }
        fastWgProxyFence(); /* the stores, before the bulk operations read them */
        fastGroupSync<RWG>();
        const int r = gtid & 63, u = u0 + r;
        const bool is_k = gtid < 64;
        if (u < khi) {
            const int D = is_k ? DK : DV;
            const float *src = is_k ? stg + r * LK : stg_v + r * LV;
            float *dst = part >= 0 ? (is_k ? pk : pv) + (size_t)r * D
                                   : (is_k ? acc_k : acc_v) + (((size_t)b * S + u) * G + g) * D;
            fastBulkPutF32(dst, src, D * 4, part < 0);
            fastBulkCommit();
            fastBulkWaitRead(); /* before the CTA's shared memory goes */
        }
    };
    if constexpr (RING) {
        fastDkdvRingCore<DK, DV, 1, true, EXTRA, RWG, selFusedPassRows<DK, DV>()>(
            c, io, maps.rows, b, g, u0, khi, ntiles,
            [=](int it, int s) -> const int * { /* the token, and j's slot in its row beside it */
                const int e = e0 + it * tpr + s;
                return e < e1 ? entries + e : nullptr;
            },
            visible, seesAny, tileFull, store,
            [=](int it, int s) -> const int * {
                const int e = e0 + it * tpr + s;
                return e < e1 ? entry_slot + e : nullptr;
            },
            dqOut, tma_out, sumsOut);
    } else {
        fastDkdvCore<DK, DV, true, 1>(
            c, io, b, g, u0, khi, ntiles,
            [=](int it, int s, int *dst) { /* the token and j's slot in its row, side by side */
                const int e = e0 + it * tpr + s;
                int *slot_dst = sSlot + (it % 4) * R + s;
                if (e < e1) {
                    fastCpAsync4(dst, entries + e);
                    fastCpAsync4(slot_dst, entry_slot + e);
                } else {
                    *dst = -1;
                    *slot_dst = -1;
                }
            },
            visible, seesAny, tileFull, store,
            [&](int it, int half, const auto &ads, bf16 *q_stage, bf16 *do_stage, const int *tok) {
                dqOut(it, half, ads, q_stage, do_stage, [&](int r) {
                    const int k = r / hpg;
                    return r < tpr * hpg ? make_int2(tok[k], sSlot[(it % 4) * R + k])
                                         : make_int2(-1, -1);
                });
            });
    }
}

/* Adds the item partials of the blocks with several items in this chunk to
 * acc, in item order. Grid (Ns, B*G, SEL_FUSED_REDUCE_SPLIT): a block's
 * 64 x (d_k + d_v) sums in that many slices. Block 0, every token's, has a
 * chunk's tokens in items of up to 256 (16 at the paper shape: a MB of
 * partials), which one CTA had streamed alone after each chunk's pass.
 * 256 threads. */
#define SEL_FUSED_REDUCE_SPLIT 8
template <int DK, int DV>
__global__ void __launch_bounds__(256) selFusedReduceKernel(FastCtx c, FastSelFused f, int chunk) {
    const int bg = blockIdx.y, b = bg / c.G, g = bg % c.G, j = blockIdx.x;
    const size_t plan = ((size_t)chunk * gridDim.y + bg) * (c.Ns + 1);
    const int items = f.item_start[plan + j + 1] - f.item_start[plan + j];
    if (items <= 1) return;
    const int first = f.part_start[plan + j];
    const int u0 = j * c.sel_len, khi = min(c.S, u0 + c.sel_len);
    constexpr int N4 = 64 * (DK + DV) / 4; /* float4 sums of a block */
    constexpr int SLICE = (N4 + SEL_FUSED_REDUCE_SPLIT - 1) / SEL_FUSED_REDUCE_SPLIT;
    const int idx_end = min(N4, ((int)blockIdx.z + 1) * SLICE);
    for (int idx = blockIdx.z * SLICE + threadIdx.x; idx < idx_end; idx += blockDim.x) {
        const bool is_k = idx < 64 * DK / 4;
        const int D = is_k ? DK : DV, rel = (is_k ? idx : idx - 64 * DK / 4) * 4;
        const int r = rel / D, col = rel % D;
        if (u0 + r >= khi) continue;
        const float *part = (is_k ? f.part_k : f.part_v) +
                            ((size_t)bg * f.max_parts + first) * 64 * D + (size_t)r * D + col;
        float4 *to = (float4 *)((is_k ? f.acc_k : f.acc_v) + (((size_t)b * c.S + u0 + r) * c.G + g) * D + col);
        float4 a = *to;
#pragma unroll 4
        for (int p = 0; p < items; p++) {
            const float4 x = *(const float4 *)(part + (size_t)p * 64 * D);
            a.x += x.x, a.y += x.y, a.z += x.z, a.w += x.w;
        }
        *to = a;
    }
}

/* dk_out, dv_out = acc in bf16, eight values per thread. */
__global__ void selFusedFinishKernel(const float *acc_k, const float *acc_v, bf16 *dk_out,
                                     bf16 *dv_out, size_t n_k8, size_t n_v8) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_k8 + n_v8;
         i += (size_t)gridDim.x * blockDim.x) {
        const bool is_k = i < n_k8;
        const size_t at = (is_k ? i : i - n_k8) * 8;
        const float4 *src = (const float4 *)((is_k ? acc_k : acc_v) + at);
        const float4 x = src[0], y = src[1];
        uint4 out;
        out.x = fastPack(x.x, x.y);
        out.y = fastPack(x.z, x.w);
        out.z = fastPack(y.x, y.y);
        out.w = fastPack(y.z, y.w);
        *(uint4 *)((is_k ? dk_out : dv_out) + at) = out;
    }
}

FastSelFused fastSelFusedShape(const FastSelBlock &sb, int Ns, int slots, int hpg, int BG,
                               int sm_count) {
    FastSelFused f = {};
    const long long CT = (long long)sb.chunk_revs * FAST_REV_TOKENS;
    /* the chunk's stages at most (every token with all its slots) */
    const long long stages = (long long)BG * CT * slots * hpg / FAST_DKDV_ROWS;
    int per_stages = FAST_SEL_FUSED_STAGES;
    while (per_stages > FAST_SEL_FUSED_MIN_STAGES && (long long)per_stages * 4 * sm_count > stages)
        per_stages /= 2;
    f.item_tokens = per_stages * (FAST_DKDV_ROWS / hpg);
    const int per_item = f.item_tokens;
    /* sum_j ceil(n_j / P) <= Ns + (entries of one (b, g) in a chunk) / P;
     * the blocks with n_j > P have at most 2 n_j / P items */
    const long long span = (CT * slots + per_item - 1) / per_item;
    f.max_items = (int)(Ns + span);
    f.max_parts = (int)(2 * span + 1);
    return f;
}

template <int DK, int DV>
static cudaError_t selFusedBackward(const FastCtx &c, const FastBwdIo &io, const int32_t *sel_idx,
                                    const FastRevIndex &rev, const FastSelBlock &sb,
                                    const FastSelFused &f, bf16 *dk_out, bf16 *dv_out,
                                    const FastChunkHook *before_combine, const FastDrain *drain,
                                    cudaStream_t stream) {
    if (!c.wgmma || c.sel_len > 64) return cudaErrorInvalidValue; /* fastSelDesign's rule */
    const size_t keys = (size_t)c.B * c.S * c.G;
    cudaError_t e;
    if ((e = cudaMemsetAsync(f.acc_k, 0, keys * DK * sizeof(float), stream)) != cudaSuccess) return e;
    if ((e = cudaMemsetAsync(f.acc_v, 0, keys * DV * sizeof(float), stream)) != cudaSuccess) return e;
    const bool ring = fastSelRowRing(c.hpg); /* the fused kernel's row stages */
    constexpr int RWG = selFusedRowWgs<DK, DV>();
    auto kernel = ring ? selFusedBwdKernel<DK, DV, true, RWG> : selFusedBwdKernel<DK, DV, false, 1>;
    const int smem = ring ? selFusedSmem<DK, DV, true, RWG>() : selFusedSmem<DK, DV, false, 1>();
    const int threads = FAST_THREADS * (ring ? RWG : 1);
    if (!selBuffersValid(sb, drain)) return cudaErrorInvalidValue;
    SelFusedMaps maps[FAST_SEL_BLOCK_BUFFERS] = {};
    for (int i = 0; ring && i < sb.buffers; i++) {
        if ((e = fastDkdvRowMaps(c, io, DK, DV, true, &maps[i].rows)) != cudaSuccess) return e;
        if (c.hpg == 16) { /* the dq partials' way out (the kernel stores by TMA at hpg 16) */
            const size_t rows =
                (size_t)c.B * sb.chunk_revs * FAST_REV_TOKENS * c.G * c.slots * c.hpg;
            if ((e = fastTmaEncodeMatrix(c.tma_encode, &maps[i].part_dq,
                                         fastSelBlockBuffer(sb, i).part_dq, rows, DK, 16)) !=
                cudaSuccess)
                return e;
        }
    }
    if ((e = fastSetSmem(kernel, smem)) != cudaSuccess) return e;
    const int BG = c.B * c.G;
    selBlockPlanKernel<<<dim3(sb.nchunks, BG), 1024, 0, stream>>>(
        c, rev, sb, f.item_tokens, f.item_start, f.item_block, f.max_items, f.part_start);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    const int CT = sb.chunk_revs * FAST_REV_TOKENS, tpc = selCombineTokens(c.hpg, DK);
    for (int chunk = 0; chunk < sb.nchunks; chunk++) {
        const FastSelBlock at = fastSelBlockBuffer(sb, chunk);
        if ((e = fastDrainBeforePass(drain, chunk, stream)) != cudaSuccess) return e;
        kernel<<<dim3(f.max_items, BG), threads, smem, stream>>>(
            c, io, rev, at, f, chunk, maps[chunk % sb.buffers]);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        selFusedReduceKernel<DK, DV><<<dim3(c.Ns, BG, SEL_FUSED_REDUCE_SPLIT), 256, 0, stream>>>(
            c, f, chunk);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        cudaStream_t combine_stream;
        if ((e = fastDrainAfterPass(drain, chunk, stream, &combine_stream)) != cudaSuccess) return e;
        if (before_combine &&
            (e = before_combine->run(before_combine->ctx, chunk * CT, min(c.S, (chunk + 1) * CT),
                                     combine_stream)) != cudaSuccess)
            return e;
        selBlockDqCombineKernel<DK><<<dim3((CT + tpc - 1) / tpc, BG), 128, 0, combine_stream>>>(
            c, io, sel_idx, at, chunk, tpc);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        if ((e = fastDrainAfterCombine(drain, chunk)) != cudaSuccess) return e;
    }
    const size_t n_k8 = keys * DK / 8, n_v8 = keys * DV / 8;
    const size_t want = (n_k8 + n_v8 + 255) / 256;
    selFusedFinishKernel<<<(unsigned)(want < 65535u * 8u ? want : 65535u * 8u), 256, 0, stream>>>(
        f.acc_k, f.acc_v, dk_out, dv_out, n_k8, n_v8);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    return fastDrainEnd(drain, sb.nchunks, stream);
}

cudaError_t fastSelFusedBackward(const FastCtx &c, int dk, int dv, const FastBwdIo &io,
                                 const int32_t *sel_idx, const FastRevIndex &rev,
                                 const FastSelBlock &sb, const FastSelFused &f, bf16 *dk_out,
                                 bf16 *dv_out, const FastChunkHook *before_combine,
                                 const FastDrain *drain, cudaStream_t stream) {
    FAST_DISPATCH(dk, dv, selFusedBackward, c, io, sel_idx, rev, sb, f, dk_out, dv_out,
                  before_combine, drain, stream);
}
