/* tile_dkdv_ring.cuh - the dK/dV main loop on wgmma whose row stages come
 * through a ring of TMA boxes and mbarriers (fastDkdvRingCore), with no
 * CTA barrier in the loop; its shared layout (FastDkdvRing). The per-stage
 * products are tile_dkdv_math.cuh's. */
#ifndef NSA_FAST_TILE_DKDV_RING_CUH
#define NSA_FAST_TILE_DKDV_RING_CUH

#include "tile_dkdv_cpasync.cuh"

/* No sums hook (fastDkdvRingCore): the sums go out through the store functor. */
struct FastNoSums {
    template <class K, class V>
    __device__ void operator()(const K &, const V &) const {}
};
/* No per-row payload beside the token (fastDkdvRingCore). */
struct FastNoAux {
    __device__ const int *operator()(int, int) const { return nullptr; }
};
/* The value a listed row's token and payload take where there is none:
 * copied like the real ones, so that every row's copy is asynchronous. */
static __device__ const int fastMinusOne = -1;

/* ---- The dK/dV core on a TMA row ring (wgmma) ----
 *
 * fastDkdvCore (tile_dkdv_cpasync.cuh) copies each row stage with 16-byte cp.async from every
 * thread and makes it visible with a CTA barrier per row tile - the
 * structure the forward and dQ loops had before their key tiles came by
 * TMA (fast_tma.cuh). Here the stages form a ring: one warp's lanes issue
 * a stage's q and dout panels as TMA boxes of whole tokens (FastRowMaps)
 * AHEAD tiles early, the first R threads issue its per-row lse, delta and
 * gate (and, gathering, the row's token) as 4-byte cp.async tracked by the
 * stage's full mbarrier, and every warp waits for the stage it needs and
 * releases it after its products: no barrier across the CTA in the loop.
 *
 * Tokens: consecutive (GATHER false: the window and compressed passes,
 * tokens(it, slot) = the token of slot `slot` of row tile it, -1 past the
 * rows that carry a gradient, slot 0 always a real position, one box per
 * panel) or listed (GATHER true: tokens(it, slot) = the address of the
 * token in the caller's list, NULL past its end; a box per token and
 * panel, the token read a tile before it is needed).
 *
 * GATHER may carry a second int per row, aux(it, slot) (the address of the
 * payload beside the token in the caller's list), and take a stageOut
 * (one key warpgroup) that runs after each pass as fastDkdvCore's does -
 * stageOut(it, half, ads, q_stage, do_stage, row) with row(r) = (token,
 * payload) of stage row r, -1 where none. Its plain stores to the stage
 * are fenced from the TMA's before the stage is released.
 *
 * Shared layout (FastDkdvRing): K, V, the q and dout stages, full and empty
 * barriers, then per slot of a ring of MS row-data slots the raw lse, delta,
 * gate (and token, payload) of each row, each row's token slot (-1: a
 * padding row, which no box writes: zeroed once), and EXTRA bytes of the
 * caller's at EXTRA_AT. */
/* Row tiles the ring's producer issues ahead (at most STAGES - 1,
 * FAST_DKDV_AHEAD): with rows from L2 a tile's compute covers the copies,
 * and one ahead leaves a four-stage ring three tiles of slack between the
 * fastest and slowest warps. */
/* RWG > 1 (row warpgroups): the CTA's RWG warpgroups share one K/V tile
 * and take its row tiles in turn - warpgroup w the tiles it = w (mod RWG),
 * each with its own producer, stages (it % STAGES) and row-data slots (it %
 * MS), so that each runs a ring of STAGES / RWG stages of its own, one
 * ahead - and add their dK/dV sums in warpgroup order at the end. It keeps
 * 8 warps on an SM where one CTA's shared memory leaves room for one only
 * (d_k = 192: K/V 40 KB, 40 KB a stage), at the cost of one K/V copy. */
