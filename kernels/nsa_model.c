/* nsa_model.c - the public model API of libnsa (kernels/nsa.h).
 *
 * Owns the NsaModel handle: the shared parameter layout, the step's loss
 * accumulator, the last step's figures and pending fault injections, and one
 * engine behind them - the CPU reference (kernels/cpu, F32 or F64 arenas) or,
 * when built with nvcc, the CUDA engine (kernels/cuda/cuda_engine.h), to
 * which every call of a CUDA model is forwarded unchanged. A CUDA model in a
 * build without the CUDA engine is an error, never a silent CPU run.
 *
 * Data parallelism on the CPU engine (nsa.h): the layout's buckets are
 * padded for the transport's world; the backward's bucket hook reduces
 * each bucket (nsaModelBackwardReduce) or the optimizer step reduces them
 * all first; the optimizer step sums every rank's loss and squared
 * gradient norm in rank order, updates this rank's pieces (NsaShard) and
 * all-gathers the weights bucket by bucket. A model alone is the same code
 * with one rank and no transport. */
#include "nsa.h"
#include "nsa_comm.h"
#include "nsa_layout.h"
#include "cpu/cpu_model.h"
#include "cpu/cpu_ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The CUDA engine is wired in when this build compiles it: nvcc found
 * (NSA_HAVE_CUDA) and its source present (the Makefile compiles every
 * .cu file under kernels/cuda, cuda_engine.cu implementing cuda_engine.h). */
#ifdef NSA_HAVE_CUDA
#include "cuda/cuda_engine.h"
#endif

typedef struct NsaEngineOps NsaEngineOps;

struct NsaModel {
    NsaModelConfig cfg;
    NsaEngineOptions opt;
    NsaLayout layout;    /* buckets padded for world ranks */
    NsaCpuModel cpu; /* device CPU */
    /* data parallelism: comm NULL, rank 0, world 1 for a model alone */
    NsaComm *comm;
    int rank, world;
    NsaShard shard;      /* this rank's slices and pieces */
    int reduced;         /* this step's gradients are reduced (until ZeroGrad) */
    int reduce_failed;   /* a bucket's reduction failed inside the backward */
    NsaError reduce_err;
    double *scalars;     /* [world][2]: every rank's loss and squared norm */
    NsaCommStats comm_stats; /* this step's, CPU engine */
    const NsaEngineOps *engine; /* the backend every call goes to (engineFor) */
#ifdef NSA_HAVE_CUDA
    NsaCudaModel *cuda; /* device CUDA */
#endif
    /* CPU engine step state (the CUDA engine keeps its own on the device) */
    double loss_accum;     /* sum of grad_scale * mean loss since ZeroGrad */
    double backward_scale; /* grad_scale / counted targets of the last Forward */
    int have_forward;      /* activations of a Forward wait for their Backward */
    int fault_nan_loss, fault_nan_grad;
    NsaStepStats stats;
};

static int isCuda(const NsaModel *m) { return m->opt.device == NSA_DEVICE_CUDA; }

/* ---- the engines ----------------------------------------------------------
 * What a backend does for the public calls below, once their arguments are
 * checked (handle, arena, index, optimizer config, fault): one table per
 * backend, chosen at create from opt->device (engineFor). Each operation
 * returns 0, or -1 with err, as the public function it serves. The CPU
 * engine's operations work on the handle's own arenas; the CUDA engine's
 * forward the call unchanged to kernels/cuda/cuda_engine.h. */
struct NsaEngineOps {
    int (*init)(NsaModel *m, uint64_t seed, NsaError *err);
    int (*get_tensor)(NsaModel *m, NsaArena arena, int i, float *dst, NsaError *err);
    int (*set_tensor)(NsaModel *m, NsaArena arena, int i, const float *src, NsaError *err);
    /* the other ranks' pieces of a moment tensor into dst (dst holds this
     * rank's; m->comm set) */
    int (*gather_pieces)(NsaModel *m, NsaArena arena, int i, float *dst, const char *what,
                         NsaError *err);
    int (*exchange)(NsaModel *m, void *buf, size_t bytes, NsaError *err);
    int (*broadcast_host)(NsaModel *m, void *buf, size_t bytes, int root, const char *what,
                          NsaError *err);
    int (*zero_grad)(NsaModel *m, NsaError *err);
    int (*forward)(NsaModel *m, const int32_t *tokens, const int32_t *targets, int B, int S,
                   float grad_scale, NsaError *err);
    /* reduce: the step's last backward, which reduces the gradients */
    int (*backward)(NsaModel *m, int reduce, NsaError *err);
    int (*optimizer_step)(NsaModel *m, const NsaOptimConfig *oc, int64_t step, NsaError *err);
    /* m->comm set; out zeroed */
    int (*comm_stats)(NsaModel *m, NsaCommStats *out, NsaError *err);
    int (*step_stats)(NsaModel *m, NsaStepStats *out, NsaError *err);
    int (*eval_loss)(NsaModel *m, const int32_t *tokens, const int32_t *targets, int B, int S,
                     double *loss, NsaError *err);
    int (*inject_fault)(NsaModel *m, NsaFault fault, NsaError *err);
    int (*memory_report)(const NsaModel *m, NsaMemoryReport *out);
};

static const NsaEngineOps *engineFor(NsaDevice device);

static const char *precisionName(NsaPrecision p) {
    switch (p) {
    case NSA_PREC_F32:
        return "fp32";
    case NSA_PREC_F64:
        return "fp64";
    case NSA_PREC_BF16:
        return "bf16";
    case NSA_PREC_FP16:
        return "fp16";
    }
    return "unknown";
}

/* ---- create / free ------------------------------------------------------ */

