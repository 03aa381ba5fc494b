/* decode.h - the CPU reference decoder: NSA's per-slot caches and the step
 * that appends tokens to them (kernels/cpu/decode.c, compiled for float and
 * for double like every source here; nsa_decode.c plans the buffers and owns
 * the public NsaDecoder).
 *
 * One arena of `real` elements holds the weights (the layout's offsets;
 * every linear weight stored transposed, [in][out], so a row times it is
 * nsaCpuMatmul's product with no per-step transpose), the caches and the
 * per-row scratch. Offsets below are element offsets into that arena.
 *
 * Caches of slot s, layer i (every key already rotated at its position):
 *   k_sel, v_sel  [T][G][dk], [T][G][dv]   position u at row u (T = max_context)
 *   k_win, v_win  [W][G][dk], [W][G][dv]   ring, position u at row u % W, W = min(w, T)
 *   k_raw, v_raw  [l][G][dk], [l][G][dv]   ring of the compressed branch's raw
 *                                          keys/values, position u at row u % l
 *   kc, vc        [Nc][G][dk], [Nc][G][dv] pooled block i (tokens [i*d, i*d+l)),
 *                                          written when token i*d + l - 1 arrives
 * Rows: a call appends `rows` tokens; rows of one slot come in position
 * order, and for each layer every row appends its keys and values and then
 * attends before the next row does, so a ring never loses a key a later row
 * of the same call still needs. */
#ifndef NSA_CPU_DECODE_H
#define NSA_CPU_DECODE_H

#include <stddef.h>
#include <stdint.h>
#include "../nsa.h"
#include "../nsa_layout.h"

typedef struct NsaCpuDecodeLayer {
    size_t k_sel, v_sel, k_win, v_win, k_raw, v_raw, kc, vc;  /* slot 0; + slot * slot_* */
} NsaCpuDecodeLayer;

typedef struct NsaCpuDecoder {
    NsaModelConfig cfg;
    const NsaLayout *layout;   /* owned by the NsaDecoder */
    int f64;
    size_t real_size;
    int max_batch, max_context, max_rows;
    int window_rows;           /* W = min(w, max_context) */
    int max_cmp_blocks;        /* nsaNumCmpBlocks(max_context) */
    int max_sel_blocks;        /* nsaNumSelBlocks(max_context) */
    void *arena;               /* real */
    size_t arena_elems;
    size_t weights;            /* layout->total elements at this offset */
    NsaCpuDecodeLayer *layers; /* [L] */
    /* elements between consecutive slots of one cache */
    size_t slot_sel_k, slot_sel_v, slot_win_k, slot_win_v, slot_raw_k, slot_raw_v;
    size_t slot_kc, slot_vc;
    /* per-row scratch, [max_rows][...] */
    size_t x, xn, rstd, q, k[3], v[3], gates, o[3], lse_cmp, y, proj, mid, fc, up, act, logits;
    size_t rope;               /* [max_rows][dk/2][2] cos, sin at the row's position */
    /* per-call scratch */
    size_t block_k, block_v;   /* [l][G][dk], [l][G][dv]: a block's raw rows in order */
    size_t hidden;             /* [G][max(dk, dv)] phi = mlp pre-activation */
    size_t scores;             /* [max_sel_blocks] */
    unsigned char *taken;      /* [max_sel_blocks] */
    int32_t *sel;              /* [nsaNumSelSlots(n_sel)] */
    int32_t *pos;              /* [max_batch]: tokens each slot holds */
    int32_t *row_slot, *row_pos;   /* [max_rows] */
    struct NsaCpuPool *pool;   /* the products' threads; NULL: the caller's only */
} NsaCpuDecoder;

/* Appends one token per row: rows 0..rows-1 go to slots row_slot[r] at
 * positions row_pos[r] (set by the caller: consecutive per slot, below
 * max_context, tokens range-checked), and leaves the logits of every row in
 * the arena at dec->logits ([rows][V]). The caller advances dec->pos.
 * Cannot fail. */
void nsaCpuDecodeRowsF32(NsaCpuDecoder *dec, const int32_t *tokens, int rows);
void nsaCpuDecodeRowsF64(NsaCpuDecoder *dec, const int32_t *tokens, int rows);

/* Stores tensor i of the layout from fp32 (or, with src64, double) values
 * into the weight arena, transposing linear weights. Cannot fail (i is
 * checked by the caller). */
void nsaCpuDecodeSetTensorF32(NsaCpuDecoder *dec, int i, const float *src, const double *src64);
void nsaCpuDecodeSetTensorF64(NsaCpuDecoder *dec, int i, const float *src, const double *src64);

/* The CPU decoder behind d, or NULL for a CUDA decoder; for tests that read
 * the logits at full precision. Not part of nsa.h. */
struct NsaDecoder;
NsaCpuDecoder *nsaDecoderCpuEngine(struct NsaDecoder *d);

#endif /* NSA_CPU_DECODE_H */
