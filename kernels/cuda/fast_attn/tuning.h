/* tuning.h - the fast attention's tuning constants, in one place: each
 * value with the measurement that set it (docs/PERF.md has the sweeps).
 * They are constants, not switches: no build sets them, and an experiment
 * that changes one is a new measurement and a new value here. Included by
 * fast_attn.h, so every kernel and the host plan see the same numbers. */
#ifndef NSA_FAST_TUNING_H
#define NSA_FAST_TUNING_H

/* ---- the selected branch's design and chunking (fast_attn.cu) ---------- */
/* Masked dense selected forward and dQ up to this S on wgmma: at 4k it beat
 * the block-centric passes about 2x; past 64 blocks the mask word is full. */
#define FAST_SEL_DENSE_MAX_S 4096
/* B x tokens per chunk of the block-centric passes, at least: halving it and
 * FAST_SEL_BLOCK_BYTES was slower (H200). */
#define FAST_SEL_BLOCK_TOKENS 4096
/* Partial bytes a chunk may fill: 4096 tokens at the paper shape. */
#define FAST_SEL_BLOCK_BYTES (1ll << 30)
/* B x tokens per chunk, at most: two chunks instead of four at proto 64k
 * were faster (H100, the fused backward and the forward). */
#define FAST_SEL_BLOCK_MAX_TOKENS 32768
/* Partial buffers where a chunk is bound by bytes: a second lets the
 * combines drain beside the next chunk's pass (H100, paper 16k-64k faster). */
#define FAST_SEL_BLOCK_BUFFERS 2
/* The window + compressed dQ beside the fused selected backward on a second
 * stream (1): faster at paper 64k (H100) than before it on one stream. */
#define FAST_BWD_SIDE_DQ 1
/* The selected dK/dV beside the other backward passes where the selected dQ
 * is masked dense (1): faster at short S than after them. */
#define FAST_BWD_SIDE_SEL 1
/* The share of L2 the groups in flight of the unfused selected dK/dV may
 * fill: 0.4 and 1.5 were no faster at paper 2k (H100). */
#define FAST_SEL_ITEM_L2_SHARE 0.75
/* Selected dK/dV rows through the TMA row ring where a token's rows make a
 * box of this many bytes or more: faster at hpg 16, slower at hpg 6 (H200). */
#define FAST_SEL_RING_BOX_BYTES 2048
/* The forced blocks (0, the token's, the one before) in a flash pass of
 * their own where l' is a multiple of 64 (1). */
#define FAST_SEL_FORCED_PASS 1
/* At l' = 64 on wgmma that pass is fast_sel_forced.cu's (1): faster than
 * the forward tile kernel with SelForcedPolicy (H100, paper 64k). */
#define FAST_SEL_FORCED_OWN 1
/* Consumer warpgroups per forced-pass CTA: four spilled at 128 registers. */
#define SEL_FORCED_WGS 3

/* ---- the compressed branch (fast_cmp.cu) -------------------------------- */
/* Equal token ranges walked in step by the key tiles where a CTA runs two
 * key warpgroups (1): fewer DRAM reads than interleaved row tiles (H100). */
#define FAST_CMP_RANGE_PARTS 1
/* 64-key CTAs per SM the interleaved parts aim at: 16 was a little faster
 * than 8 (H200, paper and paper192 64k). */
#define FAST_CMP_BALANCE_CTAS 16

/* ---- the tile loops (fast_tile.cuh, fast_tma.cuh) ---------------------- */
/* Query rows per forward CTA on wgmma (three warpgroups of 64). */
#define FAST_FWD_WG_ROWS 192
/* Rows per wgmma pass of the dK/dV core where d_k, d_v <= 128: 64 was faster
 * than 32 in every branch (H200, paper 64k). */
#define FAST_DKDV_WG_ROWS 64
/* Key warpgroups per window / compressed dK/dV CTA on wgmma: two share every
 * row stage, halving each key's L2 bytes. */
