/* fast_sel_dense.cu - selected attention at short S as masked dense flash
 * attention (one of the selected forward's and dQ's designs, FastSelFwd
 * and FastSelDq in fast_host.h; fastSelDesign in fast_attn.cu picks it).
 *
 * At short S a token chooses a large share of all blocks (16 of 32 at
 * S = 2048, l' = 64), so its selected keys are most of its causal past. Then
 * the cheapest exact way is the compressed and window branches' flash tile
 * loops (tile_fwd.cuh, tile_dq.cuh; wgmma on sm_90) over every causal key
 * tile, with the tiles a row did not choose masked out:
 *   o_t = sum_{u <= t, block(u) in sel(t)} p_u v_u,
 * a per-row bit mask of chosen blocks (one 64-bit word per (b, t, g), so
 * at most 64 blocks: Ns <= 64) and l' a multiple of 64, so that every key
 * tile (64 keys, or 32 on mma.sync at d = 128) lies in one block and a row
 * tests one bit per tile. The work is that of dense causal attention, paid
 * back by tensor-core tiles instead of per-token gathers or partials. The
 * forward runs in the window forward's pass and the dQ in the window and
 * compressed dQ pass (fast_win.cu: the policy in fast_policy.cuh); dK/dV
 * stay with the reverse index (fast_sel.cu), which touches chosen pairs
 * only. */
#include "fast_host.h"
#include "fast_policy.cuh"

/* mask[b][t][g] = OR over the token's valid sel_idx entries j of 1 << j. */
__global__ void selDenseMaskKernel(const int32_t *sel_idx, uint64_t *mask, size_t rows, int slots) {
    for (size_t r = blockIdx.x * (size_t)blockDim.x + threadIdx.x; r < rows;
         r += (size_t)gridDim.x * blockDim.x) {
        const int32_t *row = sel_idx + r * slots;
        uint64_t bits = 0;
        for (int s = 0; s < slots; s++)
            if (row[s] >= 0) bits |= 1ull << row[s];
        mask[r] = bits;
    }
}

bool fastSelDenseApplies(int S, int sel_len) {
    const int Ns = (S + sel_len - 1) / sel_len;
    return sel_len % 64 == 0 && Ns <= 64;
}

cudaError_t fastSelDenseMask(const FastCtx &c, const int32_t *sel_idx, uint64_t *mask,
                             cudaStream_t stream) {
    const size_t rows = (size_t)c.B * c.S * c.G;
    if (rows == 0) return cudaSuccess;
    const unsigned blocks = (unsigned)min((size_t)65535, (rows + 255) / 256);
    selDenseMaskKernel<<<blocks, 256, 0, stream>>>(sel_idx, mask, rows, c.slots);
    return cudaGetLastError();
}
