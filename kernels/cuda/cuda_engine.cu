/* cuda_engine.cu - the CUDA training engine: arenas, the model's forward and
 * backward as a sequence of kernels and cuBLASLt GEMMs, the optimizer step
 * and the host-facing API of cuda_engine.h.
 *
 * Memory is planned once (planActivations and planScratch walk the same
 * layout through a Carver twice: counting, then handing out pointers):
 * parameters, gradients, Adam m and v (the shared
 * layout, fp32), the bf16/fp16 weight copy the GEMMs read, saved
 * activations for max_batch x max_seq_len, backward scratch shared by all
 * layers, the cuBLASLt workspace, one fast-attention plan per layer, and
 * pinned host staging for the token ids. A step enqueues work on one stream
 * and never allocates or waits, except that re-using a pinned staging slot
 * waits for the copy made from it two Forwards ago (a bounded queue, not a
 * sync).
 *
 * Precision. Every tensor a GEMM reads is stored in the operand type
 * (m->op: fp32 in f32 mode, bf16 / fp16 otherwise): the producers write it
 * directly - RMSNorm, the MLP activation and its backward, the attention
 * inputs' gradients, the residual gradient's copy made by the RMSNorm
 * backward that updates it - and only the logits' gradient is converted.
 * Activations that only a 16-bit consumer reads leave their GEMM in the
 * operand type too: the MLP's pre-activation and its gradient, the fused
 * attention projection, the attention output's gradient (bf16 mode).
 * Residual stream, norms statistics, the loss and the optimizer stay fp32.
 * In f32 mode every buffer is fp32 and nothing is converted.
 *
 * On the fast attention path a layer's eight attention projections (q, the
 * three k, the three v, the gate logits) are one GEMM: their weights are
 * consecutive in the layout, so they form one [width][C] matrix, and one
 * kernel (attn_inputs.cu) turns the [N][width] product into the op's
 * inputs; the backward mirrors it (one kernel, one dX and one dW GEMM).
 *
 * Data parallelism (the communication stream, gradient buckets, the
 * weights' all-gather, the collectives the daemon asks for) is in
 * cuda_engine_dp.cu; the state both files share is in
 * cuda_engine_internal.h. */
#include "cuda_engine_internal.h"

#include <stdlib.h>
#include <string.h>

#define GEMM_WORKSPACE_BYTES ((size_t)32 << 20)
#define FP16_INITIAL_SCALE 65536.0f
#define FP16_SCALE_WINDOW 1000


/* ---- attention path ------------------------------------------------------ */

/* The fast attention op's dims for B sequences of S tokens of model cfg:
 * what the engine plans each layer for, and what its memory plan measures. */
static NsaAttnDims attnDimsFor(const NsaModelConfig *cfg, int B, int S) {
    const NsaAttnDims d = {B, S, cfg->n_heads, cfg->n_kv_groups, cfg->d_k, cfg->d_v,
                           cfg->cmp_len, cfg->cmp_stride, cfg->sel_len, cfg->n_sel, cfg->window};
    return d;
}

/* Decides which attention kernels a model run with opt runs and writes the
 * reason into why. Returns 1 for the fast bf16 op, 0 for the fp32 reference
 * kernels. The fast op's limits are its own (nsaAttnCudaSupports, asked at
 * the largest dims the model plans for), so that a shape it refuses is a
 * reported choice, never a failed model: the reason reaches
 * nsaCudaModelAttentionPath, the memory plan and MemoryReport. */
static int chooseAttention(const NsaModelConfig *c, const NsaEngineOptions *opt, char *why,
                           size_t len) {
    const char *ref = "reference: fp32 CUDA-core NSA kernels (kernels/cuda/attn_ref/)";
    if (opt->precision == NSA_PREC_F32) {
        snprintf(why, len, "%s, because precision f32 is the exact check mode", ref);
        return 0;
    }
    if (c->phi == NSA_PHI_MLP) {
        snprintf(why, len, "%s, because phi = mlp pools k_cmp/v_cmp with a learned MLP and the "
                           "fast bf16 op pools with avg internally", ref);
        return 0;
    }
    const NsaAttnDims max_dims = attnDimsFor(c, opt->max_batch, opt->max_seq_len);
    NsaError refused;
    if (nsaAttnCudaSupports(&max_dims, &refused)) {
        snprintf(why, len, "%s, because the fast bf16 op does not take this shape (%s)", ref,
                 refused.message);
        return 0;
    }
    snprintf(why, len, "fast: bf16 tensor-core NSA op (nsaAttnForwardCuda, kernels/cuda/fast_attn/), "
                       "one plan per layer");
    return 1;
}

static EngineMode engineMode(const NsaModelConfig *c, const NsaEngineOptions *opt, char *why,
                             size_t len) {
    EngineMode e;
    e.low = opt->precision != NSA_PREC_F32;
    e.op = opt->precision == NSA_PREC_BF16   ? DTYPE_BF16
           : opt->precision == NSA_PREC_FP16 ? DTYPE_F16
                                             : DTYPE_F32;
    e.fast = chooseAttention(c, opt, why, len);
    return e;
}

/* ---- planning ----------------------------------------------------------- */

/* Hands out consecutive pieces of one arena; with base == NULL it only
 * counts. Every piece starts on a 64-float (256-byte) boundary. */
typedef struct Carver {
    float *base;
    size_t used;
} Carver;

static float *carve(Carver *cv, size_t floats) {
    size_t at = cv->used;
    cv->used += (floats + 63) / 64 * 64;
    return cv->base ? cv->base + at : NULL;
}

static void *carveTyped(Carver *cv, size_t n, DType t) {
    return carve(cv, (n * dtypeBytes(t) + 3) / 4);
}

static int cmpBlocks(const NsaModelConfig *c, int S) {
    return nsaNumCmpBlocks(S, c->cmp_len, c->cmp_stride);
}

/* Activations for B sequences of S tokens. layers may be NULL (sizing). */
static size_t planActivations(const NsaModelConfig *c, EngineMode e, int F, int B, int S,
                              float *base, LayerActs *layers, float **final_res, void **final_xn,
                              float **final_rstd, float **logits) {
    Carver cv = {base, 0};
    const size_t N = (size_t)B * S;
    const int H = c->n_heads, G = c->n_kv_groups, dk = c->d_k, dv = c->d_v, C = c->dim;
    const size_t Nc = (size_t)cmpBlocks(c, S);
    const int slots = nsaNumSelSlots(c->n_sel);
    LayerActs shared;
    for (int i = 0; i < c->n_layers; i++) {
        LayerActs a;
        memset(&a, 0, sizeof(a));
        if (e.recompute == NSA_RECOMPUTE_LAYER && i > 0) { /* layer 0's buffers, its own residual */
            a = shared;
            a.res = carve(&cv, N * C);
            if (layers) layers[i] = a;
            continue;
        }
        /* selective: the outputs made again in the backward live in layer 0's */
        const int remade = e.recompute == NSA_RECOMPUTE_SELECTIVE && i > 0;
        a.res = carve(&cv, N * C);
        a.xn = remade ? shared.xn : carveTyped(&cv, N * C, e.op);
        a.rstd = carve(&cv, N);
        if (e.fast) {
            a.qb = carveTyped(&cv, N * H * dk, DTYPE_BF16);
            for (int b = 0; b < 3; b++) {
                a.kb[b] = carveTyped(&cv, N * G * dk, DTYPE_BF16);
                a.vb[b] = carveTyped(&cv, N * G * dv, DTYPE_BF16);
            }
            a.gb = carveTyped(&cv, N * H * 3, DTYPE_BF16);
        } else {
            a.q = carve(&cv, N * H * dk);
            for (int b = 0; b < 3; b++) {
                a.k[b] = carve(&cv, N * G * dk);
                a.v[b] = carve(&cv, N * G * dv);
            }
            a.kc = carve(&cv, (size_t)B * Nc * G * dk);
            a.vc = carve(&cv, (size_t)B * Nc * G * dv);
            if (c->phi == NSA_PHI_MLP) {
                a.hk = carve(&cv, (size_t)B * Nc * G * dk);
                a.hv = carve(&cv, (size_t)B * Nc * G * dv);
            }
            for (int b = 0; b < 3; b++) {
                a.o[b] = carve(&cv, N * H * dv);
                a.lse[b] = carve(&cv, N * H);
            }
            a.sel = (int32_t *)carve(&cv, N * G * slots);
            a.y = carve(&cv, N * H * dv);
        }
        a.gates = carve(&cv, N * H * 3);
        a.y_op = e.low ? carveTyped(&cv, N * H * dv, e.op) : (void *)a.y;
        a.mid = carve(&cv, N * C);
        a.mxn = remade ? shared.mxn : carveTyped(&cv, N * C, e.op);
        a.mrstd = carve(&cv, N);
        a.fc = carveTyped(&cv, N * F, e.op);
        a.up = c->mlp == NSA_MLP_SWIGLU ? carveTyped(&cv, N * F, e.op) : NULL;
        a.act = remade ? shared.act : carveTyped(&cv, N * F, e.op);
        if (layers) layers[i] = a;
        if (i == 0) shared = a;
    }
    float *fr = carve(&cv, N * C), *fs = carve(&cv, N);
    void *fx = carveTyped(&cv, N * C, e.op);
    float *lg = carve(&cv, N * (size_t)c->vocab_size);
    if (final_res) { *final_res = fr; *final_xn = fx; *final_rstd = fs; *logits = lg; }
    return cv.used;
}

static size_t maxOf(size_t a, size_t b) { return a > b ? a : b; }

