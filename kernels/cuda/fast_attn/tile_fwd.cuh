/* tile_fwd.cuh - the forward pass of the flash tile loops (tile_common.cuh
 * says what they share): fastFwdKernel runs one or more branches on each
 * query tile - the wgmma main loop (fastFwdMainloopWgmma) software-
 * pipelined over a TMA ring of key tiles, the mma.sync one
 * (fastFwdMainloopSync) over two cp.async stages - and ends each branch
 * with the epilogue (tile_fwd_epilogue.cuh: o, lse and, after the last
 * branch, the gate combine); its launchers. Used by the compressed and window forwards, the masked dense
 * selected forward and the forced selected blocks' pass. */
#ifndef NSA_FAST_TILE_FWD_CUH
#define NSA_FAST_TILE_FWD_CUH

#include "tile_common.cuh"
#include "tile_fwd_epilogue.cuh"

/* One branch of a forward pass: its keys, values, o and lse (io.k, io.v,
 * io.nkeys, io.o, io.lse) and which keys a row sees (the policy). */
template <class Policy>
struct FastFwdBranch {
    FastFwdIo io;
    Policy pol;
};
/* wgmma: each branch's io.k, io.v as TMA maps, in the branches' order */
#define FAST_FWD_MAX_BRANCHES 2
struct FastFwdMaps {
    FastKvMaps br[FAST_FWD_MAX_BRANCHES];
};
/* Calls f(branch, is_last) for each branch in order, is_last a
 * std::bool_constant (the last branch's epilogue may use the q tile). */
template <class F, class First, class... Rest>
__device__ __forceinline__ void fastEachBranch(F &f, const First &first, const Rest &...rest) {
    f(first, std::bool_constant<sizeof...(Rest) == 0>{});
    if constexpr (sizeof...(Rest) > 0) fastEachBranch(f, rest...);
}

/* The forward's main loop on wgmma, software-pipelined (FlashAttention-3's
 * intra-warpgroup overlap): tile it issues its scores, then P.V of tile it-1, and computes its
 * exponentials while that P.V runs on the tensor cores. Nothing is
 * in flight across iterations (the compiler would serialise the
 * products otherwise, C7515). Tiles come through the TMA ring: a
 * warp waits for tile it and releases tile it-1 (its V was the last
 * read) - no barrier across the CTA in the loop.
 * One branch's ntiles key tiles, the ring's tiles ring_base on; m, l, o
 * the warp's softmax state; maskTile and keyAt the kernel's. */
template <int DK, int DV, int KT, int R, int MT, bool TURNS, int WGS, bool LAST, class Ring,
          class MaskTile, class KeyAt>
__device__ __forceinline__ void fastFwdMainloopWgmma(const Ring &ring, const FastFwdMaps &maps,
                                                     int branch_no, int ring_base, int ntiles,
                                                     int b, int g, bf16 *sQ, int wg_row0,
                                                     float (&m)[MT][2], float (&l)[MT][2],
                                                     float (&o)[MT][DV / 8][4], MaskTile &maskTile,
                                                     KeyAt &keyAt) {
    constexpr bool WG = true;
    constexpr int NT = KT / 8;
    using Turns = FastTurns<WGS>;
    if (ntiles > 0) {
        float s[NT][4], corr[2];
        uint32_t a[NT / 2][4];
        auto scoresToP = [&](int it) { /* s: scores of tile it -> P, corr */
            float mx[2];
            maskTile(s, 0, it, mx);
            fastSoftmaxScores<NT>(s, mx, m[0], l[0], corr);
        };
        const int j0 = ring_base;
        fastCpWait<0>();
        fastTileBarrier<WG>(); /* q landed */
        ring.wait(j0);
        fastWgRunTurn<TURNS, WGS>(
            [&] { fastWgIssueAZt<NT, DK>(s, sQ, R, wg_row0, ring.k(j0), KT, 0); }, s);
        scoresToP(0); /* o is 0: no rescale */
        fastWgAFromC<NT>(a, s);
        auto produce = [&](int it) {
            if (threadIdx.x == 0 && it + Ring::AHEAD < ntiles)
                ring.produce(maps.br[branch_no], j0 + it + Ring::AHEAD, b, g,
                             keyAt(it + Ring::AHEAD));
        };
        for (int it = 1; it < ntiles; it++) {
            ring.wait(j0 + it);
            if constexpr (TURNS) Turns::wait();
            fastWgArrive();
            fastWgIssueAZt<NT, DK>(s, sQ, R, wg_row0, ring.k(j0 + it), KT, 0);
            fastWgCommit();
            fastRescaleRows<DV>(o[0], corr); /* by tile it-1's max */
            fastWgFenceAcc(o[0]);
            fastWgArrive();
            fastWgIssuePZ<NT, DV>(o[0], a, ring.v(j0 + it - 1), KT, 0);
            fastWgCommit();
            if constexpr (TURNS) Turns::pass();
            produce(it);
            fastWgWait<1>(); /* scores of tile it */
            fastWgFenceAcc(s);
            scoresToP(it);
            fastWgWait<0>(); /* P.V of tile it-1 */
            fastWgFenceAcc(o[0]);
            ring.release(j0 + it - 1);
            fastWgAFromC<NT>(a, s);
        }
        fastRescaleRows<DV>(o[0], corr);
        fastWgRunTurn<TURNS, WGS>(
            [&] { fastWgIssuePZ<NT, DV>(o[0], a, ring.v(j0 + ntiles - 1), KT, 0); }, o[0]);
        if constexpr (!LAST) ring.release(j0 + ntiles - 1); /* the next branch reuses it */
    }
}

