/* tile_dq.cuh - the dQ pass of the flash tile loops (tile_common.cuh says
 * what they share): fastDqKernel runs a list of branches on the same query
 * tiles and dq registers (the window and compressed ones, and at short S the
 * masked dense selected one) - the wgmma main loop pipelined over a TMA ring
 * where d_k > 64 (fastDqMainloopWgmmaPipelined), one tile at a time at d_k =
 * 64 (fastDqMainloopWgmma), and the mma.sync loop (fastDqMainloopSync) -
 * then its epilogue, fastStoreDqRow, which the selected branch's other dQ
 * passes (fast_sel.cu, fast_sel_union.cu) share; its launcher. */
#ifndef NSA_FAST_TILE_DQ_CUH
#define NSA_FAST_TILE_DQ_CUH

#include "tile_common.cuh"

/* Writes row half i (0: mma row grp, 1: grp + 8) of a warp's dq fragments,
 * times the softmax scale, as io.dq_mode says: ACC dq_acc = dq, ACC_OUT
 * dq_out (bf16) = dq_acc + dq - the branches' fixed summation order - or,
 * where the pass ran every branch (ALL), dq_out = dq. ALL is a template
 * argument so that the passes of fewer branches keep their code (at d_k =
 * 64 a fourth runtime case made the mma.sync dQ kernel spill). */
template <int DK, bool ALL = false>
__device__ __forceinline__ void fastStoreDqRow(const FastCtx &c, const FastBwdIo &io, size_t row, int i,
                                               const float (&dq)[DK / 8][4]) {
    const int quad = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < DK / 8; n++) {
        int col = n * 8 + quad * 2;
        float v0 = dq[n][2 * i] * c.scale, v1 = dq[n][2 * i + 1] * c.scale;
        float2 *acc = (float2 *)(io.dq_acc + row * DK + col);
        if constexpr (ALL) {
            *(uint32_t *)(io.dq_out + row * DK + col) = fastPack(v0, v1);
        } else if (io.dq_mode == FastDqMode::ACC) {
            *acc = make_float2(v0, v1);
        } else {
            float2 prev = *acc;
            *(uint32_t *)(io.dq_out + row * DK + col) = fastPack(prev.x + v0, prev.y + v1);
        }
    }
}

/* The dQ pass's main loop on wgmma where d_k > 64, software-pipelined as
 * the forward's (fastFwdMainloopWgmma): tile it issues its scores and dP,
 * then dS.K of tile it-1, and computes its dS while that runs. One
 * branch's ntiles key tiles, the ring's tiles ring_base on; dq the warp's
 * accumulator, dsTile and produce the kernel's. */
template <int DK, int DV, int KT, int R, int MT, bool TURNS, int WGS, class Ring, class DsTile,
          class Produce>
__device__ __forceinline__ void fastDqMainloopWgmmaPipelined(const Ring &ring, int ring_base,
                                                             int ntiles, bf16 *sQ, bf16 *sdO,
                                                             int wg_row0,
                                                             float (&dq)[MT][DK / 8][4],
                                                             DsTile &dsTile, Produce &produce) {
    constexpr bool WG = true;
    constexpr int NT = KT / 8;
    using Turns = FastTurns<WGS>;
if (ntiles > 0) {
    float s[NT][4], dp[NT][4];
    uint32_t a[NT / 2][4];
    const int j0 = ring_base;
    fastCpWait<0>();
    fastTileBarrier<WG>(); /* q and dout landed */
    ring.wait(j0);
    fastWgRunTurn<TURNS, WGS>(
        [&] {
            fastWgIssueAZt<NT, DK>(s, sQ, R, wg_row0, ring.k(j0), KT, 0);
            fastWgIssueAZt<NT, DV>(dp, sdO, R, wg_row0, ring.v(j0), KT, 0);
        },
        s, dp);
    dsTile(s, dp, 0, 0);
    fastWgAFromC<NT>(a, s);
    for (int it = 1; it < ntiles; it++) {
        const int j = j0 + it;
        ring.wait(j);
        if constexpr (TURNS) Turns::wait();
        fastWgArrive();
        fastWgIssueAZt<NT, DK>(s, sQ, R, wg_row0, ring.k(j), KT, 0);
        fastWgIssueAZt<NT, DV>(dp, sdO, R, wg_row0, ring.v(j), KT, 0);
        fastWgCommit();
        fastWgFenceAcc(dq[0]);
        fastWgArrive();
        fastWgIssuePZ<NT, DK>(dq[0], a, ring.k(j - 1), KT, 0);
        fastWgCommit();
        if constexpr (TURNS) Turns::pass();
        produce(it + Ring::AHEAD);
        fastWgWait<1>(); /* scores and dP of tile it */
        fastWgFenceAcc(s);
        fastWgFenceAcc(dp);
        dsTile(s, dp, 0, it);
        fastWgWait<0>(); /* dS.K of tile it-1: its A registers are free */
        fastWgFenceAcc(dq[0]);
        ring.release(j - 1);
        fastWgAFromC<NT>(a, s);
    }
    fastWgRunTurn<TURNS, WGS>(
        [&] { fastWgIssuePZ<NT, DK>(dq[0], a, ring.k(j0 + ntiles - 1), KT, 0); }, dq[0]);
    ring.release(j0 + ntiles - 1); /* the next branch reuses its stage */
}
}