const char *nsaRecomputeName(int recompute) {
    switch (recompute) {
    case NSA_RECOMPUTE_NONE: return "none";
    case NSA_RECOMPUTE_LAYER: return "layer";
    case NSA_RECOMPUTE_SELECTIVE: return "selective";
    default: return "?";
    }
}

NsaModel *nsaModelCreate(const NsaModelConfig *cfg, const NsaEngineOptions *opt, NsaError *err) {
    if (!cfg || !opt) {
        nsaErrorf(err, "nsa: nsaModelCreate needs a config and engine options (got NULL)");
        return NULL;
    }
    if (nsaModelConfigValidate(cfg, err)) return NULL;
    if (opt->device != NSA_DEVICE_CPU && opt->device != NSA_DEVICE_CUDA) {
        nsaErrorf(err, "nsa: device = %d is unknown; allowed: %d (cpu) or %d (cuda)",
                   (int)opt->device, NSA_DEVICE_CPU, NSA_DEVICE_CUDA);
        return NULL;
    }
    if (opt->max_batch < 1 || opt->max_seq_len < 1) {
        nsaErrorf(err, "nsa: max_batch = %d, max_seq_len = %d; allowed: both >= 1", opt->max_batch,
                   opt->max_seq_len);
        return NULL;
    }
    if (opt->threads < 0 || opt->threads > 256) {
        nsaErrorf(err, "nsa: threads = %d; allowed: 0 (one thread) to 256", opt->threads);
        return NULL;
    }
    if (opt->recompute < NSA_RECOMPUTE_NONE || opt->recompute > NSA_RECOMPUTE_SELECTIVE) {
        nsaErrorf(err, "nsa: recompute = %d; allowed: %d (none), %d (layer), %d (selective)",
                  opt->recompute, NSA_RECOMPUTE_NONE, NSA_RECOMPUTE_LAYER,
                  NSA_RECOMPUTE_SELECTIVE);
        return NULL;
    }
    if (opt->device == NSA_DEVICE_CPU && opt->recompute != NSA_RECOMPUTE_NONE) {
        nsaErrorf(err, "nsa: recompute = %s is a CUDA engine option; the CPU engine keeps every "
                       "activation (allowed: none)", nsaRecomputeName(opt->recompute));
        return NULL;
    }
    if (opt->device == NSA_DEVICE_CPU && opt->precision != NSA_PREC_F32 &&
        opt->precision != NSA_PREC_F64) {
        nsaErrorf(err,
                   "nsa: precision %s is not supported by the CPU engine; allowed: fp32 or fp64",
                   precisionName(opt->precision));
        return NULL;
    }
    if (!engineFor(opt->device)) {
        nsaErrorf(err, "nsa: this build has no CUDA engine");
        return NULL;
    }
    if (opt->comm) {
        const int nccl = nsaCommIsNccl(opt->comm);
        if (opt->device == NSA_DEVICE_CUDA && !nccl) {
            nsaErrorf(err, "nsa: a CUDA model needs an NCCL transport; got %s",
                      nsaCommKind(opt->comm));
            return NULL;
        }
        if (opt->device == NSA_DEVICE_CPU && nccl) {
            nsaErrorf(err, "nsa: a CPU model needs a local or TCP transport; got nccl");
            return NULL;
        }
    }

    NsaModel *m = calloc(1, sizeof(*m));
    if (!m) {
        nsaErrorf(err, "nsa: out of memory allocating the model handle");
        return NULL;
    }
    m->cfg = *cfg;
    m->opt = *opt;
    m->engine = engineFor(opt->device);
    m->comm = opt->comm;
    m->rank = nsaCommRank(opt->comm);
    m->world = nsaCommWorld(opt->comm);
    if (nsaLayoutBuildRanks(&m->layout, cfg, m->world, err) ||
        nsaShardBuild(&m->shard, &m->layout, m->rank, err)) {
        nsaModelFree(m);
        return NULL;
    }
#ifdef NSA_HAVE_CUDA
    if (opt->device == NSA_DEVICE_CUDA) {
        m->cuda = nsaCudaModelCreate(cfg, opt, err);
        if (!m->cuda) {
            nsaModelFree(m);
            return NULL;
        }
        return m;
    }
#endif
    m->scalars = calloc((size_t)m->world * 2, sizeof(double));
    if (!m->scalars) {
        nsaErrorf(err, "nsa: out of memory for the step's scalars (%d ranks)", m->world);
        nsaModelFree(m);
        return NULL;
    }
    if (nsaCpuModelAlloc(&m->cpu, cfg, &m->layout, opt->precision == NSA_PREC_F64, opt->max_batch,
                         opt->max_seq_len, opt->threads, m->shard.total, err)) {
        nsaModelFree(m);
        return NULL;
    }
    return m;
}

void nsaModelFree(NsaModel *m) {
    if (!m) return;
#ifdef NSA_HAVE_CUDA
    if (m->cuda) nsaCudaModelFree(m->cuda);
#endif
    nsaCpuModelRelease(&m->cpu);
    nsaShardFree(&m->shard);
    nsaLayoutFree(&m->layout);
    free(m->scalars);
    free(m);
}

const NsaModelConfig *nsaModelGetConfig(const NsaModel *m) { return m ? &m->cfg : NULL; }
const NsaEngineOptions *nsaModelGetOptions(const NsaModel *m) { return m ? &m->opt : NULL; }

/* ---- tensors ------------------------------------------------------------ */

int nsaModelNumTensors(const NsaModel *m) { return m ? m->layout.n_tensors : 0; }

const NsaTensorInfo *nsaModelTensorInfo(const NsaModel *m, int i) {
    if (!m || i < 0 || i >= m->layout.n_tensors) return NULL;
    return &m->layout.entries[i].info;
}

int nsaModelFindTensor(const NsaModel *m, const char *name) {
    return m ? nsaLayoutFind(&m->layout, name) : -1;
}

size_t nsaModelNumParams(const NsaModel *m) { return m ? m->layout.total : 0; }

