/* decode.cu - the CUDA decoder (decode.h): buffers planned and allocated
 * once, weights uploaded as bf16, and a pass as one CUDA graph per row
 * count. A decode step has one row per slot; a prefill pass takes up to
 * DEC_PREFILL_ROWS (256) consecutive prompt tokens of one slot as its rows,
 * so a long prompt costs len/256 passes, not len steps. The kernels are
 * decode_gemv.cu and decode_attn.cu; the order of one pass is
 *   tokens in (memcpy node), rows (slot and position of each), embed
 *   per layer: RMSNorm + [Wq; Wk/Wv of the three branches; Wgate] (one
 *              product), append (RoPE, caches; block pooling in a decode
 *              step), pool (prefill: after every row's append), compressed
 *              partials, selection, selected + window partials, combine,
 *              x += y Wo^T, act = silu(RMSNorm(x) Wfc^T) (or SwiGLU),
 *              x += act Wproj^T
 *   logits = RMSNorm(x) lm_head^T (prefill: the last row only), positions
 *   advanced, logits out (memcpy node).
 * The host synchronises once per pass, after the graph, to hand out the
 * logits. On sm_90 the kernels after the first overlap their launches with
 * the end of the one before (programmatic dependent launch, decode_ops.h's
 * DecLaunch). A prompt of more than PROMPT_MIN_POSITIONS into an empty
 * slot takes the prompt pass instead (promptPass below), where the config
 * has it. */
#include <stdlib.h>
#include <string.h>

#include "../cuda_common.cuh"
#include "decode.h"
#include "decode_ops.h"
#include "../layers/gemm.h"
#include "../layers/layers_cuda.h"

/* Rows of the prompt pass's row-local work (norms, projections, MLP) at a
 * time: its buffers hold this many rows, the residual stream and the
 * attention's inputs and output the whole prompt. */
#define PROMPT_CHUNK 4096
#define PROMPT_GEMM_WORKSPACE ((size_t)32 << 20)
/* Prompts longer than this take the prompt pass. Warm, it fills 1,024
 * positions ~10x faster than the 256-position passes, and the gap grows
 * with the prompt. A process's first prompt pass pays a one-time start-up
 * (~0.13 s, docs/PERF.md) that a long-lived nsad serve pays once; up to
 * two passes (512 positions, ~0.01 s) a short prompt is not worth it. */
#define PROMPT_MIN_POSITIONS 512

typedef struct DecLayerWeights {
    bf16 *w_attn;   /* [P][C]: wq, wk_cmp, wv_cmp, wk_sel, wv_sel, wk_win, wv_win, w_gate */
    bf16 *wo;       /* [C][H*dv] */
    bf16 *w_fc;     /* [F][C], or [2F][C] for SwiGLU (W_fc rows, then W_up rows) */
    bf16 *w_proj;   /* [C][F] */
    float *attn_norm, *mlp_norm;
    float *phi[6];  /* phi = mlp: k pos, w1, w2, v pos, w1, w2 */
} DecLayerWeights;

/* The prompt pass: an empty slot's prompt of more than
 * PROMPT_MIN_POSITIONS, all its positions at once through GEMMs and the
 * fast NSA op (the training engine's forward, kernels/cuda/fast_attn), the
 * caches then filled from the op's inputs (decode_prompt.cu). */
typedef struct DecPrompt {
    int stride;                 /* projection row stride (attnInputsStride) */
    int *tokens;                /* [T] */
    float *x;                   /* [T][C] residual stream */
    bf16 *q, *k[3], *v[3], *g;  /* the op's inputs [T][..], branches cmp, sel, win */
    bf16 *y;                    /* [T][H*dv] the op's output */
    bf16 *xn, *proj, *fc, *up;  /* [PROMPT_CHUNK][..] */
    float *rstd, *gates;        /* [PROMPT_CHUNK], [PROMPT_CHUNK][3H] */
    NsaAttnCudaPlan *plan;
    GemmContext gemm;
} DecPrompt;

struct NsaCudaDecoder {
    NsaModelConfig cfg;
    const NsaLayout *layout;
    NsaDecoderOptions opt;
    int F, P;                  /* MLP width, projection row */
    int R;                     /* rows a pass holds: max(max_batch, prefill rows) */
    DecDims dims;
    cudaStream_t stream;
    DecLaunch launch;          /* the stream, and whether kernels overlap their launches */
    void *arena;               /* one device allocation for everything */
    size_t arena_bytes;
    float *tok_emb, *final_norm;
    bf16 *lm_head;
    DecLayerWeights *lw;       /* [L] */
    DecLayerCache *cache;      /* [L] */
    DecScratch scratch;
    float *x, *logits;         /* [Bmax][C], [Bmax][V] */
    bf16 *act;                 /* [Bmax][F] */
    int *stage, *pos;          /* device: [1 + R] slot (base) then tokens; [Bmax] per slot */
    int *stage_host;           /* pinned, like stage */
    float *logits_host;        /* pinned [Bmax][V] */
    int *pos_host;             /* [Bmax] what the device holds */
    cudaGraphExec_t *graphs;   /* [Bmax + 1], decode steps by batch size */
    cudaGraphExec_t *prefill_graphs; /* [R + 1], prefill passes by rows */
    int prompt_ok;             /* the prompt pass exists for this config */
    char prefill_path[256];    /* how a prompt is prefilled, and why */
    DecPrompt pr;
};

