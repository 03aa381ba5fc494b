/* fast_policy.cuh - which keys a query sees in the compressed and window
 * branches and in the masked dense selected one: the policies of the flash
 * tile loops (tile_common.cuh says what a policy provides). In one header so
 * that one dQ kernel can run them together (fast_win.cu, fastWinCmpDq).
 * Internal to the fast kernels. */
#ifndef NSA_FAST_POLICY_CUH
#define NSA_FAST_POLICY_CUH

#include <limits.h>

#include "tile_common.cuh"

/* Window: query t sees keys [max(0, t - w + 1), t]. */
struct WinPolicy : FastNoRowMask {
    int window;
    __device__ void keyRange(int t0, int t_last, int &kb, int &ke) const {
        kb = max(0, t0 - window + 1);
        ke = t_last + 1;
    }
    __device__ bool visible(int t, int u) const { return u <= t && u > t - window; }
    /* keys [u_first, u_last] seen by every token of [t_first, t_last] */
    __device__ bool allVisible(int t_first, int t_last, int u_first, int u_last) const {
        return u_last <= t_first && u_first > t_last - window;
    }
};

/* Compressed: block i covers tokens [i*d, i*d+l) and is visible at t when
 * i*d+l-1 <= t. */
struct CmpPolicy : FastNoRowMask {
    int cmp_len, cmp_stride, Nc;
    __device__ void keyRange(int t0, int t_last, int &kb, int &ke) const {
        kb = 0;
        ke = t_last < cmp_len - 1 ? 0 : min(Nc, (t_last - cmp_len + 1) / cmp_stride + 1);
    }
    __device__ bool visible(int t, int i) const { return i * cmp_stride + cmp_len - 1 <= t; }
    __device__ bool allVisible(int t_first, int t_last, int i_first, int i_last) const {
        return i_last * cmp_stride + cmp_len - 1 <= t_first;
    }
};
static inline CmpPolicy fastCmpPolicy(const FastCtx &c) {
    return CmpPolicy{{}, c.cmp_len, c.cmp_stride, c.Nc};
}
static inline WinPolicy fastWinPolicy(const FastCtx &c) { return WinPolicy{{}, c.window}; }

/* The tile policy: query t sees key u <= t when u's block is in t's mask. */
struct SelDensePolicy {
    const uint64_t *mask;
    int S, G, sel_len;
    struct Row {
        uint64_t bits;
    };
    __device__ Row rowState(int b, int g, int t) const {
        return Row{t >= 0 ? mask[((size_t)b * S + t) * G + g] : 0ull};
    }
    /* the key tile at u0 lies in block u0 / l' (l' a multiple of the tile) */
    __device__ bool rowSees(Row r, int u0) const { return (r.bits >> (u0 / sel_len)) & 1ull; }
    __device__ void keyRange(int t0, int t_last, int &kb, int &ke) const {
        kb = 0;
        ke = t_last + 1;
    }
    template <int KT>
    __device__ int leadTiles(int) const { return 0; }
    static constexpr bool WHOLE_SELECTION = true; /* FastNoRowMask says */
    __device__ bool visible(int t, int u) const { return u <= t; }
    /* every row of the tile past every key: the causal mask is off, the
     * row mask (rowSees) still applies */
    __device__ bool allVisible(int t_first, int t_last, int u_first, int u_last) const {
        return u_last <= t_first;
    }
};
static inline SelDensePolicy fastSelDensePolicy(const FastCtx &c, const uint64_t *mask) {
    return SelDensePolicy{mask, c.S, c.G, c.sel_len};
}

/* The forced blocks of the selected branch: query t sees key u <= t when
 * u's block is block 0, t's own or the one before (the selection always
 * keeps these three in a token's set: proto/model.md). Their keys are block 0 and the run
 * from the block before the tile's first token's to its last token, so
 * block 0 comes as lead tiles ahead of that range. Rows are masked per
 * key tile (rowSees, from the row's first forced block past 0), which
 * needs l' a multiple of the tile (fastSelForcedApplies: of 64). */
struct SelForcedPolicy {
    int sel_len;
    struct Row {
        int lo; /* t's previous block's first key; INT_MAX: a padding row */
    };
    __device__ Row rowState(int, int, int t) const {
        return Row{t >= 0 ? (t / sel_len - 1) * sel_len : INT_MAX};
    }
    __device__ bool rowSees(Row r, int u0) const { return u0 < sel_len || u0 >= r.lo; }
    __device__ void keyRange(int t0, int t_last, int &kb, int &ke) const {
        const int first = t0 / sel_len;
        kb = first >= 2 ? (first - 1) * sel_len : 0; /* from block 0 on: no lead tiles */
        ke = t_last + 1;
    }
    template <int KT>
    __device__ int leadTiles(int kb) const { return kb > 0 ? sel_len / KT : 0; }
    static constexpr bool WHOLE_SELECTION = false; /* the forced blocks only */
    __device__ bool visible(int t, int u) const { return u <= t; }
    __device__ bool allVisible(int t_first, int t_last, int u_first, int u_last) const {
        return u_last <= t_first;
    }
};
static inline SelForcedPolicy fastSelForcedPolicy(const FastCtx &c) {
    return SelForcedPolicy{c.sel_len};
}

#endif