static void *cpuArena(NsaModel *m, NsaArena arena) {
    switch (arena) {
    case NSA_ARENA_PARAMS:
        return m->cpu.params;
    case NSA_ARENA_GRADS:
        return m->cpu.grads;
    case NSA_ARENA_ADAM_M:
        return m->cpu.adam_m;
    case NSA_ARENA_ADAM_V:
        return m->cpu.adam_v;
    }
    return NULL;
}

/* Checks the handle, arena and index shared by Get/SetTensor. */
static int checkTensorArgs(NsaModel *m, NsaArena arena, int i, const void *buf, NsaError *err) {
    if (!m) return nsaErrorf(err, "nsa: no model (NULL)");
    if (arena < NSA_ARENA_PARAMS || arena > NSA_ARENA_ADAM_V)
        return nsaErrorf(err, "nsa: arena = %d is unknown; allowed: 0 (params) to 3 (adam_v)",
                          (int)arena);
    if (i < 0 || i >= m->layout.n_tensors)
        return nsaErrorf(err, "nsa: tensor index %d out of range; allowed: 0 to %d", i,
                          m->layout.n_tensors - 1);
    if (!buf) return nsaErrorf(err, "nsa: tensor %s: NULL host buffer", m->layout.entries[i].name);
    return 0;
}

/* Where tensor i of an arena lives on the CPU engine: elements
 * [*begin, *begin + *n) of the tensor at element `at` of the arena's host
 * buffer. The moments hold this rank's piece only (n 0: none). */
static void cpuTensorSpan(const NsaModel *m, NsaArena arena, int i, size_t *begin, size_t *n,
                          size_t *at) {
    const NsaTensorInfo *ti = &m->layout.entries[i].info;
    *begin = 0;
    *n = ti->numel;
    *at = ti->offset;
    if (arena == NSA_ARENA_ADAM_M || arena == NSA_ARENA_ADAM_V) {
        const int p = m->shard.tensor_piece[i];
        *n = p < 0 ? 0 : m->shard.pieces[p].numel;
        *begin = p < 0 ? 0 : m->shard.pieces[p].begin;
        *at = p < 0 ? 0 : m->shard.pieces[p].local;
    }
}

static int cpuGetTensor(NsaModel *m, NsaArena arena, int i, float *dst, NsaError *err) {
    size_t begin, n, at;
    cpuTensorSpan(m, arena, i, &begin, &n, &at);
    if (m->cpu.f64) {
        const double *src = (const double *)cpuArena(m, arena) + at;
        for (size_t j = 0; j < n; j++)
            dst[begin + j] = (float)src[j];
    } else {
        memcpy(dst + begin, (const float *)cpuArena(m, arena) + at, n * sizeof(float));
    }
    return 0;
}

int nsaModelGetTensor(NsaModel *m, NsaArena arena, int i, float *dst, NsaError *err) {
    if (checkTensorArgs(m, arena, i, dst, err)) return -1;
    return m->engine->get_tensor(m, arena, i, dst, err);
}

static int cpuSetTensor(NsaModel *m, NsaArena arena, int i, const float *src, NsaError *err) {
    size_t begin, n, at;
    cpuTensorSpan(m, arena, i, &begin, &n, &at);
    if (m->cpu.f64) {
        double *dst = (double *)cpuArena(m, arena) + at;
        for (size_t j = 0; j < n; j++)
            dst[j] = src[begin + j];
    } else {
        memcpy((float *)cpuArena(m, arena) + at, src + begin, n * sizeof(float));
    }
    return 0;
}

int nsaModelSetTensor(NsaModel *m, NsaArena arena, int i, const float *src, NsaError *err) {
    if (checkTensorArgs(m, arena, i, src, err)) return -1;
    return m->engine->set_tensor(m, arena, i, src, err);
}

int nsaModelTensorShard(const NsaModel *m, int i, size_t *begin, size_t *end, NsaError *err) {
    if (!m || !begin || !end) return nsaErrorf(err, "nsa: nsaModelTensorShard needs a model and outputs");
    if (i < 0 || i >= m->layout.n_tensors)
        return nsaErrorf(err, "nsa: tensor index %d out of range; allowed: 0 to %d", i,
                         m->layout.n_tensors - 1);
    const int p = m->shard.tensor_piece[i];
    *begin = p < 0 ? 0 : m->shard.pieces[p].begin;
    *end = p < 0 ? 0 : m->shard.pieces[p].begin + m->shard.pieces[p].numel;
    return 0;
}

static int cpuGatherPieces(NsaModel *m, NsaArena arena, int i, float *dst, const char *what,
                           NsaError *err) {
    for (int r = 0; r < m->world; r++) {
        size_t begin, end;
        nsaShardTensorRange(&m->layout, i, r, &begin, &end);
        if (end > begin &&
            nsaCommBroadcast(m->comm, dst + begin, (end - begin) * sizeof(float), r, NULL, what, err))
            return -1;
    }
    return 0;
}

int nsaModelGatherTensor(NsaModel *m, NsaArena arena, int i, float *dst, NsaError *err) {
    if (nsaModelGetTensor(m, arena, i, dst, err)) return -1;
    if (!m->comm || (arena != NSA_ARENA_ADAM_M && arena != NSA_ARENA_ADAM_V)) return 0;
    char what[96];
    snprintf(what, sizeof what, "gather of %s.%s", arena == NSA_ARENA_ADAM_M ? "adam_m" : "adam_v",
             m->layout.entries[i].name);
    return m->engine->gather_pieces(m, arena, i, dst, what, err);
}

static int cpuExchange(NsaModel *m, void *buf, size_t bytes, NsaError *err) {
    return nsaCommAllGather(m->comm, buf, bytes, NULL, "exchange", err);
}