/* The dQ pass's main loop on wgmma at d_k = 64, one tile at a time: the
 * pipeline's registers would cost the second CTA per SM, which is faster
 * there. Tiles through the TMA ring, released as soon as dS.K is done.
 * Arguments as fastDqMainloopWgmmaPipelined's. */
template <int DK, int DV, int KT, int R, int MT, class Ring, class DsTile, class Produce>
__device__ __forceinline__ void fastDqMainloopWgmma(const Ring &ring, int ring_base, int ntiles,
                                                    bf16 *sQ, bf16 *sdO, int wg_row0,
                                                    float (&dq)[MT][DK / 8][4], DsTile &dsTile,
                                                    Produce &produce) {
    constexpr bool WG = true;
    constexpr int NT = KT / 8;
if (ntiles > 0) {
    fastCpWait<0>();
    fastTileBarrier<WG>(); /* q and dout landed */
}
for (int it = 0; it < ntiles; it++) {
    if (it > 0) produce(it + Ring::AHEAD);
    const int j = ring_base + it;
    ring.wait(j);
    float s[NT][4], dp[NT][4];
    fastWgRun(
        [&] {
            fastWgIssueAZt<NT, DK>(s, sQ, R, wg_row0, ring.k(j), KT, 0);
            fastWgIssueAZt<NT, DV>(dp, sdO, R, wg_row0, ring.v(j), KT, 0);
        },
        s, dp);
    dsTile(s, dp, 0, it);
    uint32_t a[NT / 2][4];
    fastWgAFromC<NT>(a, s);
    fastWgRun([&] { fastWgIssuePZ<NT, DK>(dq[0], a, ring.k(j), KT, 0); }, dq[0]);
    ring.release(j);
}
}

/* The dQ pass's main loop on mma.sync, one tile at a time through two
 * cp.async stages (loadKV fills one), a CTA barrier per tile; dq the warp's
 * accumulators, dsTile the kernel's. */
template <int DK, int DV, int KT, int MT, int LDK, int LDV, class LoadKV, class DsTile>
__device__ __forceinline__ void fastDqMainloopSync(int ntiles, LoadKV &loadKV, bf16 *sK, bf16 *sV,
                                                   bf16 *sQ, bf16 *sdO, int row0,
                                                   float (&dq)[MT][DK / 8][4], DsTile &dsTile) {
    constexpr int NT = KT / 8;
for (int it = 0; it < ntiles; it++) {
    const int st = fastSyncStage(it, ntiles, loadKV);
    const bf16 *k_t = sK + st * KT * LDK, *v_t = sV + st * KT * LDV;
    float s[MT][NT][4], dp[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[mt][n][e] = dp[mt][n][e] = 0.f;
    fastMmaAZtM<MT, NT, DK>(s, sQ, LDK, row0, k_t, LDK);
    fastMmaAZtM<MT, NT, DV>(dp, sdO, LDV, row0, v_t, LDV);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) dsTile(s[mt], dp[mt], mt, it);
    fastMmaPZM<MT, NT, DK>(dq, s, k_t, LDK);
    __syncthreads();
}
}