/* Backward scratch (shared by the layers), plus the RoPE table. */
static size_t planScratch(const NsaModelConfig *c, EngineMode e, int F, int B, int S,
                          size_t max_chunks, float *base, Scratch *sc, float **rope) {
    Carver cv = {base, 0};
    Scratch s;
    memset(&s, 0, sizeof(s));
    const size_t N = (size_t)B * S;
    const int H = c->n_heads, G = c->n_kv_groups, dk = c->d_k, dv = c->d_v, C = c->dim;
    const size_t Nc = (size_t)cmpBlocks(c, S);
    s.dres = carve(&cv, N * C);
    s.dxn = carve(&cv, N * C);
    if (!e.fast) {
        s.dq = carve(&cv, N * H * dk);
        for (int b = 0; b < 3; b++) {
            s.dk[b] = carve(&cv, N * G * dk);
            s.dv[b] = carve(&cv, N * G * dv);
        }
        for (int b = 0; b < 3; b++) {
            s.d_o[b] = carve(&cv, N * H * dv);
            s.delta[b] = carve(&cv, N * H);
        }
        s.dkc = carve(&cv, (size_t)B * Nc * G * dk);
        s.dvc = carve(&cv, (size_t)B * Nc * G * dv);
        s.dgates = carve(&cv, N * H * 3);
    }
    if (c->phi == NSA_PHI_MLP) {
        /* one set for phi_k and phi_v, every layer: sized for the wider */
        const size_t NB = poolMlpBlocks(B, S, G, c->cmp_len, c->cmp_stride);
        const size_t width = maxOf((size_t)dk, (size_t)dv), in_len = (size_t)c->cmp_len * width;
        s.pool.u = carveTyped(&cv, NB * in_len, e.op);
        s.pool.act = carveTyped(&cv, NB * width, e.op);
        s.pool.dp = e.low ? carveTyped(&cv, NB * width, e.op) : NULL;
        s.pool.dact = carve(&cv, NB * width);
        s.pool.dh = carveTyped(&cv, NB * width, e.op);
        s.pool.du = carve(&cv, NB * in_len);
        s.pool.partial = carve(&cv, (NB + POOL_MLP_CHUNK - 1) / POOL_MLP_CHUNK * width);
        s.pool.dh_sum = carve(&cv, width);
    }
    s.dy = carve(&cv, N * H * dv);
    s.dfc = carveTyped(&cv, N * F, e.op);
    s.dup = c->mlp == NSA_MLP_SWIGLU ? carveTyped(&cv, N * F, e.op) : NULL;
    s.dact = carveTyped(&cv, N * F, e.op);
    if (e.low) {
        s.op_a = carveTyped(&cv, N * maxOf((size_t)C, (size_t)c->vocab_size), e.op);
        size_t widest = maxOf(maxOf((size_t)H * dk, (size_t)G * dk),
                              maxOf((size_t)G * dv, (size_t)3 * H));
        if (!e.fast) s.op_b = carveTyped(&cv, N * widest, e.op);
    }
    if (e.fast) {
        s.proj = carveTyped(&cv, N * (size_t)attnInputsStride(H, G, dk, dv), e.op);
        s.dyb = carveTyped(&cv, N * H * dv, DTYPE_BF16);
        s.dqb = carveTyped(&cv, N * H * dk, DTYPE_BF16);
        for (int b = 0; b < 3; b++) {
            s.dkb[b] = carveTyped(&cv, N * G * dk, DTYPE_BF16);
            s.dvb[b] = carveTyped(&cv, N * G * dv, DTYPE_BF16);
        }
        s.dgb = carveTyped(&cv, N * H * 3, DTYPE_BF16);
    }
    s.row_loss = carve(&cv, N);
    s.rms_partial = carve(&cv, rmsnormPartialFloats(N, C));
    s.emb_partial = carve(&cv, max_chunks * C);
    s.norm_partial = (double *)carve(&cv, 2 * NORM_BLOCKS);
    float *r = carve(&cv, (size_t)S * (c->d_k / 2) * 2);
    if (sc) *sc = s;
    if (rope) *rope = r;
    return cv.used;
}

/* Int32 ids region: tokens, targets, order [N], chunk_start [chunks+1],
 * chunk_token [chunks], token_chunk [V+1]. */
static size_t planIds(size_t N, size_t max_chunks, int V, int32_t *base, BatchIds *ids) {
    size_t at = 0;
    BatchIds b;
#define TAKE_IDS(field, n) do { b.field = base ? base + at : NULL; at += (n); } while (0)
    TAKE_IDS(tokens, N);
    TAKE_IDS(targets, N);
    TAKE_IDS(order, N);
    TAKE_IDS(chunk_start, max_chunks + 1);
    TAKE_IDS(chunk_token, max_chunks);
    TAKE_IDS(token_chunk, (size_t)V + 1);
#undef TAKE_IDS
    if (ids) *ids = b;
    return at;
}

static int checkOptions(const NsaModelConfig *cfg, const NsaEngineOptions *opt, NsaError *err) {
    if (!cfg || !opt) return nsaErrorf(err, "cuda: config and options are required (NULL given)");
    if (opt->comm && !nsaCommIsNccl(opt->comm))
        return nsaErrorf(err,
                         "cuda: the CUDA engine's data parallelism runs on NCCL; the "
                         "transport given is %s",
                         nsaCommKind(opt->comm));
    if (nsaModelConfigValidate(cfg, err)) return -1;
    if (opt->precision != NSA_PREC_F32 && opt->precision != NSA_PREC_BF16 &&
        opt->precision != NSA_PREC_FP16)
        return nsaErrorf(err,
                         "cuda: precision = %d is not available on the CUDA engine; allowed: "
                         "%d (f32), %d (bf16), %d (fp16)",
                         (int)opt->precision, NSA_PREC_F32, NSA_PREC_BF16, NSA_PREC_FP16);
    if (opt->recompute < NSA_RECOMPUTE_NONE || opt->recompute > NSA_RECOMPUTE_SELECTIVE)
        return nsaErrorf(
            err, "cuda: recompute = %d; allowed: %d (none), %d (layer), %d (selective)",
            opt->recompute, NSA_RECOMPUTE_NONE, NSA_RECOMPUTE_LAYER, NSA_RECOMPUTE_SELECTIVE);
    if (opt->max_batch < 1)
        return nsaErrorf(err, "cuda: max_batch = %d; allowed: 1 or more", opt->max_batch);
    if (opt->max_seq_len < 1)
        return nsaErrorf(err, "cuda: max_seq_len = %d; allowed: 1 or more", opt->max_seq_len);
    if ((size_t)opt->max_batch * (size_t)opt->max_seq_len > (size_t)1 << 30)
        return nsaErrorf(err, "cuda: max_batch x max_seq_len = %zu tokens; allowed: up to 2^30",
                         (size_t)opt->max_batch * (size_t)opt->max_seq_len);
    char why[256];
    const int fast = chooseAttention(cfg, opt, why, sizeof(why));
    if (!fast && (cfg->d_k > NSA_CUDA_ATTN_MAX_DIM || cfg->d_v > NSA_CUDA_ATTN_MAX_DIM))
        return nsaErrorf(err,
                         "cuda: d_k = %d, d_v = %d; allowed: up to %d each on the reference "
                         "attention kernels (%s)",
                         cfg->d_k, cfg->d_v, NSA_CUDA_ATTN_MAX_DIM,
                         opt->precision == NSA_PREC_F32 ? "precision f32"
                         : cfg->phi == NSA_PHI_MLP      ? "phi = mlp"
                                                        : "the fast op does not take this shape");
    return 0;
}

int nsaCudaDeviceCount(int *count, NsaError *err) {
    if (!count) return nsaErrorf(err, "cuda: count pointer is NULL");
    cudaError_t e = cudaGetDeviceCount(count);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        cudaGetLastError();
        *count = 0;
        return 0;
    }
    CUDA_CHECK(e, err);
    return 0;
}

int nsaCudaDeviceDescribe(int ordinal, char *name, size_t cap, size_t *total_bytes, NsaError *err) {
    if (!name || cap == 0) return nsaErrorf(err, "cuda: name buffer is NULL or empty");
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal), err);
    snprintf(name, cap, "%s (sm_%d%d, %d SMs)", prop.name, prop.major, prop.minor,
             prop.multiProcessorCount);
    if (total_bytes) *total_bytes = prop.totalGlobalMem;
    return 0;
}


int nsaCudaMemoryPlanFor(const NsaModelConfig *cfg, const NsaEngineOptions *opt,
                         NsaCudaMemoryPlan *plan, NsaError *err) {
    return nsaCudaMemoryPlanRanks(cfg, opt, opt ? nsaCommWorld(opt->comm) : 1, plan, err);
}

int nsaCudaMemoryPlanRanks(const NsaModelConfig *cfg, const NsaEngineOptions *opt, int world,
                           NsaCudaMemoryPlan *plan, NsaError *err) {
    if (!plan) return nsaErrorf(err, "cuda: plan pointer is NULL");
    if (checkOptions(cfg, opt, err)) return -1;
    if (world < 1 || (opt->comm && world != nsaCommWorld(opt->comm)))
        return nsaErrorf(err,
                         "cuda: a plan for %d ranks; allowed: 1 or more (the transport's %d when "
                         "one is given)",
                         world, nsaCommWorld(opt->comm));
    memset(plan, 0, sizeof(*plan));
    EngineMode e = engineMode(cfg, opt, plan->attention_path,
                              sizeof(plan->attention_path));
    e.recompute = opt->recompute;
    NsaLayout lay;
    if (nsaLayoutBuildRanks(&lay, cfg, world, err)) return -1;
    const size_t arena_bytes = lay.total * sizeof(float);
    const size_t low_bytes = e.low ? lay.total * dtypeBytes(e.op) : 0;
    const size_t optim_table = sizeof(OptimState) + (size_t)lay.n_tensors * sizeof(OptimTensor);
    /* ZeRO-1: each rank holds the moments of 1/world of the arena */
    const size_t state_bytes = lay.total / (size_t)world * sizeof(float);
    /* dpCreate's buffers: the norm's partial sums (at most one range per
     * bucket), the ranks' loss and norm, the gather staging (the largest
     * tensor) */
    size_t max_numel = 0;
    for (int i = 0; i < lay.n_tensors; i++)
        if (lay.entries[i].info.numel > max_numel) max_numel = lay.entries[i].info.numel;
    const size_t dp_bytes = world > 1 ? (size_t)lay.n_buckets * NORM_BLOCKS * sizeof(double) +
                                            (size_t)world * 2 * sizeof(double) + max_numel * sizeof(float)
                                      : 0;
    nsaLayoutFree(&lay);
    const int F = nsaLayoutMlpHidden(cfg);
    const int B = opt->max_batch, S = opt->max_seq_len;
    const size_t N = (size_t)B * S;
    const size_t chunks = embeddingMaxChunks(N, cfg->vocab_size);
    plan->params = arena_bytes + low_bytes;
    plan->grads = arena_bytes;
    plan->optimizer = 2 * state_bytes;
    plan->activations =
        planActivations(cfg, e, F, B, S, NULL, NULL, NULL, NULL, NULL, NULL) * sizeof(float);
    plan->activations_per_sequence =
        planActivations(cfg, e, F, 1, S, NULL, NULL, NULL, NULL, NULL, NULL) * sizeof(float);
    size_t scratch1 = planScratch(cfg, e, F, 1, S, embeddingMaxChunks(S, cfg->vocab_size), NULL,
                                  NULL, NULL) * sizeof(float);
    CUDA_CHECK(cudaSetDevice(opt->device_ordinal), err);
    /* the fast attention op's plans, as nsaCudaModelCreate makes them: one
     * per layer with its own state, all sharing the first one's scratch */
    size_t attn = 0, attn1 = 0;
    if (e.fast) {
        for (int pass = 0; pass < 2; pass++) { /* max_batch, then one sequence */
            const NsaAttnDims d = attnDimsFor(cfg, pass ? 1 : B, S);
            size_t state = 0, scratch = 0;
            NsaError aerr = {{0}};
            if (nsaAttnCudaPlanMeasure(&d, NULL, &state, &scratch, &aerr))
                return nsaErrorf(err, "cuda: the fast attention op refused the plan (%s)",
                                 aerr.message);
            const size_t plans = e.recompute == NSA_RECOMPUTE_LAYER ? 1 : (size_t)cfg->n_layers;
            *(pass ? &attn1 : &attn) = state * plans + scratch;
        }
    }
    plan->workspace = planScratch(cfg, e, F, B, S, chunks, NULL, NULL, NULL) * sizeof(float) +
                      GEMM_WORKSPACE_BYTES + attn +
                      planIds(N, chunks, cfg->vocab_size, NULL, NULL) * sizeof(int32_t) +
                      optim_table + dp_bytes;
    plan->total = plan->params + plan->grads + plan->optimizer + plan->activations +
                  plan->workspace;
    CUDA_CHECK(cudaMemGetInfo(&plan->device_free, &plan->device_total), err);
    /* what one more sequence costs: its activations, its scratch and its
     * share of the attention plans (measured at one sequence: their chunk
     * buffers do not grow linearly in B, so this is an estimate) */
    size_t fixed = plan->params + plan->grads + plan->optimizer + GEMM_WORKSPACE_BYTES + dp_bytes;
    size_t per_seq = plan->activations_per_sequence + scratch1 + attn1;
    size_t margin = (size_t)512 << 20;   /* CUDA context, cuBLAS internals */
    if (plan->device_free > fixed + margin)
        plan->max_batch_that_fits = (int)((plan->device_free - fixed - margin) / per_seq);
    return 0;
}