int nsaModelExchange(NsaModel *m, void *buf, size_t bytes, NsaError *err) {
    if (!m || !buf) return nsaErrorf(err, "nsa: nsaModelExchange needs a model and a buffer");
    if (!m->comm) return 0;
    return m->engine->exchange(m, buf, bytes, err);
}

static int cpuBroadcastHost(NsaModel *m, void *buf, size_t bytes, int root, const char *what,
                            NsaError *err) {
    return nsaCommBroadcast(m->comm, buf, bytes, root, NULL, what, err);
}

int nsaModelBroadcastTensor(NsaModel *m, NsaArena arena, int i, float *buf, int root,
                            NsaError *err) {
    if (checkTensorArgs(m, arena, i, buf, err)) return -1;
    if (m->comm) {
        char what[96];
        snprintf(what, sizeof what, "broadcast of tensor %s (arena %d)", m->layout.entries[i].name,
                 (int)arena);
        const size_t bytes = m->layout.entries[i].info.numel * sizeof(float);
        if (m->engine->broadcast_host(m, buf, bytes, root, what, err)) return -1;
    }
    return nsaModelSetTensor(m, arena, i, buf, err);
}

NsaCpuModel *nsaModelCpuEngine(NsaModel *m) { return m && !isCuda(m) ? &m->cpu : NULL; }

void *nsaModelHostArena(NsaModel *m, NsaArena arena) {
    if (!m || isCuda(m) || arena < NSA_ARENA_PARAMS || arena > NSA_ARENA_ADAM_V) return NULL;
    return cpuArena(m, arena);
}

/* ---- init --------------------------------------------------------------- */

/* Zeroes gradients, moments and the step state of the CPU engine. */
static void cpuResetState(NsaModel *m) {
    memset(m->cpu.grads, 0, m->layout.total * m->cpu.real_size);
    memset(m->cpu.adam_m, 0, m->cpu.state_elems * m->cpu.real_size);
    memset(m->cpu.adam_v, 0, m->cpu.state_elems * m->cpu.real_size);
    m->reduced = 0;
    m->loss_accum = 0.0;
    m->have_forward = 0;
    memset(&m->stats, 0, sizeof(m->stats));
}

static int cpuInit(NsaModel *m, uint64_t seed, NsaError *err) {
    const NsaLayout *lay = &m->layout;
    memset(m->cpu.params, 0, lay->total * m->cpu.real_size); /* padding stays zero */
    size_t largest = 0;
    for (int i = 0; i < lay->n_tensors; i++)
        if (lay->entries[i].info.numel > largest) largest = lay->entries[i].info.numel;
    /* Init is not part of a step, so a temporary host buffer is allowed here. */
    float *buf = malloc(largest * sizeof(float));
    if (!buf) return nsaErrorf(err, "nsa: out of memory for init (%zu floats)", largest);
    for (int i = 0; i < lay->n_tensors; i++) {
        if (nsaLayoutInitTensor(lay, i, seed, buf, err) ||
            nsaModelSetTensor(m, NSA_ARENA_PARAMS, i, buf, err)) {
            free(buf);
            return -1;
        }
    }
    free(buf);
    cpuResetState(m);
    return 0;
}

int nsaModelInit(NsaModel *m, uint64_t seed, NsaError *err) {
    if (!m) return nsaErrorf(err, "nsa: no model (NULL)");
    return m->engine->init(m, seed, err);
}

/* ---- the step ----------------------------------------------------------- */

static int cpuZeroGrad(NsaModel *m, NsaError *err) {
    memset(m->cpu.grads, 0, m->layout.total * m->cpu.real_size);
    m->loss_accum = 0.0;
    return 0;
}

int nsaModelZeroGrad(NsaModel *m, NsaError *err) {
    if (!m) return nsaErrorf(err, "nsa: no model (NULL)");
    m->reduced = 0;
    m->comm_stats.reduce_seconds = m->comm_stats.gather_seconds = 0;
    return m->engine->zero_grad(m, err);
}

/* The batch check of the CPU engine's forward and evaluation. */
static int cpuCheckBatch(const NsaModel *m, const int32_t *tokens, const int32_t *targets, int B,
                         int S, NsaError *err) {
    size_t counted;
    return nsaBatchValidate(&m->cfg, m->opt.max_batch, m->opt.max_seq_len, tokens, targets, B, S,
                            &counted, err);
}

/* Runs the CPU forward of a checked batch (cpuCheckBatch: at least one
 * target counted) and returns the mean loss in *mean. */
static int cpuForwardPass(NsaModel *m, const int32_t *tokens, const int32_t *targets, int B,
                          int S, double *mean, size_t *count, NsaError *err) {
    double sum = 0.0;
    int rc = m->cpu.f64 ? nsaCpuModelForwardF64(&m->cpu, tokens, targets, B, S, &sum, count, err)
                        : nsaCpuModelForwardF32(&m->cpu, tokens, targets, B, S, &sum, count, err);
    if (rc) return -1;
    *mean = sum / (double)*count;
    return 0;
}

static int cpuForward(NsaModel *m, const int32_t *tokens, const int32_t *targets, int B, int S,
                      float grad_scale, NsaError *err) {
    if (cpuCheckBatch(m, tokens, targets, B, S, err)) return -1;
    if (!isfinite(grad_scale))
        return nsaErrorf(err, "nsa: grad_scale = %g; allowed: a finite number",
                          (double)grad_scale);
    m->have_forward = 0;
    double mean;
    size_t count;
    if (cpuForwardPass(m, tokens, targets, B, S, &mean, &count, err)) return -1;
    if (m->fault_nan_loss) {
        mean = NAN;
        m->fault_nan_loss = 0;
    }
    /* each rank's share of the mean over the whole batch (nsa.h) */
    const double scale = (double)grad_scale / (double)m->world;
    m->loss_accum += scale * mean;
    m->backward_scale = scale / (double)count;
    m->have_forward = 1;
    return 0;
}