template <int DK, int DV, int KWG, bool GATHER, bool AUX = false, int EXTRA = 0, int RWG = 1>
struct FastDkdvRing {
    static_assert(KWG == 1 || RWG == 1, "key and row warpgroups do not mix");
    static constexpr int R = FAST_DKDV_ROWS, KT = 64 * KWG, MS = 8;
    /* CTAs per SM the registers allow (two key or row warpgroups: one; d_k
     * = d_v = 64: three; else two) */
    static constexpr int CTAS = KWG > 1 || RWG > 1 ? 1 : (DK + DV <= 128 ? 3 : 2);
    static constexpr int bytes(int stages) {
        return KT * (DK + DV) * 2 + stages * R * (DK + DV) * 2 + 2 * stages * 8 +
               MS * R * 4 * (3 + GATHER + AUX) + R * 4 + 1024 + EXTRA;
    }
    static constexpr bool fits(int stages) { return CTAS * (bytes(stages) + 1024) <= 233472; }
    static constexpr int STAGES = fits(4) ? 4 : fits(3) && RWG == 1 ? 3 : 2;
    /* warps hold one stage at a time: the producer may run STAGES - 1 ahead
     * (RWG > 1: FAST_DKDV_AHEAD of the warpgroup's own tiles) */
    static constexpr int AHEAD =
        RWG > 1 ? FAST_DKDV_AHEAD * RWG
                : (FAST_DKDV_AHEAD < STAGES ? FAST_DKDV_AHEAD : STAGES - 1);
    static_assert(RWG == 1 || (STAGES % RWG == 0 && AHEAD < STAGES && MS % RWG == 0),
                  "each row warpgroup owns the stages and slots of its own tiles");
    static constexpr int SMEM = bytes(STAGES); /* EXTRA bytes for the caller at the end */
    static constexpr int EXTRA_AT = SMEM - EXTRA - 1024;  /* their offset from the 1024-aligned base */
    /* a warp at tile it writes the row data of tile it + AHEAD; every warp
     * is past tile it - 1 - STAGES then (its stage was refilled for tile
     * it - 1, which this warp waited for). RWG > 1: the slots of a
     * warpgroup's tiles are its own, and it is past its tile it - STAGES. */
    static_assert(MS >= STAGES + AHEAD + 1, "a row-data slot is rewritten only once no warp reads it");
    /* the dK/dV sums of warpgroups 1 .. RWG - 1, in the stages at the end */
    static_assert(RWG == 1 || (RWG - 1) * FAST_THREADS * (DK + DV) / 2 * 4 <= STAGES * R * (DK + DV) * 2,
                  "the row warpgroups' sums fit the stages");
};

/* Rows per wgmma pass of the ring core: FAST_DKDV_WG_ROWS at every d_k,
 * d_v - where either is above 128 as probabilities first
 * (fastDkdvProbsFirst), since a 64-row pass's scores and dP^T beside the
 * 64 x 192 dK accumulator spill. A caller may ask for other rows
 * (PASS_ROWS: the fused selected backward, selFusedPassRows). */
template <int DK, int DV, int KWG, bool GATHER, int EXTRA = 0, int RWG = 1, int PASS_ROWS = 0,
          class Tokens, class Visible, class SeesAny, class TileFull, class Store,
          class Aux = FastNoAux, class StageOut = FastNoStageOut, class Sums = FastNoSums>
