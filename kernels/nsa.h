/* nsa.h - the public C API of libnsa, the NSA training engine.
 *
 * libnsa holds the whole compute engine of nsad: the NSA transformer (parameter
 * layout, forward, backward), the AdamW optimizer and the standalone NSA
 * attention op, twice: a plain C reference (kernels/cpu, the oracle) and a CUDA
 * engine (kernels/cuda). It depends on libc, libm and (for the CUDA engine) the
 * CUDA toolkit only, so it builds on a machine without any of the daemon's
 * libraries, and it is exported from libnsa.so for ctypes callers.
 *
 * Conventions (the contract every engine honours; see proto/model.md):
 *   - Row-major tensors. Activations are token-major: x[B][S][C].
 *     q[B][S][H][d_k], per-branch k[B][S][G][d_k], v[B][S][G][d_v],
 *     gates[B][S][H][3] in branch order (cmp, sel, win), out[B][S][H][d_v].
 *   - Linear weights are stored [out][in] (PyTorch nn.Linear): y = x W^T.
 *   - Head h belongs to KV group h / (H/G): the heads of a group are contiguous.
 *   - RoPE pairs split halves: dims (i, i + d_k/2), theta_i = base^(-2i/d_k).
 *   - Every function that can fail returns 0 on success and -1 on error, and
 *     then fills *err (if not NULL) with one line naming what was wrong.
 *     Nothing in libnsa calls exit() or prints.
 */
#ifndef NSA_H
#define NSA_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NSA_VERSION "0.1.0"

/* ---- errors ------------------------------------------------------------ */

typedef struct NsaError {
    char message[512];
} NsaError;

/* Formats a one-line message into err (when not NULL) and returns -1, so an
 * error path reads `return nsaErrorf(err, "field: %d ...", v);`. Control
 * characters the arguments bring (newlines, escapes) become '?'. */
int nsaErrorf(NsaError *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* nsaErrorf with the arguments as a va_list (for variadic wrappers). */
int nsaErrorv(NsaError *err, const char *fmt, va_list ap)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 0)))
#endif
    ;

/* ---- model configuration ----------------------------------------------- */

typedef enum NsaPhi { NSA_PHI_AVG = 0, NSA_PHI_MLP = 1 } NsaPhi;
typedef enum NsaMlpKind { NSA_MLP_SILU = 0, NSA_MLP_SWIGLU = 1 } NsaMlpKind;

typedef enum NsaDevice { NSA_DEVICE_CPU = 0, NSA_DEVICE_CUDA = 1 } NsaDevice;

/* Compute precision. F64 exists on the CPU engine only (gradient checks);
 * F32 is the CPU default; BF16 (default on sm_80+) and FP16 (dynamic loss
 * scaling) on CUDA keep fp32 master weights and fp32 optimizer moments. */
typedef enum NsaPrecision {
    NSA_PREC_F32 = 0,
    NSA_PREC_F64 = 1,
    NSA_PREC_BF16 = 2,
    NSA_PREC_FP16 = 3
} NsaPrecision;

typedef struct NsaModelConfig {
    int vocab_size;   /* V: logical vocabulary (256 for the byte tokenizer) */
    int dim;          /* C */
    int n_layers;     /* L */
    int n_heads;      /* H query heads */
    int n_kv_groups;  /* G key/value groups; H % G == 0 */
    int d_k;          /* key/query head dim (even, for RoPE) */
    int d_v;          /* value head dim */
    int mlp_hidden;   /* MLP hidden width; 0 means 4*C */
    NsaMlpKind mlp;   /* SiLU (default) or SwiGLU */
    /* NSA */
    int cmp_len;      /* l: compressed block length */
    int cmp_stride;   /* d: compressed block stride; d | l, d | l' */
    int sel_len;      /* l': selection block length */
    int n_sel;        /* n: selected blocks per query, forced blocks included */
    int window;       /* w: sliding window, t itself included */
    NsaPhi phi;       /* compression function */
    float rope_base;  /* 10000 */
    float norm_eps;   /* RMSNorm epsilon, 1e-6 */
} NsaModelConfig;

/* Fills cfg with the prototype's defaults (dim 768, 12 layers, 12 heads,
 * 2 groups, d_k = d_v = 64, l/d/l'/n/w = 32/16/64/16/512, phi avg, SiLU MLP,
 * V 256). Cannot fail. */
void nsaModelConfigDefaults(NsaModelConfig *cfg);

/* Checks that cfg describes a model this engine can build. Returns 0, or -1
 * with err naming the field, its value and what is allowed. */
int nsaModelConfigValidate(const NsaModelConfig *cfg, NsaError *err);

/* Checks one batch for a model of cfg planned for max_batch sequences of
 * max_seq_len tokens: tokens and targets non-NULL, B in 1..max_batch, S in
 * 1..max_seq_len, every token in [0, V) and every target in [0, V) or -1,
 * at least one target counted. Returns 0 with *counted (the targets other
 * than -1), or -1 with err naming the first bad value. The one batch check
 * of both engines (nsaModelForward, nsaModelEvalLoss, and the CUDA engine's
 * own entry points). */
int nsaBatchValidate(const NsaModelConfig *cfg, int max_batch, int max_seq_len,
                     const int32_t *tokens, const int32_t *targets, int B, int S,
                     size_t *counted, NsaError *err);