int nsaModelForward(NsaModel *m, const int32_t *tokens, const int32_t *targets, int B, int S,
                    float grad_scale, NsaError *err) {
    if (!m) return nsaErrorf(err, "nsa: no model (NULL)");
    return m->engine->forward(m, tokens, targets, B, S, grad_scale, err);
}

/* What the CPU backward's bucket hook works with. */
typedef struct BucketHookCtx {
    NsaModel *m;
    int reduce;
} BucketHookCtx;

static const char *bucketName(const NsaModel *m, int b, char *buf, size_t cap) {
    if (b == NSA_BUCKET_EMBED) snprintf(buf, cap, "bucket %d (embedding)", b);
    else if (b == NSA_BUCKET_HEAD(m->cfg.n_layers)) snprintf(buf, cap, "bucket %d (head)", b);
    else snprintf(buf, cap, "bucket %d (layer %d)", b, b - NSA_BUCKET_LAYER(0));
    return buf;
}

/* Reduce-scatters bucket b of the CPU gradient arena: slice `rank` then
 * holds the sum over ranks. */
static int cpuReduceBucket(NsaModel *m, int b, NsaError *err) {
    const NsaLayoutBucket *bk = &m->layout.buckets[b];
    char name[64], what[96];
    snprintf(what, sizeof what, "reduce-scatter of %s", bucketName(m, b, name, sizeof name));
    const double t0 = nsaCommNow();
    const int rc = nsaCommReduceScatter(m->comm, (char *)m->cpu.grads + bk->offset * m->cpu.real_size,
                                        bk->count / (size_t)m->world, m->cpu.f64, NULL, what, err);
    m->comm_stats.reduce_seconds += nsaCommNow() - t0;
    return rc;
}

/* A bucket's gradients are complete: the NaN fault lands in the head
 * bucket before it can be reduced (so that it reaches whichever rank holds
 * the element), then the bucket is reduced when this is the step's last
 * backward. A failed reduction is kept for nsaModelBackwardReduce to
 * return; the later buckets are not reduced. */
static void cpuBucketReady(void *ctx, int b) {
    BucketHookCtx *h = ctx;
    NsaModel *m = h->m;
    if (b == NSA_BUCKET_HEAD(m->cfg.n_layers) && m->fault_nan_grad) {
        /* the first element of the last tensor (lm_head): any one will do */
        size_t at = m->layout.entries[m->layout.n_tensors - 1].info.offset;
        if (m->cpu.f64)
            ((double *)m->cpu.grads)[at] = NAN;
        else
            ((float *)m->cpu.grads)[at] = NAN;
        m->fault_nan_grad = 0;
    }
    if (!h->reduce || !m->comm || m->reduce_failed) return;
    if (cpuReduceBucket(m, b, &m->reduce_err)) m->reduce_failed = 1;
}

static int cpuBackward(NsaModel *m, int reduce, NsaError *err) {
    if (!m->have_forward)
        return nsaErrorf(err, "nsa: Backward needs the activations of a Forward (each Forward "
                               "serves one Backward; EvalLoss discards them)");
    BucketHookCtx hook = {m, reduce};
    m->reduce_failed = 0;
    if (m->cpu.f64)
        nsaCpuModelBackwardF64(&m->cpu, m->backward_scale, cpuBucketReady, &hook);
    else
        nsaCpuModelBackwardF32(&m->cpu, m->backward_scale, cpuBucketReady, &hook);
    m->have_forward = 0;
    if (m->reduce_failed) {
        if (err) *err = m->reduce_err;
        return -1;
    }
    return 0;
}

static int backward(NsaModel *m, int reduce, NsaError *err) {
    if (!m) return nsaErrorf(err, "nsa: no model (NULL)");
    if (m->comm && m->reduced)
        return nsaErrorf(err, "nsa: this step's gradients were already reduced by "
                              "nsaModelBackwardReduce, which must be the step's last backward "
                              "(nsaModelZeroGrad starts the next step)");
    if (m->engine->backward(m, reduce, err)) return -1;
    m->reduced = reduce && m->comm;
    return 0;
}

int nsaModelBackward(NsaModel *m, NsaError *err) { return backward(m, 0, err); }

int nsaModelBackwardReduce(NsaModel *m, NsaError *err) { return backward(m, 1, err); }

int nsaModelForwardBackward(NsaModel *m, const int32_t *tokens, const int32_t *targets, int B,
                            int S, float grad_scale, NsaError *err) {
    if (nsaModelForward(m, tokens, targets, B, S, grad_scale, err)) return -1;
    return nsaModelBackward(m, err);
}

static int checkOptim(const NsaOptimConfig *oc, int64_t step, NsaError *err) {
    if (!oc) return nsaErrorf(err, "nsa: optimizer config is NULL");
    if (!isfinite(oc->lr) || oc->lr < 0)
        return nsaErrorf(err, "nsa: optimizer lr = %g; allowed: a finite number >= 0",
                          (double)oc->lr);
    if (!(oc->beta1 >= 0 && oc->beta1 < 1))
        return nsaErrorf(err, "nsa: optimizer beta1 = %g; allowed: 0 <= beta1 < 1",
                          (double)oc->beta1);
    if (!(oc->beta2 >= 0 && oc->beta2 < 1))
        return nsaErrorf(err, "nsa: optimizer beta2 = %g; allowed: 0 <= beta2 < 1",
                          (double)oc->beta2);
    if (!(oc->eps > 0) || !isfinite(oc->eps))
        return nsaErrorf(err, "nsa: optimizer eps = %g; allowed: a finite number > 0",
                          (double)oc->eps);
    if (!(oc->weight_decay >= 0) || !isfinite(oc->weight_decay))
        return nsaErrorf(err, "nsa: optimizer weight_decay = %g; allowed: a finite number >= 0",
                          (double)oc->weight_decay);
    if (isnan(oc->grad_clip))
        return nsaErrorf(err, "nsa: optimizer grad_clip = nan; allowed: a number (<= 0 disables)");
    if (step < 1)
        return nsaErrorf(err, "nsa: optimizer step = %lld; allowed: 1 or more (1-based)",
                          (long long)step);
    return 0;
}

