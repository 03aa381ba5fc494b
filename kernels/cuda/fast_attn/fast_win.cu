/* fast_win.cu - sliding-window attention, flash style, on tensor cores.
 *
 * Query t of head h sees keys [max(0, t-w+1), t] of its group. Forward: one
 * CTA per query tile (FastQTile: 128 packed (token, head) rows of a group,
 * 192 on wgmma where d_v > 64) streams the key
 * tiles of [t0-w+1, t_last] (left and causal masks per row) and, as the
 * last branch of the forward, fuses the gate combine into its epilogue:
 * out = g_cmp o_cmp + g_sel o_sel + g_win o_win, saving a pass over memory;
 * where the selected branch is masked dense (short S) the same CTA runs it
 * first on the same q tile.
 * Backward: dK/dV per key tile (FastDkdvShape: 64 keys, 128 on wgmma where
 * d_k + d_v >= 256) over the query rows [u0, u1+w-1]
 * (deterministic, written once), and one dQ pass per query tile for this
 * branch and the compressed one together, and the masked dense selected
 * one with them where that design runs (fastWinCmpDq). */
#include "fast_host.h"
#include "fast_policy.cuh"
#include "tile_fwd.cuh"
#include "tile_dq.cuh"
#include "tile_dkdv.cuh"

/* dK, dV of the keys [u0, u0 + KEYS) of (b, g) (grid: key tiles x B*G), summed over the rows
 * (t, h of group g) with u in (t - w, t]: dv_u = sum g_win P_tu dout_t, dk_u = scale sum dS_tu q_t,
 * dS_tu = g_win P_tu (dout_t.v_u - dout_t.o_win), P = exp(s - lse); written once, bf16. */
template <int DK, int DV, bool WG>
__global__ void __launch_bounds__(FastDkdvShape<WG, DK, DV>::THREADS)
winDkdvKernel(FastCtx c, FastBwdIo io, bf16 *dk_out, bf16 *dv_out,
              const __grid_constant__ FastRowMaps maps) {
    constexpr int KT = FastDkdvShape<WG, DK, DV>::KEYS, KWG = FastDkdvShape<WG, DK, DV>::KWG;
    const int b = blockIdx.y / c.G, g = blockIdx.y % c.G;
    const int u0 = blockIdx.x * KT, khi = min(c.S, u0 + KT);
    /* the last token that sees key khi-1 is khi-1+w-1 */
    const int te = (int)min((long long)c.S, (long long)khi - 1 + c.window);
    const int tpr = FAST_DKDV_ROWS / c.hpg;
    const int ntiles = (te - u0 + tpr - 1) / tpr;
    const int window = c.window;
    /* With one key warpgroup (d_k + d_v < 256: three CTAs per SM) the row
     * tiles go as a rotation by absolute position: step k takes the tile
     * whose first token is k tpr modulo the span ntiles tpr, so that the
     * CTAs running together (consecutive key tiles, whose spans overlap in
     * all but KT tokens) read each shared row at the same step and share it
     * in L2; in token order CTA x + 1 reads a row KT / tpr steps before CTA
     * x, and the other CTAs' reads between evict it. With two key
     * warpgroups (one CTA per SM) the rotation gains nothing, so those walk
     * in token order. The order is fixed per CTA: reproducible. */
    const int phase = KWG == 1 && ntiles > 0 ? (ntiles - (u0 / tpr) % ntiles) % ntiles : 0;
    auto tileAt = [=](int it) { /* first token of the row tile walked at step it */
        if constexpr (KWG > 1) return u0 + it * tpr;
        const int k = it + phase;
        return u0 + (k >= ntiles ? k - ntiles : k) * tpr;
    };
    auto visible = [=](int t, int u) { return u <= t && u > t - window; };
    auto seesAny = [=](int it, int ua, int ub) { /* tokens [t, t_last] see keys [t - w + 1, t_last] */
        int t = tileAt(it), t_last = min(te, t + tpr) - 1;
        return ua <= t_last && ub > t - window;
    };
    auto tileFull = [=](int it, int, int ua) { /* tokens of row tile it: [t, t + tpr) */
        int t = tileAt(it);
        return t + tpr <= te && ua + 63 <= t && ua > t + tpr - 1 - window;
    };
    auto store = [=](int u, bool is_k, int col, float v0, float v1) {
        size_t key = ((size_t)b * c.S + u) * c.G + g;
        if (is_k)
            *(uint32_t *)(dk_out + key * DK + col) = fastPack(v0, v1);
        else
            *(uint32_t *)(dv_out + key * DV + col) = fastPack(v0, v1);
    };
    auto tokenOf = [=](int it, int slot) { /* row tile it: tokens tileAt(it) .., none from te */
        int t = tileAt(it) + slot;
        return t < te ? t : -1;
    };
    fastDkdvConsecutive<DK, DV, WG, KWG>(c, io, maps, b, g, u0, khi, ntiles, tokenOf, visible,
                                         seesAny, tileFull, store);
}

