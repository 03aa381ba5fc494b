/* tile_dkdv_cpasync.cuh - the dK/dV main loop whose row stages come by
 * cp.async, made visible by one CTA barrier per row tile (fastDkdvCore):
 * the mma.sync path everywhere, and on wgmma the selected passes whose
 * tokens' rows are too small for TMA boxes (fewer than 16 heads per group,
 * fastSelRowRing). The per-stage products are tile_dkdv_math.cuh's. */
#ifndef NSA_FAST_TILE_DKDV_CPASYNC_CUH
#define NSA_FAST_TILE_DKDV_CPASYNC_CUH

#include "tile_dkdv_math.cuh"

/* dK, dV of one tile of 64 * KWG keys [u0, khi), walking the row tiles of
 * FAST_DKDV_ROWS query rows (64 / hpg whole tokens) that may see them:
 *   P^T = exp2(K.Q^T s2 - lse2);  dP^T = V.dout^T;  dS^T = g P^T (dP^T - delta)
 *   dV = sum (g P^T) dout;  dK = scale sum dS^T Q.
 * A fixed row-tile order per CTA and no atomics: bit-reproducible.
 *
 * Pipeline, one barrier per row tile: the token indices of tile k arrive
 * two tiles ahead (a ring of 4 slots) (fetchToken(k, slot, dst) writes slot's token or -1 to
 * shared memory, directly or by a 4-byte async copy), so the rows of tile
 * k+1 - q, dout and their lse, delta and gate - are all async copies issued
 * while tile k computes; no thread waits on a global load in the loop.
 * Each warpgroup owns 64 keys [ka, ka + 64) of the CTA's and computes
 * only for row tiles where seesAny(k, ka, kb) (some row of tile k may see
 * a key of [ka, kb]); tileFull(k, t_first, ka) says every row of tile k
 * (first token t_first) sees every key of [ka, ka + 64).
 * store(u, is_k, col, v0, v1) writes two adjacent results of key u.
 * stageOut (wgmma only; FastNoStageOut: none) runs after each pass's dK/dV
 * products with what else the pass can give: stageOut(it, half, ads,
 * q_stage, do_stage, tok) - ads the A fragments of its dS^T (keys x rows
 * half * RH .. + RH - 1), the stage's q and dout tiles (the dout tile free
 * from here on, the q tile once every warp has passed a barrier), and the
 * row tile's tokens (fetchToken's slots). The fused selected backward
 * forms dq = dS.K there (fast_sel_block.cu). */
struct FastNoStageOut {
    template <class... A>
    __device__ void operator()(A &&...) const {}
};
template <int DK, int DV, bool WG, int KWG, class FetchToken, class Visible, class SeesAny,
          class TileFull, class Store, class StageOut = FastNoStageOut>