/* Model FLOPs of one training step per token (forward + backward), the
 * count behind MFU (proto/model.md, "FLOPs"): matmul = 6 x the matrix
 * parameters a token passes through (every projection, the MLP, the LM head,
 * phi = mlp's per block share), attention = 3 x the forward's useful
 * products (2 (d_k + d_v) per query-key pair each branch visits, averaged
 * over the positions 0..S-1 of a causal sequence of length S), dense_attention
 * what full causal attention of the same heads would count. Returns 0, or -1
 * with err when cfg does not validate or S < 1. */
typedef struct NsaFlops {
    double matmul;          /* per token */
    double attention;       /* per token, NSA's three branches */
    double dense_attention; /* per token, full causal attention instead */
    double total;           /* matmul + attention */
} NsaFlops;
int nsaModelFlopsPerToken(const NsaModelConfig *cfg, int S, NsaFlops *out, NsaError *err);

/* ---- devices ------------------------------------------------------------ */

typedef struct NsaDeviceInfo {
    int cuda_built;         /* 1 when this libnsa has the CUDA engine */
    int cuda_devices;       /* CUDA devices visible (0: no driver or no GPU) */
    char description[512];  /* one line: the devices, or why there are none */
} NsaDeviceInfo;

/* Asks the CUDA driver which devices there are (initialising the runtime
 * when the build has CUDA). Returns 0 with *out filled, including when
 * there is no GPU; -1 with err only when the runtime itself fails. */
int nsaDeviceProbe(NsaDeviceInfo *out, NsaError *err);

/* The name the CUDA driver gives device `ordinal` ("NVIDIA H100 80GB HBM3"),
 * into name (cap bytes, truncated), for tables keyed by the device model
 * (nsad's peak rates for MFU). Returns 0, or -1 with err when this libnsa
 * has no CUDA, there is no such device or the runtime fails. */
int nsaDeviceName(int ordinal, char *name, size_t cap, NsaError *err);

/* ---- model ------------------------------------------------------------- */

typedef struct NsaModel NsaModel;

/* A data-parallel transport (see "data parallelism" below). */
typedef struct NsaComm NsaComm;

/* Activation recompute (NsaEngineOptions.recompute): what the CUDA
 * engine's forward keeps for the backward, and what the backward makes
 * again.
 *   NONE       every activation of every layer kept
 *   LAYER      only each layer's input residual kept; the backward runs
 *              the layer's whole forward again (about one more forward a
 *              step; one layer's activations in memory instead of L)
 *   SELECTIVE  everything that needs a GEMM or the attention op kept; the
 *              two RMSNorm outputs and the MLP activation, which take one
 *              element-wise pass each to make, are made again in the
 *              backward into one buffer shared by the layers (three
 *              element-wise passes a layer; about a third of a layer's
 *              activation bytes in the production config)
 * The gradients are bit-identical in all three. */
typedef enum NsaRecompute {
    NSA_RECOMPUTE_NONE = 0,
    NSA_RECOMPUTE_LAYER = 1,
    NSA_RECOMPUTE_SELECTIVE = 2
} NsaRecompute;

/* "none", "layer", "selective"; "?" for a value out of range. */
const char *nsaRecomputeName(int recompute);

typedef struct NsaEngineOptions {
    NsaDevice device;
    int device_ordinal;     /* CUDA device index */
    NsaPrecision precision;
    int max_batch;          /* B: largest micro-batch forward/backward sees */
    int max_seq_len;        /* S: largest sequence length */
    int threads;            /* CPU engine worker threads; 0 = 1 */
    int recompute;          /* NsaRecompute. CUDA: any; the CPU engine takes NONE only
                               (it keeps every activation). */
    /* Data parallelism: the transport joining this model to the other
     * ranks of its job (rank and world come from it), or NULL for a model
     * alone. Not owned: free it after the model. A CPU model takes a local
     * or TCP transport, a CUDA model an NCCL one on its own device. */
    NsaComm *comm;
} NsaEngineOptions;

/* Builds a model: plans and allocates every arena (parameters, gradients,
 * optimizer state, activations for max_batch x max_seq_len) once. Nothing
 * is allocated later. Returns NULL on error with err filled. The caller
 * frees with nsaModelFree. Weights are uninitialised until nsaModelInit or
 * nsaModelSetTensor. */
NsaModel *nsaModelCreate(const NsaModelConfig *cfg, const NsaEngineOptions *opt,
                         NsaError *err);

/* Frees everything the model owns. NULL is a no-op. */
void nsaModelFree(NsaModel *m);

/* The config and options m was built with (NULL for NULL m); they live as
 * long as m. */
const NsaModelConfig *nsaModelGetConfig(const NsaModel *m);
const NsaEngineOptions *nsaModelGetOptions(const NsaModel *m);

/* Seeded, deterministic initialisation (same seed -> same weights on every
 * engine): N(0, 0.02) matrices, output projections scaled by 1/sqrt(2L),
 * norm weights 1, phi=mlp near the mean. Zeroes gradients and moments. */
int nsaModelInit(NsaModel *m, uint64_t seed, NsaError *err);

/* ---- tensors by name ---------------------------------------------------
 * Parameter names (shapes [out][in] for matrices; proto/model.md lists all):
 *   tok_emb [V][C], layers.{i}.attn_norm [C], layers.{i}.wq [H*d_k][C],
 *   layers.{i}.wk_cmp / wk_sel / wk_win [G*d_k][C],
 *   layers.{i}.wv_cmp / wv_sel / wv_win [G*d_v][C],
 *   layers.{i}.phi_k.pos [l][d_k], .w1 [d_k][l*d_k], .w2 [d_k][d_k]  (phi=mlp)
 *   layers.{i}.phi_v.pos [l][d_v], .w1 [d_v][l*d_v], .w2 [d_v][d_v]  (phi=mlp)
 *   layers.{i}.w_gate [3*H][C], layers.{i}.wo [C][H*d_v],
 *   layers.{i}.mlp_norm [C], layers.{i}.w_fc [F][C],
 *   layers.{i}.w_up [F][C] (SwiGLU only), layers.{i}.w_proj [C][F],
 *   final_norm [C], lm_head [V][C]
 */

