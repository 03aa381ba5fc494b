/* tile_dkdv_math.cuh - one row stage of the dK/dV pass (tile_dkdv.cuh):
 * the score gradients from a stage's scores and dP^T, the wgmma pass over
 * a stage (scores and dP^T together, or probabilities first where d_k or
 * d_v is above 128), the mma.sync products of a stage's rows, and the
 * epilogue that hands a warp's dK and dV rows to the caller's store. The
 * main loops that feed the stages are tile_dkdv_cpasync.cuh and
 * tile_dkdv_ring.cuh. */
#ifndef NSA_FAST_TILE_DKDV_MATH_CUH
#define NSA_FAST_TILE_DKDV_MATH_CUH

#include "tile_common.cuh"

/* One query row of a dK/dV row stage as the score gradients read it: its
 * token (-1: none), lse in the log2 domain, delta and gate (a row that
 * adds nothing has gate 0). */
struct FastDkdvRow {
    int t;
    float lse2, delta, gate;
};

/* s (scores S^T of keys x NTH*8 rows) becomes g P^T, dp (dP^T) becomes
 * dS^T: p = exp2(s scale2 - lse2) where key ukey (+8 for the fragment's
 * second row half) is visible to the row, else 0. rowOf(col) is the
 * FastDkdvRow of score column col. FULL: every row sees every key - no
 * token read, no mask tested. Two instances, chosen once per tile by the
 * caller: as one loop with a per-element test the compiler kept the test
 * and the token loads in every tile in some builds, which cost the dK/dV
 * passes a third of their time. */
template <bool FULL, int NTH, class RowOf, class Visible>
__device__ __forceinline__ void fastDkdvGradOfScores(const FastCtx &c, float (&s)[NTH][4],
                                                     float (&dp)[NTH][4], int ukey, int khi,
                                                     RowOf rowOf, Visible visible) {
    const int quad = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < NTH; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = n * 8 + quad * 2 + (e & 1);
            const FastDkdvRow row = rowOf(col);
            bool ok = true;
            if constexpr (!FULL) {
                const int u = ukey + (e >> 1) * 8;
                ok = row.t >= 0 && u < khi && visible(row.t, u);
            }
            const float p = ok ? fastExp2(s[n][e] * c.scale_log2 - row.lse2) : 0.f;
            const float gp = row.gate * p;
            s[n][e] = gp;
            dp[n][e] = gp * (dp[n][e] - row.delta);
        }
    }
}

/* The probs-first pass's two halves of fastDkdvGradOfScores: s = g P^T
 * (zero where masked) in place, then, from those probabilities as the
 * bf16 A fragments ap of dV's product, dp = g P^T (dP^T - delta). */
template <bool FULL, int NTH, class RowOf, class Visible>
__device__ __forceinline__ void fastDkdvGatedProbs(const FastCtx &c, float (&s)[NTH][4], int ukey,
                                                   int khi, RowOf rowOf, Visible visible) {
    const int quad = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < NTH; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const FastDkdvRow row = rowOf(n * 8 + quad * 2 + (e & 1));
            bool ok = true;
            if constexpr (!FULL) {
                const int u = ukey + (e >> 1) * 8;
                ok = row.t >= 0 && u < khi && visible(row.t, u);
            }
            s[n][e] = ok ? row.gate * fastExp2(s[n][e] * c.scale_log2 - row.lse2) : 0.f;
        }
    }
}
template <int NTH, class RowOf>
__device__ __forceinline__ void fastDkdvGradOfProbs(float (&dp)[NTH][4],
                                                    const uint32_t (&ap)[NTH / 2][4],
                                                    RowOf rowOf) {
    const int quad = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < NTH; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            /* fastAFromC's packing: s[n][e] is ap[n / 2][(n & 1) * 2 + e / 2], low half for even e */
            const uint32_t pair = ap[n / 2][(n & 1) * 2 + (e >> 1)];
            const float gp = __uint_as_float(e & 1 ? pair & 0xffff0000u : pair << 16);
            dp[n][e] = gp * (dp[n][e] - rowOf(n * 8 + quad * 2 + (e & 1)).delta);
        }
    }
}

/* Probabilities first: where both the scores and
 * dP^T of a 64-row pass would not fit in registers beside dK's and dV's
 * accumulators (d_k or d_v above 128: 96 + 64 + 32 + 32 of 255), the pass
 * forms S^T alone, turns it into g P^T in bf16 (the A fragments dV's
 * product needs anyway), runs dP^T beside dV += g P^T.dout, and forms dS^T
 * from the bf16 probabilities: 208 live accumulator registers at the
 * peak, not 224. Three waits on the tensor cores per pass (two 32-row
 * passes had four), and P^T rounded to bf16 before dS^T is formed from it
 * (dS^T is rounded to bf16 after, as before; test_fast_attn's d_k = 192
 * gradients within 3.5e-3 of the reference, budget 1e-2). */
/* Only there: where the registers fit, the scores and dP^T together are
 * faster. */
template <int DK, int DV, int RH>
constexpr bool fastDkdvProbsFirst() {
    return RH == 64 && (DK > 128 || DV > 128);
}

/* One wgmma pass of the dK/dV core: rows half * RH .. + RH - 1 of a row
 * stage (q_st, do_st: swizzled tiles of R rows) against this warpgroup's
 * 64 keys (rows wg * 64 .. of the KT-row tiles sK, sV, the CTA's first key
 * u0):  S^T = K.Q^T, dP^T = V.dout^T, then (fastDkdvGradOfScores)
 * dv += g P^T.dout, dk += dS^T.q. rowOf(col) is the FastDkdvRow of stage
 * row half * RH + col; ads returns dS^T's A fragments. during() runs while
 * the first two products are on the tensor cores (it must not touch their
 * accumulators): the ring core's producer work, which at the top of the
 * stage held the other warps at the products' warpgroup-wide issue. */
