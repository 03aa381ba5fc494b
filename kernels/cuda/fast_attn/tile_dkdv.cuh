/* tile_dkdv.cuh - the dK/dV pass of the flash tile loops: its two main
 * loops (tile_dkdv_cpasync.cuh, tile_dkdv_ring.cuh), the rule that picks
 * one for a branch of consecutive tokens (window, compressed), and the host
 * side's row maps. The selected branch, whose rows are gathered, calls the
 * main loops itself (fast_sel.cu, fast_sel_block.cu). */
#ifndef NSA_FAST_TILE_DKDV_CUH
#define NSA_FAST_TILE_DKDV_CUH

#include "tile_dkdv_ring.cuh"

/* The dK/dV pass of a branch whose row tiles are runs of consecutive
 * tokens (window, compressed): tokenOf(it, slot) gives the token of row
 * tile it's slot, -1 for none. On wgmma through the TMA row ring
 * (fastDkdvRingCore, one box per tile), else through fastDkdvCore's
 * cp.async stages - one rule for both. */
template <int DK, int DV, bool WG, int KWG, class TokenOf, class Visible, class SeesAny,
          class TileFull, class Store>
__device__ __forceinline__ void fastDkdvConsecutive(const FastCtx &c, const FastBwdIo &io,
                                                    const FastRowMaps &maps, int b, int g, int u0,
                                                    int khi, int ntiles, TokenOf tokenOf,
                                                    Visible visible, SeesAny seesAny,
                                                    TileFull tileFull, Store store) {
    if constexpr (WG)
        fastDkdvRingCore<DK, DV, KWG, false>(c, io, maps, b, g, u0, khi, ntiles, tokenOf, visible,
                                             seesAny, tileFull, store);
    else
        fastDkdvCore<DK, DV, WG, KWG>(
            c, io, b, g, u0, khi, ntiles,
            [=](int it, int slot, int *dst) { *dst = tokenOf(it, slot); }, visible, seesAny,
            tileFull, store);
}

/* The row maps of a dK/dV pass on the ring core (c.wgmma; zeroed maps
 * otherwise): boxes of a row tile's FAST_DKDV_ROWS / hpg tokens, or of one
 * token where the pass gathers its rows. Returns the encode status; host
 * only, no device work. */
static inline cudaError_t fastDkdvRowMaps(const FastCtx &c, const FastBwdIo &io, int dk, int dv,
                                          bool gather, FastRowMaps *maps) {
    memset(maps, 0, sizeof(*maps));
    if (!c.wgmma) return cudaSuccess;
    return fastTmaEncodeRowMaps(c.tma_encode, maps, io.q, io.dout, c.B, c.S, c.H, dk, dv, c.hpg,
                                gather ? 1 : FAST_DKDV_ROWS / c.hpg);
}

#endif