/* ---- streams and waits ---------------------------------------------------- */

/* Elements of an arena: the moments hold this rank's shard only. */
static size_t arenaElements(const NsaCudaModel *m, NsaArena arena) {
    return arena == NSA_ARENA_ADAM_M || arena == NSA_ARENA_ADAM_V ? m->dp.shard.total
                                                                  : m->lay.total;
}

/* cuda_engine_internal.h says what it does. */
int engineWaitEvent(NsaCudaModel *m, cudaEvent_t ev, const char *what, NsaError *err) {
    if (m->dp.comm) return nsaCommNcclWaitEvent(m->dp.comm, (void *)ev, what, err);
    CUDA_CHECK(cudaEventSynchronize(ev), err);
    return 0;
}

/* Waits for everything enqueued on the compute stream (see engineWaitEvent).
 * A data-parallel model also calls it before a copy between the device and
 * pageable host memory: such a copy blocks the host until the stream's
 * earlier work is done, and that work may wait for a dead peer. */
static int syncStream(NsaCudaModel *m, const char *what, NsaError *err) {
    if (!m->dp.comm) {
        CUDA_CHECK(cudaStreamSynchronize(m->stream), err);
        return 0;
    }
    CUDA_CHECK(cudaEventRecord(m->dp.sync, m->stream), err);
    return engineWaitEvent(m, m->dp.sync, what, err);
}

/* cuda_engine_internal.h says what it does. */
int engineStreamHop(cudaStream_t from, cudaStream_t to, cudaEvent_t ev, NsaError *err) {
    CUDA_CHECK(cudaEventRecord(ev, from), err);
    CUDA_CHECK(cudaStreamWaitEvent(to, ev, 0), err);
    return 0;
}

/* The compute stream waits for the all-gathered weights of bucket b (the
 * last one: of every bucket, the communication stream being in order). */
static int waitWeights(NsaCudaModel *m, int b, NsaError *err) {
    if (m->dp.comm) CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->dp.weights_ready[b], 0), err);
    return 0;
}

static int waitAllWeights(NsaCudaModel *m, NsaError *err) {
    return waitWeights(m, m->lay.n_buckets - 1, err);
}

/* Bucket b's gradients are complete on the compute stream. The NaN fault
 * lands in the head's bucket first (so it reaches whichever rank holds the
 * element); in a reducing backward the communication stream then
 * reduce-scatters the bucket while the compute stream goes on. */
static int bucketReady(NsaCudaModel *m, int b, NsaError *err) {
    if (b == NSA_BUCKET_HEAD(m->cfg.n_layers) && m->fault_nan_grad) {
        const NsaTensorInfo *last = &m->lay.entries[m->lay.n_tensors - 1].info;
        TRY(poisonFloat(m->arena[NSA_ARENA_GRADS] + last->offset, m->stream, err));
        m->fault_nan_grad = 0;
    }
    if (!m->dp.comm || !m->dp.reducing) return 0;
    if (b == NSA_BUCKET_EMBED) CUDA_CHECK(cudaEventRecord(m->dp.t_backward_end, m->stream), err);
    TRY(engineStreamHop(m->stream, m->dp.stream, m->dp.bucket_ready[b], err));
    return dpReduceBucket(m, b, err);
}

/* ---- create / free ------------------------------------------------------ */

void nsaCudaModelFree(NsaCudaModel *m) {
    if (!m) return;
    dpFree(m); /* waits for both streams (within the deadline) first */
    /* teardown cannot report: a failed wait (a device already lost) must
     * not stop the frees below */
    if (m->have_stream) (void)cudaStreamSynchronize(m->stream);
    gemmContextDestroy(&m->gemm);
    if (m->attn_plans)
        for (int i = m->n_attn_plans - 1; i >= 0; i--) /* plan 0, the scratch owner, last */
            nsaAttnCudaPlanFree(m->attn_plans[i]);
    free(m->attn_plans);
    cudaFree(m->weights_low);
    for (int a = 0; a < 4; a++) cudaFree(m->arena[a]);
    cudaFree(m->acts);
    cudaFree(m->scratch_mem);
    cudaFree(m->tensors);
    cudaFree(m->state);
    cudaFree(m->eval_loss);
    cudaFree(m->ids_device);
    cudaFreeHost(m->host_state);
    cudaFreeHost(m->host_eval_loss);
    for (int s = 0; s < STAGING_SLOTS; s++) {
        cudaFreeHost(m->staging[s]);
        if (m->staged[s]) cudaEventDestroy(m->staged[s]);
    }
    if (m->step_done) cudaEventDestroy(m->step_done);
    if (m->have_stream) cudaStreamDestroy(m->stream);
    free(m->layers);
    free(m->host_count);
    nsaLayoutFree(&m->lay);
    free(m);
}

/* cuda_engine_internal.h says what it does. */
int engineAllocDevice(void **p, size_t bytes, const char *what, NsaError *err) {
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        *p = NULL;
        cudaGetLastError();
        return nsaErrorf(err, "cuda: out of device memory allocating %zu bytes for %s: %s", bytes,
                         what, cudaGetErrorString(e));
    }
    return 0;
}

static int allocPinned(void **p, size_t bytes, const char *what, NsaError *err) {
    cudaError_t e = cudaMallocHost(p, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        *p = NULL;
        cudaGetLastError();
        return nsaErrorf(err, "cuda: cannot allocate %zu bytes of pinned host memory for %s: %s",
                         bytes, what, cudaGetErrorString(e));
    }
    return 0;
}

static void trackPeak(NsaCudaModel *m) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && total_b - free_b > m->peak_used)
        m->peak_used = total_b - free_b;
}

/* The fast path reads each layer's eight attention projections as one
 * [stride][C] matrix from wq on (and adds their gradients as one): they must
 * follow each other in the layout with no padding between them, which the
 * layout gives whenever the fast op takes the dims (phi = avg, d_k a
 * multiple of 64), and w_gate must be followed by the layout's zero rows up
 * to attnInputsStride rows. Returns 0, or -1 with err naming the gap. */
static int checkFusedProjections(const NsaLayout *lay, const NsaModelConfig *c, NsaError *err) {
    const int width = attnInputsWidth(c->n_heads, c->n_kv_groups, c->d_k, c->d_v);
    const int stride = attnInputsStride(c->n_heads, c->n_kv_groups, c->d_k, c->d_v);
    for (int i = 0; i < lay->n_layers; i++) {
        const NsaLayerIndex *li = &lay->layers[i];
        const int order[8] = {li->wq,     li->wk_cmp, li->wv_cmp, li->wk_sel,
                              li->wv_sel, li->wk_win, li->wv_win, li->w_gate};
        for (int j = 1; j < 8; j++) {
            const NsaTensorInfo *prev = &lay->entries[order[j - 1]].info;
            const NsaTensorInfo *next = &lay->entries[order[j]].info;
            if (next->offset != prev->offset + prev->numel)
                return nsaErrorf(err,
                                 "cuda: %s does not follow %s in the parameter layout; the "
                                 "fused attention projection needs them adjacent",
                                 next->name, prev->name);
        }
        const NsaTensorInfo *gate = &lay->entries[li->w_gate].info;
        const size_t end = gate->offset + gate->numel + (size_t)(stride - width) * c->dim;
        const size_t next = li->w_gate + 1 < lay->n_tensors
                                ? lay->entries[li->w_gate + 1].info.offset : lay->total;
        if (end > next)
            return nsaErrorf(err,
                             "cuda: %s is not followed by %d zero rows in the parameter "
                             "layout; the fused attention projection reads them",
                             gate->name, stride - width);
    }
    return 0;
}

/* The four f32 arenas (parameters, gradients, Adam m and v) and, in bf16
 * or fp16, the weight copy the GEMMs read; counts their bytes. Returns 0,
 * or -1 with err (what was freed is left to nsaCudaModelFree). */
static int allocArenas(NsaCudaModel *m, NsaError *err) {
    const size_t arena_bytes = m->lay.total * sizeof(float);
    const char *arena_names[4] = {"parameters", "gradients", "Adam m", "Adam v"};
    /* zeroed once: the layout's padding stays zero in every arena and in the
     * weight copy (the fused projection's GEMMs read the padding rows) */
    for (int a = 0; a < 4; a++) {
        const size_t bytes = arenaElements(m, (NsaArena)a) * sizeof(float);
        if (engineAllocDevice((void **)&m->arena[a], bytes, arena_names[a], err)) return -1;
        CUDA_CHECK(cudaMemsetAsync(m->arena[a], 0, bytes, m->stream), err);
    }
    m->bytes_params = arena_bytes;
    if (m->mode.low) {
        const size_t low_bytes = m->lay.total * dtypeBytes(m->mode.op);
        if (engineAllocDevice(&m->weights_low, low_bytes, "the bf16/fp16 weight copy", err)) return -1;
        CUDA_CHECK(cudaMemsetAsync(m->weights_low, 0, low_bytes, m->stream), err);
        m->bytes_params += low_bytes;
    }
    m->bytes_grads = arena_bytes;
    m->bytes_optimizer = 2 * m->dp.shard.total * sizeof(float);
    return 0;
}