__device__ __forceinline__ void fastDkdvRingCore(const FastCtx &c, const FastBwdIo &io,
                                                 const FastRowMaps &maps, int b, int g, int u0,
                                                 int khi, int ntiles, Tokens tokens,
                                                 Visible visible, SeesAny seesAny,
                                                 TileFull tileFull, Store store, Aux aux = Aux{},
                                                 StageOut stageOut = StageOut{},
                                                 bool defer_release = false, Sums sums = Sums{}) {
    constexpr bool HAS_AUX = !std::is_same<Aux, FastNoAux>::value;
    constexpr bool HAS_OUT = !std::is_same<StageOut, FastNoStageOut>::value;
    static_assert(GATHER || !HAS_AUX, "payloads need listed tokens");
    static_assert(!HAS_OUT || (GATHER && KWG == 1), "stageOut: listed tokens, one key warpgroup");
    using Ring = FastDkdvRing<DK, DV, KWG, GATHER, HAS_AUX, EXTRA, RWG>;
    constexpr int R = Ring::R, KT = Ring::KT, MS = Ring::MS, STAGES = Ring::STAGES;
    constexpr int AHEAD = Ring::AHEAD, THREADS = FAST_THREADS * KWG * RWG;
    constexpr int RH = PASS_ROWS ? PASS_ROWS : FAST_DKDV_WG_ROWS, NTH = RH / 8;
    bf16 *sK = fastTileBase<true>(), *sV = sK + KT * DK, *sQ = sV + KT * DV;
    bf16 *sdO = sQ + STAGES * R * DK;
    uint64_t *full = (uint64_t *)(sdO + STAGES * R * DV), *empty = full + STAGES;
    float *mL = (float *)(empty + STAGES), *mD = mL + MS * R, *mG = mD + MS * R;
    int *mT = (int *)(mG + MS * R);               /* GATHER: [MS][R] row tokens */
    int *mA = mT + (GATHER ? MS * R : 0);         /* HAS_AUX: [MS][R] row payloads */
    int *rowSlot = mA + (HAS_AUX ? MS * R : 0);   /* [R] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* RWG > 1: this thread's row warpgroup, and its thread and warp in it */
    const int rwg = RWG > 1 ? warp >> 2 : 0, gtid = RWG > 1 ? tid & 127 : tid,
              gwarp = RWG > 1 ? warp & 3 : warp;
    const int hpg = c.hpg, tpr = R / hpg, rows = tpr * hpg;
    const uint32_t tx_bytes = (uint32_t)rows * 128 * ((DK + DV) / 64);
    /* defer_release: stageOut's bulk stores of tile it may still read its
     * stage when it returns; the stage is released in tile it + 1, under
     * its first products and before the producer waits for it */
    const bool defer = HAS_OUT && defer_release;

    fastLoadKeyTile<true, KT, DK, DV, THREADS>(sK, sV, io.k, io.v, io.nkeys, c.G, b, g, u0, khi);
    fastCpCommit();
    if (rows < R) { /* padding rows: never written by a box, read by the products */
        constexpr int CH = (DK + DV) / 8; /* 16-byte chunks per row of q and dout */
        for (int i = tid; i < STAGES * (R - rows) * CH; i += THREADS) {
            const int st = i / ((R - rows) * CH), rest = i % ((R - rows) * CH);
            const int r = rows + rest / CH, ch = rest % CH;
            bf16 *at = ch < DK / 8 ? sQ + st * R * DK + (ch / 8) * R * 64 + r * 64 + (ch % 8) * 8
                                   : sdO + st * R * DV + ((ch - DK / 8) / 8) * R * 64 + r * 64 +
                                         ((ch - DK / 8) % 8) * 8;
            *(uint4 *)at = make_uint4(0, 0, 0, 0);
        }
    }
    for (int r = tid; r < R; r += THREADS) rowSlot[r] = r < rows ? r / hpg : -1;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            fastMbarInit(&full[s], 1 + R); /* the producer's, and each row's row data */
            fastMbarInit(&empty[s], THREADS / 32 / RWG); /* its warpgroup's warps */
        }
        fastMbarInitFence();
    }
    /* The first tiles' rows are issued before K/V is waited for, so that
     * their token reads and boxes overlap its load rather than follow it:
     * at one CTA per SM (d_k = 192) nothing else hides a work item's start. */
    __syncthreads(); /* rowSlot and barriers visible */

    /* row data thread r < R (of each row warpgroup): row r of every tile
     * (of the warpgroup's) - token slot, head */
    const int my_slot = gtid < R ? rowSlot[gtid] : -1, my_head = gtid % hpg;
    auto tokenAt = [&](int it, int slot) -> int { /* GATHER: a global read */
        if constexpr (GATHER) {
            const int *p = slot >= 0 && it < ntiles ? tokens(it, slot) : nullptr;
            return p ? *p : -1;
        } else {
            return slot >= 0 ? tokens(it, slot) : -1;
        }
    };
    /* The producer's work is split over three warps: the row data of rows
     * 0-63 (threads tid < R: warps 0 and 1) and the boxes (BOX_WARP), each
     * of about the same length; with the boxes on warp 0 too, that warp
     * came to the next warpgroup-wide product last, and the other warps
     * stalled on that issue waiting for it. */
    constexpr int BOX_WARP = FAST_DKDV_BOX_WARP;
    static_assert(BOX_WARP < 4 * KWG, "the boxes' warp is one of the CTA's");
    /* tokens of the next tile to issue (this warpgroup's first, then j +
     * RWG after tile j): this row's, and (BOX_WARP) lane's slot */
    int next_row_tok = gtid < R ? tokenAt(rwg, my_slot) : -1;
    int next_box_tok[2] = {-1, -1}; /* slots lane and lane + 32 (tpr <= 64) */
    if (GATHER && gwarp == BOX_WARP)