/* ---- plan ------------------------------------------------------------------- */

static size_t take(size_t *cursor, size_t bytes) {
    const size_t at = *cursor;
    *cursor += (bytes + 255) / 256 * 256;
    return at;
}

static int checkLimits(const NsaModelConfig *c, const NsaDecoderOptions *o, NsaError *err) {
    const int F = nsaLayoutMlpHidden(c), hpg = c->n_heads / c->n_kv_groups;
    if (c->dim % 8 || (c->n_heads * c->d_v) % 8 || F % 8)
        return nsaErrorf(err,
                         "nsa decoder (cuda): dim = %d, n_heads*d_v = %d, mlp width = %d; "
                         "allowed: multiples of 8",
                         c->dim, c->n_heads * c->d_v, F);
    if (c->d_k % 8 || c->d_v % 8 || c->d_k > DEC_MAX_HEAD_DIM || c->d_v > DEC_MAX_HEAD_DIM)
        return nsaErrorf(err,
                         "nsa decoder (cuda): d_k = %d, d_v = %d; allowed: multiples of 8 up "
                         "to %d",
                         c->d_k, c->d_v, DEC_MAX_HEAD_DIM);
    if (hpg > DEC_MAX_HEADS_PER_GROUP)
        return nsaErrorf(err, "nsa decoder (cuda): %d heads per group; allowed: at most %d", hpg,
                         DEC_MAX_HEADS_PER_GROUP);
    if (o->max_batch > DEC_MAX_BATCH)
        return nsaErrorf(err, "nsa decoder (cuda): max_batch = %d; allowed: 1 to %d", o->max_batch,
                         DEC_MAX_BATCH);
    if (nsaNumSelBlocks(o->max_context, c->sel_len) > DEC_MAX_SEL_BLOCKS)
        return nsaErrorf(err,
                         "nsa decoder (cuda): max_context = %d makes %d selection blocks; "
                         "allowed: at most %d (max_context <= %d at sel_len %d)",
                         o->max_context, nsaNumSelBlocks(o->max_context, c->sel_len),
                         DEC_MAX_SEL_BLOCKS, DEC_MAX_SEL_BLOCKS * c->sel_len, c->sel_len);
    const int dmax = c->d_k > c->d_v ? c->d_k : c->d_v;
    if (c->phi == NSA_PHI_MLP && c->cmp_len * dmax > DEC_MLP_POOL_MAX)
        return nsaErrorf(err,
                         "nsa decoder (cuda): phi = mlp with cmp_len * max(d_k, d_v) = %d; "
                         "allowed: at most %d",
                         c->cmp_len * dmax, DEC_MLP_POOL_MAX);
    return 0;
}

/* Offsets of everything in the arena for the config; fills d's pointers
 * when base is not NULL. Returns the bytes. */
