/* cuda_engine_internal.h - the CUDA engine's state, shared by its two
 * files (internal to kernels/cuda): cuda_engine.cu (memory plan, forward,
 * backward, optimizer step, the API of cuda_engine.h) and cuda_engine_dp.cu
 * (data parallelism). Nothing outside them includes it. */
#ifndef NSA_CUDA_ENGINE_INTERNAL_H
#define NSA_CUDA_ENGINE_INTERNAL_H

#include "cuda_engine.h"

#include "../nsa_comm.h"
#include "../nsa_layout.h"
#include "attn_ref/attn_cuda.h"
#include "cuda_common.cuh"
#include "layers/gemm.h"
#include "layers/layers_cuda.h"

#define TRY(call) do { if ((call) != 0) return -1; } while (0)
#define STAGING_SLOTS 2

/* One layer's saved forward activations (device pointers). "op" buffers are
 * in the GEMM operand type (fp32 in f32 mode); "bf16" ones feed the fast
 * attention op. A path's buffers are NULL when the other path is in use. */
typedef struct LayerActs {
    float *res;            /* [N][C] residual entering the layer */
    void *xn;              /* op [N][C] attention RMSNorm output */
    float *rstd;           /* [N] 1/rms */
    /* reference attention path (fp32) */
    float *q;              /* [N][H][dk] rotated */
    float *k[3], *v[3];    /* per branch (cmp, sel, win) [N][G][dk] rotated, [N][G][dv] */
    float *kc, *vc;        /* pooled [B][Nc][G][dk], [B][Nc][G][dv] */
    float *hk, *hv;        /* phi = mlp: pre-activations, shaped as kc, vc (else NULL) */
    float *o[3], *lse[3];  /* per branch [N][H][dv], [N][H] */
    int32_t *sel;          /* [N][G][slots] */
    float *y;              /* [N][H][dv] gate-combined */
    /* fast attention path (bf16; the plan keeps o, lse, kc, vc, sel) */
    void *qb, *kb[3], *vb[3], *gb;
    float *gates;          /* [N][H][3] post-sigmoid, fp32 */
    void *y_op;            /* op [N][H][dv] the Wo operand (== y in f32 mode) */
    float *mid;            /* [N][C] residual after attention */
    void *mxn;             /* op [N][C] MLP RMSNorm output */
    float *mrstd;
    void *fc, *up;         /* op [N][F] pre-activations; up only for SwiGLU */
    void *act;             /* op [N][F] */
} LayerActs;

typedef struct Scratch {
    float *dres, *dxn;
    float *dq, *dk[3], *dv[3];   /* fp32, reference path only */
    float *dkc, *dvc, *dgates, *d_o[3], *delta[3];   /* reference path only */
    PoolMlpScratch pool;         /* phi = mlp only (zeroed otherwise); forward and backward */
    float *dy;                   /* [N][H][dv] fp32 */
    void *dfc, *dup;             /* op [N][F] */
    void *dact;                  /* op [N][F] */
    void *op_a;                  /* op [N][max(C, V)]: residual / logits gradient (bf16/fp16) */
    void *op_b;                  /* op [N][max(H dk, G dk, G dv, 3H)]: attention input gradients
                                    (reference path) */
    void *proj;                  /* op [N][attnInputsStride]: the fused attention projection,
                                    then its gradient (fast path) */
    void *dyb, *dqb, *dkb[3], *dvb[3], *dgb;   /* bf16, fast path */
    float *row_loss;       /* [N] */
    float *rms_partial;    /* rmsnormPartialFloats(N, C) */
    float *emb_partial;    /* [max chunks][C] */
    double *norm_partial;  /* [NORM_BLOCKS] */
} Scratch;

/* Device copies of one batch's ids and the embedding backward plan. */
typedef struct BatchIds {
    int32_t *tokens, *targets, *order, *chunk_start, *chunk_token, *token_chunk;
} BatchIds;

/* What the precision mode and the dims decide about storage. */
typedef struct EngineMode {
    int low;       /* 1 in bf16/fp16 mode: GEMM operands are 16-bit */
    int fast;      /* 1 when attention runs on the fast bf16 op */
    DType op;      /* GEMM operand type */
    int recompute; /* NsaRecompute. LAYER: only each layer's input is kept; the
                      backward runs the layer's forward again into one shared
                      set of buffers. SELECTIVE: the norms' outputs and the MLP
                      activation share one buffer each; the backward makes
                      them again */
} EngineMode;

/* The data-parallel part of a model (comm NULL: a model alone, world 1,
 * and the shard is every tensor with the moments at their arena offsets). */