struct FastNoop {
    __device__ void operator()() const {}
};
template <int DK, int DV, int KT, int R, int RH, class RowOf, class Visible,
          class During = FastNoop>
__device__ __forceinline__ void fastDkdvWgPass(const FastCtx &c, const bf16 *sK, const bf16 *sV,
                                               int wg, const bf16 *q_st, const bf16 *do_st,
                                               int half, int u0, int khi, bool full, RowOf rowOf,
                                               Visible visible, float (&dk)[DK / 8][4],
                                               float (&dv)[DV / 8][4],
                                               uint32_t (&ads)[RH / 16][4],
                                               During during = During{}) {
    constexpr int NTH = RH / 8;
    /* (warps past the key warpgroups': row warpgroups, the same keys) */
    const int ukey = u0 + (int)((threadIdx.x >> 5) & (KT / 16 - 1)) * 16 + (int)((threadIdx.x & 31) >> 2);
    if constexpr (fastDkdvProbsFirst<DK, DV, RH>()) {
        float s[NTH][4];
        fastWgFenceAcc(s);
        fastWgArrive();
        fastWgIssueAZt<NTH, DK>(s, sK, KT, wg * 64, q_st, R, half * RH);
        fastWgCommit();
        during();
        fastWgWait<0>();
        fastWgFenceAcc(s);
        if (full) fastDkdvGatedProbs<true>(c, s, ukey, khi, rowOf, visible);
        else fastDkdvGatedProbs<false>(c, s, ukey, khi, rowOf, visible);
        uint32_t ap[NTH / 2][4];
        fastWgAFromC<NTH>(ap, s);
        float dp[NTH][4];
        fastWgFenceAcc(dp);
        fastWgFenceAcc(dv);
        fastWgArrive();
        fastWgIssueAZt<NTH, DV>(dp, sV, KT, wg * 64, do_st, R, half * RH);
        fastWgIssuePZ<NTH, DV>(dv, ap, do_st, R, half * RH);
        fastWgCommit();
        fastWgWait<0>();
        fastWgFenceAcc(dp);
        fastWgFenceAcc(dv);
        fastDkdvGradOfProbs(dp, ap, rowOf);
        fastWgAFromC<NTH>(ads, dp);
        fastWgRun([&] { fastWgIssuePZ<NTH, DK>(dk, ads, q_st, R, half * RH); }, dk);
        return;
    }
    float s[NTH][4], dp[NTH][4];
    fastWgFenceAcc(s);
    fastWgFenceAcc(dp);
    fastWgArrive();
    fastWgIssueAZt<NTH, DK>(s, sK, KT, wg * 64, q_st, R, half * RH);
    fastWgIssueAZt<NTH, DV>(dp, sV, KT, wg * 64, do_st, R, half * RH);
    fastWgCommit();
    during();
    fastWgWait<0>();
    fastWgFenceAcc(s);
    fastWgFenceAcc(dp);
    if (full) fastDkdvGradOfScores<true>(c, s, dp, ukey, khi, rowOf, visible);
    else fastDkdvGradOfScores<false>(c, s, dp, ukey, khi, rowOf, visible);
    uint32_t ap[NTH / 2][4];
    fastWgAFromC<NTH>(ap, s);
    fastWgAFromC<NTH>(ads, dp);
    fastWgRun(
        [&] {
            fastWgIssuePZ<NTH, DV>(dv, ap, do_st, R, half * RH);
            fastWgIssuePZ<NTH, DK>(dk, ads, q_st, R, half * RH);
        },
        dv, dk);
}

/* Hands a warp's dK (times the scale) and dV rows - keys u0 + warp * 16 +
 * grp (+ 8) of the CTA's, in C-fragment layout - to store(u, is_k, col,
 * v0, v1), two adjacent columns at a time; keys from khi on are skipped. */
template <int DK, int DV, class Store>
__device__ __forceinline__ void fastDkdvStore(const FastCtx &c, int u0, int khi,
                                              const float (&dk)[DK / 8][4],
                                              const float (&dv)[DV / 8][4], Store store) {
    const int lane = threadIdx.x & 31, quad = lane & 3;
    const int keyA = (int)(threadIdx.x >> 5) * 16 + (lane >> 2);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int u = u0 + keyA + i * 8;
        if (u >= khi) continue;
#pragma unroll
        for (int n = 0; n < DK / 8; n++)
            store(u, true, n * 8 + quad * 2, dk[n][2 * i] * c.scale, dk[n][2 * i + 1] * c.scale);
#pragma unroll
        for (int n = 0; n < DV / 8; n++)
            store(u, false, n * 8 + quad * 2, dv[n][2 * i], dv[n][2 * i + 1]);
    }
}

/* acc[0 .. D/8) += A . tile[k0, k0 + 16)[0, D) on mma.sync: A one 16 x 16
 * fragment (rows of keys), tile row-major with row stride ld - dV += P^T dO
 * and dK += dS^T Q of the mma.sync dK/dV loop, 16 query rows at a time. */
template <int D>
__device__ __forceinline__ void fastMmaRowsOfTile(float (&acc)[D / 8][4], const uint32_t (&a)[4],
                                                  const bf16 *tile, int ld, int k0) {
#pragma unroll
    for (int dd = 0; dd < D / 16; dd++) {
        uint32_t bb[4];
        fastLoadBCols(bb, tile, ld, k0, dd * 16);
        fastMma(acc[2 * dd], a, bb[0], bb[1]);
        fastMma(acc[2 * dd + 1], a, bb[2], bb[3]);
    }
}

#endif
