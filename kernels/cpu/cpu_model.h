/* cpu_model.h - the CPU reference engine's whole-model state and passes.
 *
 * nsa_model.c owns an NsaCpuModel and calls the precision-suffixed passes
 * below (kernels/cpu/model.c, compiled for float and for double). Every
 * buffer is allocated once, at nsaCpuModelAlloc, for max_batch x max_seq_len:
 * the passes never allocate. Arenas hold `real` elements (float for F32,
 * double for F64); offsets below are element offsets. */
#ifndef NSA_CPU_MODEL_H
#define NSA_CPU_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "../nsa.h"
#include "../nsa_layout.h"
#include "../nsa_cpu_pool.h"

/* Where one layer's saved forward activations live in the activation arena. */
typedef struct NsaCpuLayerActs {
    size_t res;                 /* [N][C] residual stream entering the layer */
    size_t attn_xn, attn_rstd;  /* [N][C], [N] */
    size_t q;                   /* [N][H][dk], rotated */
    size_t k[3], v[3];          /* per branch (cmp, sel, win): [N][G][dk] rotated, [N][G][dv] */
    size_t kc, vc;              /* pooled [B][Nc][G][dk], [B][Nc][G][dv] */
    size_t hk, hv;              /* phi = mlp hidden pre-activations, same shapes as kc, vc */
    size_t gates;               /* [N][H][3], post-sigmoid */
    size_t o[3], lse[3];        /* per branch [N][H][dv], [N][H] */
    size_t y_attn;              /* [N][H][dv], gate-combined */
    size_t res_mid;             /* [N][C] residual after attention */
    size_t mlp_xn, mlp_rstd;    /* [N][C], [N] */
    size_t fc, up, act;         /* [N][F] pre-activation, SwiGLU up, post-activation */
} NsaCpuLayerActs;

/* Backward scratch, shared by all layers (reused layer after layer). */
typedef struct NsaCpuScratch {
    size_t proj;                /* [N][C] forward output of wo / w_proj before the residual add */
    size_t dres, dxn;           /* [N][C] */
    size_t dq, dk[3], dv[3];    /* like q, k, v */
    size_t dkc, dvc;            /* like kc, vc */
    size_t dgates;              /* [N][H][3], w.r.t. the post-sigmoid gates */
    size_t dgate_logits;        /* [N][H][3], w.r.t. the pre-sigmoid logits */
    size_t d_o[3], dy_attn;     /* [N][H][dv] */
    size_t dfc, dup, dact;      /* [N][F] */
    size_t dlogits;             /* [N][V] */
    size_t wt;                  /* the transpose of the weight a linear forward uses */
    size_t dyt;                 /* the transpose of the output gradient of a linear backward */
} NsaCpuScratch;

typedef struct NsaCpuModel {
    NsaModelConfig cfg;
    const NsaLayout *layout;    /* owned by the NsaModel */
    int f64;                    /* 1: real is double */
    size_t real_size;           /* sizeof(real) */
    int max_batch, max_seq;
    int max_cmp_blocks;         /* nsaNumCmpBlocks at max_seq */
    void *params, *grads;       /* layout->total elements each */
    void *adam_m, *adam_v;      /* state_elems each: the rank's shard arena (nsa_layout.h) */
    size_t state_elems;
    void *acts;                 /* saved activations (forward) */
    size_t acts_elems;
    void *scratch;              /* backward workspace + RoPE table */
    size_t scratch_elems;
    int32_t *sel_idx;           /* [L][B][S][G][nsaNumSelSlots(n_sel)] */
    int32_t *tokens, *targets;  /* copies of the last forward's ids, [B*S] */
    NsaCpuLayerActs *layer_acts;   /* [L] */
    size_t final_res;           /* [N][C] residual stream after the last layer */
    size_t final_xn, final_rstd, logits, ce_lse;   /* in acts */
    size_t rope;                /* in scratch: [max_seq][d_k/2][2] */
    int rope_ready;             /* the table is filled on the first forward */
    NsaCpuPool *pool;           /* worker threads (NULL or 1 part: the caller alone) */
    NsaCpuScratch sc;
    /* set by the forward, used by the backward */
    int B, S;
    size_t n_counted;           /* targets != -1 in the last forward */
} NsaCpuModel;

/* Plans and allocates every buffer and starts threads-1 workers (threads
 * <= 1: none); linear layers split by rows/outputs and the attention ops by
 * sequence, so results are the same for any thread count. The Adam moments
 * take state_elems elements each (layout->total alone; a data-parallel
 * rank's shard arena otherwise). Returns 0, or -1 with err filled (out of
 * memory, sizes too large); on error nothing is left to free. Weights are
 * zero until someone writes them. */
int nsaCpuModelAlloc(NsaCpuModel *cm, const NsaModelConfig *cfg, const NsaLayout *layout,
                     int f64, int max_batch, int max_seq, int threads, size_t state_elems,
                     NsaError *err);
/* Frees what nsaCpuModelAlloc allocated; safe to call twice. */
void nsaCpuModelRelease(NsaCpuModel *cm);
/* Bytes of the activation arena and of the backward workspace. */
size_t nsaCpuModelActivationBytes(const NsaCpuModel *cm);
size_t nsaCpuModelWorkspaceBytes(const NsaCpuModel *cm);

/* Forward over tokens/targets [B*S] (already range-checked): keeps the
 * activations, returns in *loss_sum the sum of the per-token losses (double)
 * and in *count the number of counted targets. Returns 0, or -1 with err
 * when an op fails (nsaCpuSelectBlocks past 65536 selection blocks). */
int nsaCpuModelForwardF32(NsaCpuModel *cm, const int32_t *tokens, const int32_t *targets, int B,
                          int S, double *loss_sum, size_t *count, NsaError *err);
int nsaCpuModelForwardF64(NsaCpuModel *cm, const int32_t *tokens, const int32_t *targets, int B,
                          int S, double *loss_sum, size_t *count, NsaError *err);

/* Called by the backward as soon as a gradient bucket (nsa_layout.h:
 * NSA_BUCKET_HEAD, then each layer from the last, then NSA_BUCKET_EMBED)
 * is complete: the data-parallel reduction starts there. */
typedef void (*NsaCpuBucketHook)(void *ctx, int bucket);

/* Backward of (scale * sum of per-token losses) from the activations of the
 * last forward; adds into the gradient arena and calls hook (when not NULL)
 * for each bucket as it completes. Cannot fail. */
void nsaCpuModelBackwardF32(NsaCpuModel *cm, double scale, NsaCpuBucketHook hook, void *ctx);
void nsaCpuModelBackwardF64(NsaCpuModel *cm, double scale, NsaCpuBucketHook hook, void *ctx);

/* The CPU engine behind a model (nsa_model.c), or NULL for a CUDA model.
 * For tests that look at saved activations (logits); not part of nsa.h. */
NsaCpuModel *nsaModelCpuEngine(NsaModel *m);

#endif /* NSA_CPU_MODEL_H */