/* Reduces what nsaModelBackwardReduce did not, then the AdamW step over
 * this rank's pieces and the all-gather of the weights. */
static int cpuOptimizerStep(NsaModel *m, const NsaOptimConfig *oc, int64_t step, NsaError *err) {
    const NsaLayout *lay = &m->layout;
    const NsaShard *sh = &m->shard;
    const int f64 = m->cpu.f64;
    if (m->comm && !m->reduced) /* in the backward's order */
        for (int b = lay->n_buckets - 1; b >= 0; b--)
            if (cpuReduceBucket(m, b, err)) return -1;
    m->reduced = m->comm != NULL;
    /* this rank's squared norm over its pieces in layout order (alone: every
     * tensor), then every rank's figures added in rank order */
    double sum_sq = 0.0;
    for (int p = 0; p < sh->n_pieces; p++) {
        const NsaShardPiece *pc = &sh->pieces[p];
        sum_sq += f64 ? nsaCpuSumSquaresF64((const double *)m->cpu.grads + pc->offset, pc->numel)
                      : nsaCpuSumSquaresF32((const float *)m->cpu.grads + pc->offset, pc->numel);
    }
    double loss = m->loss_accum;
    if (m->comm) {
        double *all = m->scalars;
        all[2 * m->rank] = loss;
        all[2 * m->rank + 1] = sum_sq;
        if (nsaCommAllGather(m->comm, all, 2 * sizeof(double), NULL,
                             "all-gather of the loss and gradient norm", err))
            return -1;
        loss = sum_sq = 0.0;
        for (int r = 0; r < m->world; r++) {
            loss += all[2 * r];
            sum_sq += all[2 * r + 1];
        }
    }
    NsaStepStats *st = &m->stats;
    st->loss = loss;
    st->grad_norm = sqrt(sum_sq);
    st->nonfinite_loss = !isfinite(st->loss);
    st->nonfinite_grad = !isfinite(st->grad_norm);
    st->applied = 0;
    if (st->nonfinite_loss || st->nonfinite_grad) return 0; /* the NaN guard: skip it all */

    const double clip =
        oc->grad_clip > 0 && st->grad_norm > oc->grad_clip ? oc->grad_clip / st->grad_norm : 1.0;
    const double bc1 = 1.0 - pow(oc->beta1, (double)step);
    const double bc2 = 1.0 - pow(oc->beta2, (double)step);
    for (int p = 0; p < sh->n_pieces; p++) {
        const NsaShardPiece *pc = &sh->pieces[p];
        const double wd = pc->weight_decay ? oc->weight_decay : 0.0;
        if (f64)
            nsaCpuAdamWF64(
                (double *)m->cpu.params + pc->offset, (const double *)m->cpu.grads + pc->offset,
                (double *)m->cpu.adam_m + pc->local, (double *)m->cpu.adam_v + pc->local,
                pc->numel, oc->lr, oc->beta1, oc->beta2, oc->eps, wd, bc1, bc2, clip);
        else
            nsaCpuAdamWF32((float *)m->cpu.params + pc->offset,
                           (const float *)m->cpu.grads + pc->offset,
                           (float *)m->cpu.adam_m + pc->local, (float *)m->cpu.adam_v + pc->local,
                           pc->numel, oc->lr, oc->beta1, oc->beta2, oc->eps, wd, bc1, bc2, clip);
    }
    /* every rank's updated slices to every rank, in the forward's order */
    const double t0 = nsaCommNow();
    for (int b = 0; m->comm && b < lay->n_buckets; b++) {
        const NsaLayoutBucket *bk = &lay->buckets[b];
        char name[64], what[96];
        snprintf(what, sizeof what, "all-gather of the weights of %s",
                 bucketName(m, b, name, sizeof name));
        if (nsaCommAllGather(m->comm, (char *)m->cpu.params + bk->offset * m->cpu.real_size,
                             bk->count / (size_t)m->world * m->cpu.real_size, NULL, what, err))
            return -1;
    }
    m->comm_stats.gather_seconds = nsaCommNow() - t0;
    st->applied = 1;
    return 0;
}

int nsaModelOptimizerStep(NsaModel *m, const NsaOptimConfig *oc, int64_t step, NsaError *err) {
    if (!m) return nsaErrorf(err, "nsa: no model (NULL)");
    if (checkOptim(oc, step, err)) return -1;
    /* each engine reduces what nsaModelBackwardReduce did not */
    if (m->engine->optimizer_step(m, oc, step, err)) return -1;
    m->reduced = m->comm != NULL;
    return 0;
}

static int cpuCommStats(NsaModel *m, NsaCommStats *out, NsaError *err) {
    *out = m->comm_stats;
    /* the CPU transports do not overlap: every reduction is exposed */
    out->exposed_seconds = out->reduce_seconds;
    out->overlap = 0.0;
    out->bytes_sent = 2.0 * (double)m->layout.total * (double)m->cpu.real_size *
                      (double)(m->world - 1) / (double)m->world;
    return 0;
}

int nsaModelCommStats(NsaModel *m, NsaCommStats *out, NsaError *err) {
    if (!m || !out) return nsaErrorf(err, "nsa: nsaModelCommStats needs a model and an output");
    memset(out, 0, sizeof *out);
    if (!m->comm) return 0;
    return m->engine->comm_stats(m, out, err);
}