typedef enum NsaArena {
    NSA_ARENA_PARAMS = 0,  /* master weights */
    NSA_ARENA_GRADS = 1,
    NSA_ARENA_ADAM_M = 2,
    NSA_ARENA_ADAM_V = 3
} NsaArena;

typedef struct NsaTensorInfo {
    const char *name;
    int ndim;
    int64_t shape[4];
    size_t numel;
    size_t offset;     /* element offset inside each arena */
    int weight_decay;  /* 1 for matrices (decayed), 0 for norms and vectors */
} NsaTensorInfo;

/* The number of named tensors (0 for NULL m); indices run 0 .. n-1. */
int nsaModelNumTensors(const NsaModel *m);
/* Returns NULL when i is out of range. The pointer lives as long as m. */
const NsaTensorInfo *nsaModelTensorInfo(const NsaModel *m, int i);
/* Returns the index of the named tensor, or -1. */
int nsaModelFindTensor(const NsaModel *m, const char *name);
/* Total elements in one arena (every arena has the same layout). */
size_t nsaModelNumParams(const NsaModel *m);

/* Copies tensor i of an arena to/from host fp32 (exact for fp32 master
 * weights). Synchronous: call between steps, never inside one. */
int nsaModelGetTensor(NsaModel *m, NsaArena arena, int i, float *dst, NsaError *err);
int nsaModelSetTensor(NsaModel *m, NsaArena arena, int i, const float *src, NsaError *err);

/* CPU engine only: the raw host arena, of element type double for
 * NSA_PREC_F64 and float otherwise. NULL for the CUDA engine. Tests use it
 * for finite differences. */
void *nsaModelHostArena(NsaModel *m, NsaArena arena);

/* ---- training ----------------------------------------------------------
 * One optimizer step is:
 *   nsaModelZeroGrad;  k x (nsaModelForward, nsaModelBackward) (accumulation);
 *   nsaModelOptimizerStep;  nsaModelStepStats.
 * On CUDA the first three only enqueue work: no host synchronisation and
 * no allocation inside a step. nsaModelStepStats waits for the step. */

/* Zeroes the gradient arena and starts a step's accumulation. Returns 0,
 * or -1 with err (NULL m, or the device's enqueue failed). */
int nsaModelZeroGrad(NsaModel *m, NsaError *err);

/* tokens and targets are host arrays of B*S ids in [0, V); B <= max_batch,
 * S <= max_seq_len. A target of -1 is ignored (not counted in the mean).
 * nsaModelForward runs the forward pass, keeps the activations and adds
 * grad_scale * mean cross-entropy into the step's loss accumulator;
 * nsaModelBackward then adds grad_scale * d(mean cross-entropy)/dparam into
 * the gradient arena (it needs the activations of the last Forward).
 * nsaModelForwardBackward does both. */
int nsaModelForward(NsaModel *m, const int32_t *tokens, const int32_t *targets,
                    int B, int S, float grad_scale, NsaError *err);
int nsaModelBackward(NsaModel *m, NsaError *err);
int nsaModelForwardBackward(NsaModel *m, const int32_t *tokens, const int32_t *targets,
                            int B, int S, float grad_scale, NsaError *err);

typedef struct NsaOptimConfig {
    float lr;
    float beta1, beta2, eps;   /* 0.9, 0.95, 1e-8 */
    float weight_decay;        /* applied to weight_decay tensors only */
    float grad_clip;           /* global-norm clip; <= 0 disables */
} NsaOptimConfig;

/* Global gradient norm (deterministic reduction), then - only if the
 * accumulated loss and the norm are both finite - clip and AdamW with bias
 * correction for 1-based step t. A non-finite loss or norm leaves weights
 * and moments untouched: a bad update never reaches the weights. */
int nsaModelOptimizerStep(NsaModel *m, const NsaOptimConfig *oc, int64_t step, NsaError *err);

typedef struct NsaStepStats {
    double loss;          /* accumulated mean loss of the step */
    double grad_norm;     /* before clipping */
    int nonfinite_loss;   /* 1 if loss was NaN/Inf */
    int nonfinite_grad;   /* 1 if the gradient norm was NaN/Inf */
    int applied;          /* 1 if the update reached the weights */
} NsaStepStats;

/* Waits for the last optimizer step and returns its figures. */
int nsaModelStepStats(NsaModel *m, NsaStepStats *out, NsaError *err);

/* Forward only, for evaluation: returns the mean cross-entropy (nats per
 * token) of this batch. Synchronous. Leaves gradients untouched. */
int nsaModelEvalLoss(NsaModel *m, const int32_t *tokens, const int32_t *targets,
                     int B, int S, double *loss, NsaError *err);