template <int DK, int DV>
static cudaError_t winForward(const FastCtx &c, const FastFwdIo &io, const FastFwdIo *sel,
                              const uint64_t *sel_mask, cudaStream_t stream) {
    if (sel)
        return fastLaunchForwardBranches<DK, DV, true>(
            c, io, stream, FastFwdBranch<SelDensePolicy>{*sel, fastSelDensePolicy(c, sel_mask)},
            FastFwdBranch<WinPolicy>{io, fastWinPolicy(c)});
    return fastLaunchForward<DK, DV, WinPolicy, true>(c, io, fastWinPolicy(c), stream);
}

template <int DK, int DV>
static cudaError_t winBackward(const FastCtx &c, const FastBwdIo &io, bf16 *dk, bf16 *dv,
                               cudaStream_t stream, const FastMarks *marks) {
    FastRowMaps maps = {};
    cudaError_t e = fastDkdvRowMaps(c, io, DK, DV, false, &maps);
    if (e != cudaSuccess) return e;
    auto dkdv = c.wgmma ? winDkdvKernel<DK, DV, true> : winDkdvKernel<DK, DV, false>;
    const int kt = c.wgmma ? FastDkdvShape<true, DK, DV>::KEYS
                           : FastDkdvShape<false, DK, DV>::KEYS;
    const int threads = c.wgmma ? FastDkdvShape<true, DK, DV>::THREADS
                                : FastDkdvShape<false, DK, DV>::THREADS;
    const int smem_kv = c.wgmma ? FastDkdvRing<DK, DV, FastDkdvShape<true, DK, DV>::KWG, false>::SMEM
                                : fastDkdvSmem(DK, DV, false, kt / 64);
    if ((e = fastSetSmem(dkdv, smem_kv)) != cudaSuccess) return e;
    if ((e = fastMark(marks, "bwd.win.dkdv")) != cudaSuccess) return e;
    dkdv<<<dim3((c.S + kt - 1) / kt, c.B * c.G), threads, smem_kv, stream>>>(c, io, dk, dv, maps);
    return cudaGetLastError();
}

template <int DK, int DV>
static cudaError_t winCmpDq(const FastCtx &c, const FastBwdIo &win, const FastBwdIo *cmp_io,
                            const FastBwdIo *sel, const uint64_t *sel_mask, int t_begin,
                            int t_end, cudaStream_t stream) {
    if (!cmp_io) return cudaErrorInvalidValue;
    const FastBwdIo &cmp = *cmp_io;
    if (sel && sel_mask)
        return fastLaunchDq<DK, DV>(c, win, t_begin, t_end, stream,
                                    fastDqBranch(win, fastWinPolicy(c)),
                                    fastDqBranch(cmp, fastCmpPolicy(c)),
                                    fastDqBranch(*sel, fastSelDensePolicy(c, sel_mask)));
    if (sel) { /* the forced blocks only (fastSelForcedDqApplies: d_k >= 128) */
        if constexpr (DK >= 128)
            return fastLaunchDq<DK, DV>(c, win, t_begin, t_end, stream,
                                        fastDqBranch(win, fastWinPolicy(c)),
                                        fastDqBranch(cmp, fastCmpPolicy(c)),
                                        fastDqBranch(*sel, fastSelForcedPolicy(c)));
        return cudaErrorInvalidValue;
    }
    return fastLaunchDq<DK, DV>(c, win, t_begin, t_end, stream,
                                fastDqBranch(win, fastWinPolicy(c)),
                                fastDqBranch(cmp, fastCmpPolicy(c)));
}

cudaError_t fastWinForward(const FastCtx &c, int dk, int dv, const FastFwdIo &io,
                           const FastFwdIo *sel, const uint64_t *sel_mask, cudaStream_t stream) {
    if (sel && !sel_mask) return cudaErrorInvalidValue;
    FAST_DISPATCH(dk, dv, winForward, c, io, sel, sel_mask, stream);
}

cudaError_t fastWinBackward(const FastCtx &c, int dk, int dv, const FastBwdIo &io, bf16 *dk_out,
                            bf16 *dv_out, cudaStream_t stream, const FastMarks *marks) {
    FAST_DISPATCH(dk, dv, winBackward, c, io, dk_out, dv_out, stream, marks);
}

cudaError_t fastWinCmpDq(const FastCtx &c, int dk, int dv, const FastBwdIo &win,
                         const FastBwdIo *cmp, const FastBwdIo *sel, const uint64_t *sel_mask,
                         int t_begin, int t_end, cudaStream_t stream) {
    if (sel && !sel_mask && !fastSelForcedDqApplies(c, dk)) return cudaErrorInvalidValue;
    /* a pass with the masked dense branch runs every token (fastDqKernel's ALL) */
    if (sel && sel_mask && (t_begin != 0 || t_end != c.S)) return cudaErrorInvalidValue;
    FAST_DISPATCH(dk, dv, winCmpDq, c, win, cmp, sel, sel_mask, t_begin, t_end, stream);
}
