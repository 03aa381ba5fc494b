/* nsa_layout.h - the parameter layout every engine shares.
 *
 * From an NsaModelConfig, nsaLayoutBuild makes the ordered tensor table of the
 * model: name, shape, element count, element offset inside each arena (params,
 * grads, Adam m, Adam v all use the same offsets), whether AdamW decays it,
 * and how nsaModelInit fills it. The order is the checkpoint order, the
 * gradient-norm reduction order and the order in which init draws random
 * numbers, so the same seed gives the same weights on every engine.
 *
 * Order (phi tensors only when phi = mlp, w_up only for SwiGLU):
 *   tok_emb
 *   for each layer i:
 *     layers.{i}.attn_norm, wq, wk_cmp, wv_cmp, wk_sel, wv_sel, wk_win, wv_win,
 *     phi_k.pos, phi_k.w1, phi_k.w2, phi_v.pos, phi_v.w1, phi_v.w2,
 *     w_gate, wo, mlp_norm, w_fc, w_up, w_proj
 *   final_norm, lm_head
 * Offsets are rounded up to NSA_LAYOUT_ALIGN elements, and w_gate is followed
 * by zero rows up to a multiple of 8 rows of the block wq .. w_gate (the CUDA
 * engine's fused projection); the padding is zero in every arena and takes
 * part in nothing. proto/model.md is the contract.
 *
 * Buckets (data parallelism): the arena splits into contiguous ranges that
 * the backward completes one after another - bucket 0 the embedding,
 * bucket 1 + i layer i, bucket L + 1 the final norm and the head. For a
 * job of `ranks` ranks each bucket is padded (at its end) to a multiple of
 * ranks x NSA_LAYOUT_ALIGN elements, so that it splits into `ranks` equal,
 * aligned slices; with one rank there is no extra padding and the offsets
 * are those above. */
#ifndef NSA_LAYOUT_H
#define NSA_LAYOUT_H

#include <stddef.h>
#include "nsa.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every tensor starts at a multiple of this many elements (256 bytes in fp32),
 * so engines may use aligned vector loads on any tensor. */
#define NSA_LAYOUT_ALIGN 64

#define NSA_LAYOUT_NAME_MAX 48

typedef enum NsaInitKind {
    NSA_INIT_NORMAL = 0,  /* N(0, init_std), drawn in layout order */
    NSA_INIT_ONES = 1     /* every element 1 (norm weights); draws nothing */
} NsaInitKind;

typedef struct NsaLayoutEntry {
    NsaTensorInfo info;          /* info.name points into name[] below */
    NsaInitKind init;
    double init_std;             /* NSA_INIT_NORMAL only */
    char name[NSA_LAYOUT_NAME_MAX];
} NsaLayoutEntry;

/* Tensor indices of one layer; -1 where the config has no such tensor
 * (phi_* unless phi = mlp, w_up unless SwiGLU). */
typedef struct NsaLayerIndex {
    int attn_norm, wq, wk_cmp, wv_cmp, wk_sel, wv_sel, wk_win, wv_win;
    int phi_k_pos, phi_k_w1, phi_k_w2, phi_v_pos, phi_v_w1, phi_v_w2;
    int w_gate, wo, mlp_norm, w_fc, w_up, w_proj;
} NsaLayerIndex;

/* One bucket: arena elements [offset, offset + count), tensors [first, end). */
typedef struct NsaLayoutBucket {
    size_t offset, count;
    int first, end;
} NsaLayoutBucket;

typedef struct NsaLayout {
    int n_tensors;
    NsaLayoutEntry *entries;     /* n_tensors, in layout order */
    int tok_emb, final_norm, lm_head;
    int n_layers;
    NsaLayerIndex *layers;       /* n_layers */
    size_t total;                /* elements per arena, padding included */
    size_t n_params;             /* elements of real parameters, padding excluded */
    int ranks;                   /* the bucket padding is for this many ranks */
    int n_buckets;               /* L + 2 */
    NsaLayoutBucket *buckets;    /* n_buckets, in arena order */
} NsaLayout;