#define FAST_DKDV_KEY_WGS 2
/* The wgmma forward's epilogue staged through shared memory where it gains (1). */
#define FAST_FWD_STAGED_OUT 1
/* The window forward prefetches its gate-combine inputs (1). */
#define FAST_FWD_PREFETCH 1
/* The ring's next tile issued under the warpgroup's products (1): faster
 * fwd+bwd at paper 64k and 2k and proto 16k (H100). */
#define FAST_RING_PRODUCE_UNDER 1
/* The forward's warpgroups take turns at the tensor cores where d_k > 128
 * (1): faster at paper192, slower at paper's d_k = 128 (H100, ncu). */
#define FAST_FWD_TURNS 1
/* The dQ pass's warpgroups take turns at the tensor cores (1): faster at
 * paper and paper192 64k (H100). */
#define FAST_DQ_TURNS 1
/* The dK/dV core forms the probabilities first where d_k or d_v is above
 * 128 (1); at every shape it was slower (H100, paper 64k). */
#define FAST_DKDV_PROBS_FIRST 1
/* Row tiles the dK/dV ring's producer issues ahead: one beat two and three
 * (H200, paper and proto 64k compressed dK/dV). */
#define FAST_DKDV_AHEAD 1
/* The dK/dV producer's work runs under the stage's first products (1):
 * faster at paper 64k and 16k (H100). */
#define FAST_DKDV_ISSUE_UNDER 1
/* The warp that issues the dK/dV ring's row boxes: warp 2 beat warp 0
 * (H100, paper 64k and 16k). */
#define FAST_DKDV_BOX_WARP 2
/* Key tiles the forward and dQ rings issue ahead at four stages: two beat
 * one (H200, paper 64k). */
#define FAST_RING_AHEAD 2

/* ---- the selected passes (fast_sel.cu, fast_sel_block.cu) -------------- */
/* Unfused selected dK/dV CTAs per SM at d_k = 64. */
#define SEL_DKDV_MIN_CTAS_D64 3
/* Row tiles per block-centric work item: 8 beat 4, 2 and 1 (H200). */
#define SELB_TILES 8
/* q row stages of the block-centric forward's ring at d_k = 192: one fits
 * two CTAs per SM and was faster (H100, paper192). */
#define SELB_RING_STAGES_WIDE 1
/* ... and elsewhere. */
#define SELB_RING_STAGES 2
/* The block-centric forward's partials through a buffer of their own at
 * d_k = 192 (1): faster at paper192 64k (H100). */
#define SELB_OUT_STAGE 1
/* The block-centric forward's partials stored by bulk tensor copies on the
 * q ring (1). */
#define FAST_SELB_TMA_STORE 1
/* Row warpgroups of the fused selected backward at d_k = 192: two beat one
 * (H100, paper192 64k). */
#define SEL_FUSED_ROW_WGS_WIDE 2
/* ... and at d_k = 128, where two were no faster. */
#define SEL_FUSED_ROW_WGS 1
/* Rows per wgmma pass of the fused kernel where d_k or d_v is above 128:
 * 64-row passes spill. */
#define SEL_FUSED_WIDE_PASS_ROWS 32
/* The fused kernel waits for its dq stores to have read a stage only under
 * the next stage's products (1): faster at paper and proto 64k (H100). */
#define SEL_FUSED_DEFER_READ 1
/* Fused selected backward CTAs per SM at d_k = 64: a third overlaps the
 * chain of small products (H100, proto 64k). */
#define SEL_FUSED_MIN_CTAS_D64 3
/* 64-row stages per fused work item, at most, and the least it halves to
 * while a chunk holds fewer than 4 x sm_count items' stages. */
#define FAST_SEL_FUSED_STAGES 64
#define FAST_SEL_FUSED_MIN_STAGES 16

#if SEL_FUSED_DEFER_READ && !FAST_DKDV_ISSUE_UNDER
#error "SEL_FUSED_DEFER_READ releases a stage under the next stage's products: FAST_DKDV_ISSUE_UNDER"
#endif

#endif