static size_t plan(NsaCudaDecoder *d, char *base) {
    const NsaModelConfig *c = &d->cfg;
    const size_t Bm = d->opt.max_batch, R = d->R, C = c->dim, V = c->vocab_size, H = c->n_heads;
    const size_t G = c->n_kv_groups, dk = c->d_k, dv = c->d_v, F = d->F, P = d->P;
    const DecDims *dm = &d->dims;
    const size_t units = (size_t)dm->sel_units + dm->win_units, L = c->n_layers;
    size_t cur = 0;
#define TAKE(ptr, type, count)                                    \
    do {                                                          \
        const size_t at_ = take(&cur, (size_t)(count) * sizeof(type)); \
        if (base) (ptr) = (type *)(base + at_);                   \
    } while (0)
    TAKE(d->tok_emb, float, V * C);
    TAKE(d->final_norm, float, C);
    TAKE(d->lm_head, bf16, V * C);
    for (size_t i = 0; i < L; i++) {
        DecLayerWeights *w = &d->lw[i];
        DecLayerCache *k = &d->cache[i];
        TAKE(w->w_attn, bf16, P * C);
        TAKE(w->wo, bf16, C * H * dv);
        TAKE(w->w_fc, bf16, (c->mlp == NSA_MLP_SWIGLU ? 2 : 1) * F * C);
        TAKE(w->w_proj, bf16, C * F);
        TAKE(w->attn_norm, float, C);
        TAKE(w->mlp_norm, float, C);
        if (c->phi == NSA_PHI_MLP) {
            const size_t l = c->cmp_len;
            TAKE(w->phi[0], float, l * dk);
            TAKE(w->phi[1], float, dk * l * dk);
            TAKE(w->phi[2], float, dk * dk);
            TAKE(w->phi[3], float, l * dv);
            TAKE(w->phi[4], float, dv * l * dv);
            TAKE(w->phi[5], float, dv * dv);
        }
        TAKE(k->k_sel, bf16, Bm * G * dm->T * dk);
        TAKE(k->v_sel, bf16, Bm * G * dm->T * dv);
        TAKE(k->k_win, bf16, Bm * G * dm->W * dk);
        TAKE(k->v_win, bf16, Bm * G * dm->W * dv);
        TAKE(k->kc, bf16, Bm * G * dm->Nc * dk);
        TAKE(k->vc, bf16, Bm * G * dm->Nc * dv);
        TAKE(k->k_raw, float, Bm * G * dm->raw_ring * dk);
        TAKE(k->v_raw, float, Bm * G * dm->raw_ring * dv);
        if (base) {
            k->phi_k_pos = w->phi[0];
            k->phi_k_w1 = w->phi[1];
            k->phi_k_w2 = w->phi[2];
            k->phi_v_pos = w->phi[3];
            k->phi_v_w1 = w->phi[4];
            k->phi_v_w2 = w->phi[5];
        }
    }
    DecScratch *s = &d->scratch;
    float *rope = NULL;
    TAKE(rope, float, (size_t)dm->T * dk);
    int *row_slot = NULL, *row_pos = NULL;
    TAKE(s->proj, float, R * P);
    TAKE(s->q, float, R * H * dk);
    TAKE(s->cmp_scores, float, R * H * dm->Nc);
    TAKE(s->cmp_m, float, R * H * dm->n_chunks);
    TAKE(s->cmp_l, float, R * H * dm->n_chunks);
    TAKE(s->cmp_o, float, R * H * dm->n_chunks * dv);
    TAKE(s->sel_cand, int2, R * G * dm->sel_chunks * dm->cand_stride);
    TAKE(s->sel, int, R * G * dm->slots);
    TAKE(s->sw_m, float, R * H * units);
    TAKE(s->sw_l, float, R * H * units);
    TAKE(s->sw_o, float, R * H * units * dv);
    TAKE(s->y, bf16, R * H * dv);
    TAKE(d->x, float, R * C);
    TAKE(d->act, bf16, R * F);
    TAKE(d->logits, float, Bm * V);
    TAKE(d->stage, int, 1 + R);
    TAKE(d->pos, int, Bm);
    TAKE(row_slot, int, R);
    TAKE(row_pos, int, R);
    if (d->prompt_ok) {
        DecPrompt *pr = &d->pr;
        const size_t T = dm->T, CH = PROMPT_CHUNK < T ? PROMPT_CHUNK : T;
        const size_t kn = G * dk, vn = G * dv;
        TAKE(pr->tokens, int, T);
        TAKE(pr->x, float, T * C);
        TAKE(pr->q, bf16, T * H * dk);
        for (int b = 0; b < 3; b++) {
            TAKE(pr->k[b], bf16, T * kn);
            TAKE(pr->v[b], bf16, T * vn);
        }
        TAKE(pr->g, bf16, T * 3 * H);
        TAKE(pr->y, bf16, T * H * dv);
        TAKE(pr->xn, bf16, CH * C);
        TAKE(pr->proj, bf16, CH * pr->stride);
        TAKE(pr->fc, bf16, CH * F);
        if (c->mlp == NSA_MLP_SWIGLU) TAKE(pr->up, bf16, CH * F);
        TAKE(pr->rstd, float, CH);
        TAKE(pr->gates, float, CH * 3 * H);
    }
#undef TAKE
    if (base) {
        s->rope = rope;
        s->row_slot = row_slot;
        s->row_pos = row_pos;
    }
    return cur;
}

static void releaseAll(NsaCudaDecoder *d) {
    if (d->graphs)
        for (int b = 0; b <= d->opt.max_batch; b++)
            if (d->graphs[b]) cudaGraphExecDestroy(d->graphs[b]);
    if (d->prefill_graphs)
        for (int r = 0; r <= d->R; r++)
            if (d->prefill_graphs[r]) cudaGraphExecDestroy(d->prefill_graphs[r]);
    nsaAttnCudaPlanFree(d->pr.plan);
    gemmContextDestroy(&d->pr.gemm);
    if (d->arena) cudaFree(d->arena);
    if (d->stage_host) cudaFreeHost(d->stage_host);
    if (d->logits_host) cudaFreeHost(d->logits_host);
    if (d->stream) cudaStreamDestroy(d->stream);
    free(d->graphs);
    free(d->prefill_graphs);
    free(d->pos_host);
    free(d->lw);
    free(d->cache);
    free(d);
}

static NsaAttnDims promptDims(const NsaCudaDecoder *d, int S) {
    const NsaModelConfig *c = &d->cfg;
    NsaAttnDims md = {};
    md.B = 1;
    md.S = S;
    md.H = c->n_heads;
    md.G = c->n_kv_groups;
    md.d_k = c->d_k;
    md.d_v = c->d_v;
    md.cmp_len = c->cmp_len;
    md.cmp_stride = c->cmp_stride;
    md.sel_len = c->sel_len;
    md.n_sel = c->n_sel;
    md.window = c->window;
    return md;
}

/* Whether this decoder has the prompt pass, with the reason in
 * prefill_path: it needs the fast op (phi = avg, the op's head sizes and
 * limits, which nsaAttnCudaPlanMeasure checks) and a context of more than
 * PROMPT_MIN_POSITIONS. */
static void promptDecide(NsaCudaDecoder *d) {
    const NsaModelConfig *c = &d->cfg;
    char *why = d->prefill_path;
    const size_t len = sizeof d->prefill_path;
    char passes[64];
    snprintf(passes, sizeof passes, "passes of up to %d positions", DEC_PREFILL_ROWS);
    d->prompt_ok = 0;
    if (c->phi == NSA_PHI_MLP) {
        snprintf(why, len, "%s, because phi = mlp and the fast NSA op pools with avg", passes);
        return;
    }
    if (d->dims.T <= PROMPT_MIN_POSITIONS) {
        snprintf(why, len, "%s, because max_context (%d) is at most %d positions, where they beat "
                           "the prompt pass's start-up",
                 passes, d->dims.T, PROMPT_MIN_POSITIONS);
        return;
    }
    const NsaAttnDims md = promptDims(d, d->dims.T);
    NsaError e = {{0}};
    size_t state = 0, scratch = 0;
    if (nsaAttnCudaPlanMeasure(&md, NULL, &state, &scratch, &e)) {
        snprintf(why, len, "%s, because %s", passes, e.message);
        return;
    }
    d->prompt_ok = 1;
    d->pr.stride = attnInputsStride(c->n_heads, c->n_kv_groups, c->d_k, c->d_v);
    snprintf(why, len, "prompt pass: an empty slot's prompt of more than %d positions at once "
                       "through GEMMs and the fast NSA op; %s otherwise",
             PROMPT_MIN_POSITIONS, passes);
}