/* Bucket indices: the embedding, layer i, the final norm with the head. */
#define NSA_BUCKET_EMBED 0
#define NSA_BUCKET_LAYER(i) (1 + (i))
#define NSA_BUCKET_HEAD(L) ((L) + 1)

/* Builds the table for cfg (validated first with nsaModelConfigValidate).
 * Returns 0, or -1 with err filled (bad config, out of memory); on error lay
 * holds nothing to free. The caller frees with nsaLayoutFree. */
int nsaLayoutBuild(NsaLayout *lay, const NsaModelConfig *cfg, NsaError *err);
/* The same with the buckets padded for `ranks` data-parallel ranks (1 to
 * 4096; 1 is nsaLayoutBuild). */
int nsaLayoutBuildRanks(NsaLayout *lay, const NsaModelConfig *cfg, int ranks, NsaError *err);

/* This rank's part of a layout for data parallelism (ZeRO-1): slice `rank`
 * of every bucket, and for each tensor the piece of it that lies in this
 * rank's slices (at most one contiguous range per tensor, as a tensor lies
 * in one bucket). The rank keeps the Adam moments of its slices only, in a
 * shard arena of `total` elements: slice b at `local` onwards. With one
 * rank the slices are the buckets, the pieces the whole tensors and every
 * local offset equals the arena offset. */
typedef struct NsaShardPiece {
    int tensor;
    size_t offset;    /* arena offset of the piece's first element */
    size_t begin;     /* its index within the tensor */
    size_t numel;
    size_t local;     /* its offset in the shard arena */
    int weight_decay;
} NsaShardPiece;

typedef struct NsaShardSlice {
    size_t offset, count;  /* arena elements of this rank's slice of the bucket */
    size_t local;          /* where the slice lives in the shard arena */
} NsaShardSlice;

typedef struct NsaShard {
    int rank, ranks;
    size_t total;            /* shard arena elements: the sum of the slices */
    int n_slices;            /* one per bucket */
    NsaShardSlice *slices;
    int n_pieces;
    NsaShardPiece *pieces;   /* in arena order */
    int *tensor_piece;       /* [n_tensors]: index into pieces, or -1 */
} NsaShard;

/* Elements [*begin, *end) of tensor i whose moments rank r holds (within
 * the tensor; begin == end: none), without building r's shard. */
void nsaShardTensorRange(const NsaLayout *lay, int i, int rank, size_t *begin, size_t *end);

/* Builds rank's shard of lay (built for lay->ranks ranks). Returns 0, or -1
 * with err (bad rank, out of memory). Free with nsaShardFree. */
int nsaShardBuild(NsaShard *sh, const NsaLayout *lay, int rank, NsaError *err);
void nsaShardFree(NsaShard *sh);

/* Frees what nsaLayoutBuild allocated and zeroes lay. Safe on a zeroed or
 * already freed layout. */
void nsaLayoutFree(NsaLayout *lay);

/* Index of the named tensor, or -1. */
int nsaLayoutFind(const NsaLayout *lay, const char *name);

/* Fills dst (info.numel floats) with tensor i's initial values for seed:
 * NSA_INIT_ONES -> 1; NSA_INIT_NORMAL -> (float)(init_std * z) with z drawn
 * by nsaRngNormal from nsaRngSeed(seed, stream = i), element by element in
 * row-major order. Every engine initialises through this function (the F64
 * CPU engine widens the same floats), so one seed gives bit-identical
 * starting weights everywhere. Returns 0, or -1 with err for a bad index. */
int nsaLayoutInitTensor(const NsaLayout *lay, int i, uint64_t seed, float *dst, NsaError *err);

/* The MLP hidden width F the config implies (mlp_hidden, or 4*dim when 0). */
int nsaLayoutMlpHidden(const NsaModelConfig *cfg);

#ifdef __cplusplus
}
#endif
#endif /* NSA_LAYOUT_H */