/* dQ of one tile of FAST_QTILE_ROWS query rows, recomputing P from the
 * saved lse:
 *   dP = dO_c.V^T with dO_c = g_c dout;  dS = P (dP - delta_c), delta_c = g_c dout.o_c;
 *   dq = scale dS.K, summed into the running dq of the branches (io.dq_mode).
 * io gives the rows (q, dout) and where dq goes; each of the branches (a
 * FastDqBranch: keys, lse, policy) runs its tile loop in turn on the same
 * q / dout tiles and dq registers - the window and compressed branches
 * share one pass this way (one load of the rows and one dq round trip
 * less). */
/* CTAs per SM the registers are sized for: two m-tiles (DK = 128) need
 * 255 registers, 2 CTAs of 4 warps; DK = 64 fits 2 CTAs of 8 warps in
 * 128 (faster than one CTA at 208 registers); DK = 192 needs 1 CTA of 8
 * warps at up to 255. */
template <class P>
struct FastDqBranch {
    using Policy = P;
    using Row = typename Policy::Row;
    FastBwdIo io; /* the branch's k, v, nkeys, lse and index into dsum / gates */
    Policy pol;
};
/* wgmma: each branch's io.k, io.v as TMA maps, in the branches' order
 * (fastLaunchDq fills them); three where the masked dense selected dQ
 * joins the window and compressed ones (fastWinCmpDq) */
#define FAST_DQ_MAX_BRANCHES 3
struct FastDqMaps {
    FastKvMaps br[FAST_DQ_MAX_BRANCHES];
    /* the pass's tokens [t_begin, t_end) of every batch row: all, or one
     * chunk of the fused selected backward's (fastWinCmpDq). Here rather
     * than in FastBwdIo, which every backward kernel takes by value: grown,
     * it changed the others' register allocation (spills at d = 64 on
     * mma.sync). */
    int t_begin, t_end;
};
/* dq of one query tile (grid: tiles of R / hpg tokens from t_begin x B*G; the rows are the heads
 * of group g), over the branches c in order: dq = scale sum_c dS_c.K_c,
 * dS_c = g_c P_c (dout.V_c^T - dout.o_c), P_c = exp(s - lse_c) over the keys the branch's policy
 * makes visible; stored as io.dq_mode says (fastStoreDqRow). */