#pragma unroll
        for (int k = 0; k < 2; k++) next_box_tok[k] = tokenAt(rwg, lane + 32 * k < tpr ? lane + 32 * k : -1);
    auto issue = [&](int j) { /* tile j into stage j % STAGES, row data slot j % MS */
        const int s = j % STAGES;
        if (gwarp == BOX_WARP) {
            if (lane == 0) {
                if (j >= STAGES) fastMbarWait(&empty[s], (uint32_t)(j / STAGES + 1) & 1u);
                fastMbarArriveTx(&full[s], tx_bytes);
            }
            __syncwarp();
            bf16 *q_st = sQ + s * R * DK, *do_st = sdO + s * R * DV;
            if constexpr (GATHER) {
#pragma unroll
                for (int k = 0; k < 2; k++) {
                    const int slot = lane + 32 * k;
                    if (slot < tpr) { /* past the list: a box past S, zeros */
                        const int t = next_box_tok[k] >= 0 ? next_box_tok[k] : c.S;
#pragma unroll
                        for (int p = 0; p < DK / 64; p++)
                            fastTmaLoad4(q_st + p * R * 64 + slot * hpg * 64, &maps.q, p * 64,
                                         g * hpg, t, b, &full[s]);
#pragma unroll
                        for (int p = 0; p < DV / 64; p++)
                            fastTmaLoad4(do_st + p * R * 64 + slot * hpg * 64, &maps.dout, p * 64,
                                         g * hpg, t, b, &full[s]);
                    }
                    next_box_tok[k] = tokenAt(j + RWG, slot < tpr ? slot : -1);
                }
            } else if (lane == 0) {
                const int t0 = tokens(j, 0);
#pragma unroll
                for (int p = 0; p < DK / 64; p++)
                    fastTmaLoad4(q_st + p * R * 64, &maps.q, p * 64, g * hpg, t0, b, &full[s]);
#pragma unroll
                for (int p = 0; p < DV / 64; p++)
                    fastTmaLoad4(do_st + p * R * 64, &maps.dout, p * 64, g * hpg, t0, b, &full[s]);
            }
        }
        if (gtid < R) {
            const int t = next_row_tok, ms = j % MS, r = gtid;
            const size_t row = ((size_t)b * c.S + (t < 0 ? 0 : t)) * c.H + (size_t)g * hpg + my_head;
            fastCpAsync4Or0(mL + ms * R + r, t >= 0 ? io.lse + row : nullptr, io.lse);
            fastCpAsync4Or0(mD + ms * R + r, t >= 0 ? io.dsum + row * 3 + io.branch : nullptr,
                            io.lse);
            fastCpAsync4Or0(mG + ms * R + r, t >= 0 ? io.gate_f + row * 3 + io.branch : nullptr,
                            io.lse);
            if constexpr (GATHER) /* -1 where the row has no token */
                fastCpAsync4(mT + ms * R + r, t >= 0 ? tokens(j, my_slot) : &fastMinusOne);
            if constexpr (HAS_AUX)
                fastCpAsync4(mA + ms * R + r, t >= 0 ? aux(j, my_slot) : &fastMinusOne);
            fastMbarArriveCpAsync(&full[s]);
            next_row_tok = tokenAt(j + RWG, my_slot);
        }
    };
    /* each warpgroup its own first tiles (RWG = 1: tiles 0 .. AHEAD - 1) */
    for (int j = rwg; j < AHEAD && j < ntiles; j += RWG) issue(j);
    fastCpWait<0>(); /* K/V (the rows' cp.async are not in a group: their barrier tracks them) */
    fastWgProxyFence();
    __syncthreads(); /* K/V and the zeroed rows visible to the products */

    float dk[DK / 8][4], dv[DV / 8][4];
#pragma unroll
    for (int n = 0; n < DK / 8; n++) dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.f;