/* The activations the backward reads and the scratch it works in, both
 * planned for B sequences of S tokens. Returns 0, or -1 with err. */
static int allocActivations(NsaCudaModel *m, int B, int S, NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    m->layers = (LayerActs *)calloc((size_t)c->n_layers, sizeof(LayerActs));
    if (!m->layers) return nsaErrorf(err, "cuda: out of host memory for %d layers", c->n_layers);
    m->acts_floats = planActivations(c, m->mode, m->F, B, S, NULL, NULL, NULL, NULL, NULL, NULL);
    if (engineAllocDevice((void **)&m->acts, m->acts_floats * sizeof(float), "activations", err))
        return -1;
    planActivations(c, m->mode, m->F, B, S, m->acts, m->layers, &m->final_res, &m->final_xn,
                    &m->final_rstd, &m->logits);
    m->scratch_floats = planScratch(c, m->mode, m->F, B, S, m->max_chunks, NULL, NULL, NULL);
    if (engineAllocDevice((void **)&m->scratch_mem, m->scratch_floats * sizeof(float),
                          "backward scratch", err))
        return -1;
    planScratch(c, m->mode, m->F, B, S, m->max_chunks, m->scratch_mem, &m->sc, &m->rope);
    m->bytes_acts = m->acts_floats * sizeof(float);
    return 0;
}

/* One fast-attention plan per layer (none on the reference path): each
 * keeps what its layer's forward saves for the backward (pooled keys,
 * branch outputs, lse, the selection), so all L backward calls find their
 * own. The layers run one after another on one stream, so plans 1..L-1
 * borrow plan 0's per-call scratch instead of holding L copies; they are
 * freed first. With layer recompute a layer's forward state is made again
 * right before its backward, so one plan serves every layer. Adds their
 * bytes to *plan_bytes. Returns 0, or -1 with err. */
static int createAttnPlans(NsaCudaModel *m, int B, int S, size_t *plan_bytes, NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    if (m->mode.fast) {
        m->n_attn_plans = m->mode.recompute == NSA_RECOMPUTE_LAYER ? 1 : c->n_layers;
        m->attn_plans = (NsaAttnCudaPlan **)calloc((size_t)m->n_attn_plans, sizeof(*m->attn_plans));
        if (!m->attn_plans) return nsaErrorf(err, "cuda: out of host memory for attention plans");
        const NsaAttnDims max_dims = attnDimsFor(c, B, S);
        for (int i = 0; i < m->n_attn_plans; i++) {
            NsaError perr = {{0}};
            /* the default options: every design as fastSelDesign picks it */
            m->attn_plans[i] = i == 0 ? nsaAttnCudaPlanCreate(&max_dims, NULL, &perr)
                                      : nsaAttnCudaPlanCreateSharing(&max_dims, NULL,
                                                                     m->attn_plans[0], &perr);
            if (!m->attn_plans[i])
                return nsaErrorf(err, "cuda: layer %d's fast attention plan: %s", i, perr.message);
            *plan_bytes += nsaAttnCudaPlanBytes(m->attn_plans[i]);
        }
    }
    return 0;
}

/* The RoPE table, made once in double on the host and copied to m->rope.
 * Returns 0, or -1 with err. */
static int uploadRope(NsaCudaModel *m, int S, NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    const size_t rope_floats = (size_t)S * (c->d_k / 2) * 2;
    float *rope_host = (float *)malloc(rope_floats * sizeof(float));
    if (!rope_host) return nsaErrorf(err, "cuda: out of host memory for the RoPE table");
    ropeTableHost(rope_host, S, c->d_k, (double)c->rope_base);
    cudaError_t ce = cudaMemcpy(m->rope, rope_host, rope_floats * sizeof(float),
                                cudaMemcpyHostToDevice);
    free(rope_host);
    CUDA_CHECK(ce, err);
    return 0;
}

/* The optimizer's table on the device: this rank's shard pieces (alone:
 * every tensor, its moments at its own offset), and the largest tensor
 * and piece sizes. Returns 0, or -1 with err. */
static int buildOptimTable(NsaCudaModel *m, NsaError *err) {
    const NsaShard *sh = &m->dp.shard;
    m->n_optim = sh->n_pieces;
    OptimTensor *table = (OptimTensor *)calloc((size_t)sh->n_pieces + 1, sizeof(OptimTensor));
    if (!table) return nsaErrorf(err, "cuda: out of host memory for the tensor table");
    for (int p = 0; p < sh->n_pieces; p++) {
        table[p].offset = sh->pieces[p].offset;
        table[p].numel = sh->pieces[p].numel;
        table[p].state_offset = sh->pieces[p].local;
        table[p].decay = sh->pieces[p].weight_decay;
        if (sh->pieces[p].numel > m->optim_max_numel) m->optim_max_numel = sh->pieces[p].numel;
    }
    for (int i = 0; i < m->lay.n_tensors; i++)
        if (m->lay.entries[i].info.numel > m->max_numel) m->max_numel = m->lay.entries[i].info.numel;
    if (engineAllocDevice((void **)&m->tensors, ((size_t)sh->n_pieces + 1) * sizeof(OptimTensor),
                          "the tensor table", err)) {
        free(table);
        return -1;
    }
    const cudaError_t ce = cudaMemcpy(m->tensors, table,
                                      (size_t)sh->n_pieces * sizeof(OptimTensor),
                                      cudaMemcpyHostToDevice);
    free(table);
    CUDA_CHECK(ce, err);
    return 0;
}

/* What a step keeps between its phases: the optimizer's state and the eval
 * loss (device and pinned host copies), the token ids and their pinned
 * staging slots with their events, and the token counts. Returns 0, or -1
 * with err. */
static int allocStepState(NsaCudaModel *m, size_t N, NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    if (engineAllocDevice((void **)&m->state, sizeof(OptimState), "the optimizer state", err) ||
        engineAllocDevice((void **)&m->eval_loss, sizeof(double), "the eval loss", err) ||
        allocPinned((void **)&m->host_state, sizeof(OptimState), "step stats", err) ||
        allocPinned((void **)&m->host_eval_loss, sizeof(double), "the eval loss", err))
        return -1;
    m->ids_ints = planIds(N, m->max_chunks, c->vocab_size, NULL, NULL);
    if (engineAllocDevice((void **)&m->ids_device, m->ids_ints * sizeof(int32_t), "token ids", err))
        return -1;
    planIds(N, m->max_chunks, c->vocab_size, m->ids_device, &m->ids);
    for (int s = 0; s < STAGING_SLOTS; s++) {
        if (allocPinned((void **)&m->staging[s], m->ids_ints * sizeof(int32_t), "token staging",
                        err))
            return -1;
        CUDA_CHECK(cudaEventCreateWithFlags(&m->staged[s], cudaEventDisableTiming), err);
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&m->step_done, cudaEventDisableTiming), err);
    m->host_count = (int32_t *)malloc((size_t)c->vocab_size * sizeof(int32_t));
    if (!m->host_count) return nsaErrorf(err, "cuda: out of host memory for token counts");
    return 0;
}

/* Everything a model holds, in order; on failure what was made is freed by
 * nsaCudaModelFree. Returns 0, or -1 with err. */
static int createInner(NsaCudaModel *m, NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    const int B = m->opt.max_batch, S = m->opt.max_seq_len;
    const size_t N = (size_t)B * S;
    CUDA_CHECK(cudaSetDevice(m->opt.device_ordinal), err);
    m->dp.comm = m->opt.comm;
    m->dp.rank = nsaCommRank(m->dp.comm);
    m->dp.world = nsaCommWorld(m->dp.comm);
    if (nsaLayoutBuildRanks(&m->lay, c, m->dp.world, err) ||
        nsaShardBuild(&m->dp.shard, &m->lay, m->dp.rank, err))
        return -1;
    if (m->mode.fast && checkFusedProjections(&m->lay, c, err)) return -1;
    m->F = nsaLayoutMlpHidden(c);
    m->max_tokens = (int)N;
    m->max_cmp = cmpBlocks(c, S);
    m->slots = nsaNumSelSlots(c->n_sel);
    m->max_chunks = embeddingMaxChunks(N, c->vocab_size);
    CUDA_CHECK(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking), err);
    m->have_stream = 1;
    if (gemmContextCreate(&m->gemm, m->opt.precision, GEMM_WORKSPACE_BYTES, err) ||
        rmsnormPrepare(c->dim, err))
        return -1;

    size_t plan_bytes = 0;
    if (allocArenas(m, err) || allocActivations(m, B, S, err) ||
        createAttnPlans(m, B, S, &plan_bytes, err) || uploadRope(m, S, err) ||
        buildOptimTable(m, err) || dpCreate(m, err) || allocStepState(m, N, err))
        return -1;
    m->bytes_workspace = m->scratch_floats * sizeof(float) + GEMM_WORKSPACE_BYTES + plan_bytes +
                         m->ids_ints * sizeof(int32_t) + sizeof(OptimState) +
                         (size_t)m->n_optim * sizeof(OptimTensor) + dpBytes(m);
    trackPeak(m);
    return 0;
}

NsaCudaModel *nsaCudaModelCreate(const NsaModelConfig *cfg, const NsaEngineOptions *opt,
                                 NsaError *err) {
    if (checkOptions(cfg, opt, err)) return NULL;
    NsaCudaModel *m = (NsaCudaModel *)calloc(1, sizeof(NsaCudaModel));
    if (!m) {
        nsaErrorf(err, "cuda: out of host memory for the model");
        return NULL;
    }
    m->cfg = *cfg;
    m->opt = *opt;
    m->mode = engineMode(cfg, opt, m->attention_path, sizeof(m->attention_path));
    m->mode.recompute = opt->recompute;
    if (createInner(m, err)) {
        nsaCudaModelFree(m);
        return NULL;
    }
    if (nsaCudaModelResetState(m, err)) {
        nsaCudaModelFree(m);
        return NULL;
    }
    return m;
}

/* ---- state, tensors ----------------------------------------------------- */

int nsaCudaModelResetState(NsaCudaModel *m, NsaError *err) {
    if (!m) return nsaErrorf(err, "cuda: no model (NULL)");
    for (int a = NSA_ARENA_GRADS; a <= NSA_ARENA_ADAM_V; a++)
        CUDA_CHECK(cudaMemsetAsync(m->arena[a], 0, arenaElements(m, (NsaArena)a) * sizeof(float),
                                   m->stream), err);
    OptimState st;
    memset(&st, 0, sizeof(st));
    st.loss_scale = m->opt.precision == NSA_PREC_FP16 ? FP16_INITIAL_SCALE : 1.0f;
    *m->host_state = st;
    CUDA_CHECK(cudaMemcpyAsync(m->state, m->host_state, sizeof(st), cudaMemcpyHostToDevice,
                               m->stream), err);
    if (syncStream(m, "reset", err)) return -1;
    memset(m->host_state, 0, sizeof(OptimState));
    m->dp.reduced = 0;
    m->have_forward = 0;
    m->step_recorded = 0;
    m->fault_nan_loss = m->fault_nan_grad = 0;
    return 0;
}