static int createInto(NsaCudaDecoder *d, NsaError *err) {
    const NsaModelConfig *c = &d->cfg;
    CUDA_CHECK(cudaSetDevice(d->opt.device_ordinal), err);
    CUDA_CHECK(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), err);
    const size_t L = c->n_layers, Bm = d->opt.max_batch;
    d->lw = (DecLayerWeights *)calloc(L, sizeof *d->lw);
    d->cache = (DecLayerCache *)calloc(L, sizeof *d->cache);
    d->pos_host = (int *)calloc(Bm, sizeof(int));
    d->graphs = (cudaGraphExec_t *)calloc(Bm + 1, sizeof(cudaGraphExec_t));
    d->prefill_graphs = (cudaGraphExec_t *)calloc((size_t)d->R + 1, sizeof(cudaGraphExec_t));
    if (!d->lw || !d->cache || !d->pos_host || !d->graphs || !d->prefill_graphs)
        return nsaErrorf(err, "nsa decoder (cuda): out of host memory");
    d->launch.stream = d->stream;
    if (decOverlapSupported(&d->launch.overlap, err) || decAttnPrepare(&d->dims, err)) return -1;
    promptDecide(d);
    d->arena_bytes = plan(d, NULL);
    CUDA_CHECK(cudaMalloc(&d->arena, d->arena_bytes), err);
    CUDA_CHECK(cudaMemset(d->arena, 0, d->arena_bytes), err);
    plan(d, (char *)d->arena);
    if (d->prompt_ok) {
        const NsaAttnDims md = promptDims(d, d->dims.T);
        d->pr.plan = nsaAttnCudaPlanCreate(&md, NULL, err);
        if (!d->pr.plan || gemmContextCreate(&d->pr.gemm, NSA_PREC_BF16, PROMPT_GEMM_WORKSPACE, err))
            return -1;
    }
    CUDA_CHECK(cudaMallocHost((void **)&d->stage_host, (1 + (size_t)d->R) * sizeof(int)), err);
    CUDA_CHECK(cudaMallocHost((void **)&d->logits_host, Bm * c->vocab_size * sizeof(float)), err);
    /* RoPE table: cos, sin in double, as the CPU engine's */
    const size_t rope_n = (size_t)d->dims.T * c->d_k;
    float *rope = (float *)malloc(rope_n * sizeof(float));
    if (!rope) return nsaErrorf(err, "nsa decoder (cuda): out of host memory for the RoPE table");
    ropeTableHost(rope, d->dims.T, c->d_k, c->rope_base);
    cudaError_t e = cudaMemcpy((void *)d->scratch.rope, rope, rope_n * sizeof(float),
                               cudaMemcpyHostToDevice);
    free(rope);
    if (e != cudaSuccess)
        return nsaErrorf(err, "nsa decoder (cuda): uploading the RoPE table: %s",
                         cudaGetErrorString(e));
    return 0;
}

extern "C" NsaCudaDecoder *nsaCudaDecoderCreate(const NsaModelConfig *cfg, const NsaLayout *layout,
                                                const NsaDecoderOptions *opt, NsaError *err) {
    if (checkLimits(cfg, opt, err)) return NULL;
    NsaCudaDecoder *d = (NsaCudaDecoder *)calloc(1, sizeof *d);
    if (!d) {
        nsaErrorf(err, "nsa decoder (cuda): out of host memory");
        return NULL;
    }
    d->cfg = *cfg;
    d->layout = layout;
    d->opt = *opt;
    d->F = nsaLayoutMlpHidden(cfg);
    const int H = cfg->n_heads, G = cfg->n_kv_groups;
    d->P = H * cfg->d_k + 3 * G * (cfg->d_k + cfg->d_v) + 3 * H;
    const int prefill_rows = DEC_PREFILL_ROWS < opt->max_context ? DEC_PREFILL_ROWS : opt->max_context;
    d->R = opt->max_batch > prefill_rows ? opt->max_batch : prefill_rows;
    DecDims *dm = &d->dims;
    dm->B = 0;
    dm->H = H;
    dm->G = G;
    dm->dk = cfg->d_k;
    dm->dv = cfg->d_v;
    dm->T = opt->max_context;
    /* the rings hold R - 1 rows more than a row reads: a prefill pass of R
     * rows appends every row before the first one reads */
    const int window = cfg->window < opt->max_context ? cfg->window : opt->max_context;
    dm->W = window + d->R - 1 < opt->max_context ? window + d->R - 1 : opt->max_context;
    dm->raw_ring = cfg->cmp_len + d->R - 1;
    const int nc = nsaNumCmpBlocks(opt->max_context, cfg->cmp_len, cfg->cmp_stride);
    dm->Nc = nc > 0 ? nc : 1;
    dm->n_chunks = (dm->Nc + DEC_CMP_CHUNK - 1) / DEC_CMP_CHUNK;
    dm->l = cfg->cmp_len;
    dm->d = cfg->cmp_stride;
    dm->l_sel = cfg->sel_len;
    dm->n_sel = cfg->n_sel;
    dm->slots = nsaNumSelSlots(cfg->n_sel);
    dm->window = cfg->window;
    decSelectDims(dm);
    dm->sel_units = dm->slots * ((cfg->sel_len + DEC_UNIT - 1) / DEC_UNIT);
    dm->win_units = (window + DEC_UNIT - 1) / DEC_UNIT;
    dm->proj_stride = d->P;
    dm->phi_mlp = cfg->phi == NSA_PHI_MLP;
    if (createInto(d, err)) {
        releaseAll(d);
        return NULL;
    }
    return d;
}

