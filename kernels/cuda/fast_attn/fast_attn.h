/* fast_attn.h - the fast NSA attention op on Hopper/Ampere tensor cores
 * (kernels/cuda/fast_attn/): bf16 in and out, fp32 softmax statistics, every
 * matrix product on mma.sync m16n8k16, O(S) memory, deterministic backward.
 *
 * The public C entry points (plan, forward, backward, profile) are declared
 * in kernels/nsa.h so ctypes callers can reach them; this header holds the
 * kernels' limits and sizes, fast_host.h the per-kernel launchers.
 *
 * Kernels, in the order the op runs them:
 *   forward   pool (k, v) -> kc, vc                          fast_cmp.cu
 *             compressed attention -> o_cmp, lse_cmp         fast_cmp.cu
 *             scores + top-n fused -> sel_idx only           fast_select.cu
 *             selected attention, group-centric: from S = 8192
 *             one warp per token (its group's heads as mma
 *             rows) gathering its own blocks -> o_sel         fast_sel.cu
 *             below it one CTA per 4 tokens streaming the
 *             union of their blocks                          fast_sel_union.cu
 *             window attention + gate combine -> o_win, out  fast_win.cu
 *   backward  gate backward: dgates = dout.o_c (the deltas),
 *             the gates in fp32                               fast_attn.cu
 *             window dK/dV, dQ                                fast_win.cu
 *             compressed dK/dV (row tiles dealt to several
 *             CTAs started longest first, fp32 partials summed
 *             in a fixed order by the pooling backward), dQ   fast_cmp.cu
 *             reverse index (stable counting sort), selected
 *             dK/dV per block, fixed-order chunk reduce, dQ
 *             (warp per token from S = 4096, union below)     fast_sel.cu
 * CTA shapes: forward and dQ tiles are 8 warps = 128 query rows (whole
 * tokens of one KV group) against 64-key tiles; dK/dV tiles are 4 warps =
 * 64 keys against 64-row stages whose metadata arrives by async copies one
 * tile ahead; the score pass is 4 warps, a warp per token's top-n.
 * The flash tile loops shared by the branches are in tile_*.cuh
 * (tile_common.cuh lists them), the mma/ldmatrix/cp.async helpers in
 * fast_common.cuh, the launchers in
 * fast_host.h. Correctness: tests/gpu/test_fast_attn.cu; timing:
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