/* ---- data parallelism ----------------------------------------------------
 * A data-parallel job runs `world` ranks of one model, each an NsaModel
 * with its own part of every batch, driven by a thread of its own (the
 * collectives below wait for every rank). They start from the same
 * weights (the same seed or checkpoint) and stay identical:
 *   - nsaModelForward scales by grad_scale / world, so that the ranks' sum
 *     is the mean over the whole batch (every rank's micro-batch must count
 *     the same number of targets for it to be that mean exactly);
 *   - the gradients are reduce-scattered (summed in rank order) once per
 *     optimizer step, bucket by bucket: a bucket is a contiguous range of
 *     the parameter arena (the embedding, one per layer, the final norm
 *     with the head); nsaModelBackwardReduce reduces each bucket as soon as
 *     its gradients are complete, overlapped with the rest of the backward
 *     on CUDA; after a plain nsaModelBackward the optimizer step reduces
 *     them first;
 *   - ZeRO-1: rank r owns slice r of every bucket (1/world of it) and holds
 *     the Adam moments of its slices only. The optimizer step takes the
 *     global loss and gradient norm from every rank's partial sums (added
 *     in rank order, so every rank sees the same bits), makes the same
 *     NaN-guard and clip decision everywhere, updates its slices (a
 *     tensor's weight-decay flag applies to its part of a slice) and
 *     all-gathers the fp32 weights, from which each rank rounds its own
 *     bf16/fp16 copy: every rank ends the step with the same weights.
 * Every collective has a deadline (the transport's timeout): a peer that
 * does not arrive in time aborts the transport, and the call - and every
 * later one - fails with an error naming the collective and the ranks that
 * were missing. A model whose transport was aborted must be freed. */

/* The transport's rank and world size; 0 and 1 for NULL. */
int nsaCommRank(const NsaComm *comm);
int nsaCommWorld(const NsaComm *comm);
/* "local", "tcp" or "nccl" ("" for NULL). */
const char *nsaCommKind(const NsaComm *comm);

/* In-process transport for the CPU engine: creates world handles that
 * share one exchange (ranks are threads of this process; collectives copy
 * and add host buffers directly, summing in rank order). comms[r] is rank
 * r's handle, each freed with nsaCommFree. timeout_seconds (> 0) bounds
 * every wait for the other ranks. Returns 0, or -1 with err. */
int nsaCommLocalCreate(int world, double timeout_seconds, NsaComm **comms, NsaError *err);

/* NCCL transport for the CUDA engine. The unique id (made once, by rank 0,
 * with nsaCommNcclUniqueId) must reach every rank before it creates its
 * handle; every rank of the job calls nsaCommNcclCreate (each from its own
 * thread or process) within timeout_seconds of the others. The
 * communicator is non-blocking: init and every collective are polled
 * against the deadline and aborted (ncclCommAbort) past it, so no call
 * waits for a dead peer forever. Sets NCCL_NVLS_ENABLE=0 (NVLink
 * multicast off) unless the environment already sets it. Returns NULL with
 * err, also when this libnsa was built without NCCL (nccl.h absent at
 * build time) or without CUDA, or when libnccl.so.2 (>= 2.14, loaded at
 * the first call) is not on this machine. */
#define NSA_COMM_ID_BYTES 128
typedef struct NsaCommId {
    unsigned char bytes[NSA_COMM_ID_BYTES];
} NsaCommId;
int nsaCommNcclUniqueId(NsaCommId *id, NsaError *err);
NsaComm *nsaCommNcclCreate(const NsaCommId *id, int rank, int world, int device_ordinal,
                           double timeout_seconds, NsaError *err);
/* 1 when this libnsa has the NCCL transport and libnccl.so.2 loaded (the
 * first call loads it), else 0; never fails. */
int nsaCommHaveNccl(void);

/* TCP transport for the CPU engine across processes (nsad daemons on
 * several nodes): a star through rank 0, summing in rank order like the
 * local transport (the same bits). nsaCommTcpUniqueId opens rank 0's
 * listening socket on bind_host (an IPv4 address of this machine, "" for
 * all) and an ephemeral port and describes it in id, with a random key the
 * other ranks present; rank 0's handle must be made from it in the same
 * process. nsaCommTcpIdSetHost sets the address the other ranks connect to.
 * nsaCommTcpCreate joins (rank 0 waits for the others on the id's socket,
 * the others connect) within timeout_seconds, which also bounds every
 * collective. Return 0 / a handle, or -1 / NULL with err.
 * The socket belongs to the id's maker, who closes it with
 * nsaCommTcpIdRelease once rank 0's handle is made or will not be, whether
 * the job failed or not (the handles do not need it). Release is a no-op
 * on a released id, on another process's id (a copy sent to a peer) and
 * on a NULL or non-TCP id; it cannot fail. */
int nsaCommTcpUniqueId(const char *bind_host, NsaCommId *id, NsaError *err);
void nsaCommTcpIdRelease(NsaCommId *id);
int nsaCommTcpIdSetHost(NsaCommId *id, const char *host, NsaError *err);
NsaComm *nsaCommTcpCreate(const NsaCommId *id, int rank, int world, double timeout_seconds,
                          NsaError *err);

/* Aborts the transport from any thread: waiting and later collectives of
 * every rank that shares it (local) or of this rank (NCCL: its peers then
 * fail by their own deadline) fail with reason. Idempotent. */
void nsaCommAbort(NsaComm *comm, const char *reason);
/* 1 after an abort (reason copied into out when not NULL), else 0. */
int nsaCommAborted(NsaComm *comm, char *out, size_t cap);
/* Frees the handle (the local exchange goes with its last handle). NULL is
 * a no-op. Free the models that use it first. */
void nsaCommFree(NsaComm *comm);

/* Fault injection (tests of the deadlines): the next collective this rank
 * issues first sleeps `seconds` (interrupted by an abort), as a rank that
 * stalls in a collective would. */
void nsaCommInjectStall(NsaComm *comm, double seconds);

