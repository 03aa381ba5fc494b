/* tile_common.cuh - what the flash-attention tile loops of the fast
 * attention share: the query tile's shape (FastQTile), the dynamic shared
 * memory of each pass, tile loads, the walk over a branch's key tiles, the
 * warpgroups' turns at the tensor cores and the host side of a query-tile
 * launch. The loops themselves, one header per pass:
 *   tile_fwd.cuh          forward: kernel and main loops (wgmma, mma.sync)
 *   tile_fwd_epilogue.cuh   its epilogue (o, lse, the gate combine)
 *   tile_dq.cuh           dQ (several branches on the same query tiles):
 *                         kernel, main loops, epilogue
 *   tile_dkdv.cuh         dK/dV, which picks its main loop:
 *     tile_dkdv_cpasync.cuh  row stages by cp.async (mma.sync, and wgmma
 *                            passes of the selected branch at < 16 heads)
 *     tile_dkdv_ring.cuh     row stages through a TMA ring (wgmma)
 *     tile_dkdv_math.cuh     one row stage's products and the dK/dV store
 * They serve the window and compressed branches (fast_win.cu, fast_cmp.cu),
 * the masked dense selected branch (fast_sel_dense.cu) and, for dK/dV, the
 * selected branch (fast_sel.cu, fast_sel_block.cu). A branch supplies a
 * policy (fast_policy.cuh): which keys a tile of query tokens may see
 * (keyRange), the visibility rule (visible(t, u)) and, optionally, a
 * per-row tile mask (FastNoRowMask). Each loop has two forms: mma.sync
 * with ldmatrix (any sm_80+), and wgmma (WG, sm_90a; fast_wgmma.cuh), where
 * the forward and dQ are software-pipelined and read their key tiles
 * through a TMA ring (fast_tma.cuh), and dK/dV reads its query-side row
 * stages through one (fastDkdvRingCore; the mma.sync loops, and the
 * selected passes at fewer than 16 heads per group, use cp.async:
 * fastDkdvCore).
 * Warps own 16 mma rows (an m-tile) or two; the query-tile kernels
 * (forward, dQ) split their rows (FAST_QTILE_ROWS, the wgmma forward at
 * d_v > 64 FAST_FWD_WG_ROWS) as FastQTile says, the dK/dV core one
 * warpgroup (4 warps) per 64 keys (FastDkdvShape).
 *
 * Rows of a query tile are the heads of one KV group of consecutive tokens
 * (GQA packing: the K/V tile is loaded once for every head of the group).
 * Scores live in the log2 domain: s2 = scale*log2(e) q.k, so the softmax is
 * exp2(s2 - m2) and lse = (m2 + log2 l) ln 2. Rows that see nothing get
 * o = 0, lse = -INFINITY and zero gradients (never NaN). */
#ifndef NSA_FAST_TILE_COMMON_CUH
#define NSA_FAST_TILE_COMMON_CUH

#include <type_traits>
#include "fast_host.h"
#include "fast_common.cuh"
#include "fast_tma.cuh"

/* A policy (see the file comment) may also mask whole key tiles per row:
 * rowState(b, g, t) is loaded once per query row (t < 0: a padding row),
 * rowSees(row, u0) says whether the row may see the key tile starting at
 * u0 at all (the masked dense selected branch, fast_sel_dense.cu). Plain
 * policies inherit this one, which sees everything and costs nothing. */
struct FastNoRowMask {
    struct Row {};
    __device__ Row rowState(int, int, int) const { return Row{}; }
    __device__ bool rowSees(Row, int) const { return true; }
    /* Key tiles the forward and dQ loops take ahead of [kb, ke): tile i <
     * leadTiles covers keys [i KT, (i + 1) KT) (the forced selected blocks'
     * block 0, fast_policy.cuh); plain policies have none. */
    template <int KT>
    __device__ int leadTiles(int) const { return 0; }
    /* true only for a branch that is the whole selected branch (the masked
     * dense one): a dQ pass holding it forms every term of dq */
    static constexpr bool WHOLE_SELECTION = false;
};