int nsaCudaModelInit(NsaCudaModel *m, uint64_t seed, NsaError *err) {
    if (!m) return nsaErrorf(err, "cuda: no model (NULL)");
    float *host = (float *)calloc(m->lay.total, sizeof(float));   /* padding stays zero */
    if (!host)
        return nsaErrorf(err, "cuda: out of host memory for init (%zu floats)", m->lay.total);
    for (int i = 0; i < m->lay.n_tensors; i++) {
        if (nsaLayoutInitTensor(&m->lay, i, seed, host + m->lay.entries[i].info.offset, err)) {
            free(host);
            return -1;
        }
    }
    int rc = nsaCudaModelSetArena(m, NSA_ARENA_PARAMS, host, err);
    free(host);
    if (rc) return -1;
    return nsaCudaModelResetState(m, err);
}

int nsaCudaModelNumTensors(const NsaCudaModel *m) { return m ? m->lay.n_tensors : 0; }

const NsaTensorInfo *nsaCudaModelTensorInfo(const NsaCudaModel *m, int i) {
    if (!m || i < 0 || i >= m->lay.n_tensors) return NULL;
    return &m->lay.entries[i].info;
}

size_t nsaCudaModelArenaElements(const NsaCudaModel *m) { return m ? m->lay.total : 0; }

static int checkArena(NsaArena arena, NsaError *err) {
    if (arena < NSA_ARENA_PARAMS || arena > NSA_ARENA_ADAM_V)
        return nsaErrorf(err,
                         "cuda: arena = %d; allowed: 0 (params), 1 (grads), 2 (adam_m), "
                         "3 (adam_v)",
                         (int)arena);
    return 0;
}

/* The loss scale the gradient arena currently carries (synchronous). */
static int currentLossScale(NsaCudaModel *m, float *scale, NsaError *err) {
    if (m->opt.precision != NSA_PREC_FP16) {
        *scale = 1.0f;
        return 0;
    }
    if (m->dp.comm && syncStream(m, "reading the loss scale", err)) return -1;
    CUDA_CHECK(cudaMemcpyAsync(scale, &m->state->loss_scale, sizeof(float), cudaMemcpyDeviceToHost,
                               m->stream), err);
    return syncStream(m, "reading the loss scale", err);
}

static int copyOut(NsaCudaModel *m, NsaArena arena, size_t offset, size_t n, float *dst,
                   NsaError *err) {
    if (checkArena(arena, err)) return -1;
    if (!dst) return nsaErrorf(err, "cuda: destination is NULL");
    if (waitAllWeights(m, err)) return -1;
    if (m->dp.comm && syncStream(m, "reading a tensor", err)) return -1;
    CUDA_CHECK(cudaMemcpyAsync(dst, m->arena[arena] + offset, n * sizeof(float),
                               cudaMemcpyDeviceToHost, m->stream), err);
    if (syncStream(m, "reading a tensor", err)) return -1;
    if (arena == NSA_ARENA_GRADS) {
        float scale;
        if (currentLossScale(m, &scale, err)) return -1;
        if (scale != 1.0f)
            for (size_t i = 0; i < n; i++) dst[i] /= scale;
    }
    return 0;
}

static int copyIn(NsaCudaModel *m, NsaArena arena, size_t offset, size_t n, const float *src,
                  NsaError *err) {
    if (checkArena(arena, err)) return -1;
    if (!src) return nsaErrorf(err, "cuda: source is NULL");
    if (arena == NSA_ARENA_GRADS && m->opt.precision == NSA_PREC_FP16)
        return nsaErrorf(err, "cuda: setting gradients is not supported in fp16 mode (they carry "
                              "the loss scale); allowed arenas: params, adam_m, adam_v");
    if (waitAllWeights(m, err)) return -1;
    if (m->dp.comm && syncStream(m, "writing a tensor", err)) return -1;
    CUDA_CHECK(cudaMemcpyAsync(m->arena[arena] + offset, src, n * sizeof(float),
                               cudaMemcpyHostToDevice, m->stream), err);
    /* the GEMMs' weight copy follows every change of the master weights */
    if (arena == NSA_ARENA_PARAMS && m->weights_low &&
        convertTensor((char *)m->weights_low + offset * dtypeBytes(m->mode.op), m->mode.op,
                      m->arena[arena] + offset, DTYPE_F32, n, m->stream, err))
        return -1;
    return syncStream(m, "writing a tensor", err);
}

/* Where tensor i of an arena lives: elements [*begin, *begin + *n) of the
 * tensor at *at of the arena (the moments: this rank's piece; n 0 none). */
static void tensorSpan(const NsaCudaModel *m, NsaArena arena, int i, size_t *begin, size_t *n,
                       size_t *at) {
    const NsaTensorInfo *ti = &m->lay.entries[i].info;
    *begin = 0;
    *n = ti->numel;
    *at = ti->offset;
    if (arena == NSA_ARENA_ADAM_M || arena == NSA_ARENA_ADAM_V) {
        const int p = m->dp.shard.tensor_piece[i];
        *begin = p < 0 ? 0 : m->dp.shard.pieces[p].begin;
        *n = p < 0 ? 0 : m->dp.shard.pieces[p].numel;
        *at = p < 0 ? 0 : m->dp.shard.pieces[p].local;
    }
}

int nsaCudaModelGetTensor(NsaCudaModel *m, NsaArena arena, int i, float *dst, NsaError *err) {
    const NsaTensorInfo *ti = nsaCudaModelTensorInfo(m, i);
    if (!ti)
        return nsaErrorf(err, "cuda: tensor index %d; allowed: 0 to %d", i,
                         nsaCudaModelNumTensors(m) - 1);
    if (checkArena(arena, err)) return -1;
    size_t begin, n, at;
    tensorSpan(m, arena, i, &begin, &n, &at);
    return n ? copyOut(m, arena, at, n, dst ? dst + begin : NULL, err) : 0;
}

int nsaCudaModelSetTensor(NsaCudaModel *m, NsaArena arena, int i, const float *src,
                          NsaError *err) {
    const NsaTensorInfo *ti = nsaCudaModelTensorInfo(m, i);
    if (!ti)
        return nsaErrorf(err, "cuda: tensor index %d; allowed: 0 to %d", i,
                         nsaCudaModelNumTensors(m) - 1);
    if (checkArena(arena, err)) return -1;
    size_t begin, n, at;
    tensorSpan(m, arena, i, &begin, &n, &at);
    return n ? copyIn(m, arena, at, n, src ? src + begin : NULL, err) : 0;
}

int nsaCudaModelSetArena(NsaCudaModel *m, NsaArena arena, const float *src, NsaError *err) {
    if (!m) return nsaErrorf(err, "cuda: no model (NULL)");
    if (checkArena(arena, err)) return -1;
    return copyIn(m, arena, 0, arenaElements(m, arena), src, err);
}

/* ---- the step ------------------------------------------------------------ */

int nsaCudaModelZeroGrad(NsaCudaModel *m, NsaError *err) {
    if (!m) return nsaErrorf(err, "cuda: no model (NULL)");
    m->dp.reduced = 0;
    CUDA_CHECK(cudaMemsetAsync(m->arena[NSA_ARENA_GRADS], 0, m->lay.total * sizeof(float),
                               m->stream), err);
    CUDA_CHECK(cudaMemsetAsync(&m->state->loss, 0, sizeof(double), m->stream), err);
    return 0;
}

/* Stages the ids (and the embedding backward plan) through a pinned slot
 * and enqueues their upload. */
static int uploadBatch(NsaCudaModel *m, const int32_t *tokens, const int32_t *targets, size_t N,
                       NsaError *err) {
    const int slot = m->next_slot;
    m->next_slot = (slot + 1) % STAGING_SLOTS;
    if (m->staged_used[slot] && engineWaitEvent(m, m->staged[slot], "token staging", err)) return -1;
    int32_t *host = m->staging[slot];
    BatchIds h;
    planIds((size_t)m->max_tokens, m->max_chunks, m->cfg.vocab_size, host, &h);
    memcpy(h.tokens, tokens, N * sizeof(int32_t));
    memcpy(h.targets, targets, N * sizeof(int32_t));
    EmbedPlan plan = {h.order, h.chunk_start, h.chunk_token, h.token_chunk, 0};
    embeddingPlanBackward(&plan, m->host_count, tokens, N, m->cfg.vocab_size);
    m->plan_chunks = plan.n_chunks;
    CUDA_CHECK(cudaMemcpyAsync(m->ids_device, host, m->ids_ints * sizeof(int32_t),
                               cudaMemcpyHostToDevice, m->stream), err);
    CUDA_CHECK(cudaEventRecord(m->staged[slot], m->stream), err);
    m->staged_used[slot] = 1;
    return 0;
}


#define P(idx) (m->arena[NSA_ARENA_PARAMS] + m->lay.entries[(idx)].info.offset)
#define GR(idx) (m->arena[NSA_ARENA_GRADS] + m->lay.entries[(idx)].info.offset)

/* The fast attention plan that holds layer's forward state. */
static NsaAttnCudaPlan *attnPlan(const NsaCudaModel *m, int layer) {
    return m->attn_plans[m->mode.recompute == NSA_RECOMPUTE_LAYER ? 0 : layer];
}

/* Weight idx as a GEMM operand: the fp32 master in f32 mode, else its
 * bf16/fp16 copy (kept current by AdamW and copyIn). */
static const void *weightOperand(const NsaCudaModel *m, int idx) {
    if (!m->mode.low) return P(idx);
    return (const char *)m->weights_low +
           m->lay.entries[idx].info.offset * dtypeBytes(m->mode.op);
}
#define W(idx) weightOperand(m, (idx))

/* An fp32 tensor of n elements as a GEMM operand: itself in f32 mode, else
 * converted into buf (operand type). */
static int operandOf(NsaCudaModel *m, const void **out, const float *x, size_t n, void *buf,
                     NsaError *err) {
    if (!m->mode.low) {
        *out = x;
        return 0;
    }
    TRY(convertTensor(buf, m->mode.op, x, DTYPE_F32, n, m->stream, err));
    *out = buf;
    return 0;
}

/* One phi (k or v) of a layer: P and the fp32 W1 from the master
 * weights, W1 and W2 as GEMM operands. */