/* Collectives, also usable on their own (every rank calls the same ones in
 * the same order; what names the call in errors). buf is host memory for
 * the local transport and device memory (stream a cudaStream_t) for NCCL.
 *   ReduceScatter: buf holds world * shard elements; on return slice r
 *     (elements [r*shard, (r+1)*shard)) of rank r holds the sum over ranks,
 *     the rest is unspecified. f64 selects double elements, else float.
 *   AllGather: slice r of every rank's buf (shard_bytes bytes) is copied
 *     into slice r of every other rank's buf.
 *   Broadcast: root's buf (bytes) is copied into every rank's buf.
 * Return 0, or -1 with err (deadline, abort, mismatched calls). */
int nsaCommReduceScatter(NsaComm *comm, void *buf, size_t shard, int f64, void *stream,
                         const char *what, NsaError *err);
int nsaCommAllGather(NsaComm *comm, void *buf, size_t shard_bytes, void *stream, const char *what,
                     NsaError *err);
int nsaCommBroadcast(NsaComm *comm, void *buf, size_t bytes, int root, void *stream,
                     const char *what, NsaError *err);

/* The last micro-batch's backward of a data-parallel step: nsaModelBackward,
 * and each gradient bucket is reduced (reduce-scattered) as soon as it is
 * complete. A model alone: the same as nsaModelBackward. */
int nsaModelBackwardReduce(NsaModel *m, NsaError *err);

/* Which elements of tensor i's Adam moments this rank holds: [*begin,
 * *end) (element indices within the tensor; begin == end: none). A model
 * alone holds all of them. nsaModelGetTensor/SetTensor of NSA_ARENA_ADAM_M
 * or ADAM_V read/write that range only (the rest of dst is left as it is,
 * the rest of src ignored). Returns 0, or -1 with err for a bad index. */
int nsaModelTensorShard(const NsaModel *m, int i, size_t *begin, size_t *end, NsaError *err);

/* Collective (every rank calls it with the same arguments, in the same
 * order): fills dst with the whole tensor i of arena on every rank - for the
 * moments, each holder's range is broadcast by its holder. Params and grads
 * are copied locally (params are the same on every rank between steps;
 * grads are this rank's). A model alone: nsaModelGetTensor. Synchronous. */
int nsaModelGatherTensor(NsaModel *m, NsaArena arena, int i, float *dst, NsaError *err);
/* Collective: rank root's buf (the whole tensor i) reaches every rank's buf
 * and is set there (nsaModelSetTensor: each rank keeps its range of the
 * moments). A model alone: nsaModelSetTensor. Synchronous. */
int nsaModelBroadcastTensor(NsaModel *m, NsaArena arena, int i, float *buf, int root,
                            NsaError *err);

/* What the last optimizer step's communication cost this rank (after
 * nsaModelStepStats). Times are device time on CUDA (events on the
 * communication stream), wall time on the CPU transports (which do not
 * overlap: exposed equals reduce there). A model alone: all zero. */
typedef struct NsaCommStats {
    double reduce_seconds;   /* the gradient reduce-scatters, summed */
    double exposed_seconds;  /* what of them ran after the backward's compute had ended */
    double gather_seconds;   /* the weights' all-gather (CUDA: the previous step's, the last one
                                known to be complete) */
    double overlap;          /* share of the reductions the backward hid: 1 - exposed/reduce */
    double bytes_sent;       /* bytes this rank sends per step (reductions and all-gather) */
} NsaCommStats;
int nsaModelCommStats(NsaModel *m, NsaCommStats *out, NsaError *err);

/* Collective: a small host exchange through the model's transport (an
 * all-gather): buf holds world slots of `bytes`; this rank's slot (its
 * rank) is read, every slot is filled on return. For what the ranks must
 * agree on besides the math (a halt, evaluation sums, figures). A model
 * alone: nothing to do. On CUDA through a device staging buffer of the
 * largest tensor's size (world x bytes must fit). Synchronous. */
int nsaModelExchange(NsaModel *m, void *buf, size_t bytes, NsaError *err);

/* Fault injection for tests of the NaN guard: poisons the next
 * Forward's loss (NSA_FAULT_NAN_LOSS) or one gradient element
 * (NSA_FAULT_NAN_GRAD) with NaN. */
typedef enum NsaFault { NSA_FAULT_NONE = 0, NSA_FAULT_NAN_LOSS = 1, NSA_FAULT_NAN_GRAD = 2 } NsaFault;
int nsaModelInjectFault(NsaModel *m, NsaFault fault, NsaError *err);

/* Bytes held by each arena and the activations, for the start-up report. */
typedef struct NsaMemoryReport {
    size_t params, grads, optimizer, activations, workspace, total;
    size_t device_free, device_total;   /* CUDA only */
    /* CUDA only ("" on the CPU engine): which attention kernels the model
     * runs and why, e.g. "fast: bf16 tensor-core NSA op ..." or
     * "reference: fp32 CUDA-core NSA kernels ..., because ...". */
    char attention_path[256];
} NsaMemoryReport;
int nsaModelMemoryReport(const NsaModel *m, NsaMemoryReport *out);

/* What nsaModelCreate(cfg, opt) would allocate on device
 * opt->device_ordinal, without allocating or building anything, and that
 * device's free and total memory now - the engine's memory plan, so that a
 * job can be refused before it starts. world is the number of data-parallel
 * ranks the model would be one of (1: alone): each keeps 1/world of the
 * optimizer moments (ZeRO-1) and, past one, the data-parallel buffers; it
 * needs no transport (opt->comm NULL, or one of that world). *max_batch_fits
 * (may be NULL) gets the largest micro-batch of opt->max_seq_len tokens that
 * would fit in the free memory (an estimate; 0 when not even one sequence
 * fits). CUDA engine only: returns -1 with err for device CPU, a build
 * without CUDA, no such device, world < 1, or a config the engine refuses;
 * 0 otherwise. */