/* The forward's main loop on mma.sync for one branch: its ntiles key tiles
 * through two cp.async stages (loadKV fills one), a CTA barrier per tile;
 * m, l, o the warp's softmax state, maskTile the kernel's. */
template <int DK, int DV, int KT, int MT, int LDK, int LDV, class LoadKV, class MaskTile>
__device__ __forceinline__ void fastFwdMainloopSync(int ntiles, LoadKV &loadKV, bf16 *sK, bf16 *sV,
                                                    bf16 *sQ, int row0, float (&m)[MT][2],
                                                    float (&l)[MT][2], float (&o)[MT][DV / 8][4],
                                                    MaskTile &maskTile) {
    constexpr int NT = KT / 8;
    for (int it = 0; it < ntiles; it++) {
        const int st = fastSyncStage(it, ntiles, loadKV);
        const bf16 *k_t = sK + st * KT * LDK, *v_t = sV + st * KT * LDV;
        float s[MT][NT][4];
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int n = 0; n < NT; n++)
                s[i][n][0] = s[i][n][1] = s[i][n][2] = s[i][n][3] = 0.f;
        /* q fragments are re-read from shared memory per tile: holding
         * them (MT * DK / 4 registers) would spill */
        fastMmaAZtM<MT, NT, DK>(s, sQ, LDK, row0, k_t, LDK);
#pragma unroll
        for (int i = 0; i < MT; i++) {
            float mx[2];
            maskTile(s[i], i, it, mx);
            fastSoftmaxStep<NT, DV>(s[i], mx, m[i], l[i], o[i]);
        }
        fastMmaPZM<MT, NT, DV>(o, s, v_t, LDV);
        __syncthreads();
    }
}

/* Forward of one tile of FWD_ROWS query rows (FastQTile), per branch in
 * turn on the same q tile: o = softmax(scale q.K^T) V over the keys
 * [kb, ke) of the branch's policy, visible(t, u) masking per row; the
 * branch's o and lse out, and after the last branch the gate combine when
 * COMBINE (io: q, and o_cmp, o_sel, gates, out; an o_sel that an earlier
 * branch of this pass wrote is read back from L2). Two branches: the
 * masked dense selected forward and the window forward at short S share
 * the q tile and the launch.
 * Grid (ceil(S / tokens_per_tile), B*G), FastQTile<DV>::FWD_THREADS threads. */
/* Two CTAs per SM: with one m-tile per warp that holds the kernel to 128
 * registers (the latency-bound loop gains more from a second CTA than from
 * registers); two m-tiles need all 255 and get 2 x 4 warps. */