template <int DK, int DV, bool WG, class... Branches>
__global__ void __launch_bounds__(FastQTile<DK, WG>::THREADS, FastQTile<DK, WG>::DQ_CTAS)
fastDqKernel(FastCtx c, FastBwdIo io, const __grid_constant__ FastDqMaps maps, Branches... br) {
    static_assert(sizeof...(Branches) <= FAST_DQ_MAX_BRANCHES, "FastDqMaps holds the branches");
    /* every branch in this pass (the masked dense selected dQ joins the
     * window and compressed ones): dq goes out as it is (fastStoreDqRow).
     * A third branch of the forced selected blocks leaves the rest of the
     * selected dq to the fused backward's combine. */
    constexpr bool ALL = (Branches::Policy::WHOLE_SELECTION || ...);
    using Q = FastQTile<DK, WG>;
    constexpr int MT = Q::MT, KT = Q::KEYS, NT = KT / 8;
    constexpr int LDK = DK + Q::PAD, LDV = DV + Q::PAD, R = FAST_QTILE_ROWS, THREADS = Q::THREADS;
    /* the pipelined pass's two warpgroups take turns at issuing their
     * products (FastTurns) */
    constexpr bool TURNS = Q::DQ_PIPE;
    constexpr int WGS = THREADS >= 256 ? THREADS / 128 : 2;
    using Turns = FastTurns<WGS>;
    bf16 *sQ = fastTileBase<WG>(), *sdO = sQ + R * LDK, *sK = sdO + R * LDV,
         *sV = sK + Q::STAGES * KT * LDK;
    using Ring = FastKvRing<KT, DK, DV, fastDqStages<DK, DV>()>;
    const Ring ring = Ring::at(sK); /* WG: the key/value tiles (sK, sV unused) */
    int ring_base = 0; /* WG: the ring's index of the branch's first tile */
    int branch_no = 0; /* the branch's place in br (its maps) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 2, quad = lane & 3;
    const int b = blockIdx.y / c.G, g = blockIdx.y % c.G;
    /* the pass's tokens (a pass of all three branches runs every token:
     * there a runtime range cost the short-S kernels registers and time) */
    const int t_begin = ALL ? 0 : maps.t_begin, t_end = ALL ? c.S : maps.t_end;
    const int tpc = R / c.hpg, t0 = t_begin + blockIdx.x * tpc, t_last = min(t_end, t0 + tpc) - 1;
    auto rowToken = [&](int r) {
        int tok = t0 + r / c.hpg;
        return (r < tpc * c.hpg && tok < t_end) ? tok : -1;
    };
    auto rowIndex = [&](int r) -> size_t {
        return ((size_t)b * c.S + t0 + r / c.hpg) * c.H + (size_t)g * c.hpg + r % c.hpg;
    };
    fastLoadTileFor<WG, R, DK, THREADS>(sQ, [&](int r) -> const bf16 * {
        return rowToken(r) >= 0 ? io.q + rowIndex(r) * DK : nullptr;
    });
    fastLoadTileFor<WG, R, DV, THREADS>(sdO, [&](int r) -> const bf16 * {
        return rowToken(r) >= 0 ? io.dout + rowIndex(r) * DV : nullptr;
    });
    if (!ALL && io.dq_mode != FastDqMode::ACC) {
        /* the epilogue adds to this tile's running dq (dq_acc, fp32): its
         * rows toward L2 now, so that the epilogue - at one CTA per SM
         * nothing overlaps it - reads them from L2 rather than DRAM */
        constexpr int LINES = DK * 4 / 128; /* 128-byte lines per row */
        for (int i = threadIdx.x; i < R * LINES; i += THREADS) {
            const int r = i / LINES;
            if (rowToken(r) >= 0) fastPrefetchL2(io.dq_acc + rowIndex(r) * DK + (i % LINES) * 32);
        }
    }
    if constexpr (WG) {
        fastCpCommit(); /* q, dout */
        if (threadIdx.x == 0) ring.init(Q::WARPS);
        __syncthreads(); /* the ring's barriers are initialised */
    }
    const int row0 = warp * 16 * MT, wg_row0 = (warp >> 2) * 64;
    float dq[MT][DK / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < DK / 8; n++) dq[mt][n][0] = dq[mt][n][1] = dq[mt][n][2] = dq[mt][n][3] = 0.f;
    /* one branch's keys: the tile loop over its key range, dq accumulating
     * over the branches in their order */
    auto runBranch = [&](const auto &branch) {
        const FastBwdIo &bio = branch.io;
        const auto &pol = branch.pol;
        using Row = typename std::decay_t<decltype(branch)>::Row;
        int kb, ke, lead;
        const int ntiles = fastKeyTiles<KT>(pol, t0, t_last, kb, ke, lead);
        auto keyAt = [&](int it) { return fastKeyTileAt<KT>(it, lead, kb); };
        auto loadKV = [&](int it, int st) {
            fastLoadKeyTile<WG, KT, DK, DV, THREADS>(sK + st * KT * LDK, sV + st * KT * LDV, bio.k,
                                                     bio.v, bio.nkeys, c.G, b, g, keyAt(it), ke);
        };
        /* WG: tile it of this branch is the ring's tile ring_base + it */
        auto produce = [&](int it) {
            if (threadIdx.x == 0 && it < ntiles)
                ring.produce(maps.br[branch_no], ring_base + it, b, g, keyAt(it));
        };
        if constexpr (WG) {
            for (int j = 0; j <= Ring::AHEAD; j++) produce(j);
        } else {
            __syncthreads(); /* the last branch's stages are free */
            if (ntiles > 0) loadKV(0, 0);
            fastCpCommit();
        }

        int tok[MT][2];
        float lse2[MT][2], dsum[MT][2], gate[MT][2];
        Row rows[MT][2];
    #pragma unroll
        for (int mt = 0; mt < MT; mt++) {
    #pragma unroll
            for (int i = 0; i < 2; i++) {
                int r = row0 + 16 * mt + grp + 8 * i;
                tok[mt][i] = rowToken(r);
                rows[mt][i] = pol.rowState(b, g, tok[mt][i]);
                lse2[mt][i] = dsum[mt][i] = gate[mt][i] = 0.f;
                if (tok[mt][i] >= 0) {
                    size_t row = rowIndex(r);
                    float lse = bio.lse[row];
                    if (lse == -INFINITY) tok[mt][i] = -1; /* sees nothing: no gradient */
                    else lse2[mt][i] = lse * FAST_LOG2E;
                    dsum[mt][i] = bio.dsum[row * 3 + bio.branch];
                    gate[mt][i] = __bfloat162float(bio.gates[row * 3 + bio.branch]);
                }
            }
        }

        /* m-tile mt of tile it: s (scores) becomes dS = g P (dP - delta),
         * in two instances chosen once per tile - interior tiles (every row
         * sees every key) test no key. Left to the compiler, one loop with a
         * per-element `full ||` test was split in two in some builds and
         * not in others (not once a token range was added to the pass,
         * which then ran far slower). */
        auto dsTile = [&](float (&si)[NT][4], const float (&dpi)[NT][4], int mt, int it) {
            const int u0 = keyAt(it);
            const bool full = u0 + KT <= ke && pol.allVisible(t0, t_last, u0, u0 + KT - 1);
            const bool sees[2] = {pol.rowSees(rows[mt][0], u0), pol.rowSees(rows[mt][1], u0)};
            auto run = [&](auto is_full) {
                constexpr bool FULL = decltype(is_full)::value;
    #pragma unroll
                for (int n = 0; n < NT; n++) {
    #pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int u = u0 + n * 8 + quad * 2 + (e & 1);
                        int i = e >> 1, t = tok[mt][i];
                        /* a row that sees nothing (t < 0) stays masked even in a full tile */
                        bool ok = t >= 0 && (FULL || (u < ke && pol.visible(t, u))) && sees[i];
                        float p = ok ? fastExp2(si[n][e] * c.scale_log2 - lse2[mt][i]) : 0.f;
                        si[n][e] = gate[mt][i] * p * (dpi[n][e] - dsum[mt][i]);
                    }
                }
            };
            if (full) run(std::true_type{});
            else run(std::false_type{});
        };
        if constexpr (Q::DQ_PIPE)
            fastDqMainloopWgmmaPipelined<DK, DV, KT, R, MT, TURNS, WGS>(
                ring, ring_base, ntiles, sQ, sdO, wg_row0, dq, dsTile, produce);
        else if constexpr (WG)
            fastDqMainloopWgmma<DK, DV, KT, R, MT>(ring, ring_base, ntiles, sQ, sdO, wg_row0, dq,
                                                   dsTile, produce);
        else
            fastDqMainloopSync<DK, DV, KT, MT, LDK, LDV>(ntiles, loadKV, sK, sV, sQ, sdO, row0, dq,
                                                         dsTile);
        fastCpWait<0>();
        if constexpr (WG) ring_base += ntiles;
        branch_no++;
    };
    if constexpr (TURNS) Turns::begin();
    (runBranch(br), ...);
    if constexpr (TURNS) Turns::end();
    fastCpWait<0>();