int nsaModelMemoryPlan(const NsaModelConfig *cfg, const NsaEngineOptions *opt, int world,
                       NsaMemoryReport *out, int *max_batch_fits, NsaError *err);

/* ---- decoding (kernels/nsa_decode.c, kernels/cpu/decode.c, cuda/decode.cu)
 * Token-by-token generation with NSA's caches, per slot (one sequence each)
 * and layer: the selection branch's keys and values of every position (its
 * blocks may come from anywhere in the past), the window branch's last w
 * keys and values (a ring), the last l raw compressed-branch keys and values
 * (a ring) and the pooled compressed blocks, a new one every d tokens once l
 * tokens are there. A step embeds one new token per slot, appends its keys
 * and values, scores the selection blocks from the new token's compressed
 * attention and runs the three branches over the caches; logits at a
 * position are those of nsaModelForward at that position (the CPU decoder
 * reuses the reference ops and their summation orders; tests/unit/
 * test_decode.c checks it against the full forward).
 * A decoder holds its own copy of the weights (set from a model or tensor by
 * tensor, in the layout of nsaModelTensorInfo) and allocates everything at
 * create: nothing later. CPU: F32 or F64, the reference's arithmetic. CUDA:
 * BF16 weights and caches, fp32 accumulation and residual stream, each step
 * one CUDA graph (no host synchronisation inside it but the logits copy). */
typedef struct NsaDecoder NsaDecoder;

typedef struct NsaDecoderOptions {
    NsaDevice device;
    int device_ordinal;     /* CUDA device index */
    NsaPrecision precision; /* CPU: F32 or F64; CUDA: BF16 */
    int max_batch;          /* slots: sequences decoded together */
    int max_context;        /* tokens a slot holds: prompt + generated */
    int threads;            /* CPU: threads for the matrix-vector products (0 or 1: the
                               caller's only), bit-identical logits for any count;
                               CUDA: ignored */
} NsaDecoderOptions;

/* Plans and allocates weights, caches and scratch. Returns NULL with err on
 * a bad config or options or a failed allocation. Weights are zero until
 * nsaDecoderLoadModel or nsaDecoderSetTensor; every slot starts empty.
 * Free with nsaDecoderFree (NULL is a no-op). */
NsaDecoder *nsaDecoderCreate(const NsaModelConfig *cfg, const NsaDecoderOptions *opt,
                             NsaError *err);
void nsaDecoderFree(NsaDecoder *d);
const NsaModelConfig *nsaDecoderGetConfig(const NsaDecoder *d);
const NsaDecoderOptions *nsaDecoderGetOptions(const NsaDecoder *d);

/* The decoder's tensor table is the model's (nsaModelTensorInfo): the same
 * names, shapes and indices. SetTensor copies host fp32 values of tensor i
 * (numel floats) in. LoadModel copies every weight of m, whose config must
 * equal the decoder's (a CPU model's arena is read at full precision, so an
 * F64 decoder gets F64 weights; a CUDA model is read with
 * nsaModelGetTensor: call it between steps). Both leave the caches alone.
 * Return 0, or -1 with err (bad index, NULL, config mismatch). */
int nsaDecoderNumTensors(const NsaDecoder *d);
const NsaTensorInfo *nsaDecoderTensorInfo(const NsaDecoder *d, int i);
int nsaDecoderFindTensor(const NsaDecoder *d, const char *name);
int nsaDecoderSetTensor(NsaDecoder *d, int i, const float *src, NsaError *err);
int nsaDecoderLoadModel(NsaDecoder *d, NsaModel *m, NsaError *err);

/* Empties slot (its position goes back to 0); slot -1 empties every slot.
 * Returns 0, or -1 with err for a slot out of range. */
int nsaDecoderReset(NsaDecoder *d, int slot, NsaError *err);
/* Tokens slot holds (its next position), or -1 for a bad slot. */
int nsaDecoderPosition(const NsaDecoder *d, int slot);
/* Makes slot dst hold what slot src holds: src's tokens, caches and
 * position (dst's own are dropped; src is unchanged; dst == src is a
 * no-op). A prompt prefilled once can so be continued several ways, each
 * slot then stepping on its own: several samples of one prompt pay for one
 * prefill. Copies the live part of each cache, on the device for a CUDA
 * decoder. Synchronous. Returns 0, or -1 with err for a slot out of range
 * or a failed copy. */
int nsaDecoderCopySlot(NsaDecoder *d, int dst, int src, NsaError *err);

/* How Prefill runs on this decoder, and why: a sentence owned by d (NULL
 * for NULL). CPU: the reference rows, up to 64 positions a call. CUDA:
 * passes of up to 256 positions of a slot, each one CUDA graph of the
 * decode kernels; and, where the fast NSA op takes the config (phi = avg,
 * its head sizes), an empty slot's prompt of more than 512 positions goes
 * through the prompt pass instead: all its positions at once through
 * GEMMs and the fast op, the caches filled from the op's inputs (the
 * training forward's arithmetic; tests/gpu/test_decode.cu checks both
 * against the CPU decoder). */
const char *nsaDecoderPrefillPath(const NsaDecoder *d);

/* Appends n tokens (ids in [0, V)) to slot, in order, and writes the logits
 * of the last one into logits [V] (may be NULL). Fails, changing nothing,
 * when a token is out of range or the slot would hold more than
 * max_context tokens. Synchronous. Returns 0 or -1 with err. */