template <int DK, int DV, bool COMBINE, bool WG, class... Branches>
__global__ void __launch_bounds__(FastQTile<DV, WG>::FWD_THREADS, FastQTile<DV, WG>::FWD_CTAS)
fastFwdKernel(FastCtx c, FastFwdIo io, const __grid_constant__ FastFwdMaps maps, Branches... br) {
    static_assert(sizeof...(Branches) >= 1 && sizeof...(Branches) <= FAST_FWD_MAX_BRANCHES,
                  "FastFwdMaps holds the branches");
    using Q = FastQTile<DV, WG>;
    constexpr int MT = Q::MT, KT = Q::KEYS, NT = KT / 8;
    constexpr int LDK = DK + Q::PAD, LDV = DV + Q::PAD, R = Q::FWD_ROWS, THREADS = Q::FWD_THREADS;
    /* the warpgroups take turns at issuing their products (FastTurns) where
     * d_k > 128; at d_k = 128 the score products are shorter against the
     * same exponentials and turns cost more than they save */
    constexpr bool TURNS = WG && DV > 64 && DK > 128;
    constexpr int WGS = THREADS >= 256 ? THREADS / 128 : 2;
    using Turns = FastTurns<WGS>;
    bf16 *sQ = fastTileBase<WG>(), *sK = sQ + R * LDK, *sV = sK + Q::STAGES * KT * LDK;
    using Ring = FastKvRing<KT, DK, DV, fastFwdStages<DK, DV>()>;
    const Ring ring = Ring::at(sK); /* WG: the key/value tiles (sK, sV unused) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 2, quad = lane & 3;
    const int b = blockIdx.y / c.G, g = blockIdx.y % c.G;
    const int tpc = R / c.hpg, t0 = blockIdx.x * tpc, t_last = min(c.S, t0 + tpc) - 1;
    auto rowToken = [&](int r) {
        int tok = t0 + r / c.hpg;
        return (r < tpc * c.hpg && tok < c.S) ? tok : -1;
    };
    auto rowIndex = [&](int r) -> size_t {
        return ((size_t)b * c.S + t0 + r / c.hpg) * c.H + (size_t)g * c.hpg + r % c.hpg;
    };
    fastLoadTileFor<WG, R, DK, THREADS>(sQ, [&](int r) -> const bf16 * {
        return rowToken(r) >= 0 ? io.q + rowIndex(r) * DK : nullptr;
    });
    if constexpr (COMBINE) {
        /* the gate combine's o_cmp, o_sel and gate rows toward L2 now, so
         * the epilogue - which nothing else on the SM overlaps at one CTA
         * per SM - reads them from L2 rather than DRAM */
        constexpr int LINES = DV * 2 / 128; /* 128-byte lines per output row */
        for (int i = threadIdx.x; i < R * LINES; i += THREADS) {
            const int r = i / LINES, part = i % LINES;
            if (rowToken(r) < 0) continue;
            const size_t row = rowIndex(r);
            fastPrefetchL2(io.o_cmp + row * DV + part * 64);
            /* (an o_sel of this pass is written later, and read from L2) */
            if (sizeof...(Branches) == 1) fastPrefetchL2(io.o_sel + row * DV + part * 64);
            if (part == 0 && r % c.hpg == 0) fastPrefetchL2(io.gates + row * 3);
        }
    }
    if constexpr (WG) {
        fastCpCommit(); /* q */
        if (threadIdx.x == 0) ring.init(THREADS / 32);
        __syncthreads(); /* the ring's barriers are initialised */
    }
    int ring_base = 0; /* WG: the ring's index of the branch's first tile */
    int branch_no = 0; /* the branch's place in br (its maps) */
    auto runBranch = [&](const auto &branch, auto is_last) {
        constexpr bool LAST = decltype(is_last)::value;
        const FastFwdIo &bio = branch.io;
        const auto &pol = branch.pol;
        using Policy = std::decay_t<decltype(pol)>;
        int kb, ke, lead;
        const int ntiles = fastKeyTiles<KT>(pol, t0, t_last, kb, ke, lead);
        auto keyAt = [&](int it) { return fastKeyTileAt<KT>(it, lead, kb); };
        auto loadKV = [&](int it, int st) {
            fastLoadKeyTile<WG, KT, DK, DV, THREADS>(sK + st * KT * LDK, sV + st * KT * LDV, bio.k,
                                                     bio.v, bio.nkeys, c.G, b, g, keyAt(it), ke);
        };
        if constexpr (WG) {
            if (threadIdx.x == 0)
                for (int j = 0; j <= Ring::AHEAD && j < ntiles; j++)
                    ring.produce(maps.br[branch_no], ring_base + j, b, g, keyAt(j));
        } else {
            if (branch_no > 0) __syncthreads(); /* the last branch's stages are free */
            if (ntiles > 0) loadKV(0, 0);
            fastCpCommit();
        }

        /* m-tile i of the warp holds rows row0 + 16i + grp (+ 8); with WG the
         * warpgroup of the warp owns rows wg_row0 .. wg_row0 + 63 */
        [[maybe_unused]] const int wg_row0 = (warp >> 2) * 64;
        const int row0 = warp * 16 * MT;
        int tok[MT][2];
        float m[MT][2], l[MT][2];
        float o[MT][DV / 8][4];
        typename Policy::Row rows[MT][2];
#pragma unroll
        for (int i = 0; i < MT; i++) {
            tok[i][0] = rowToken(row0 + 16 * i + grp);
            tok[i][1] = rowToken(row0 + 16 * i + grp + 8);
            rows[i][0] = pol.rowState(b, g, tok[i][0]);
            rows[i][1] = pol.rowState(b, g, tok[i][1]);
            m[i][0] = m[i][1] = -INFINITY;
            l[i][0] = l[i][1] = 0.f;
#pragma unroll
            for (int n = 0; n < DV / 8; n++)
                o[i][n][0] = o[i][n][1] = o[i][n][2] = o[i][n][3] = 0.f;
        }
        /* scores of m-tile i of tile it to the log2 domain, masked entries
         * -inf, and their row-half maxima, in two instances chosen once per
         * tile - interior tiles (every row sees every key) test no key - as
         * the dQ pass's dsTile, where the compiler did not always split it
         * itself */
        auto maskTile = [&](float (&si)[NT][4], int i, int it, float mx[2]) {
            const int u0 = keyAt(it);
            const bool full = u0 + KT <= ke && pol.allVisible(t0, t_last, u0, u0 + KT - 1);
            const bool sees[2] = {pol.rowSees(rows[i][0], u0), pol.rowSees(rows[i][1], u0)};
            auto run = [&](auto is_full) {
                constexpr bool FULL = decltype(is_full)::value;
                mx[0] = mx[1] = -INFINITY;
#pragma unroll
                for (int n = 0; n < NT; n++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int u = u0 + n * 8 + quad * 2 + (e & 1);
                        int t = tok[i][e >> 1];
                        bool ok = (FULL || (t >= 0 && u < ke && pol.visible(t, u))) && sees[e >> 1];
                        float v = ok ? si[n][e] * c.scale_log2 : -INFINITY;
                        si[n][e] = v;
                        mx[e >> 1] = fmaxf(mx[e >> 1], v);
                    }
                }
            };
            if (full) run(std::true_type{});
            else run(std::false_type{});
        };
        if constexpr (WG)
            fastFwdMainloopWgmma<DK, DV, KT, R, MT, TURNS, WGS, LAST>(
                ring, maps, branch_no, ring_base, ntiles, b, g, sQ, wg_row0, m, l, o, maskTile,
                keyAt);
        else
            fastFwdMainloopSync<DK, DV, KT, MT, LDK, LDV>(ntiles, loadKV, sK, sV, sQ, row0, m, l, o,
                                                          maskTile);
        fastCpWait<0>();

        fastFwdEpilogue<DV, MT, R, COMBINE, LAST, WG>(io, bio, sQ, tok, m, l, o, row0, rowToken,
                                                     rowIndex);
        if constexpr (WG) ring_base += ntiles;
        branch_no++;
    }; /* runBranch */
    if constexpr (TURNS) Turns::begin();
    fastEachBranch(runBranch, br...);
    if constexpr (TURNS) Turns::end();
}

