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
/* The share of L2 the groups in flight of the unfused selected dK/dV may
 * fill: 0.4 and 1.5 were no faster at paper 2k (H100). */
#define FAST_SEL_ITEM_L2_SHARE 0.75
/* Selected dK/dV rows through the TMA row ring where a token's rows make a
 * box of this many bytes or more: faster at hpg 16, slower at hpg 6 (H200). */
#define FAST_SEL_RING_BOX_BYTES 2048
/* Consumer warpgroups per forced-pass CTA: four spilled at 128 registers. */
#define SEL_FORCED_WGS 3

/* ---- the compressed branch (fast_cmp.cu) -------------------------------- */
/* 64-key CTAs per SM the interleaved parts aim at: 16 was a little faster
 * than 8 (H200, paper and paper192 64k). */
#define FAST_CMP_BALANCE_CTAS 16

/* ---- the tile loops (tile_*.cuh, fast_tma.cuh) ------------------------- */
/* Query rows per forward CTA on wgmma (three warpgroups of 64). */
#define FAST_FWD_WG_ROWS 192
/* Rows per wgmma pass of the dK/dV core where d_k, d_v <= 128: 64 was faster
 * than 32 in every branch (H200, paper 64k). */
#define FAST_DKDV_WG_ROWS 64
/* Key warpgroups per window / compressed dK/dV CTA on wgmma: two share every
 * row stage, halving each key's L2 bytes. */
#define FAST_DKDV_KEY_WGS 2
/* Row tiles the dK/dV ring's producer issues ahead: one beat two and three
 * (H200, paper and proto 64k compressed dK/dV). */
#define FAST_DKDV_AHEAD 1
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
/* Row warpgroups of the fused selected backward at d_k = 192: two beat one
 * (H100, paper192 64k). */
#define SEL_FUSED_ROW_WGS_WIDE 2
/* ... and at d_k = 128, where two were no faster. */
#define SEL_FUSED_ROW_WGS 1
/* Rows per wgmma pass of the fused kernel where d_k or d_v is above 128:
 * 64-row passes spill. */
#define SEL_FUSED_WIDE_PASS_ROWS 32
/* Fused selected backward CTAs per SM at d_k = 64: a third overlaps the
 * chain of small products (H100, proto 64k). */
#define SEL_FUSED_MIN_CTAS_D64 3
/* 64-row stages per fused work item, at most, and the least it halves to
 * while a chunk holds fewer than 4 x sm_count items' stages. */
#define FAST_SEL_FUSED_STAGES 64
#define FAST_SEL_FUSED_MIN_STAGES 16

#endif