static PoolMlpWeights poolMlpWeights(const NsaCudaModel *m, int pos, int w1, int w2) {
    PoolMlpWeights w = {P(pos), W(w1), W(w2), P(w1)};
    return w;
}

/* Attention of one layer on the fp32 reference kernels: q, k, v, gates
 * from a->xn, output y (and its operand copy y_op in bf16/fp16 mode). */
static int attentionForwardReference(NsaCudaModel *m, const LayerActs *a, const NsaLayerIndex *li,
                                     const NsaAttnDims *dims, NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    const int B = dims->B, S = dims->S, N = B * S, C = c->dim;
    const int H = c->n_heads, G = c->n_kv_groups, dk = c->d_k, dv = c->d_v;
    const int wk[3] = {li->wk_cmp, li->wk_sel, li->wk_win};
    const int wv[3] = {li->wv_cmp, li->wv_sel, li->wv_win};
    cudaStream_t st = m->stream;
    GemmContext *gm = &m->gemm;
    TRY(linearForward(gm, st, a->q, a->xn, W(li->wq), N, C, H * dk, 0.0f, NULL, err));
    TRY(ropeForward(a->q, m->rope, B, S, H, dk, st, err));
    for (int b = 0; b < 3; b++) {
        TRY(linearForward(gm, st, a->k[b], a->xn, W(wk[b]), N, C, G * dk, 0.0f, NULL, err));
        TRY(ropeForward(a->k[b], m->rope, B, S, G, dk, st, err));
        TRY(linearForward(gm, st, a->v[b], a->xn, W(wv[b]), N, C, G * dv, 0.0f, NULL, err));
    }
    if (c->phi == NSA_PHI_MLP) {
        const PoolMlpWeights pk = poolMlpWeights(m, li->phi_k_pos, li->phi_k_w1, li->phi_k_w2);
        const PoolMlpWeights pv = poolMlpWeights(m, li->phi_v_pos, li->phi_v_w1, li->phi_v_w2);
        TRY(poolMlpForward(gm, st, a->kc, a->hk, a->k[0], &pk, &m->sc.pool, B, S, G, dk,
                           c->cmp_len, c->cmp_stride, err));
        TRY(poolMlpForward(gm, st, a->vc, a->hv, a->v[0], &pv, &m->sc.pool, B, S, G, dv,
                           c->cmp_len, c->cmp_stride, err));
    } else {
        TRY(attnPoolAvgForward(a->kc, a->k[0], B, S, G, dk, c->cmp_len, c->cmp_stride, st, err));
        TRY(attnPoolAvgForward(a->vc, a->v[0], B, S, G, dv, c->cmp_len, c->cmp_stride, st, err));
    }
    TRY(linearForward(gm, st, a->gates, a->xn, W(li->w_gate), N, C, 3 * H, 0.0f, NULL, err));
    TRY(sigmoidForward(a->gates, a->gates, (size_t)N * 3 * H, st, err));
    TRY(attnCmpForward(a->o[0], a->lse[0], a->q, a->kc, a->vc, dims, st, err));
    TRY(attnSelectBlocks(a->sel, a->q, a->kc, a->lse[0], dims, st, err));
    TRY(attnSelForward(a->o[1], a->lse[1], a->q, a->k[1], a->v[1], a->sel, dims, st, err));
    TRY(attnWinForward(a->o[2], a->lse[2], a->q, a->k[2], a->v[2], dims, st, err));
    TRY(attnGateCombineForward(a->y, a->gates, a->o[0], a->o[1], a->o[2], dims, st, err));
    if (m->mode.low)
        TRY(convertTensor(a->y_op, m->mode.op, a->y, DTYPE_F32, (size_t)N * H * dv, st, err));
    return 0;
}

/* Attention of one layer on the fast bf16 op: one GEMM for the eight
 * projections into sc->proj, one pass into the layer's saved bf16 inputs
 * (RoPE, sigmoid), then the op, which writes y in bf16 (the Wo operand
 * itself in bf16 mode). */
static int attentionForwardFast(NsaCudaModel *m, int layer, const LayerActs *a,
                                const NsaLayerIndex *li, const NsaAttnDims *dims, NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    const int B = dims->B, S = dims->S, N = B * S, C = c->dim;
    const int H = c->n_heads, G = c->n_kv_groups, dk = c->d_k, dv = c->d_v;
    const Scratch *sc = &m->sc;
    cudaStream_t st = m->stream;
    /* all stride rows of the weight block: the padding rows are zero, so
     * the padding columns come out zero */
    const int stride = attnInputsStride(H, G, dk, dv);
    TRY(gemmRowMajorTo(&m->gemm, st, 0, 1, N, stride, C, 1.0f, a->xn, C, W(li->wq), C, 0.0f, NULL,
                       stride, sc->proj, m->mode.op, stride, err));
    const AttnInputTensors ins = {a->qb, {a->kb[0], a->kb[1], a->kb[2]},
                                  {a->vb[0], a->vb[1], a->vb[2]}, a->gb};
    TRY(attnInputsForward(ins, a->gates, sc->proj, m->mode.op, m->rope, B, S, H, G, dk, dv, st,
                          err));
    const NsaAttnDeviceInputs in = {a->qb, a->kb[0], a->vb[0], a->kb[1],
                                    a->vb[1], a->kb[2], a->vb[2], a->gb};
    void *out = m->mode.op == DTYPE_BF16 ? a->y_op : sc->dyb;
    TRY(nsaAttnForwardCuda(attnPlan(m, layer), dims, &in, out, NULL, NULL, st, err));
    if (m->mode.op != DTYPE_BF16)
        TRY(convertTensor(a->y_op, m->mode.op, sc->dyb, DTYPE_BF16, (size_t)N * H * dv, st, err));
    return 0;
}

/* Layer i's forward from its input a->res into the layer's activations;
 * with write_out its output (the next layer's input, or final_res), else
 * everything the backward needs and not the output (the recompute of a
 * layer whose output is already kept). */
static int layerForward(NsaCudaModel *m, int i, const NsaAttnDims *dims, int write_out,
                        NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    const int C = c->dim, H = c->n_heads, dv = c->d_v, F = m->F, L = c->n_layers;
    const int N = dims->B * dims->S;
    const DType op = m->mode.op;
    cudaStream_t st = m->stream;
    GemmContext *gm = &m->gemm;
    const LayerActs *a = &m->layers[i];
    const NsaLayerIndex *li = &m->lay.layers[i];

    TRY(rmsnormForwardTo(a->xn, op, a->rstd, a->res, P(li->attn_norm), (size_t)N, C, c->norm_eps,
                         st, err));
    if (m->mode.fast) TRY(attentionForwardFast(m, i, a, li, dims, err));
    else TRY(attentionForwardReference(m, a, li, dims, err));
    /* the residual add rides in the GEMM epilogue: mid = res + y Wo^T */
    TRY(linearForward(gm, st, a->mid, a->y_op, W(li->wo), N, H * dv, C, 1.0f, a->res, err));

    TRY(rmsnormForwardTo(a->mxn, op, a->mrstd, a->mid, P(li->mlp_norm), (size_t)N, C, c->norm_eps,
                         st, err));
    TRY(linearForwardTo(gm, st, a->fc, op, a->mxn, W(li->w_fc), N, C, F, err));
    if (c->mlp == NSA_MLP_SWIGLU) {
        TRY(linearForwardTo(gm, st, a->up, op, a->mxn, W(li->w_up), N, C, F, err));
        TRY(swigluForwardTo(a->act, op, a->fc, a->up, op, (size_t)N * F, st, err));
    } else {
        TRY(siluForwardTo(a->act, op, a->fc, op, (size_t)N * F, st, err));
    }
    if (write_out) {
        float *out = i + 1 < L ? m->layers[i + 1].res : m->final_res;
        TRY(linearForward(gm, st, out, a->act, W(li->w_proj), N, F, C, 1.0f, a->mid, err));
    }
    return 0;
}

/* The forward pass over the uploaded ids; logits end up as the loss
 * gradient when want_grad. */
static int forwardPass(NsaCudaModel *m, int B, int S, int want_grad, float grad_factor,
                       NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    const int C = c->dim, V = c->vocab_size, L = c->n_layers;
    const int N = B * S;
    const DType op = m->mode.op;
    const NsaAttnDims dims = attnDimsFor(&m->cfg, B, S);
    cudaStream_t st = m->stream;

    TRY(waitWeights(m, NSA_BUCKET_EMBED, err));
    TRY(embeddingForward(m->layers[0].res, P(m->lay.tok_emb), m->ids.tokens, (size_t)N, C, st,
                         err));
    for (int i = 0; i < L; i++) {
        TRY(waitWeights(m, NSA_BUCKET_LAYER(i), err));
        TRY(layerForward(m, i, &dims, 1, err));
    }
    TRY(waitWeights(m, NSA_BUCKET_HEAD(L), err));
    TRY(rmsnormForwardTo(m->final_xn, op, m->final_rstd, m->final_res, P(m->lay.final_norm),
                         (size_t)N, C, c->norm_eps, st, err));
    TRY(linearForward(&m->gemm, st, m->logits, m->final_xn, W(m->lay.lm_head), N, C, V, 0.0f,
                      NULL, err));
    TRY(crossEntropyForward(m->logits, m->sc.row_loss, m->ids.targets, (size_t)N, V, want_grad,
                            grad_factor, &m->state->loss_scale, st, err));
    return 0;
}

/* The attention inputs in a fixed order: q, k_cmp, v_cmp, k_sel, v_sel,
 * k_win, v_win, gates (the order of NsaAttnDeviceInputs). */
static int attentionInputWidth(const NsaModelConfig *c, int j) {
    if (j == 0) return c->n_heads * c->d_k;
    if (j == 7) return 3 * c->n_heads;
    return c->n_kv_groups * (j % 2 ? c->d_k : c->d_v);
}

static int attentionInputWeight(const NsaLayerIndex *li, int j) {
    const int w[8] = {li->wq,     li->wk_cmp, li->wv_cmp, li->wk_sel,
                      li->wv_sel, li->wk_win, li->wv_win, li->w_gate};
    return w[j];
}

/* The two GEMMs of attention input j's gradient d (operand type):
 * dxn (+)= d W_j (input 0 overwrites, the others add), dW_j += d^T xn. */
static int attentionInputGemms(NsaCudaModel *m, const LayerActs *a, const NsaLayerIndex *li, int N,
                               int j, const void *d, NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    const int width = attentionInputWidth(c, j), widx = attentionInputWeight(li, j);
    TRY(linearBackwardX(&m->gemm, m->stream, m->sc.dxn, d, W(widx), N, c->dim, width,
                        j == 0 ? 0.0f : 1.0f, err));
    TRY(linearBackwardW(&m->gemm, m->stream, GR(widx), d, a->xn, N, c->dim, width, err));
    return 0;
}