int nsaDecoderPrefill(NsaDecoder *d, int slot, const int32_t *tokens, int n, float *logits,
                      NsaError *err);
/* One decode step for slots 0..B-1: appends tokens[b] to slot b (each slot
 * at its own position) and writes logits [B][V] (may be NULL). Same checks
 * as Prefill. Synchronous (the logits are copied back). Returns 0 or -1. */
int nsaDecoderStep(NsaDecoder *d, int B, const int32_t *tokens, float *logits, NsaError *err);

/* Bytes the caches of one slot at context T read per decoded token, all
 * layers (compressed blocks visible at T, the selected blocks, the window),
 * at the decoder's cache precision; for benchmarks. 0 for NULL. */
size_t nsaDecoderKvBytesPerToken(const NsaDecoder *d, int T);

/* ---- the NSA attention op alone ----------------------------------------
 * Inputs after the projections and RoPE, phi = avg:
 *   q [B][S][H][d_k]; k_cmp, k_sel, k_win [B][S][G][d_k];
 *   v_cmp, v_sel, v_win [B][S][G][d_v]; gates [B][S][H][3] (post-sigmoid).
 * Outputs: out [B][S][H][d_v]; sel_idx [B][S][G][nsaNumSelSlots(n_sel)]
 * int32 (= n_sel for n_sel >= 3), the selected selection-block indices in
 * ascending order, padded with -1 (optional);
 * lse_cmp [B][S][H] (optional), the compressed softmax's log-sum-exp
 * (-INFINITY where no block is visible).
 * Backward takes dout and returns the gradient of every input (dgates is
 * the gradient with respect to the post-sigmoid gate values); it overwrites
 * the eight gradient arrays, all of which must be given. Selection is
 * a discrete choice and passes no gradient. */

typedef struct NsaAttnDims {
    int B, S, H, G, d_k, d_v;
    int cmp_len, cmp_stride, sel_len, n_sel, window;
} NsaAttnDims;

/* Number of compressed blocks: floor((S - l)/d) + 1, or 0 when S < l. */
int nsaNumCmpBlocks(int S, int cmp_len, int cmp_stride);
/* Number of selection blocks: ceil(S / l'). */
int nsaNumSelBlocks(int S, int sel_len);
/* Entries per sel_idx row: max(n_sel, 3). The forced blocks (0, the current
 * and the previous one) are kept even when n_sel < 3, so a row may hold up
 * to 3 blocks; for n_sel >= 3 this is n_sel. sel_idx is [B][S][G][slots]. */
int nsaNumSelSlots(int n_sel);

/* Checks dims against the op's rules (sizes positive and in range, G
 * dividing H, cmp_stride dividing cmp_len and sel_len, ...): 0, or -1 with
 * err naming the first field that breaks one and what is allowed. */
int nsaAttnDimsValidate(const NsaAttnDims *dims, NsaError *err);

typedef struct NsaAttnInputs {
    const float *q, *k_cmp, *v_cmp, *k_sel, *v_sel, *k_win, *v_win, *gates;
} NsaAttnInputs;

typedef struct NsaAttnGrads {
    float *dq, *dk_cmp, *dv_cmp, *dk_sel, *dv_sel, *dk_win, *dv_win, *dgates;
} NsaAttnGrads;

/* CPU reference, fp32 host arrays. */
int nsaAttnForwardCpu(const NsaAttnDims *dims, const NsaAttnInputs *in, float *out,
                      int32_t *sel_idx, float *lse_cmp, NsaError *err);
int nsaAttnBackwardCpu(const NsaAttnDims *dims, const NsaAttnInputs *in, const float *dout,
                       const NsaAttnGrads *grads, NsaError *err);

/* ---- the fast NSA attention op on CUDA (kernels/cuda/fast_attn/) --------
 * bf16 device tensors in the layouts above (phi = avg), tensor cores,
 * O(S) memory, deterministic backward. Declared for every build so ctypes
 * callers can reach them through libnsa.so; they exist when libnsa was
 * built with CUDA. Limits: (d_k, d_v) in {(64,64), (128,64), (128,128),
 * (192,128)}, H/G <= 16, n_sel <= 32 (each refused with a one-line error).
 *
 * A plan allocates the one workspace for dims up to max_dims (same H, G,
 * head dims and NSA sizes; B and S no larger) and keeps what the forward
 * saves for the backward: call nsaAttnBackwardCuda after the forward of the
 * same inputs on the same plan. Forward and backward only enqueue on the
 * given stream (a cudaStream_t, NULL for the default stream): no allocation,
 * no host synchronisation. They return 0, or -1 with err naming the fault.
 * sel_idx and lse_cmp outputs are optional (NULL). Backward overwrites all
 * eight gradients (bf16; dgates is the gradient of the post-sigmoid gates). */
typedef struct NsaAttnCudaPlan NsaAttnCudaPlan;

/* Whether the fast op takes dims: 0, or -1 with err naming the first limit
 * dims break (the ones above, and the block geometry's: a tile of 64
 * compressed blocks must span few enough selection blocks, a token sit in
 * few enough overlapping compressed blocks, and S / sel_len fit the
 * histogram's shared memory). Pure host code; needs no device. */
int nsaAttnCudaSupports(const NsaAttnDims *dims, NsaError *err);

typedef struct NsaAttnDeviceInputs {
    const void *q, *k_cmp, *v_cmp, *k_sel, *v_sel, *k_win, *v_win, *gates;
} NsaAttnDeviceInputs;

