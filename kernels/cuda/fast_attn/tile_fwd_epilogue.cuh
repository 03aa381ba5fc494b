/* tile_fwd_epilogue.cuh - the forward pass's epilogue (tile_fwd.cuh runs
 * it after each branch's main loop): the branch's o and lse, and after the
 * last branch the gate combine. */
#ifndef NSA_FAST_TILE_FWD_EPILOGUE_CUH
#define NSA_FAST_TILE_FWD_EPILOGUE_CUH

#include "tile_common.cuh"

/* The forward's epilogue for one branch's rows of the tile: o (normalised)
 * and lse out and, after the last branch (LAST) with COMBINE, the gate
 * combine out = g_cmp o_cmp + g_sel o_sel + g_win o. On wgmma where it
 * gains, staged through the q tile in shared memory and moved in 16-byte
 * chunks; elsewhere 4-byte stores from the fragments. tok, m, l, o are the
 * warp's rows (m-tiles) as the main loop left them; rowToken and rowIndex
 * the kernel's row maps. */
template <int DV, int MT, int R, bool COMBINE, bool LAST, bool WG, class RowToken, class RowIndex>
__device__ __forceinline__ void fastFwdEpilogue(const FastFwdIo &io, const FastFwdIo &bio, bf16 *sQ,
                                                int (&tok)[MT][2], float (&m)[MT][2],
                                                float (&l)[MT][2], float (&o)[MT][DV / 8][4],
                                                int row0, const RowToken &rowToken,
                                                const RowIndex &rowIndex) {
    const int lane = threadIdx.x & 31, grp = lane >> 2, quad = lane & 3;
    if constexpr (LAST && WG && (COMBINE || DV > 64)) {
        /* The epilogue through shared memory: the warp stages its 16 rows of
         * o (normalised, bf16) in its own rows of the q tile - its
         * warpgroup's products, the only readers of those rows, are done -
         * and then moves whole 16-byte chunks: o out, and with COMBINE
         *   out = g_cmp o_cmp + g_sel o_sel + g_win o
         * from 16-byte loads of o_cmp and o_sel. o enters the combine in
         * bf16, as it is stored (and as o_cmp, o_sel are). The fragments'
         * 4-byte loads and stores had been most of the window forward's
         * epilogue, which at one CTA per SM nothing overlaps. Not at d_v =
         * 64 without the combine: there two CTAs per SM overlap their
         * epilogues, and staging was a little slower. */
        float inv[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float lsum = fastQuadSum(l[0][i]);
            inv[i] = lsum > 0.f ? 1.f / lsum : 0.f;
            if (tok[0][i] >= 0 && quad == 0)
                bio.lse[rowIndex(row0 + grp + 8 * i)] = fastLse(m[0][i], lsum);
        }
#pragma unroll
        for (int h = 0; h < DV / 64; h++)
            fastStagePut64<R>(sQ, row0, h * 64, fastPanel64(o[0], h), inv[0], inv[1]);
        __syncwarp();
        /* lane l < 16 knows row row0 + l: its index (-1: none) and gates */
        const int my_r = row0 + (lane & 15);
        const long long my_at = rowToken(my_r) >= 0 ? (long long)rowIndex(my_r) : -1;
        float my_g[3] = {0.f, 0.f, 0.f};
        if (COMBINE && my_at >= 0)
#pragma unroll
            for (int k = 0; k < 3; k++) my_g[k] = __bfloat162float(io.gates[my_at * 3 + k]);
        constexpr int CH = DV / 8; /* 16-byte chunks per row */
#pragma unroll 2
        for (int idx = lane; idx < 16 * CH; idx += 32) {
            const int r = idx / CH, k = idx % CH;
            const long long at = __shfl_sync(0xffffffffu, my_at, r);
            const float gc = __shfl_sync(0xffffffffu, my_g[0], r);
            const float gs = __shfl_sync(0xffffffffu, my_g[1], r);
            const float gw = __shfl_sync(0xffffffffu, my_g[2], r);
            if (at < 0) continue;
            const uint4 ov = fastStageChunk<R>(sQ, row0 + r, k);
            const size_t off = (size_t)at * DV + k * 8;
            *(uint4 *)(bio.o + off) = ov;
            if constexpr (COMBINE) {
                const uint4 cv = *(const uint4 *)(io.o_cmp + off);
                const uint4 sv = *(const uint4 *)(io.o_sel + off);
                const __nv_bfloat162 *o2 = (const __nv_bfloat162 *)&ov;
                const __nv_bfloat162 *c2 = (const __nv_bfloat162 *)&cv;
                const __nv_bfloat162 *s2 = (const __nv_bfloat162 *)&sv;
                uint4 y;
                uint32_t *y32 = (uint32_t *)&y;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 a = __bfloat1622float2(c2[e]), bs = __bfloat1622float2(s2[e]),
                                 w = __bfloat1622float2(o2[e]);
                    y32[e] = fastPack(gc * a.x + gs * bs.x + gw * w.x,
                                      gc * a.y + gs * bs.y + gw * w.y);
                }
                *(uint4 *)(io.out + off) = y;
            }
        }
    } else {
        /* from the fragments: 4-byte stores (and loads for the combine) */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float lsum = fastQuadSum(l[mt][i]);
                if (tok[mt][i] < 0) continue;
                size_t row = rowIndex(row0 + 16 * mt + grp + 8 * i);
                float inv = lsum > 0.f ? 1.f / lsum : 0.f;
                float gc = 0.f, gs = 0.f, gw = 0.f;
                if (LAST && COMBINE) {
                    gc = __bfloat162float(io.gates[row * 3 + 0]);
                    gs = __bfloat162float(io.gates[row * 3 + 1]);
                    gw = __bfloat162float(io.gates[row * 3 + 2]);
                }
#pragma unroll
                for (int n = 0; n < DV / 8; n++) {
                    int col = n * 8 + quad * 2;
                    float o0 = o[mt][n][2 * i] * inv, o1 = o[mt][n][2 * i + 1] * inv;
                    *(uint32_t *)(bio.o + row * DV + col) = fastPack(o0, o1);
                    if (LAST && COMBINE) {
                        const size_t at = row * DV + col;
                        __nv_bfloat162 oc = *(const __nv_bfloat162 *)(io.o_cmp + at);
                        __nv_bfloat162 os = *(const __nv_bfloat162 *)(io.o_sel + at);
                        float y0 = gc * __low2float(oc) + gs * __low2float(os) + gw * o0;
                        float y1 = gc * __high2float(oc) + gs * __high2float(os) + gw * o1;
                        *(uint32_t *)(io.out + row * DV + col) = fastPack(y0, y1);
                    }
                }
                if (quad == 0)
                    bio.lse[row] = fastLse(m[mt][i], lsum);
            }
        }
    }
}

#endif