/* Reference-path attention backward: sc->dy (fp32 d loss / d y) to dxn and
 * the attention weights' gradients. */
static int attentionBackwardReference(NsaCudaModel *m, const LayerActs *a, const NsaLayerIndex *li,
                                      const NsaAttnDims *dims, NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    const int B = dims->B, S = dims->S, N = B * S;
    const int H = c->n_heads, G = c->n_kv_groups, dk = c->d_k, dv = c->d_v;
    const Scratch *sc = &m->sc;
    cudaStream_t st = m->stream;
    TRY(attnGateCombineBackward(sc->dgates, sc->d_o[0], sc->d_o[1], sc->d_o[2], sc->dy, a->gates,
                                a->o[0], a->o[1], a->o[2], dims, st, err));
    for (int b = 0; b < 3; b++)
        TRY(attnRowDelta(sc->delta[b], sc->d_o[b], a->o[b], (size_t)N * H, dv, st, err));
    TRY(attnWinBackward(sc->dq, 0, sc->dk[2], sc->dv[2], sc->d_o[2], a->q, a->k[2], a->v[2],
                        a->lse[2], sc->delta[2], dims, st, err));
    TRY(attnSelBackward(sc->dq, 1, sc->dk[1], sc->dv[1], sc->d_o[1], a->q, a->k[1], a->v[1], a->sel,
                        a->lse[1], sc->delta[1], dims, st, err));
    TRY(attnCmpBackward(sc->dq, 1, sc->dkc, sc->dvc, sc->d_o[0], a->q, a->kc, a->vc, a->lse[0],
                        sc->delta[0], dims, st, err));
    if (c->phi == NSA_PHI_MLP) {
        const PoolMlpWeights pk = poolMlpWeights(m, li->phi_k_pos, li->phi_k_w1, li->phi_k_w2);
        const PoolMlpWeights pv = poolMlpWeights(m, li->phi_v_pos, li->phi_v_w1, li->phi_v_w2);
        TRY(poolMlpBackward(&m->gemm, st, sc->dk[0], 0, GR(li->phi_k_pos), GR(li->phi_k_w1),
                            GR(li->phi_k_w2), sc->dkc, a->hk, a->k[0], &pk, &sc->pool, B, S, G,
                            dk, c->cmp_len, c->cmp_stride, err));
        TRY(poolMlpBackward(&m->gemm, st, sc->dv[0], 0, GR(li->phi_v_pos), GR(li->phi_v_w1),
                            GR(li->phi_v_w2), sc->dvc, a->hv, a->v[0], &pv, &sc->pool, B, S, G,
                            dv, c->cmp_len, c->cmp_stride, err));
    } else {
        TRY(attnPoolAvgBackward(sc->dk[0], sc->dkc, B, S, G, dk, c->cmp_len, c->cmp_stride, 0,
                                st, err));
        TRY(attnPoolAvgBackward(sc->dv[0], sc->dvc, B, S, G, dv, c->cmp_len, c->cmp_stride, 0,
                                st, err));
    }
    TRY(ropeBackward(sc->dq, m->rope, B, S, H, dk, st, err));
    TRY(sigmoidBackward(sc->dgates, sc->dgates, a->gates, (size_t)N * H * 3, st, err));
    for (int b = 0; b < 3; b++) TRY(ropeBackward(sc->dk[b], m->rope, B, S, G, dk, st, err));
    float *grads[8] = {sc->dq,    sc->dk[0], sc->dv[0], sc->dk[1],
                       sc->dv[1], sc->dk[2], sc->dv[2], sc->dgates};
    for (int j = 0; j < 8; j++) {
        const void *d;
        TRY(operandOf(m, &d, grads[j], (size_t)N * attentionInputWidth(c, j), sc->op_b, err));
        TRY(attentionInputGemms(m, a, li, N, j, d, err));
    }
    return 0;
}

/* Fast-path attention backward from d loss / d y (sc->dyb in bf16 mode,
 * else sc->dy, rounded to bf16 here): the op's bf16 gradients become one
 * row of the fused projection's gradient (RoPE back, sigmoid'), then one
 * GEMM sets dxn and one adds the eight weights' gradients. */
static int attentionBackwardFast(NsaCudaModel *m, int layer, const LayerActs *a,
                                 const NsaLayerIndex *li, const NsaAttnDims *dims, NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    const int B = dims->B, S = dims->S, N = B * S, C = c->dim;
    const int H = c->n_heads, G = c->n_kv_groups, dk = c->d_k, dv = c->d_v;
    const int stride = attnInputsStride(H, G, dk, dv);
    const Scratch *sc = &m->sc;
    cudaStream_t st = m->stream;
    if (m->mode.op != DTYPE_BF16)
        TRY(convertTensor(sc->dyb, DTYPE_BF16, sc->dy, DTYPE_F32, (size_t)N * H * dv, st, err));
    const NsaAttnDeviceInputs in = {a->qb, a->kb[0], a->vb[0], a->kb[1],
                                    a->vb[1], a->kb[2], a->vb[2], a->gb};
    const NsaAttnDeviceGrads gr = {sc->dqb,    sc->dkb[0], sc->dvb[0], sc->dkb[1],
                                   sc->dvb[1], sc->dkb[2], sc->dvb[2], sc->dgb};
    TRY(nsaAttnBackwardCuda(attnPlan(m, layer), dims, &in, sc->dyb, &gr, st, err));
    const AttnInputTensors grads = {sc->dqb, {sc->dkb[0], sc->dkb[1], sc->dkb[2]},
                                    {sc->dvb[0], sc->dvb[1], sc->dvb[2]}, sc->dgb};
    TRY(attnInputsBackward(sc->proj, m->mode.op, grads, a->gates, m->rope, B, S, H, G, dk, dv, st,
                           err));
    /* dxn = d W_all, dW_all += d^T xn over all stride rows: d's padding
     * columns are zero, so they add nothing and the padding stays zero */
    TRY(gemmRowMajor(&m->gemm, st, 0, 0, N, C, stride, 1.0f, sc->proj, stride, W(li->wq), C, 0.0f,
                     sc->dxn, C, sc->dxn, C, err));
    TRY(gemmRowMajor(&m->gemm, st, 1, 0, stride, C, N, 1.0f, sc->proj, stride, a->xn, C, 1.0f,
                     GR(li->wq), C, GR(li->wq), C, err));
    return 0;
}

/* Selective recompute: layer i's MLP input (RMSNorm of mid) and
 * activation made again into the shared buffers, by the forward's own
 * kernels on the kept inputs, so they come out bit for bit as the forward
 * made them. */
static int remakeMlpInputs(NsaCudaModel *m, int i, NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    const size_t N = (size_t)m->B * m->S;
    const DType op = m->mode.op;
    const LayerActs *a = &m->layers[i];
    const NsaLayerIndex *li = &m->lay.layers[i];
    TRY(rmsnormForwardTo(a->mxn, op, a->mrstd, a->mid, P(li->mlp_norm), N, c->dim, c->norm_eps,
                         m->stream, err));
    if (c->mlp == NSA_MLP_SWIGLU)
        return swigluForwardTo(a->act, op, a->fc, a->up, op, N * m->F, m->stream, err);
    return siluForwardTo(a->act, op, a->fc, op, N * m->F, m->stream, err);
}

static int backwardPass(NsaCudaModel *m, NsaError *err) {
    const NsaModelConfig *c = &m->cfg;
    const int B = m->B, S = m->S;
    const int C = c->dim, V = c->vocab_size, H = c->n_heads;
    const int dv = c->d_v, F = m->F, L = c->n_layers;
    const int N = B * S;
    const DType op = m->mode.op;
    const NsaAttnDims dims = attnDimsFor(&m->cfg, B, S);
    const Scratch *sc = &m->sc;
    cudaStream_t st = m->stream;
    GemmContext *gm = &m->gemm;
    const NsaLayout *lay = &m->lay;
    /* d loss / d residual as a GEMM operand: in 16-bit modes a copy each
     * RMSNorm backward writes beside its fp32 update (op_a), else itself */
    void *dres_copy = m->mode.low ? sc->op_a : NULL;
    const void *dres_op = m->mode.low ? sc->op_a : (const void *)sc->dres;
    const void *d;

    /* head: logits hold d loss / d logits already */
    TRY(operandOf(m, &d, m->logits, (size_t)N * V, sc->op_a, err));
    TRY(linearBackwardX(gm, st, sc->dxn, d, W(lay->lm_head), N, C, V, 0.0f, err));
    TRY(linearBackwardW(gm, st, GR(lay->lm_head), d, m->final_xn, N, C, V, err));
    CUDA_CHECK(cudaMemsetAsync(sc->dres, 0, (size_t)N * C * sizeof(float), st), err);
    TRY(rmsnormBackwardTo(sc->dres, dres_copy, op, GR(lay->final_norm), sc->rms_partial, sc->dxn,
                          m->final_res, P(lay->final_norm), m->final_rstd, (size_t)N, C, st,
                          err));
    TRY(bucketReady(m, NSA_BUCKET_HEAD(L), err));

    for (int i = L - 1; i >= 0; i--) {
        const LayerActs *a = &m->layers[i];
        const NsaLayerIndex *li = &lay->layers[i];
        /* with recompute the shared buffers hold the last layer's forward;
         * every other layer's is made again from its kept input (layer) or
         * from the kept GEMM outputs (selective) */
        const int last = i == L - 1;
        const int remake_layer = !last && m->mode.recompute == NSA_RECOMPUTE_LAYER;
        const int remake_inputs = !last && m->mode.recompute == NSA_RECOMPUTE_SELECTIVE;
        if (remake_layer) TRY(layerForward(m, i, &dims, 0, err));
        if (remake_inputs) TRY(remakeMlpInputs(m, i, err));

        /* MLP; dres = d loss / d(layer output) */
        TRY(linearBackwardXTo(gm, st, sc->dact, op, dres_op, W(li->w_proj), N, F, C, err));
        TRY(linearBackwardW(gm, st, GR(li->w_proj), dres_op, a->act, N, F, C, err));
        if (c->mlp == NSA_MLP_SWIGLU) {
            TRY(swigluBackwardTo(sc->dfc, sc->dup, op, sc->dact, a->fc, a->up, op, (size_t)N * F,
                                 st, err));
            TRY(linearBackwardX(gm, st, sc->dxn, sc->dup, W(li->w_up), N, C, F, 0.0f, err));
            TRY(linearBackwardW(gm, st, GR(li->w_up), sc->dup, a->mxn, N, C, F, err));
            TRY(linearBackwardX(gm, st, sc->dxn, sc->dfc, W(li->w_fc), N, C, F, 1.0f, err));
        } else {
            TRY(siluBackwardTo(sc->dfc, op, sc->dact, a->fc, op, (size_t)N * F, st, err));
            TRY(linearBackwardX(gm, st, sc->dxn, sc->dfc, W(li->w_fc), N, C, F, 0.0f, err));
        }
        TRY(linearBackwardW(gm, st, GR(li->w_fc), sc->dfc, a->mxn, N, C, F, err));
        TRY(rmsnormBackwardTo(sc->dres, dres_copy, op, GR(li->mlp_norm), sc->rms_partial, sc->dxn,
                              a->mid, P(li->mlp_norm), a->mrstd, (size_t)N, C, st, err));

        /* attention; dres = d loss / d mid */
        if (m->mode.fast && op == DTYPE_BF16)
            TRY(linearBackwardXTo(gm, st, sc->dyb, DTYPE_BF16, dres_op, W(li->wo), N, H * dv, C,
                                  err));
        else
            TRY(linearBackwardX(gm, st, sc->dy, dres_op, W(li->wo), N, H * dv, C, 0.0f, err));
        TRY(linearBackwardW(gm, st, GR(li->wo), dres_op, a->y_op, N, H * dv, C, err));
        if (remake_inputs)
            TRY(rmsnormForwardTo(a->xn, op, a->rstd, a->res, P(li->attn_norm), (size_t)N, C,
                                 c->norm_eps, st, err));
        if (m->mode.fast) TRY(attentionBackwardFast(m, i, a, li, &dims, err));
        else TRY(attentionBackwardReference(m, a, li, &dims, err));
        /* the embedding's backward reads the fp32 sum only */
        TRY(rmsnormBackwardTo(sc->dres, i > 0 ? dres_copy : NULL, op, GR(li->attn_norm),
                              sc->rms_partial, sc->dxn, a->res, P(li->attn_norm), a->rstd,
                              (size_t)N, C, st, err));
        TRY(bucketReady(m, NSA_BUCKET_LAYER(i), err));
    }
    EmbedPlan plan = {m->ids.order, m->ids.chunk_start, m->ids.chunk_token, m->ids.token_chunk,
                      m->plan_chunks};
    TRY(embeddingBackward(GR(lay->tok_emb), sc->emb_partial, sc->dres, &plan, V, C, st, err));
    TRY(bucketReady(m, NSA_BUCKET_EMBED, err));
    return 0;
}