typedef struct NsaAttnDeviceGrads {
    void *dq, *dk_cmp, *dv_cmp, *dk_sel, *dv_sel, *dk_win, *dv_win, *dgates;
} NsaAttnDeviceGrads;

/* The selected branch's kernels (docs/FAST_ATTN.md has the table of which
 * runs at which shape): AUTO picks by shape; the others force one design at
 * every shape, for the tests and benchmarks - UNION (a CTA per 4 tokens
 * streaming the union of their blocks), WARP (the dQ one warp per token,
 * the forward block-centric), BLOCK (block-centric forward and dQ), DENSE
 * (masked dense forward and dQ where l' is a multiple of 64 and there are
 * at most 64 blocks; AUTO elsewhere). */
typedef enum NsaAttnSelDesign {
    NSA_ATTN_SEL_AUTO = 0,
    NSA_ATTN_SEL_UNION,
    NSA_ATTN_SEL_WARP,
    NSA_ATTN_SEL_BLOCK,
    NSA_ATTN_SEL_DENSE,
} NsaAttnSelDesign;

/* The tensor cores the tile loops use: AUTO is wgmma on compute capability
 * 9.0 (where the sm_90a code is built), mma.sync elsewhere; WGMMA anywhere
 * else is refused. */
typedef enum NsaAttnMma { NSA_ATTN_MMA_AUTO = 0, NSA_ATTN_MMA_SYNC, NSA_ATTN_MMA_WGMMA } NsaAttnMma;

/* How a plan runs; all zero (or a NULL pointer) is the default, what the
 * engine uses. The fields other than the defaults exist for the tests and
 * benchmarks, which check and time each design at every shape. */
typedef struct NsaAttnCudaOptions {
    NsaAttnSelDesign sel; /* the selected branch's design */
    NsaAttnMma mma;       /* the tile loops' tensor-core path */
    /* 1: the selected dK/dV and dQ as two passes where the fused pass
     * (both in one) would run; 0: fused where it applies */
    int sel_unfused;
    /* the compressed dK/dV's parts: 0 picks them from a schedule model of
     * the pass (per B and S), 1 to 16 fixes them */
    int cmp_parts;
    /* B x tokens per chunk of the block-centric selected passes: 0 as many
     * as their partial buffers hold (the default budget), else a multiple
     * of 256 from 256 to 1048576 (less memory for some speed; the tests use
     * small chunks to run many at small S) */
    int sel_chunk_tokens;
} NsaAttnCudaOptions;

/* Returns NULL with err filled on bad dims, bad options (opt NULL: the
 * defaults) or a failed allocation. Free with nsaAttnCudaPlanFree (NULL is
 * a no-op). */
NsaAttnCudaPlan *nsaAttnCudaPlanCreate(const NsaAttnDims *max_dims, const NsaAttnCudaOptions *opt,
                                       NsaError *err);
/* A plan with its own state (what its forward leaves for its backward) that
 * borrows the per-call scratch (dq accumulator, partial sums, chunk
 * buffers; about half of a plan at long S) of owner, a plan from
 * nsaAttnCudaPlanCreate with identical max_dims and options on the same device: the L
 * plans of an L-layer model then hold one scratch, not L. Calls on plans
 * that share a scratch must not overlap (enqueue them on one stream), and
 * owner must be freed last. Returns NULL with err on NULL or unsuitable
 * owner, bad dims or a failed allocation. */
NsaAttnCudaPlan *nsaAttnCudaPlanCreateSharing(const NsaAttnDims *max_dims,
                                              const NsaAttnCudaOptions *opt,
                                              NsaAttnCudaPlan *owner, NsaError *err);
void nsaAttnCudaPlanFree(NsaAttnCudaPlan *plan);
/* Device bytes the plan allocated (0 for NULL): state and scratch for an
 * owner, state only for a plan that shares another's scratch. */
size_t nsaAttnCudaPlanBytes(const NsaAttnCudaPlan *plan);
/* The bytes a plan for max_dims would take on the current device, without
 * allocating: its state (each plan's own) and its scratch (an owner's, that
 * sharing plans borrow); either pointer may be NULL. Same checks and
 * options as nsaAttnCudaPlanCreate. Returns 0, or -1 with err. */
int nsaAttnCudaPlanMeasure(const NsaAttnDims *max_dims, const NsaAttnCudaOptions *opt,
                           size_t *state_bytes, size_t *scratch_bytes,
                           NsaError *err);

/* The forward and backward of a plan (see the top of this section):
 * enqueue only; 0, or -1 with err. */
int nsaAttnForwardCuda(NsaAttnCudaPlan *plan, const NsaAttnDims *dims,
                       const NsaAttnDeviceInputs *in, void *out, int32_t *sel_idx,
                       float *lse_cmp, void *stream, NsaError *err);
int nsaAttnBackwardCuda(NsaAttnCudaPlan *plan, const NsaAttnDims *dims,
                        const NsaAttnDeviceInputs *in, const void *dout,
                        const NsaAttnDeviceGrads *grads, void *stream, NsaError *err);

/* Per-phase timing for benchmarks: when enabled, forward and backward record
 * CUDA events between their phases; ProfileRead waits for them and fills up
 * to max (name, milliseconds) pairs of the last forward and backward,
 * returning how many (or -1 with err). */
int nsaAttnCudaProfile(NsaAttnCudaPlan *plan, int enable, NsaError *err);
int nsaAttnCudaProfileRead(NsaAttnCudaPlan *plan, const char **names, float *ms, int max,
                           NsaError *err);

#ifdef __cplusplus
}
#endif
#endif /* NSA_H */