#pragma unroll
    for (int n = 0; n < DV / 8; n++) dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.f;
    /* this warpgroup's keys [ka, kb] */
    const int wg = KWG > 1 ? warp >> 2 : 0, ka = u0 + wg * 64, kb = min(khi, ka + 64) - 1;

    for (int it = rwg; it < ntiles; it += RWG) {
        /* the producer's part of tile it + AHEAD (BOX_WARP's boxes, the row
         * data of the first R threads): under this tile's first products
         * where the pass runs, else here */
        bool issued = it + AHEAD >= ntiles, released = !(defer && it >= RWG);
        auto produce = [&] {
            if (!released) { /* this warpgroup's last tile's stage, once its bulk stores have read it */
                __syncwarp();
                if (lane == 0) {
                    fastBulkWaitRead();
                    fastMbarArrive(&empty[(it - RWG) % STAGES]);
                }
                released = true;
            }
            if (!issued) issue(it + AHEAD);
            issued = true;
        };
        const int s = it % STAGES, ms = it % MS;
        fastMbarWait(&full[s], (uint32_t)(it / STAGES) & 1u);
        __syncwarp();
        /* a warpgroup whose keys no row of the tile sees adds nothing; it
         * still waits for the tile first, so that its release counts
         * toward this use of the stage */
        const bool runs = KWG == 1 || (ka <= kb && seesAny(it, ka, kb));
        /* stageOut's row r of tile it: (token or -1, payload or -1) */
        auto stageRow = [&](int it, int ms, int r) {
            int t;
            if constexpr (GATHER) t = mT[ms * R + r];
            else t = rowSlot[r] >= 0 ? tokens(it, rowSlot[r]) : -1;
            return make_int2(t, HAS_AUX ? mA[ms * R + r] : -1);
        };
        if (runs) {
            const float *l_t = mL + ms * R, *d_t = mD + ms * R, *g_t = mG + ms * R;
            const int *t_t = mT + ms * R;
            int t_first;
            if constexpr (GATHER) t_first = t_t[0];
            else t_first = tokens(it, 0);
            const bool full_tile = kb - ka == 63 && tileFull(it, t_first, ka);
#pragma unroll 1
            for (int half = 0; half < R / RH; half++) {
                const int h0 = half * RH;
                auto rowOf = [&](int col) {
                    const int r = h0 + col;
                    int t;
                    if constexpr (GATHER) t = t_t[r];
                    else t = tokens(it, rowSlot[r]);
                    return FastDkdvRow{rowSlot[r] >= 0 ? t : -1, l_t[r] * FAST_LOG2E, d_t[r], g_t[r]};
                };
                uint32_t ads[NTH / 2][4];
                fastDkdvWgPass<DK, DV, KT, R, RH>(c, sK, sV, wg, sQ + s * R * DK,
                                                  sdO + s * R * DV, half, u0, khi, full_tile,
                                                  rowOf, visible, dk, dv, ads, produce);
                if constexpr (HAS_OUT)
                    stageOut(it, half, ads, sQ + s * R * DK, sdO + s * R * DV,
                             [&](int r) { return stageRow(it, ms, r); });
            }
        }
        produce(); /* where no pass ran */
        /* stageOut wrote the stage by plain stores; the next writes to it
         * are the TMA's */
        if constexpr (HAS_OUT) fastWgProxyFence();
        __syncwarp();
        if (lane == 0 && !defer) fastMbarArrive(&empty[s]);
    }
    if (defer && lane == 0) fastBulkWaitRead(); /* the last stage's stores, before the CTA ends */
    if constexpr (RWG > 1) {
        /* warpgroups 1 .. RWG - 1 leave their sums in the stages (drained:
         * every issued tile was waited for), warpgroup 0 adds them in order
         * and stores; per thread, its fragments' 4 (DK + DV) / 8 floats,
         * [float][thread] so that a warp's stores meet no bank twice */
        constexpr int NF = (DK + DV) / 2;
        float *sums = (float *)sQ;
        __syncthreads(); /* every warp is past its last stage */
        if (rwg > 0) {
            float *mine = sums + (size_t)(rwg - 1) * NF * FAST_THREADS + gtid;
#pragma unroll
            for (int n = 0; n < DK / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) mine[(n * 4 + e) * FAST_THREADS] = dk[n][e];
#pragma unroll
            for (int n = 0; n < DV / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) mine[(DK / 2 + n * 4 + e) * FAST_THREADS] = dv[n][e];
        }
        __syncthreads();
        if (rwg > 0) return;
#pragma unroll 1
        for (int w = 1; w < RWG; w++) {
            const float *theirs = sums + (size_t)(w - 1) * NF * FAST_THREADS + gtid;
#pragma unroll
            for (int n = 0; n < DK / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) dk[n][e] += theirs[(n * 4 + e) * FAST_THREADS];
#pragma unroll
            for (int n = 0; n < DV / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) dv[n][e] += theirs[(DK / 2 + n * 4 + e) * FAST_THREADS];
        }
    }
    /* sums(dk, dv), where given, takes the sums (dK unscaled) instead of
     * store. The threads of warpgroup 0 call it (RWG > 1: with the other
     * warpgroups' sums added); other warps of that warpgroup may still be
     * reading the ring's shared memory, so it syncs the warpgroup before
     * it writes there. */
    if constexpr (!std::is_same<Sums, FastNoSums>::value) sums(dk, dv);
    else fastDkdvStore<DK, DV>(c, u0, khi, dk, dv, store);
}

#endif