int nsaCudaModelForward(NsaCudaModel *m, const int32_t *tokens, const int32_t *targets, int B,
                        int S, float grad_scale, NsaError *err) {
    if (!m) return nsaErrorf(err, "cuda: no model (NULL)");
    if (!isfinite(grad_scale))
        return nsaErrorf(err, "cuda: grad_scale = %g; allowed: a finite number",
                         (double)grad_scale);
    size_t count;
    if (nsaBatchValidate(&m->cfg, m->opt.max_batch, m->opt.max_seq_len, tokens, targets, B, S,
                         &count, err))
        return -1;
    m->have_forward = 0;
    const size_t N = (size_t)B * S;
    if (uploadBatch(m, tokens, targets, N, err)) return -1;
    /* each rank's share of the mean over the whole batch (nsa.h) */
    const double scale = (double)grad_scale / (double)m->dp.world;
    const float factor = (float)(scale / (double)count);
    if (forwardPass(m, B, S, 1, factor, err)) return -1;
    TRY(crossEntropyReduce(&m->state->loss, m->sc.row_loss, N, scale / (double)count,
                           m->fault_nan_loss, m->stream, err));
    m->fault_nan_loss = 0;
    m->B = B;
    m->S = S;
    m->backward_factor = factor;
    m->have_forward = 1;
    return 0;
}

static int backward(NsaCudaModel *m, int reduce, NsaError *err) {
    if (!m) return nsaErrorf(err, "cuda: no model (NULL)");
    if (!m->have_forward)
        return nsaErrorf(err, "cuda: Backward needs the activations of a Forward (each Forward "
                              "serves one Backward; EvalLoss discards them)");
    if (m->dp.reduced)
        return nsaErrorf(err, "cuda: this step's gradients were already reduced; the reducing "
                              "backward must be the step's last");
    m->have_forward = 0;
    m->dp.reducing = reduce && m->dp.comm;
    const int rc = backwardPass(m, err);
    m->dp.reduced = m->dp.reducing && rc == 0;
    m->dp.reducing = 0;
    return rc;
}

int nsaCudaModelBackward(NsaCudaModel *m, NsaError *err) { return backward(m, 0, err); }

int nsaCudaModelBackwardReduce(NsaCudaModel *m, NsaError *err) { return backward(m, 1, err); }

int nsaCudaModelOptimizerStep(NsaCudaModel *m, const NsaOptimConfig *oc, int64_t step,
                              NsaError *err) {
    if (!m || !oc) return nsaErrorf(err, "cuda: OptimizerStep needs a model and a config");
    if (step < 1)
        return nsaErrorf(err, "cuda: optimizer step = %lld; allowed: 1 or more (1-based)",
                         (long long)step);
    const double bc1 = 1.0 - pow((double)oc->beta1, (double)step);
    const double bc2 = 1.0 - pow((double)oc->beta2, (double)step);
    if (m->dp.comm) {
        DpState *dp = &m->dp;
        if (!dp->reduced) { /* a plain backward: reduce every bucket now */
            CUDA_CHECK(cudaEventRecord(dp->t_backward_end, m->stream), err);
            TRY(engineStreamHop(m->stream, dp->stream, dp->to_comm, err));
            for (int b = m->lay.n_buckets - 1; b >= 0; b--) TRY(dpReduceBucket(m, b, err));
            dp->reduced = 1;
        }
        TRY(engineStreamHop(dp->stream, m->stream, dp->to_compute, err));
        TRY(dpGlobalScalars(m, err));
    } else {
        TRY(gradNorm(m->state, m->sc.norm_partial, m->arena[NSA_ARENA_GRADS], m->lay.total,
                     m->stream, err));
    }
    TRY(adamwStepWithCopy(m->arena[NSA_ARENA_PARAMS], m->weights_low, m->mode.op,
                          m->arena[NSA_ARENA_GRADS], m->arena[NSA_ARENA_ADAM_M],
                          m->arena[NSA_ARENA_ADAM_V], m->tensors, m->n_optim, m->optim_max_numel,
                          m->state, oc->lr, oc->beta1, oc->beta2, oc->eps, oc->weight_decay,
                          oc->grad_clip, bc1, bc2, m->opt.precision == NSA_PREC_FP16,
                          FP16_SCALE_WINDOW, m->stream, err));
    if (m->dp.comm) TRY(dpGatherWeights(m, err));
    /* the figures travel back behind the step; StepStats waits for them */
    CUDA_CHECK(cudaMemcpyAsync(m->host_state, m->state, sizeof(OptimState),
                               cudaMemcpyDeviceToHost, m->stream), err);
    CUDA_CHECK(cudaEventRecord(m->step_done, m->stream), err);
    m->step_recorded = 1;
    return 0;
}

int nsaCudaModelStepStats(NsaCudaModel *m, NsaStepStats *out, NsaError *err) {
    if (!m || !out) return nsaErrorf(err, "cuda: StepStats needs a model and an output");
    memset(out, 0, sizeof(*out));
    if (!m->step_recorded) return 0;   /* no step yet: zeros, like the CPU engine */
    if (engineWaitEvent(m, m->step_done, "the step", err)) return -1;
    const OptimState *s = m->host_state;
    out->loss = s->loss;
    out->grad_norm = s->grad_norm;
    out->nonfinite_loss = s->nonfinite_loss;
    out->nonfinite_grad = s->nonfinite_grad;
    out->applied = s->applied;
    trackPeak(m);
    return 0;
}

int nsaCudaModelEvalLoss(NsaCudaModel *m, const int32_t *tokens, const int32_t *targets, int B,
                         int S, double *loss, NsaError *err) {
    if (!m || !loss) return nsaErrorf(err, "cuda: EvalLoss needs a model and an output");
    size_t count;
    if (nsaBatchValidate(&m->cfg, m->opt.max_batch, m->opt.max_seq_len, tokens, targets, B, S,
                         &count, err))
        return -1;
    m->have_forward = 0;   /* the pass overwrites the saved activations */
    const size_t N = (size_t)B * S;
    if (uploadBatch(m, tokens, targets, N, err)) return -1;
    CUDA_CHECK(cudaMemsetAsync(m->eval_loss, 0, sizeof(double), m->stream), err);
    if (forwardPass(m, B, S, 0, 0.0f, err)) return -1;
    TRY(crossEntropyReduce(m->eval_loss, m->sc.row_loss, N, 1.0 / (double)count, 0, m->stream,
                           err));
    CUDA_CHECK(cudaMemcpyAsync(m->host_eval_loss, m->eval_loss, sizeof(double),
                               cudaMemcpyDeviceToHost, m->stream), err);
    if (syncStream(m, "evaluation", err)) return -1;
    *loss = *m->host_eval_loss;
    return 0;
}

int nsaCudaModelInjectFault(NsaCudaModel *m, NsaFault fault, NsaError *err) {
    if (!m) return nsaErrorf(err, "cuda: no model (NULL)");
    switch (fault) {
    case NSA_FAULT_NONE: m->fault_nan_loss = m->fault_nan_grad = 0; return 0;
    case NSA_FAULT_NAN_LOSS: m->fault_nan_loss = 1; return 0;
    case NSA_FAULT_NAN_GRAD: m->fault_nan_grad = 1; return 0;
    }
    return nsaErrorf(err,
                     "cuda: fault = %d is unknown; allowed: 0 (none), 1 (nan_loss), "
                     "2 (nan_grad)",
                     (int)fault);
}

int nsaCudaModelMemoryReport(const NsaCudaModel *m, NsaMemoryReport *out) {
    if (!m || !out) return -1;
    memset(out, 0, sizeof(*out));
    out->params = m->bytes_params;
    out->grads = m->bytes_grads;
    out->optimizer = m->bytes_optimizer;
    out->activations = m->bytes_acts;
    out->workspace = m->bytes_workspace;
    out->total = out->params + out->grads + out->optimizer + out->activations + out->workspace;
    snprintf(out->attention_path, sizeof(out->attention_path), "%s", m->attention_path);
    if (cudaMemGetInfo(&out->device_free, &out->device_total) != cudaSuccess) {
        cudaGetLastError();
        out->device_free = out->device_total = 0;
    }
    return 0;
}

size_t nsaCudaModelPeakDeviceBytes(const NsaCudaModel *m) { return m ? m->peak_used : 0; }

void *nsaCudaModelStream(const NsaCudaModel *m) { return m ? (void *)m->stream : NULL; }

const char *nsaCudaModelAttentionPath(const NsaCudaModel *m) {
    return m ? m->attention_path : "";
}