static int cpuStepStats(NsaModel *m, NsaStepStats *out, NsaError *err) {
    *out = m->stats;
    return 0;
}

int nsaModelStepStats(NsaModel *m, NsaStepStats *out, NsaError *err) {
    if (!m || !out) return nsaErrorf(err, "nsa: nsaModelStepStats needs a model and an output");
    return m->engine->step_stats(m, out, err);
}

static int cpuEvalLoss(NsaModel *m, const int32_t *tokens, const int32_t *targets, int B, int S,
                       double *loss, NsaError *err) {
    if (cpuCheckBatch(m, tokens, targets, B, S, err)) return -1;
    /* the pass overwrites the saved activations: a pending Backward is void */
    m->have_forward = 0;
    size_t count;
    return cpuForwardPass(m, tokens, targets, B, S, loss, &count, err);
}

int nsaModelEvalLoss(NsaModel *m, const int32_t *tokens, const int32_t *targets, int B, int S,
                     double *loss, NsaError *err) {
    if (!m || !loss) return nsaErrorf(err, "nsa: nsaModelEvalLoss needs a model and an output");
    return m->engine->eval_loss(m, tokens, targets, B, S, loss, err);
}

static int cpuInjectFault(NsaModel *m, NsaFault fault, NsaError *err) {
    if (fault == NSA_FAULT_NONE) m->fault_nan_loss = m->fault_nan_grad = 0;
    if (fault == NSA_FAULT_NAN_LOSS) m->fault_nan_loss = 1;
    if (fault == NSA_FAULT_NAN_GRAD) m->fault_nan_grad = 1;
    return 0;
}

int nsaModelInjectFault(NsaModel *m, NsaFault fault, NsaError *err) {
    if (!m) return nsaErrorf(err, "nsa: no model (NULL)");
    if (fault < NSA_FAULT_NONE || fault > NSA_FAULT_NAN_GRAD)
        return nsaErrorf(err,
                          "nsa: fault = %d is unknown; allowed: 0 (none), 1 (nan_loss), "
                          "2 (nan_grad)",
                          (int)fault);
    return m->engine->inject_fault(m, fault, err);
}

static int cpuMemoryReport(const NsaModel *m, NsaMemoryReport *out) {
    memset(out, 0, sizeof(*out));
    const size_t arena = m->layout.total * m->cpu.real_size;
    out->params = arena;
    out->grads = arena;
    out->optimizer = 2 * m->cpu.state_elems * m->cpu.real_size;
    out->activations = nsaCpuModelActivationBytes(&m->cpu);
    out->workspace = nsaCpuModelWorkspaceBytes(&m->cpu);
    out->total = out->params + out->grads + out->optimizer + out->activations + out->workspace;
    return 0;
}

int nsaModelMemoryReport(const NsaModel *m, NsaMemoryReport *out) {
    if (!m || !out) return -1;
    return m->engine->memory_report(m, out);
}

static const NsaEngineOps cpuEngine = {
    .init = cpuInit,
    .get_tensor = cpuGetTensor,
    .set_tensor = cpuSetTensor,
    .gather_pieces = cpuGatherPieces,
    .exchange = cpuExchange,
    .broadcast_host = cpuBroadcastHost,
    .zero_grad = cpuZeroGrad,
    .forward = cpuForward,
    .backward = cpuBackward,
    .optimizer_step = cpuOptimizerStep,
    .comm_stats = cpuCommStats,
    .step_stats = cpuStepStats,
    .eval_loss = cpuEvalLoss,
    .inject_fault = cpuInjectFault,
    .memory_report = cpuMemoryReport,
};

#ifdef NSA_HAVE_CUDA
/* The CUDA engine's operations: each forwards to cuda_engine.h unchanged
 * (dst/buf are host memory; NCCL needs device buffers, so the CUDA engine
 * stages the gathered pieces and broadcasts itself). */
static int cudaInit(NsaModel *m, uint64_t seed, NsaError *err) {
    return nsaCudaModelInit(m->cuda, seed, err);
}
static int cudaGetTensor(NsaModel *m, NsaArena arena, int i, float *dst, NsaError *err) {
    return nsaCudaModelGetTensor(m->cuda, arena, i, dst, err);
}
static int cudaSetTensor(NsaModel *m, NsaArena arena, int i, const float *src, NsaError *err) {
    return nsaCudaModelSetTensor(m->cuda, arena, i, src, err);
}
static int cudaGatherPieces(NsaModel *m, NsaArena arena, int i, float *dst, const char *what,
                            NsaError *err) {
    return nsaCudaModelGatherPieces(m->cuda, arena, i, dst, what, err);
}
static int cudaExchange(NsaModel *m, void *buf, size_t bytes, NsaError *err) {
    return nsaCudaModelExchange(m->cuda, buf, bytes, err);
}
static int cudaBroadcastHost(NsaModel *m, void *buf, size_t bytes, int root, const char *what,
                             NsaError *err) {
    return nsaCudaModelBroadcastHost(m->cuda, buf, bytes, root, what, err);
}
static int cudaZeroGrad(NsaModel *m, NsaError *err) { return nsaCudaModelZeroGrad(m->cuda, err); }
static int cudaForward(NsaModel *m, const int32_t *tokens, const int32_t *targets, int B, int S,
                       float grad_scale, NsaError *err) {
    return nsaCudaModelForward(m->cuda, tokens, targets, B, S, grad_scale, err);
}
static int cudaBackward(NsaModel *m, int reduce, NsaError *err) {
    return reduce ? nsaCudaModelBackwardReduce(m->cuda, err) : nsaCudaModelBackward(m->cuda, err);
}
static int cudaOptimizerStep(NsaModel *m, const NsaOptimConfig *oc, int64_t step, NsaError *err) {
    return nsaCudaModelOptimizerStep(m->cuda, oc, step, err);
}
static int cudaCommStats(NsaModel *m, NsaCommStats *out, NsaError *err) {
    return nsaCudaModelCommStats(m->cuda, out, err);
}
static int cudaStepStats(NsaModel *m, NsaStepStats *out, NsaError *err) {
    return nsaCudaModelStepStats(m->cuda, out, err);
}
static int cudaEvalLoss(NsaModel *m, const int32_t *tokens, const int32_t *targets, int B, int S,
                        double *loss, NsaError *err) {
    return nsaCudaModelEvalLoss(m->cuda, tokens, targets, B, S, loss, err);
}
static int cudaInjectFault(NsaModel *m, NsaFault fault, NsaError *err) {
    return nsaCudaModelInjectFault(m->cuda, fault, err);
}
static int cudaMemoryReport(const NsaModel *m, NsaMemoryReport *out) {
    return nsaCudaModelMemoryReport(m->cuda, out);
}