typedef struct DpState {
    NsaComm *comm;
    int rank, world;
    NsaShard shard;                  /* this rank's slices and pieces */
    int n_ranges;                    /* its slices with neighbours merged (1 alone) */
    size_t *range_offset, *range_count;
    cudaStream_t stream;             /* communication stream */
    int have_stream;
    cudaEvent_t *bucket_ready;       /* [n_buckets] on the compute stream */
    cudaEvent_t *weights_ready;      /* [n_buckets] on the communication stream */
    cudaEvent_t to_comm, to_compute, sync; /* hand-overs between the streams, host waits */
    double *partial;                 /* device [n_ranges][NORM_BLOCKS] */
    double *scalars;                 /* device [world][2] */
    float *staging;                  /* device, the largest tensor: gathers, broadcasts */
    int reducing;                    /* the running backward reduces its buckets */
    int reduced;                     /* this step's buckets are reduced (until ZeroGrad) */
    /* timing (nsaCudaModelCommStats): each bucket's reduce-scatter on the
     * communication stream, the backward's end on the compute stream, and
     * the weights' all-gather in two sets used by turns (the set of the
     * step before is complete when a step's figures are read) */
    cudaEvent_t *t_begin, *t_end;    /* [n_buckets] */
    cudaEvent_t t_backward_end;
    cudaEvent_t t_gather[2][2];
    int gather_turn, gather_recorded[2];
    double last_gather_seconds;
} DpState;

struct NsaCudaModel {
    NsaModelConfig cfg;
    NsaEngineOptions opt;
    NsaLayout lay;
    EngineMode mode;
    char attention_path[256];
    int F, max_tokens, max_cmp, slots;
    size_t max_chunks;
    cudaStream_t stream;
    int have_stream;
    GemmContext gemm;
    float *arena[4];                 /* params, grads, adam m, adam v */
    void *weights_low;               /* bf16/fp16 copy of the params arena (low modes) */
    NsaAttnCudaPlan **attn_plans;    /* host array [n_attn_plans] (fast path) */
    int n_attn_plans;                /* L, or 1 with recompute (layers take turns) */
    float *acts;                     /* activation arena */
    size_t acts_floats;
    float *scratch_mem;              /* scratch arena */
    size_t scratch_floats;
    LayerActs *layers;               /* host array [L] of device pointers */
    float *final_res, *final_rstd, *logits;
    void *final_xn;                  /* op */
    Scratch sc;
    float *rope;                     /* [max_seq][dk/2][2] */
    OptimTensor *tensors;            /* device [n_optim]: the shard's pieces */
    int n_optim;
    size_t optim_max_numel;          /* the largest piece */
    size_t max_numel;                /* the largest tensor */
    DpState dp;
    OptimState *state;               /* device */
    OptimState *host_state;          /* pinned, filled after each step */
    double *eval_loss, *host_eval_loss;
    /* staging */
    int32_t *ids_device;             /* one region, carved into ids */
    BatchIds ids;
    int32_t *staging[STAGING_SLOTS]; /* pinned, same size as ids_device */
    cudaEvent_t staged[STAGING_SLOTS];
    int staged_used[STAGING_SLOTS];
    int next_slot;
    size_t ids_ints;
    int32_t *host_count;             /* [V] counting-sort scratch */
    int32_t *host_plan_chunks;       /* n_chunks of the last forward */
    int plan_chunks;
    cudaEvent_t step_done;
    int step_recorded;
    /* step bookkeeping */
    int B, S, have_forward;
    float backward_factor;           /* grad_scale / counted targets */
    int fault_nan_loss, fault_nan_grad;
    size_t bytes_params, bytes_grads, bytes_optimizer, bytes_acts, bytes_workspace;
    size_t peak_used;
};

/* ---- cuda_engine.cu: allocation and waits -------------------------------- */

/* cudaMalloc of bytes (256 when bytes is 0) into *p; -1 with err naming
 * what (and *p NULL) when the device has no room. The caller frees. */
int engineAllocDevice(void **p, size_t bytes, const char *what, NsaError *err);
/* Waits on the host for ev: plainly for a model alone, with the transport's
 * deadline (an overrun aborts the communicator) for a data-parallel one.
 * Returns 0, or -1 with err. */
int engineWaitEvent(NsaCudaModel *m, cudaEvent_t ev, const char *what, NsaError *err);
/* Makes `to` wait on the device for what `from` has enqueued so far (ev is
 * recorded on from). Returns 0, or -1 with err. */
int engineStreamHop(cudaStream_t from, cudaStream_t to, cudaEvent_t ev, NsaError *err);

/* ---- cuda_engine_dp.cu ---------------------------------------------------- */

/* Device bytes of the data-parallel buffers (0 for a model alone). */
size_t dpBytes(const NsaCudaModel *m);
/* The communication stream, events, slice ranges and buffers of m->dp
 * (comm, rank, world and shard already set); nothing for a model alone.
 * Returns 0, or -1 with err (dpFree releases what was made). */
int dpCreate(NsaCudaModel *m, NsaError *err);
/* Waits for both streams (deadline-bound), then frees m->dp and zeroes it.
 * Safe on a partly made or empty state. */
void dpFree(NsaCudaModel *m);
/* Reduce-scatters gradient bucket b on the communication stream, which must
 * already wait for the bucket's gradients. Returns 0, or -1 with err. */
int dpReduceBucket(NsaCudaModel *m, int b, NsaError *err);
/* The step's global loss and gradient norm into m->state (every rank's pair
 * all-gathered, summed in rank order). Returns 0, or -1 with err. */
int dpGlobalScalars(NsaCudaModel *m, NsaError *err);
/* After AdamW: every rank's weight slices to every rank, bucket by bucket,
 * with an event per bucket for the next forward. Returns 0, or -1 with err. */
int dpGatherWeights(NsaCudaModel *m, NsaError *err);

#endif