/* The query-tile kernels (forward, dQ) hold FAST_QTILE_ROWS query rows per
 * CTA: 128 rows halve the K/V bytes each row pulls from L2 against 64 (the
 * compressed forward was L2-bound at 64 rows).
 * How the rows are split depends on the width D of the accumulator a warp
 * keeps (DV in the forward, DK in dQ):
 *  - D = 128: 4 warps of two 16-row m-tiles against 32-key tiles. Every
 *    K/V fragment read from shared memory then feeds two products; with
 *    one, ldmatrix traffic bounded the tile loop (an ldmatrix.x4 moves 512
 *    bytes, 4 cycles of the SM's shared-memory bandwidth, per two
 *    mma.sync: the loop stalled on shared-memory reads). The
 *    accumulators take the 255 registers, so 2 CTAs (8 warps) per SM.
 *  - D = 64: 8 warps of one m-tile against 64-key tiles. The accumulators
 *    are small enough for more warps per SM, which wins there over two
 *    m-tiles.
 *  - D = 192 (dQ with d_k = 192): one m-tile too; two would spill. */
#define FAST_QTILE_ROWS 128
/* With wgmma (WG) the tile is two warpgroups of 64 rows (8 warps, one
 * m-tile each; the forward at d_v > 64 three, FWD_ROWS) against 64-key
 * tiles: the tensor cores read both operands
 * of the scores from shared memory, so the ldmatrix bound above is gone.
 * CTAS: the CTAs per SM the registers are sized for. */
template <int D, bool WG = false>
struct FastQTile {
    static constexpr int MT = (!WG && D == 128) ? 2 : 1; /* m-tiles per warp */
    static constexpr int WARPS = FAST_QTILE_ROWS / (16 * MT);
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int KEYS = 64 / MT; /* keys per tile */
    static constexpr int PAD = WG ? 0 : 8; /* row padding of the shared tiles, bf16 */
    /* K/V stages of the mma.sync loops (the wgmma loops' TMA ring:
     * fastFwdStages, fastDqStages) */
    static constexpr int STAGES = 2;
    /* forward (D = DV) and dQ (D = DK); the pipelined wgmma loops hold a
     * score tile, its P fragments and the accumulator (plus dP in dQ):
     * more than the 128 registers two CTAs of 8 warps leave, except the
     * forward at D = 64 */
    static constexpr int FWD_CTAS = WG && D > 64 ? 1 : 2;
    /* the forward's rows per CTA: at one CTA per SM (D > 64 on wgmma)
     * FAST_FWD_WG_ROWS, as 64-row warpgroups - three share each K/V tile
     * and a CTA's start and epilogue (its q load, the gate combine) are
     * spread over more rows; the 138 registers of the loop allow 384
     * threads. Elsewhere FAST_QTILE_ROWS. */
    static constexpr int FWD_ROWS = WG && D > 64 ? FAST_FWD_WG_ROWS : FAST_QTILE_ROWS;
    static constexpr int FWD_THREADS = 32 * FWD_ROWS / (16 * MT);
    static constexpr bool DQ_PIPE = WG && D > 64;
    static constexpr int DQ_CTAS = D == 192 || (WG && D > 64) ? 1 : 2;
};
/* Key/value stages of the wgmma query-tile kernels: a TMA ring
 * (fast_tma.cuh) beside the query-side tiles (q; dQ also dout). */
template <int DK, int DV>
constexpr int fastFwdStages() {
    using Q = FastQTile<DV, true>;
    return fastRingStages<Q::KEYS, DK, DV>(Q::FWD_ROWS * DK * 2, Q::FWD_CTAS);
}
template <int DK, int DV>
constexpr int fastDqStages() {
    using Q = FastQTile<DK, true>;
    return fastRingStages<Q::KEYS, DK, DV>(FAST_QTILE_ROWS * (DK + DV) * 2, Q::DQ_CTAS);
}
/* Dynamic shared memory of the tile kernels; WG tiles are swizzled and
 * start 1024-byte aligned (fastTileBase), hence the slack. */
