/* fast_attn.h - the fast NSA attention op on Hopper/Ampere tensor cores
 * (kernels/cuda/fast_attn/): bf16 in and out, fp32 softmax statistics,
 * every matrix product on the tensor cores (wgmma on sm_90a, mma.sync
 * m16n8k16 elsewhere), O(S) memory, deterministic backward.
 *
 * The public C entry points (plan, forward, backward, profile) are declared
 * in kernels/nsa.h so ctypes callers can reach them; this header holds the
 * kernels' limits and sizes and the element type; fast_host.h the call
 * context and the per-kernel launchers.
 *
 * Kernels, in the order the op runs them:
 *   forward   pool (k, v) -> kc, vc                          fast_cmp.cu
 *             compressed attention -> o_cmp, lse_cmp         fast_cmp.cu
 *             scores + top-n fused -> sel_idx only           fast_select.cu
 *             selected attention -> o_sel: masked dense at
 *             short S (in the window's pass), block-centric
 *             over the reverse index, or one CTA per 4 tokens
 *             over their blocks' union     fast_win.cu, fast_sel_block.cu,
 *                                          fast_sel_forced.cu, fast_sel_union.cu
 *             window attention + gate combine -> o_win, out  fast_win.cu
 *   backward  gate backward: dgates = dout.o_c (the deltas),
 *             the gates in fp32                               fast_attn.cu
 *             window dK/dV                                    fast_win.cu
 *             compressed dK/dV (fp32 partials in parts,
 *             summed in a fixed order by the pooling backward) fast_cmp.cu
 *             window + compressed (+ masked dense selected) dQ fast_win.cu
 *             selected dK/dV and dQ: fused, or the reverse
 *             index, per-block dK/dV and a fixed-order reduce
 *             and a separate dQ         fast_sel_block.cu, fast_sel.cu,
 *                                       fast_sel_union.cu
 * docs/FAST_ATTN.md has the table of which kernel runs each pass at each
 * shape. The flash tile loops shared by the branches are in tile_*.cuh
 * (tile_common.cuh lists them), the mma/ldmatrix/cp.async helpers in
 * fast_common.cuh. Correctness: tests/gpu/test_fast_attn.cu; timing:
 * bench/attn (make bench-attn); results: docs/PERF.md.
 * Limits: (d_k, d_v) in {(64,64), (128,64), (128,128), (192,128)}; heads per
 * group 1..16; n_sel <= 32. Every limit is checked with a one-line error. */
#ifndef NSA_FAST_ATTN_H
#define NSA_FAST_ATTN_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "../../nsa.h"
#include "tuning.h"

typedef __nv_bfloat16 bf16;

#define FAST_LOG2E 1.4426950408889634f
#define FAST_LN2 0.6931471805599453f

#define FAST_MAX_SLOTS 32      /* sel_idx entries per row the kernels handle */
#define FAST_MAX_HPG 16        /* heads per KV group */
#define FAST_SEL_CHUNK 4096    /* reverse-index entries one selected dK/dV CTA reduces, at most */
#define FAST_REV_TOKENS 256    /* tokens per counting-sort chunk */
/* The most B x tokens a chunk NsaAttnCudaOptions.sel_chunk_tokens may ask
 * for (the chunking's defaults are in tuning.h). */
#define FAST_SEL_CHUNK_TOKENS_MAX 1048576
#define FAST_SCORE_RING 128    /* selection blocks a score pass keeps open */

#endif