/* The forward tile kernel over one or more branches (FastFwdBranch, run in
 * turn on each q tile; io: q and the gate combine's inputs when COMBINE) on
 * this context's tensor-core path (c.wgmma: the key tiles by TMA, their
 * maps encoded here on the host); returns the encode, attribute or launch
 * status, never synchronises. */
template <int DK, int DV, bool COMBINE, class... Branches>
static inline cudaError_t fastLaunchForwardBranches(const FastCtx &c, const FastFwdIo &io,
                                                    cudaStream_t stream, Branches... br) {
    FastFwdMaps maps = {};
    if (c.wgmma) {
        cudaError_t e =
            fastTmaEncodeBranches<DK, DV, FastQTile<DV, true>::KEYS>(c, maps.br, br...);
        if (e != cudaSuccess) return e;
        using Q = FastQTile<DV, true>;
        return fastLaunchQTiles(fastFwdKernel<DK, DV, COMBINE, true, Branches...>, Q::FWD_ROWS,
                                Q::FWD_THREADS, fastFwdSmem<DK, DV, true>(), c.S, c, stream, io,
                                maps, br...);
    }
    using Q = FastQTile<DV>;
    return fastLaunchQTiles(fastFwdKernel<DK, DV, COMBINE, false, Branches...>, Q::FWD_ROWS,
                            Q::FWD_THREADS, fastFwdSmem<DK, DV>(), c.S, c, stream, io, maps, br...);
}
/* The forward of one policy's branch (io: its keys, o, lse, and the
 * combine's inputs when COMBINE). */
template <int DK, int DV, class Policy, bool COMBINE>
static inline cudaError_t fastLaunchForward(const FastCtx &c, const FastFwdIo &io, Policy pol,
                                            cudaStream_t stream) {
    return fastLaunchForwardBranches<DK, DV, COMBINE>(c, io, stream, FastFwdBranch<Policy>{io, pol});
}

#endif