#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int r = row0 + 16 * mt + grp + 8 * i;
            if (rowToken(r) < 0) continue;
            fastStoreDqRow<DK, ALL>(c, io, rowIndex(r), i, dq[mt]);
        }
    }
}

/* The dQ tile kernel over one or more branches (FastDqBranch, run in
 * order) for the tokens [t_begin, t_end) of every batch row. Returns
 * cudaErrorInvalidValue for an empty or out-of-range token range, else the
 * encode, attribute or launch status; never synchronises. */
template <int DK, int DV, class... Branches>
static inline cudaError_t fastLaunchDq(const FastCtx &c, const FastBwdIo &io, int t_begin,
                                       int t_end, cudaStream_t stream, Branches... br) {
    if (t_begin < 0 || t_end <= t_begin || t_end > c.S) return cudaErrorInvalidValue;
    FastDqMaps maps = {};
    maps.t_begin = t_begin;
    maps.t_end = t_end;
    if (c.wgmma) {
        cudaError_t e =
            fastTmaEncodeBranches<DK, DV, FastQTile<DK, true>::KEYS>(c, maps.br, br...);
        if (e != cudaSuccess) return e;
        return fastLaunchQTiles(fastDqKernel<DK, DV, true, Branches...>, FAST_QTILE_ROWS,
                                FastQTile<DK, true>::THREADS, fastDqSmem<DK, DV, true>(),
                                t_end - t_begin, c, stream, io, maps, br...);
    }
    return fastLaunchQTiles(fastDqKernel<DK, DV, false, Branches...>, FAST_QTILE_ROWS,
                            FastQTile<DK>::THREADS, fastDqSmem<DK, DV>(), t_end - t_begin, c,
                            stream, io, maps, br...);
}
template <class Policy>
static inline FastDqBranch<Policy> fastDqBranch(const FastBwdIo &io, Policy pol) {
    return FastDqBranch<Policy>{io, pol};
}

#endif