extern "C" void nsaCudaDecoderFree(NsaCudaDecoder *d) {
    if (!d) return;
    /* teardown cannot report: a failure here (a device already lost) must
     * not stop the release of what can still be released */
    (void)cudaSetDevice(d->opt.device_ordinal);
    if (d->stream) (void)cudaStreamSynchronize(d->stream);
    (void)cudaGetLastError();
    releaseAll(d);
}

/* ---- weights ----------------------------------------------------------------- */

/* Round to nearest even; NaN stays NaN. */
static uint16_t toBf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static int uploadBf16(void *dst, const float *src, size_t n, NsaError *err) {
    uint16_t *h = (uint16_t *)malloc(n * sizeof(uint16_t));
    if (!h) return nsaErrorf(err, "nsa decoder (cuda): out of host memory for %zu values", n);
    for (size_t i = 0; i < n; i++) h[i] = toBf16(src[i]);
    cudaError_t e = cudaMemcpy(dst, h, n * sizeof(uint16_t), cudaMemcpyHostToDevice);
    free(h);
    if (e != cudaSuccess)
        return nsaErrorf(err, "nsa decoder (cuda): cudaMemcpy of a weight: %s",
                         cudaGetErrorString(e));
    return 0;
}

static int uploadF32(float *dst, const float *src, size_t n, NsaError *err) {
    CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice), err);
    return 0;
}

extern "C" int nsaCudaDecoderSetTensor(NsaCudaDecoder *d, int i, const float *src, NsaError *err) {
    CUDA_CHECK(cudaSetDevice(d->opt.device_ordinal), err);
    const NsaLayout *lay = d->layout;
    const NsaModelConfig *c = &d->cfg;
    const size_t n = lay->entries[i].info.numel, C = c->dim;
    if (i == lay->tok_emb) return uploadF32(d->tok_emb, src, n, err);
    if (i == lay->final_norm) return uploadF32(d->final_norm, src, n, err);
    if (i == lay->lm_head) return uploadBf16(d->lm_head, src, n, err);
    const size_t qn = (size_t)c->n_heads * c->d_k, kn = (size_t)c->n_kv_groups * c->d_k;
    const size_t vn = (size_t)c->n_kv_groups * c->d_v;
    for (int l = 0; l < c->n_layers; l++) {
        const NsaLayerIndex *li = &lay->layers[l];
        DecLayerWeights *w = &d->lw[l];
        /* rows of the concatenated attention projection */
        const int parts[8] = {li->wq, li->wk_cmp, li->wv_cmp, li->wk_sel,
                              li->wv_sel, li->wk_win, li->wv_win, li->w_gate};
        const size_t rows0[8] = {0, qn, qn + kn, qn + kn + vn, qn + 2 * kn + vn,
                                 qn + 2 * kn + 2 * vn, qn + 3 * kn + 2 * vn, qn + 3 * kn + 3 * vn};
        for (int p = 0; p < 8; p++)
            if (i == parts[p]) return uploadBf16(w->w_attn + rows0[p] * C, src, n, err);
        if (i == li->wo) return uploadBf16(w->wo, src, n, err);
        if (i == li->w_fc) return uploadBf16(w->w_fc, src, n, err);
        if (i == li->w_up) return uploadBf16(w->w_fc + (size_t)d->F * C, src, n, err);
        if (i == li->w_proj) return uploadBf16(w->w_proj, src, n, err);
        if (i == li->attn_norm) return uploadF32(w->attn_norm, src, n, err);
        if (i == li->mlp_norm) return uploadF32(w->mlp_norm, src, n, err);
        const int phi[6] = {li->phi_k_pos, li->phi_k_w1, li->phi_k_w2,
                            li->phi_v_pos, li->phi_v_w1, li->phi_v_w2};
        for (int p = 0; p < 6; p++)
            if (phi[p] >= 0 && i == phi[p]) return uploadF32(w->phi[p], src, n, err);
    }
    return nsaErrorf(err, "nsa decoder (cuda): tensor %d (%s) has no place", i,
                     lay->entries[i].name);
}

/* ---- steps -------------------------------------------------------------------- */

/* Enqueues one pass of B rows: a decode step (slots stage[0] ..
 * stage[0]+B-1, a token each) or a prefill pass (B tokens of slot
 * stage[0], at its next B positions). */