__device__ __forceinline__ void fastDkdvCore(const FastCtx &c, const FastBwdIo &io, int b, int g,
                                             int u0, int khi, int ntiles, FetchToken fetchToken,
                                             Visible visible, SeesAny seesAny, TileFull tileFull,
                                             Store store, StageOut stageOut = StageOut{}) {
    constexpr int LDK = DK + (WG ? 0 : 8), LDV = DV + (WG ? 0 : 8);
    constexpr int R = FAST_DKDV_ROWS, KT = 64 * KWG, THREADS = FAST_THREADS * KWG;
    static_assert(R <= FAST_THREADS, "one metadata thread per row");
    bf16 *sK = fastTileBase<WG>(), *sV = sK + KT * LDK, *sQ = sV + KT * LDV,
         *sdO = sQ + 2 * R * LDK;
    float *sL = (float *)(sdO + 2 * R * LDV), *sD = sL + 2 * R, *sG = sD + 2 * R;
    int *sT = (int *)(sG + 2 * R);
    int *sTok = sT + 2 * R; /* [4][R]: tokens of row tile k in ring slot k % 4 */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 2;
    const int hpg = c.hpg, tpr = R / hpg;

    fastLoadKeyTile<WG, KT, DK, DV, THREADS>(sK, sV, io.k, io.v, io.nkeys, c.G, b, g, u0, khi);
    auto fetchTokens = [&](int k) {
        if (k < ntiles && (int)threadIdx.x < tpr)
            fetchToken(k, (int)threadIdx.x, sTok + (k % 4) * R + threadIdx.x);
    };
    /* Row r of a row tile is token slot r / hpg, head r % hpg; a thread's
     * rows - the one it copies (fastTileRowOf) and its metadata row r =
     * threadIdx.x - are the same in every tile, so their slots and heads are
     * formed here once (divisions by the runtime hpg, per row and tile, had
     * been a tenth of this loop's instructions). Slot -1: a padding row. */
    struct RowSlot {
        int slot, head;
    };
    auto slotOf = [&](int r) { return RowSlot{r < tpr * hpg ? r / hpg : -1, r % hpg}; };
    const RowSlot ld_rs = slotOf(fastTileRowOf<R, THREADS>()), md_rs = slotOf((int)threadIdx.x);
    auto rowOf = [&](const int *tok, RowSlot rs, size_t &row) {
        if (rs.slot < 0) return false;
        int t = tok[rs.slot];
        if (t < 0) return false;
        row = ((size_t)b * c.S + t) * c.H + (size_t)g * hpg + rs.head;
        return true;
    };
    /* async copies of row tile k into stage k & 1 (its tokens are visible) */
    auto issueRows = [&](int k) {
        const int st = k & 1;
        const int *tok = sTok + (k % 4) * R;
        fastLoadTileFor<WG, R, DK, THREADS>(sQ + st * R * LDK, [&](int) -> const bf16 * {
            size_t row;
            return rowOf(tok, ld_rs, row) ? io.q + row * DK : nullptr;
        });
        fastLoadTileFor<WG, R, DV, THREADS>(sdO + st * R * LDV, [&](int) -> const bf16 * {
            size_t row;
            return rowOf(tok, ld_rs, row) ? io.dout + row * DV : nullptr;
        });
        if ((int)threadIdx.x < R) {
            const int r = threadIdx.x;
            size_t row = 0;
            const bool ok = rowOf(tok, md_rs, row);
            sT[st * R + r] = ok ? tok[md_rs.slot] : -1;
            fastCpAsync4(sL + st * R + r, ok ? io.lse + row : nullptr);
            fastCpAsync4(sD + st * R + r, ok ? io.dsum + row * 3 + io.branch : nullptr);
            fastCpAsync4(sG + st * R + r, ok ? io.gate_f + row * 3 + io.branch : nullptr);
        }
    };
    /* the thread that issued row r's metadata finishes it once its copies
     * landed: lse to the log2 domain; a row that sees nothing (lse = -inf)
     * gets token -1 and zero gate, delta (no gradient, never NaN) */
    auto finishRows = [&](int k) {
        if ((int)threadIdx.x < R) {
            const int i = (k & 1) * R + threadIdx.x;
            const float lse = sL[i];
            if (sT[i] >= 0 && lse != -INFINITY) {
                sL[i] = lse * FAST_LOG2E;
            } else {
                sT[i] = -1;
                sL[i] = 0.f;
                sD[i] = 0.f;
                sG[i] = 0.f;
            }
        }
    };
    fetchTokens(0);
    fetchTokens(1);
    fastCpCommit();
    fastCpWait<0>();
    __syncthreads();
    if (ntiles > 0) issueRows(0);
    fetchTokens(2);
    fastCpCommit();

    float dk[DK / 8][4], dv[DV / 8][4];
#pragma unroll
    for (int n = 0; n < DK / 8; n++) dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.f;
#pragma unroll
    for (int n = 0; n < DV / 8; n++) dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.f;
    const int keyA = warp * 16 + grp;
    /* this warpgroup's keys [ka, kb] */
    const int wg = KWG > 1 ? warp >> 2 : 0, ka = u0 + wg * 64, kb = min(khi, ka + 64) - 1;

    for (int it = 0; it < ntiles; it++) {
        const int st = it & 1;
        fastCpWait<0>(); /* rows of tile it, tokens of tile it + 2 */
        finishRows(it);
        fastTileBarrier<WG>(); /* ... visible to all; stage st ^ 1 is free again */
        if (it + 1 < ntiles) issueRows(it + 1);
        fetchTokens(it + 3);
        fastCpCommit();
        const int t_first = sTok[(it % 4) * R]; /* slot (it + 3) % 4 is being refilled */
        /* no row of the tile sees this warpgroup's keys: nothing to add
         * (warpgroup-uniform, so the wgmma below stay whole) */
        if constexpr (KWG > 1) /* one warpgroup: the caller's row tiles all see key u0 */
            if (ka > kb || !seesAny(it, ka, kb)) continue;
        /* every row of the tile sees all 64 keys: no mask (rows without a
         * gradient carry gate 0, so they add nothing either way) */
        const bool full = kb - ka == 63 && tileFull(it, t_first, ka);
        /* rows per pass: the mma.sync path holds a 16 x 32 score tile per
         * warp; wgmma takes the whole 64-row stage in one m64n64 pass where
         * the dK/dV accumulators leave room (d_k, d_v <= 128) */
        constexpr int RH = (WG && DK <= 128 && DV <= 128) ? FAST_DKDV_WG_ROWS : 32, NTH = RH / 8;
        const float *l_t = sL + st * R, *d_t = sD + st * R, *g_t = sG + st * R;
        const int *t_t = sT + st * R;
#pragma unroll 1
        for (int half = 0; half < R / RH; half++) {
            const int h0 = half * RH; /* the pass's first row of the stage */
            auto rowOf = [&](int col) {
                return FastDkdvRow{t_t[h0 + col], l_t[h0 + col], d_t[h0 + col], g_t[h0 + col]};
            };
            if constexpr (WG) {
                uint32_t ads[NTH / 2][4];
                fastDkdvWgPass<DK, DV, KT, R, RH>(c, sK, sV, wg, sQ + st * R * LDK,
                                                  sdO + st * R * LDV, half, u0, khi, full, rowOf,
                                                  visible, dk, dv, ads);
                if constexpr (!std::is_same<StageOut, FastNoStageOut>::value)
                    stageOut(it, half, ads, sQ + st * R * LDK, sdO + st * R * LDV,
                             sTok + (it % 4) * R);
            } else {
                const bf16 *q_t = sQ + (st * R + h0) * LDK, *do_t = sdO + (st * R + h0) * LDV;
                float s[NTH][4], dp[NTH][4];
#pragma unroll
                for (int n = 0; n < NTH; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.f;
                fastMmaAZt<NTH, DK>(s, sK, LDK, warp * 16, q_t, LDK);
                fastMmaAZt<NTH, DV>(dp, sV, LDV, warp * 16, do_t, LDV);
                if (full) fastDkdvGradOfScores<true>(c, s, dp, u0 + keyA, khi, rowOf, visible);
                else fastDkdvGradOfScores<false>(c, s, dp, u0 + keyA, khi, rowOf, visible);
#pragma unroll
                for (int ks = 0; ks < NTH / 2; ks++) {
                    uint32_t a[4];
                    fastAFromC(a, s[2 * ks], s[2 * ks + 1]);
                    fastMmaRowsOfTile<DV>(dv, a, do_t, LDV, ks * 16);
                    fastAFromC(a, dp[2 * ks], dp[2 * ks + 1]);
                    fastMmaRowsOfTile<DK>(dk, a, q_t, LDK, ks * 16);
                }
            }
        } /* half */
    }
    fastCpWait<0>();
    fastDkdvStore<DK, DV>(c, u0, khi, dk, dv, store);
}

#endif