template <int DK, int DV, bool WG = false>
constexpr int fastFwdSmem() {
    using Q = FastQTile<DV, WG>;
    constexpr int KT = Q::KEYS, P = Q::PAD, ST = Q::STAGES;
    if constexpr (WG)
        return Q::FWD_ROWS * DK * 2 + FastKvRing<KT, DK, DV, fastFwdStages<DK, DV>()>::BYTES + 1024;
    return (FAST_QTILE_ROWS * (DK + P) + ST * KT * (DK + P) + ST * KT * (DV + P)) * 2;
}
template <int DK, int DV, bool WG = false>
constexpr int fastDqSmem() {
    using Q = FastQTile<DK, WG>;
    constexpr int KT = Q::KEYS, P = Q::PAD, ST = Q::STAGES;
    if constexpr (WG)
        return FAST_QTILE_ROWS * (DK + DV) * 2 +
               FastKvRing<KT, DK, DV, fastDqStages<DK, DV>()>::BYTES + 1024;
    return (FAST_QTILE_ROWS * ((DK + P) + (DV + P)) + ST * KT * (DK + P) + ST * KT * (DV + P)) * 2;
}

/* The tile kernels' dynamic shared memory, 1024-byte aligned for WG. */
template <bool WG>
__device__ __forceinline__ bf16 *fastTileBase() {
    extern __shared__ __align__(16) unsigned char fast_smem[];
    if (!WG) return (bf16 *)fast_smem;
    const uint32_t pad = (1024u - (fastSmemAddr(fast_smem) & 1023u)) & 1023u;
    return (bf16 *)(fast_smem + pad);
}
/* A padded (mma.sync) or swizzled (WG) tile load; see fastLoadTile. */
template <bool WG, int ROWS, int D, int THREADS = FAST_THREADS, class RowPtr>
__device__ __forceinline__ void fastLoadTileFor(bf16 *dst, RowPtr rowPtr) {
    if constexpr (WG) fastLoadTileSw<ROWS, D, THREADS>(dst, rowPtr);
    else fastLoadTile<ROWS, D, THREADS>(dst, rowPtr);
}
/* Starts the async copy of key tile [u0, u0 + KT) of k, v [B][nkeys][G][D]
 * into the stages sK, sV, rows from ke on zero-filled. */
template <bool WG, int KT, int DK, int DV, int THREADS>
__device__ __forceinline__ void fastLoadKeyTile(bf16 *sK, bf16 *sV, const bf16 *k, const bf16 *v,
                                                int nkeys, int G, int b, int g, int u0, int ke) {
    fastLoadTileFor<WG, KT, DK, THREADS>(sK, [&](int r) -> const bf16 * {
        int u = u0 + r;
        return u < ke ? k + (((size_t)b * nkeys + u) * G + g) * DK : nullptr;
    });
    fastLoadTileFor<WG, KT, DV, THREADS>(sV, [&](int r) -> const bf16 * {
        int u = u0 + r;
        return u < ke ? v + (((size_t)b * nkeys + u) * G + g) * DV : nullptr;
    });
}
/* The barrier after a cp.async wait: for WG the landed tiles are first
 * handed to the async proxy the tensor cores read through. */
template <bool WG>
__device__ __forceinline__ void fastTileBarrier() {
    if constexpr (WG) fastWgProxyFence();
    __syncthreads();
}
/* Query rows per dK/dV stage: whole tokens, computed as two 32-row halves
 * per barrier (registers hold a 16 x 32 score tile per warp). */
#define FAST_DKDV_ROWS 64
/* Rows per wgmma pass of the dK/dV core where d_k, d_v <= 128:
 * FAST_DKDV_WG_ROWS. */
/* Key warpgroups per dK/dV CTA of the window and compressed branches on
 * wgmma: two warpgroups of 64 keys each share every row stage (q, dout and
 * their row data), which halves the bytes each key pulls from L2; the
 * selected branch's CTAs hold one selection block (64 keys) and keep one. */
template <bool WG, int DK, int DV>
struct FastDkdvShape {
    /* warpgroups of 64 keys: at d_k = d_v = 64 one warpgroup's registers
     * leave three CTAs per SM, two warpgroups one, which is slower there.
     * (At d_k = 192, 64-key CTAs in two row warpgroups - FastDkdvRing's
     * RWG, four stages, as the fused selected backward runs there - were
     * slower than these 128-key CTAs on three shared stages.) */
    static constexpr int KWG = WG && DK + DV >= 256 ? FAST_DKDV_KEY_WGS : 1;
    static constexpr int KEYS = 64 * KWG, THREADS = FAST_THREADS * KWG;
};
constexpr int fastDkdvSmem(int dk, int dv, bool wg = false, int key_wgs = 1) {
    const int pad = wg ? 0 : 8;
    return (64 * key_wgs * (dk + pad) + 64 * key_wgs * (dv + pad) +
            2 * FAST_DKDV_ROWS * (dk + pad) + 2 * FAST_DKDV_ROWS * (dv + pad)) * 2 +
           2 * FAST_DKDV_ROWS * 4 * 4 + 4 * FAST_DKDV_ROWS * 4 + (wg ? 1024 : 0);
}

