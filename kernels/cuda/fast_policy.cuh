/* fast_policy.cuh - which keys a query sees in the compressed and window
 * branches and in the masked dense selected one: the policies of the flash
 * tile loops (fast_tile.cuh says what a policy provides). In one header so
 * that one dQ kernel can run them together (fast_win.cu, fastWinCmpDq).
 * Internal to the fast kernels. */
#ifndef NSA_FAST_POLICY_CUH
#define NSA_FAST_POLICY_CUH

#include "fast_tile.cuh"

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

#endif