static int enqueuePass(NsaCudaDecoder *d, int B, int prefill, NsaError *err) {
    const NsaModelConfig *c = &d->cfg;
    cudaStream_t st = d->stream;
    const DecLaunch *ln = &d->launch;
    /* the first kernel follows a copy, not a kernel: it does not overlap */
    const DecLaunch first = {st, 0};
    const int C = c->dim, V = c->vocab_size, H = c->n_heads, dv = c->d_v, F = d->F;
    DecDims dm = d->dims;
    dm.B = B;
    dm.pool_in_append = !prefill;
    DecScratch *s = &d->scratch;
    CUDA_CHECK(cudaMemcpyAsync(d->stage, d->stage_host, (size_t)(1 + B) * sizeof(int),
                               cudaMemcpyHostToDevice, st),
               err);
    if (decRows((int *)s->row_slot, (int *)s->row_pos, d->stage, d->pos, B, prefill, &first, err) ||
        decEmbed(d->x, d->tok_emb, d->stage + 1, B, C, ln, err))
        return -1;
    for (int i = 0; i < c->n_layers; i++) {
        const DecLayerWeights *w = &d->lw[i];
        const DecLayerCache *k = &d->cache[i];
        DecGemv g = {};
        g.w = w->w_attn; g.N = d->P; g.K = C; g.B = B;
        g.x = d->x; g.norm_w = w->attn_norm; g.eps = c->norm_eps; g.out = s->proj;
        if (decGemv(&g, DEC_STORE, ln, err)) return -1;
        if (decAppend(&dm, k, s, ln, err) || (prefill && decPool(&dm, k, s, ln, err)) ||
            decCmp(&dm, k, s, ln, err) || decSelect(&dm, s, ln, err) ||
            decSelWin(&dm, k, s, ln, err) || decCombine(&dm, s, ln, err))
            return -1;
        g = DecGemv{};
        g.w = w->wo; g.N = C; g.K = H * dv; g.B = B; g.xb = s->y; g.out = d->x;
        if (decGemv(&g, DEC_ADD, ln, err)) return -1;
        g = DecGemv{};
        g.w = w->w_fc; g.N = F; g.K = C; g.B = B;
        g.x = d->x; g.norm_w = w->mlp_norm; g.eps = c->norm_eps; g.outb = d->act;
        if (decGemv(&g, c->mlp == NSA_MLP_SWIGLU ? DEC_SWIGLU : DEC_SILU, ln, err)) return -1;
        g = DecGemv{};
        g.w = w->w_proj; g.N = C; g.K = F; g.B = B; g.xb = d->act; g.out = d->x;
        if (decGemv(&g, DEC_ADD, ln, err)) return -1;
    }
    /* a prefill pass hands out the logits of its last token only */
    const int out_rows = prefill ? 1 : B;
    DecGemv g = {};
    g.w = d->lm_head; g.N = V; g.K = C; g.B = out_rows;
    g.x = d->x + (size_t)(B - out_rows) * C; g.norm_w = d->final_norm; g.eps = c->norm_eps;
    g.out = d->logits;
    if (decGemv(&g, DEC_STORE, ln, err)) return -1;
    if (decAdvance(d->pos, d->stage, B, prefill, ln, err)) return -1;
    CUDA_CHECK(cudaMemcpyAsync(d->logits_host, d->logits, (size_t)out_rows * V * sizeof(float),
                               cudaMemcpyDeviceToHost, st),
               err);
    return 0;
}

/* The graph of a B-row pass, captured on first use. */
static int graphFor(NsaCudaDecoder *d, int B, int prefill, cudaGraphExec_t *out, NsaError *err) {
    cudaGraphExec_t *slot = prefill ? &d->prefill_graphs[B] : &d->graphs[B];
    if (*slot) {
        *out = *slot;
        return 0;
    }
    CUDA_CHECK(cudaStreamBeginCapture(d->stream, cudaStreamCaptureModeThreadLocal), err);
    const int rc = enqueuePass(d, B, prefill, err);
    cudaGraph_t graph = NULL;
    const cudaError_t e = cudaStreamEndCapture(d->stream, &graph);
    if (rc) {
        if (graph) cudaGraphDestroy(graph);
        return -1;
    }
    if (e != cudaSuccess)
        return nsaErrorf(err, "nsa decoder (cuda): capturing the %d-row %s: %s", B,
                         prefill ? "prefill pass" : "step", cudaGetErrorString(e));
    const cudaError_t ie = cudaGraphInstantiate(slot, graph, 0);
    cudaGraphDestroy(graph);
    if (ie != cudaSuccess) {
        *slot = NULL;
        return nsaErrorf(err, "nsa decoder (cuda): instantiating the %d-row %s: %s", B,
                         prefill ? "prefill pass" : "step", cudaGetErrorString(ie));
    }
    *out = *slot;
    return 0;
}

/* Runs one pass of B rows, the slot and tokens in stage_host already. */
static int runPass(NsaCudaDecoder *d, int B, int prefill, NsaError *err) {
    cudaGraphExec_t exec = NULL;
    if (graphFor(d, B, prefill, &exec, err)) return -1;
    CUDA_CHECK(cudaGraphLaunch(exec, d->stream), err);
    CUDA_CHECK(cudaStreamSynchronize(d->stream), err);
    return 0;
}

extern "C" int nsaCudaDecoderStep(NsaCudaDecoder *d, int B, const int32_t *tokens, float *logits,
                                  NsaError *err) {
    CUDA_CHECK(cudaSetDevice(d->opt.device_ordinal), err);
    d->stage_host[0] = 0;
    for (int b = 0; b < B; b++) d->stage_host[1 + b] = tokens[b];
    if (runPass(d, B, 0, err)) return -1;
    for (int b = 0; b < B; b++) d->pos_host[b]++;
    if (logits)
        memcpy(logits, d->logits_host, (size_t)B * d->cfg.vocab_size * sizeof(float));
    return 0;
}