static const NsaEngineOps cudaEngine = {
    .init = cudaInit,
    .get_tensor = cudaGetTensor,
    .set_tensor = cudaSetTensor,
    .gather_pieces = cudaGatherPieces,
    .exchange = cudaExchange,
    .broadcast_host = cudaBroadcastHost,
    .zero_grad = cudaZeroGrad,
    .forward = cudaForward,
    .backward = cudaBackward,
    .optimizer_step = cudaOptimizerStep,
    .comm_stats = cudaCommStats,
    .step_stats = cudaStepStats,
    .eval_loss = cudaEvalLoss,
    .inject_fault = cudaInjectFault,
    .memory_report = cudaMemoryReport,
};
#endif

/* The engine of a device: NULL for CUDA in a build without it (the caller
 * says so), never a silent CPU run. */
static const NsaEngineOps *engineFor(NsaDevice device) {
    if (device == NSA_DEVICE_CPU) return &cpuEngine;
#ifdef NSA_HAVE_CUDA
    if (device == NSA_DEVICE_CUDA) return &cudaEngine;
#endif
    return NULL;
}

int nsaModelMemoryPlan(const NsaModelConfig *cfg, const NsaEngineOptions *opt, int world,
                       NsaMemoryReport *out, int *max_batch_fits, NsaError *err) {
    if (!cfg || !opt || !out)
        return nsaErrorf(err, "nsa: nsaModelMemoryPlan needs a config, options and a report (got NULL)");
    memset(out, 0, sizeof *out);
    if (max_batch_fits) *max_batch_fits = 0;
    if (opt->device != NSA_DEVICE_CUDA)
        return nsaErrorf(err, "nsa: memory plans are made for the CUDA engine only (device = %d)",
                         (int)opt->device);
    if (nsaModelConfigValidate(cfg, err)) return -1;
#ifdef NSA_HAVE_CUDA
    NsaCudaMemoryPlan plan;
    if (nsaCudaMemoryPlanRanks(cfg, opt, world, &plan, err) != 0) return -1;
    out->params = plan.params;
    out->grads = plan.grads;
    out->optimizer = plan.optimizer;
    out->activations = plan.activations;
    out->workspace = plan.workspace;
    out->total = plan.total;
    out->device_free = plan.device_free;
    out->device_total = plan.device_total;
    snprintf(out->attention_path, sizeof out->attention_path, "%s", plan.attention_path);
    if (max_batch_fits) *max_batch_fits = plan.max_batch_that_fits;
    return 0;
#else
    return nsaErrorf(err, "nsa: this libnsa was built without CUDA: no CUDA memory plan");
#endif
}

int nsaDeviceProbe(NsaDeviceInfo *out, NsaError *err) {
    if (!out) return nsaErrorf(err, "nsa: device info pointer is NULL");
    memset(out, 0, sizeof *out);
#ifdef NSA_HAVE_CUDA
    out->cuda_built = 1;
    if (nsaCudaDeviceCount(&out->cuda_devices, err) != 0) return -1;
    if (out->cuda_devices == 0) {
        snprintf(out->description, sizeof out->description,
                 "no CUDA device (no NVIDIA driver or GPU): the CPU engine runs");
        return 0;
    }
    size_t used = (size_t)snprintf(out->description, sizeof out->description, "%d CUDA device%s:",
                                   out->cuda_devices, out->cuda_devices == 1 ? "" : "s");
    for (int i = 0; i < out->cuda_devices && used < sizeof out->description; i++) {
        char name[256];
        size_t bytes = 0;
        if (nsaCudaDeviceDescribe(i, name, sizeof name, &bytes, err) != 0) return -1;
        used += (size_t)snprintf(out->description + used, sizeof out->description - used,
                                 "%s %d: %s, %.1f GiB", i ? ";" : "", i, name,
                                 (double)bytes / (1024.0 * 1024.0 * 1024.0));
    }
#else
    snprintf(out->description, sizeof out->description,
             "this libnsa was built without CUDA: the CPU engine runs");
#endif
    return 0;
}

int nsaDeviceName(int ordinal, char *name, size_t cap, NsaError *err) {
    if (!name || cap == 0) return nsaErrorf(err, "nsa: device name buffer is NULL or empty");
    name[0] = '\0';
#ifdef NSA_HAVE_CUDA
    int count = 0;
    if (nsaCudaDeviceCount(&count, err) != 0) return -1;
    if (count == 0) return nsaErrorf(err, "nsa: no CUDA device (no NVIDIA driver or GPU)");
    if (ordinal < 0 || ordinal >= count)
        return nsaErrorf(err, "nsa: no CUDA device %d; allowed: 0 to %d", ordinal, count - 1);
    size_t bytes = 0;
    return nsaCudaDeviceDescribe(ordinal, name, cap, &bytes, err);
#else
    (void)ordinal;
    return nsaErrorf(err, "nsa: this libnsa was built without CUDA: no CUDA device names");
#endif
}