/* A branch's keys for the query tokens [t0, t_last]: [kb, ke) by its
 * policy, after the policy's lead tiles (leadTiles: none but for the forced
 * selected blocks' block 0); returns the KT-key tiles of both (0 for none),
 * tile it starting at key fastKeyTileAt<KT>(it, lead, kb). */
template <int KT, class Policy>
__device__ __forceinline__ int fastKeyTiles(const Policy &pol, int t0, int t_last, int &kb,
                                            int &ke, int &lead) {
    pol.keyRange(t0, t_last, kb, ke);
    const int in_range = ke > kb ? (ke - kb + KT - 1) / KT : 0;
    lead = in_range > 0 ? pol.template leadTiles<KT>(kb) : 0;
    return lead + in_range;
}
template <int KT>
__device__ __forceinline__ int fastKeyTileAt(int it, int lead, int kb) {
    return it < lead ? it * KT : kb + (it - lead) * KT;
}
/* The mma.sync query-tile loops' two key/value stages: issues tile it + 1
 * into the other stage, waits for tile it's copies and makes them visible
 * to the CTA; returns tile it's stage. */
template <class LoadKV>
__device__ __forceinline__ int fastSyncStage(int it, int ntiles, LoadKV &loadKV) {
    const int st = it & 1;
    if (it + 1 < ntiles) loadKV(it + 1, st ^ 1);
    fastCpCommit();
    fastCpWait<1>();
    __syncthreads();
    return st;
}
/* fastWgRun taking a turn (TURNS: FastTurns<WGS>): the warpgroup waits for
 * its turn before it issues, and hands the turn on before it waits for the
 * products. */
template <bool TURNS, int WGS, class Issue, class... Acc>
__device__ __forceinline__ void fastWgRunTurn(Issue issue, Acc &...accs) {
    (fastWgFenceAcc(accs), ...);
    if constexpr (TURNS) FastTurns<WGS>::wait();
    fastWgArrive();
    issue();
    fastWgCommit();
    if constexpr (TURNS) FastTurns<WGS>::pass();
    fastWgWait<0>();
    (fastWgFenceAcc(accs), ...);
}

/* Sets a kernel's dynamic shared memory limit (above 48 KB needs opt-in). */
template <class Kernel>
static inline cudaError_t fastSetSmem(Kernel kernel, int bytes) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

/* Enqueues a query-tile kernel (an instance of fastFwdKernel or
 * fastDqKernel, threads per CTA from its FastQTile) over `tokens` tokens of
 * every batch row (the forward's all, a dQ pass's t_end - t_begin): one CTA
 * per rows / hpg whole tokens of each (b, g). Returns the attribute or
 * launch status; never synchronises. */
template <class Kernel, class... Args>
static inline cudaError_t fastLaunchQTiles(Kernel kernel, int rows, int threads, int smem,
                                           int tokens, const FastCtx &c, cudaStream_t stream,
                                           Args... args) {
    cudaError_t e = fastSetSmem(kernel, smem);
    if (e != cudaSuccess) return e;
    const int tpc = rows / c.hpg;
    kernel<<<dim3((tokens + tpc - 1) / tpc, c.B * c.G), threads, smem, stream>>>(
        c, args...);
    return cudaGetLastError();
}

/* maps[i] = the TMA maps of branch i's keys and values (br.io.k, io.v, in
 * tiles of KEYS), in the branches' order. Host only; returns the first
 * encode error. */
template <int DK, int DV, int KEYS, class... Branches>
static inline cudaError_t fastTmaEncodeBranches(const FastCtx &c, FastKvMaps *maps,
                                                const Branches &...br) {
    cudaError_t e = cudaSuccess;
    int n = 0;
    ((e = e != cudaSuccess ? e
                           : fastTmaEncodeKv(c.tma_encode, &maps[n++], br.io.k, br.io.v, c.B,
                                             br.io.nkeys, c.G, DK, DV, KEYS)),
     ...);
    return e;
}

#endif