/* The prompt pass: n tokens into empty slot, every layer's row-local work
 * PROMPT_CHUNK rows at a time (RMSNorm, the eight projections as one GEMM,
 * RoPE and the sigmoid into the op's inputs; Wo and the MLP with their
 * residual adds in the GEMM epilogues), the attention over all n at once;
 * the caches filled from the op's inputs; the last row's logits. Enqueued
 * plainly (no graph: n varies) and synchronised once, at the end. */
static int promptPass(NsaCudaDecoder *d, int slot, const int32_t *tokens, int n, NsaError *err) {
    const NsaModelConfig *c = &d->cfg;
    const int C = c->dim, H = c->n_heads, G = c->n_kv_groups, dk = c->d_k, dv = c->d_v;
    const int F = d->F, P = d->P, V = c->vocab_size;
    DecPrompt *pr = &d->pr;
    cudaStream_t st = d->stream;
    const DecLaunch plain = {st, 0};
    CUDA_CHECK(cudaMemcpyAsync(pr->tokens, tokens, (size_t)n * sizeof(int), cudaMemcpyHostToDevice,
                               st),
               err);
    if (decEmbed(pr->x, d->tok_emb, pr->tokens, n, C, &plain, err)) return -1;
    const NsaAttnDims dims = promptDims(d, n);
    for (int i = 0; i < c->n_layers; i++) {
        const DecLayerWeights *w = &d->lw[i];
        for (int r0 = 0; r0 < n; r0 += PROMPT_CHUNK) {
            const int rows = n - r0 < PROMPT_CHUNK ? n - r0 : PROMPT_CHUNK;
            const size_t r = (size_t)r0;
            const AttnInputTensors ins = {pr->q + r * H * dk,
                                          {pr->k[0] + r * G * dk, pr->k[1] + r * G * dk,
                                           pr->k[2] + r * G * dk},
                                          {pr->v[0] + r * G * dv, pr->v[1] + r * G * dv,
                                           pr->v[2] + r * G * dv},
                                          pr->g + r * 3 * H};
            /* the RoPE table from position r0: the chunk is one sequence of
             * `rows` positions to attnInputsForward */
            if (rmsnormForwardTo(pr->xn, DTYPE_BF16, pr->rstd, pr->x + r * C, w->attn_norm,
                                 (size_t)rows, C, c->norm_eps, st, err) ||
                gemmRowMajorTo(&pr->gemm, st, 0, 1, rows, P, C, 1.0f, pr->xn, C, w->w_attn, C, 0.0f,
                               NULL, pr->stride, pr->proj, DTYPE_BF16, pr->stride, err) ||
                attnInputsForward(ins, pr->gates, pr->proj, DTYPE_BF16, d->scratch.rope + r * dk, 1,
                                  rows, H, G, dk, dv, st, err))
                return -1;
        }
        const NsaAttnDeviceInputs in = {pr->q, pr->k[0], pr->v[0], pr->k[1],
                                        pr->v[1], pr->k[2], pr->v[2], pr->g};
        const DecPromptInputs kv = {{pr->k[0], pr->k[1], pr->k[2]}, {pr->v[0], pr->v[1], pr->v[2]}};
        if (nsaAttnForwardCuda(pr->plan, &dims, &in, pr->y, NULL, NULL, st, err) ||
            decPromptCaches(&d->dims, &d->cache[i], slot, &kv, n, st, err))
            return -1;
        for (int r0 = 0; r0 < n; r0 += PROMPT_CHUNK) {
            const int rows = n - r0 < PROMPT_CHUNK ? n - r0 : PROMPT_CHUNK;
            float *x = pr->x + (size_t)r0 * C;
            if (linearForward(&pr->gemm, st, x, pr->y + (size_t)r0 * H * dv, w->wo, rows, H * dv, C,
                              1.0f, x, err) ||
                rmsnormForwardTo(pr->xn, DTYPE_BF16, pr->rstd, x, w->mlp_norm, (size_t)rows, C,
                                 c->norm_eps, st, err) ||
                linearForwardTo(&pr->gemm, st, pr->fc, DTYPE_BF16, pr->xn, w->w_fc, rows, C, F, err))
                return -1;
            if (c->mlp == NSA_MLP_SWIGLU) {
                if (linearForwardTo(&pr->gemm, st, pr->up, DTYPE_BF16, pr->xn, w->w_fc + (size_t)F * C,
                                    rows, C, F, err) ||
                    swigluForwardTo(pr->fc, DTYPE_BF16, pr->fc, pr->up, DTYPE_BF16, (size_t)rows * F,
                                    st, err))
                    return -1;
            } else if (siluForwardTo(pr->fc, DTYPE_BF16, pr->fc, DTYPE_BF16, (size_t)rows * F, st,
                                     err)) {
                return -1;
            }
            if (linearForward(&pr->gemm, st, x, pr->fc, w->w_proj, rows, F, C, 1.0f, x, err))
                return -1;
        }
    }
    DecGemv g = {};
    g.w = d->lm_head; g.N = V; g.K = C; g.B = 1;
    g.x = pr->x + (size_t)(n - 1) * C; g.norm_w = d->final_norm; g.eps = c->norm_eps;
    g.out = d->logits;
    if (decGemv(&g, DEC_STORE, &plain, err)) return -1;
    d->stage_host[0] = n;
    CUDA_CHECK(cudaMemcpyAsync(d->pos + slot, d->stage_host, sizeof(int), cudaMemcpyHostToDevice, st),
               err);
    CUDA_CHECK(cudaMemcpyAsync(d->logits_host, d->logits, (size_t)V * sizeof(float),
                               cudaMemcpyDeviceToHost, st),
               err);
    CUDA_CHECK(cudaStreamSynchronize(st), err);
    d->pos_host[slot] = n;
    return 0;
}

extern "C" const char *nsaCudaDecoderPrefillPath(const NsaCudaDecoder *d) { return d->prefill_path; }

extern "C" int nsaCudaDecoderPrefill(NsaCudaDecoder *d, int slot, const int32_t *tokens, int n,
                                     float *logits, NsaError *err) {
    CUDA_CHECK(cudaSetDevice(d->opt.device_ordinal), err);
    if (d->prompt_ok && d->pos_host[slot] == 0 && n > PROMPT_MIN_POSITIONS) {
        if (promptPass(d, slot, tokens, n, err)) return -1;
        if (logits) memcpy(logits, d->logits_host, (size_t)d->cfg.vocab_size * sizeof(float));
        return 0;
    }
    const int rows = d->R < DEC_PREFILL_ROWS ? d->R : DEC_PREFILL_ROWS;
    for (int i = 0; i < n; i += rows) {
        const int B = n - i < rows ? n - i : rows;
        d->stage_host[0] = slot;
        for (int r = 0; r < B; r++) d->stage_host[1 + r] = tokens[i + r];
        if (runPass(d, B, 1, err)) return -1;
        d->pos_host[slot] += B;
    }
    if (logits) memcpy(logits, d->logits_host, (size_t)d->cfg.vocab_size * sizeof(float));
    return 0;
}

extern "C" int nsaCudaDecoderReset(NsaCudaDecoder *d, int slot, NsaError *err) {
    CUDA_CHECK(cudaSetDevice(d->opt.device_ordinal), err);
    for (int s = 0; s < d->opt.max_batch; s++)
        if (slot < 0 || s == slot) d->pos_host[s] = 0;
    CUDA_CHECK(cudaMemcpy(d->pos, d->pos_host, (size_t)d->opt.max_batch * sizeof(int),
                          cudaMemcpyHostToDevice),
               err);
    return 0;
}

/* Copies rows [0, rows) of each group's [rows_per_group][row_bytes] block of
 * a [slot][group] cache from slot src to slot dst. */
static int copyCacheRows(NsaCudaDecoder *d, void *base, size_t rows_per_group, size_t row_bytes,
                         size_t rows, int dst, int src, NsaError *err) {
    if (rows == 0) return 0;
    const size_t pitch = rows_per_group * row_bytes, G = d->cfg.n_kv_groups;
    char *b = (char *)base;
    CUDA_CHECK(cudaMemcpy2DAsync(b + (size_t)dst * G * pitch, pitch, b + (size_t)src * G * pitch,
                                 pitch, rows * row_bytes, G, cudaMemcpyDeviceToDevice, d->stream),
               err);
    return 0;
}

extern "C" int nsaCudaDecoderCopySlot(NsaCudaDecoder *d, int dst, int src, NsaError *err) {
    CUDA_CHECK(cudaSetDevice(d->opt.device_ordinal), err);
    const DecDims *dm = &d->dims;
    const size_t dk = d->cfg.d_k, dv = d->cfg.d_v, live = (size_t)d->pos_host[src];
    const size_t kb = dk * sizeof(bf16), vb = dv * sizeof(bf16);
    /* the selection branch's caches: the live rows only; the rings and the
     * pooled blocks are small, so whole */
    for (int i = 0; i < d->cfg.n_layers; i++) {
        const DecLayerCache *k = &d->cache[i];
        if (copyCacheRows(d, k->k_sel, dm->T, kb, live, dst, src, err) ||
            copyCacheRows(d, k->v_sel, dm->T, vb, live, dst, src, err) ||
            copyCacheRows(d, k->k_win, dm->W, kb, dm->W, dst, src, err) ||
            copyCacheRows(d, k->v_win, dm->W, vb, dm->W, dst, src, err) ||
            copyCacheRows(d, k->kc, dm->Nc, kb, dm->Nc, dst, src, err) ||
            copyCacheRows(d, k->vc, dm->Nc, vb, dm->Nc, dst, src, err) ||
            copyCacheRows(d, k->k_raw, dm->raw_ring, dk * sizeof(float), dm->raw_ring, dst, src,
                          err) ||
            copyCacheRows(d, k->v_raw, dm->raw_ring, dv * sizeof(float), dm->raw_ring, dst, src,
                          err))
            return -1;
    }
    CUDA_CHECK(cudaMemcpyAsync(d->pos + dst, d->pos + src, sizeof(int), cudaMemcpyDeviceToDevice,
                               d->stream),
               err);
    CUDA_CHECK(cudaStreamSynchronize(d->stream), err);
    d->pos_host[dst] = d->pos_host[src];
    return 0;
}

extern "C" int nsaCudaDecoderPosition(const NsaCudaDecoder *d, int slot) {
    return d->pos_host[slot];
}
