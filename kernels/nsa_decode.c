/* nsa_decode.c - the public decoder API of libnsa (kernels/nsa.h): checks,
 * the CPU decoder's buffer plan, slot positions, and dispatch to the CPU
 * reference step (kernels/cpu/decode.c) or, when built with nvcc, the CUDA
 * decoder (kernels/cuda/decode/decode.h). A CUDA decoder in a build without CUDA is
 * an error, never a silent CPU run. */
#include "nsa.h"
#include "nsa_layout.h"
#include "nsa_cpu_pool.h"
#include "cpu/decode.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef NSA_HAVE_CUDA
#include "cuda/decode/decode.h"
#define NSA_DECODE_CUDA 1
#endif

/* Rows a CPU prefill call pushes through the layers together (named in
 * nsaDecoderPrefillPath's sentence). */
#define DECODE_PREFILL_ROWS 64

struct NsaDecoder {
    NsaModelConfig cfg;
    NsaDecoderOptions opt;
    NsaLayout layout;
    NsaCpuDecoder cpu;
#ifdef NSA_DECODE_CUDA
    NsaCudaDecoder *cuda;
#endif
};

static int isCuda(const NsaDecoder *d) { return d->opt.device == NSA_DEVICE_CUDA; }

/* ---- the CPU plan ----------------------------------------------------------- */

static size_t planTake(size_t *cursor, size_t elems) {
    size_t at = *cursor;
    *cursor += (elems + 15) / 16 * 16;
    return at;
}

static void cpuRelease(NsaCpuDecoder *cd) {
    nsaCpuPoolFree(cd->pool);
    free(cd->arena);
    free(cd->layers);
    free(cd->taken);
    free(cd->sel);
    free(cd->pos);
    free(cd->row_slot);
    free(cd->row_pos);
    memset(cd, 0, sizeof *cd);
}

static int cpuAlloc(NsaCpuDecoder *cd, const NsaModelConfig *cfg, const NsaLayout *layout,
                    const NsaDecoderOptions *opt, NsaError *err) {
    memset(cd, 0, sizeof *cd);
    cd->cfg = *cfg;
    cd->layout = layout;
    cd->f64 = opt->precision == NSA_PREC_F64;
    cd->real_size = cd->f64 ? sizeof(double) : sizeof(float);
    cd->max_batch = opt->max_batch;
    cd->max_context = opt->max_context;
    cd->max_rows = opt->max_batch > DECODE_PREFILL_ROWS ? opt->max_batch : DECODE_PREFILL_ROWS;
    cd->window_rows = cfg->window < opt->max_context ? cfg->window : opt->max_context;
    cd->max_cmp_blocks = nsaNumCmpBlocks(opt->max_context, cfg->cmp_len, cfg->cmp_stride);
    cd->max_sel_blocks = nsaNumSelBlocks(opt->max_context, cfg->sel_len);

    const size_t T = (size_t)opt->max_context, Bm = (size_t)opt->max_batch;
    const size_t R = (size_t)cd->max_rows, C = cfg->dim, V = cfg->vocab_size;
    const size_t H = cfg->n_heads, G = cfg->n_kv_groups, dk = cfg->d_k, dv = cfg->d_v;
    const size_t F = (size_t)nsaLayoutMlpHidden(cfg), L = cfg->n_layers, l = cfg->cmp_len;
    const size_t Nc = cd->max_cmp_blocks > 0 ? (size_t)cd->max_cmp_blocks : 1;
    const size_t Wr = (size_t)cd->window_rows, dmax = dk > dv ? dk : dv;

    cd->layers = calloc(L, sizeof *cd->layers);
    if (!cd->layers) return nsaErrorf(err, "nsa decoder: out of memory planning %zu layers", L);
    cd->slot_sel_k = T * G * dk;
    cd->slot_sel_v = T * G * dv;
    cd->slot_win_k = Wr * G * dk;
    cd->slot_win_v = Wr * G * dv;
    cd->slot_raw_k = l * G * dk;
    cd->slot_raw_v = l * G * dv;
    cd->slot_kc = Nc * G * dk;
    cd->slot_vc = Nc * G * dv;

    size_t a = 0;
    cd->weights = planTake(&a, layout->total);
    for (size_t i = 0; i < L; i++) {
        NsaCpuDecodeLayer *cl = &cd->layers[i];
        cl->k_sel = planTake(&a, Bm * cd->slot_sel_k);
        cl->v_sel = planTake(&a, Bm * cd->slot_sel_v);
        cl->k_win = planTake(&a, Bm * cd->slot_win_k);
        cl->v_win = planTake(&a, Bm * cd->slot_win_v);
        cl->k_raw = planTake(&a, Bm * cd->slot_raw_k);
        cl->v_raw = planTake(&a, Bm * cd->slot_raw_v);
        cl->kc = planTake(&a, Bm * cd->slot_kc);
        cl->vc = planTake(&a, Bm * cd->slot_vc);
    }
    cd->x = planTake(&a, R * C);
    cd->xn = planTake(&a, R * C);
    cd->rstd = planTake(&a, R);
    cd->q = planTake(&a, R * H * dk);
    for (int b = 0; b < 3; b++) {
        cd->k[b] = planTake(&a, R * G * dk);
        cd->v[b] = planTake(&a, R * G * dv);
        cd->o[b] = planTake(&a, R * H * dv);
    }
    cd->gates = planTake(&a, R * H * 3);
    cd->lse_cmp = planTake(&a, R * H);
    cd->y = planTake(&a, R * H * dv);
    cd->proj = planTake(&a, R * C);
    cd->mid = planTake(&a, R * C);
    cd->fc = planTake(&a, R * F);
    cd->up = planTake(&a, R * F);
    cd->act = planTake(&a, R * F);
    cd->logits = planTake(&a, R * V);
    cd->rope = planTake(&a, R * dk);
    cd->block_k = planTake(&a, l * G * dk);
    cd->block_v = planTake(&a, l * G * dv);
    cd->hidden = planTake(&a, G * dmax);
    cd->scores = planTake(&a, (size_t)cd->max_sel_blocks);
    cd->arena_elems = a;

    if (a > SIZE_MAX / cd->real_size)
        return nsaErrorf(err, "nsa decoder: %zu cache elements overflow size_t", a);
    cd->arena = calloc(a, cd->real_size);
    cd->taken = calloc((size_t)cd->max_sel_blocks, 1);
    cd->sel = calloc((size_t)nsaNumSelSlots(cfg->n_sel), sizeof(int32_t));
    cd->pos = calloc(Bm, sizeof(int32_t));
    cd->row_slot = calloc(R, sizeof(int32_t));
    cd->row_pos = calloc(R, sizeof(int32_t));
    if (!cd->arena || !cd->taken || !cd->sel || !cd->pos || !cd->row_slot || !cd->row_pos) {
        cpuRelease(cd);
        return nsaErrorf(err, "nsa decoder: out of memory for %.1f MB of weights and caches",
                         (double)a * (opt->precision == NSA_PREC_F64 ? 8 : 4) / 1e6);
    }
    if (opt->threads > 1 && !(cd->pool = nsaCpuPoolCreate(opt->threads, err))) {
        cpuRelease(cd);
        return -1;
    }
    return 0;
}

/* ---- create / free ------------------------------------------------------------ */

NsaDecoder *nsaDecoderCreate(const NsaModelConfig *cfg, const NsaDecoderOptions *opt,
                             NsaError *err) {
    if (!cfg || !opt) {
        nsaErrorf(err, "nsa decoder: nsaDecoderCreate needs a config and options (got NULL)");
        return NULL;
    }
    if (nsaModelConfigValidate(cfg, err)) return NULL;
    if (opt->device != NSA_DEVICE_CPU && opt->device != NSA_DEVICE_CUDA) {
        nsaErrorf(err, "nsa decoder: device = %d is unknown; allowed: %d (cpu) or %d (cuda)",
                  (int)opt->device, NSA_DEVICE_CPU, NSA_DEVICE_CUDA);
        return NULL;
    }
    if (opt->max_batch < 1 || opt->max_batch > 4096) {
        nsaErrorf(err, "nsa decoder: max_batch = %d; allowed: 1 to 4096", opt->max_batch);
        return NULL;
    }
    if (opt->threads < 0 || opt->threads > 256) {
        nsaErrorf(err, "nsa decoder: threads = %d; allowed: 0 (one thread) to 256", opt->threads);
        return NULL;
    }
    if (opt->max_context < 1 || opt->max_context > (1 << 24)) {
        nsaErrorf(err, "nsa decoder: max_context = %d; allowed: 1 to %d", opt->max_context,
                  1 << 24);
        return NULL;
    }
    if (opt->device == NSA_DEVICE_CPU && opt->precision != NSA_PREC_F32 &&
        opt->precision != NSA_PREC_F64) {
        nsaErrorf(err, "nsa decoder: precision %d on the CPU; allowed: %d (fp32) or %d (fp64)",
                  (int)opt->precision, NSA_PREC_F32, NSA_PREC_F64);
        return NULL;
    }
    if (opt->device == NSA_DEVICE_CUDA && opt->precision != NSA_PREC_BF16) {
        nsaErrorf(err, "nsa decoder: precision %d on CUDA; allowed: %d (bf16)",
                  (int)opt->precision, NSA_PREC_BF16);
        return NULL;
    }
#ifndef NSA_DECODE_CUDA
    if (opt->device == NSA_DEVICE_CUDA) {
        nsaErrorf(err, "nsa decoder: this build has no CUDA engine");
        return NULL;
    }
#endif
    NsaDecoder *d = calloc(1, sizeof *d);
    if (!d) {
        nsaErrorf(err, "nsa decoder: out of memory allocating the handle");
        return NULL;
    }
    d->cfg = *cfg;
    d->opt = *opt;
    if (nsaLayoutBuild(&d->layout, cfg, err)) {
        free(d);
        return NULL;
    }
#ifdef NSA_DECODE_CUDA
    if (isCuda(d)) {
        d->cuda = nsaCudaDecoderCreate(cfg, &d->layout, opt, err);
        if (!d->cuda) {
            nsaLayoutFree(&d->layout);
            free(d);
            return NULL;
        }
        return d;
    }
#endif
    if (cpuAlloc(&d->cpu, cfg, &d->layout, opt, err)) {
        nsaLayoutFree(&d->layout);
        free(d);
        return NULL;
    }
    return d;
}

void nsaDecoderFree(NsaDecoder *d) {
    if (!d) return;
#ifdef NSA_DECODE_CUDA
    if (d->cuda) nsaCudaDecoderFree(d->cuda);
#endif
    cpuRelease(&d->cpu);
    nsaLayoutFree(&d->layout);
    free(d);
}

const NsaModelConfig *nsaDecoderGetConfig(const NsaDecoder *d) { return d ? &d->cfg : NULL; }
const NsaDecoderOptions *nsaDecoderGetOptions(const NsaDecoder *d) { return d ? &d->opt : NULL; }
NsaCpuDecoder *nsaDecoderCpuEngine(NsaDecoder *d) { return d && !isCuda(d) ? &d->cpu : NULL; }

/* ---- weights ---------------------------------------------------------------- */

int nsaDecoderNumTensors(const NsaDecoder *d) { return d ? d->layout.n_tensors : 0; }

const NsaTensorInfo *nsaDecoderTensorInfo(const NsaDecoder *d, int i) {
    if (!d || i < 0 || i >= d->layout.n_tensors) return NULL;
    return &d->layout.entries[i].info;
}

int nsaDecoderFindTensor(const NsaDecoder *d, const char *name) {
    return d ? nsaLayoutFind(&d->layout, name) : -1;
}

static int setTensor(NsaDecoder *d, int i, const float *src, const double *src64, NsaError *err) {
#ifdef NSA_DECODE_CUDA
    if (isCuda(d)) return nsaCudaDecoderSetTensor(d->cuda, i, src, err);
#endif
    if (d->cpu.f64)
        nsaCpuDecodeSetTensorF64(&d->cpu, i, src, src64);
    else
        nsaCpuDecodeSetTensorF32(&d->cpu, i, src, src64);
    (void)err;
    return 0;
}

int nsaDecoderSetTensor(NsaDecoder *d, int i, const float *src, NsaError *err) {
    if (!d) return nsaErrorf(err, "nsa decoder: no decoder (NULL)");
    if (i < 0 || i >= d->layout.n_tensors)
        return nsaErrorf(err, "nsa decoder: tensor index %d out of range; allowed: 0 to %d", i,
                         d->layout.n_tensors - 1);
    if (!src)
        return nsaErrorf(err, "nsa decoder: tensor %s: NULL host buffer", d->layout.entries[i].name);
    return setTensor(d, i, src, NULL, err);
}

int nsaDecoderLoadModel(NsaDecoder *d, NsaModel *m, NsaError *err) {
    if (!d || !m) return nsaErrorf(err, "nsa decoder: LoadModel needs a decoder and a model");
    if (memcmp(nsaModelGetConfig(m), &d->cfg, sizeof d->cfg) != 0)
        return nsaErrorf(err, "nsa decoder: the model's config differs from the decoder's; "
                              "allowed: a model built from the same NsaModelConfig");
    const NsaEngineOptions *mo = nsaModelGetOptions(m);
    /* a CPU decoder reads a CPU model's arena at its precision */
    const void *arena = isCuda(d) ? NULL : nsaModelHostArena(m, NSA_ARENA_PARAMS);
    size_t largest = 0;
    for (int i = 0; i < d->layout.n_tensors; i++)
        if (d->layout.entries[i].info.numel > largest) largest = d->layout.entries[i].info.numel;
    float *buf = arena && mo->precision == NSA_PREC_F32 ? NULL : malloc(largest * sizeof(float));
    if (!arena && !buf)
        return nsaErrorf(err, "nsa decoder: out of memory for a %zu-float tensor", largest);
    int rc = 0;
    for (int i = 0; i < d->layout.n_tensors && rc == 0; i++) {
        const size_t off = d->layout.entries[i].info.offset;
        if (arena && mo->precision == NSA_PREC_F64)
            rc = setTensor(d, i, NULL, (const double *)arena + off, err);
        else if (arena)
            rc = setTensor(d, i, (const float *)arena + off, NULL, err);
        else if ((rc = nsaModelGetTensor(m, NSA_ARENA_PARAMS, i, buf, err)) == 0)
            rc = setTensor(d, i, buf, NULL, err);
    }
    free(buf);
    return rc;
}

/* ---- slots and steps ----------------------------------------------------------- */

int nsaDecoderReset(NsaDecoder *d, int slot, NsaError *err) {
    if (!d) return nsaErrorf(err, "nsa decoder: no decoder (NULL)");
    if (slot < -1 || slot >= d->opt.max_batch)
        return nsaErrorf(err, "nsa decoder: slot %d; allowed: -1 (all) or 0 to %d", slot,
                         d->opt.max_batch - 1);
#ifdef NSA_DECODE_CUDA
    if (isCuda(d)) return nsaCudaDecoderReset(d->cuda, slot, err);
#endif
    /* the caches need no clearing: a slot reads only positions it wrote */
    for (int s = 0; s < d->opt.max_batch; s++)
        if (slot < 0 || s == slot) d->cpu.pos[s] = 0;
    return 0;
}

/* Copies n elements of a per-slot cache from slot src to slot dst. */
static void cpuCopyCache(NsaCpuDecoder *cd, size_t base, size_t slot_elems, int dst, int src,
                         size_t n) {
    char *a = (char *)cd->arena;
    const size_t es = cd->real_size;
    memcpy(a + (base + (size_t)dst * slot_elems) * es, a + (base + (size_t)src * slot_elems) * es,
           n * es);
}

int nsaDecoderCopySlot(NsaDecoder *d, int dst, int src, NsaError *err) {
    if (!d) return nsaErrorf(err, "nsa decoder: no decoder (NULL)");
    if (dst < 0 || dst >= d->opt.max_batch || src < 0 || src >= d->opt.max_batch)
        return nsaErrorf(err, "nsa decoder: copy of slot %d into slot %d; allowed: slots 0 to %d",
                         src, dst, d->opt.max_batch - 1);
    if (dst == src) return 0;
#ifdef NSA_DECODE_CUDA
    if (isCuda(d)) return nsaCudaDecoderCopySlot(d->cuda, dst, src, err);
#endif
    NsaCpuDecoder *cd = &d->cpu;
    /* the selection branch's caches hold position u at row u: only the live
     * rows; the rings and the pooled blocks are small, so whole */
    const size_t live = (size_t)cd->pos[src], G = cd->cfg.n_kv_groups;
    for (int i = 0; i < cd->cfg.n_layers; i++) {
        const NsaCpuDecodeLayer *l = &cd->layers[i];
        cpuCopyCache(cd, l->k_sel, cd->slot_sel_k, dst, src, live * G * cd->cfg.d_k);
        cpuCopyCache(cd, l->v_sel, cd->slot_sel_v, dst, src, live * G * cd->cfg.d_v);
        cpuCopyCache(cd, l->k_win, cd->slot_win_k, dst, src, cd->slot_win_k);
        cpuCopyCache(cd, l->v_win, cd->slot_win_v, dst, src, cd->slot_win_v);
        cpuCopyCache(cd, l->k_raw, cd->slot_raw_k, dst, src, cd->slot_raw_k);
        cpuCopyCache(cd, l->v_raw, cd->slot_raw_v, dst, src, cd->slot_raw_v);
        cpuCopyCache(cd, l->kc, cd->slot_kc, dst, src, cd->slot_kc);
        cpuCopyCache(cd, l->vc, cd->slot_vc, dst, src, cd->slot_vc);
    }
    cd->pos[dst] = cd->pos[src];
    return 0;
}

int nsaDecoderPosition(const NsaDecoder *d, int slot) {
    if (!d || slot < 0 || slot >= d->opt.max_batch) return -1;
#ifdef NSA_DECODE_CUDA
    if (isCuda(d)) return nsaCudaDecoderPosition(d->cuda, slot);
#endif
    return d->cpu.pos[slot];
}

static int checkTokens(const NsaDecoder *d, const int32_t *tokens, int n, NsaError *err) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= d->cfg.vocab_size)
            return nsaErrorf(err, "nsa decoder: tokens[%d] = %d; allowed: 0 to %d", i,
                             (int)tokens[i], d->cfg.vocab_size - 1);
    return 0;
}

static int checkRoom(const NsaDecoder *d, int slot, int n, NsaError *err) {
    const int at = nsaDecoderPosition(d, slot);
    if ((int64_t)at + n > d->opt.max_context)
        return nsaErrorf(err,
                         "nsa decoder: slot %d holds %d tokens and %d more would pass "
                         "max_context (%d)",
                         slot, at, n, d->opt.max_context);
    return 0;
}

/* Copies the logits of CPU rows [first, first + n) out as fp32. */
static void cpuLogitsOut(const NsaCpuDecoder *cd, int first, int n, float *out) {
    const size_t V = cd->cfg.vocab_size, count = (size_t)n * V;
    if (cd->f64) {
        const double *src = (const double *)cd->arena + cd->logits + (size_t)first * V;
        for (size_t j = 0; j < count; j++) out[j] = (float)src[j];
    } else {
        memcpy(out, (const float *)cd->arena + cd->logits + (size_t)first * V,
               count * sizeof(float));
    }
}

static void cpuRun(NsaCpuDecoder *cd, const int32_t *tokens, int rows) {
    if (cd->f64)
        nsaCpuDecodeRowsF64(cd, tokens, rows);
    else
        nsaCpuDecodeRowsF32(cd, tokens, rows);
}

const char *nsaDecoderPrefillPath(const NsaDecoder *d) {
    if (!d) return NULL;
#ifdef NSA_DECODE_CUDA
    if (isCuda(d)) return nsaCudaDecoderPrefillPath(d->cuda);
#endif
    return "reference rows, up to 64 positions a call (DECODE_PREFILL_ROWS)";
}

int nsaDecoderPrefill(NsaDecoder *d, int slot, const int32_t *tokens, int n, float *logits,
                      NsaError *err) {
    if (!d) return nsaErrorf(err, "nsa decoder: no decoder (NULL)");
    if (slot < 0 || slot >= d->opt.max_batch)
        return nsaErrorf(err, "nsa decoder: slot %d; allowed: 0 to %d", slot,
                         d->opt.max_batch - 1);
    if (n < 1 || !tokens)
        return nsaErrorf(err, "nsa decoder: prefill of %d tokens; allowed: 1 or more", n);
    if (checkTokens(d, tokens, n, err) || checkRoom(d, slot, n, err)) return -1;
#ifdef NSA_DECODE_CUDA
    if (isCuda(d)) return nsaCudaDecoderPrefill(d->cuda, slot, tokens, n, logits, err);
#endif
    NsaCpuDecoder *cd = &d->cpu;
    for (int done = 0; done < n;) {
        const int rows = n - done < cd->max_rows ? n - done : cd->max_rows;
        for (int r = 0; r < rows; r++) {
            cd->row_slot[r] = slot;
            cd->row_pos[r] = cd->pos[slot] + r;
        }
        cpuRun(cd, tokens + done, rows);
        cd->pos[slot] += rows;
        done += rows;
        if (done == n && logits) cpuLogitsOut(cd, rows - 1, 1, logits);
    }
    return 0;
}

int nsaDecoderStep(NsaDecoder *d, int B, const int32_t *tokens, float *logits, NsaError *err) {
    if (!d) return nsaErrorf(err, "nsa decoder: no decoder (NULL)");
    if (B < 1 || B > d->opt.max_batch || !tokens)
        return nsaErrorf(err, "nsa decoder: step over B = %d slots; allowed: 1 to max_batch (%d)",
                         B, d->opt.max_batch);
    if (checkTokens(d, tokens, B, err)) return -1;
    for (int b = 0; b < B; b++)
        if (checkRoom(d, b, 1, err)) return -1;
#ifdef NSA_DECODE_CUDA
    if (isCuda(d)) return nsaCudaDecoderStep(d->cuda, B, tokens, logits, err);
#endif
    NsaCpuDecoder *cd = &d->cpu;
    for (int b = 0; b < B; b++) {
        cd->row_slot[b] = b;
        cd->row_pos[b] = cd->pos[b];
    }
    cpuRun(cd, tokens, B);
    for (int b = 0; b < B; b++) cd->pos[b]++;
    if (logits) cpuLogitsOut(cd, 0, B, logits);
    return 0;
}

size_t nsaDecoderKvBytesPerToken(const NsaDecoder *d, int T) {
    if (!d || T < 1) return 0;
    const NsaModelConfig *c = &d->cfg;
    const size_t elem = isCuda(d) ? 2 : (d->opt.precision == NSA_PREC_F64 ? 8 : 4);
    const size_t kv = (size_t)c->n_kv_groups * (c->d_k + c->d_v);
    /* the new token at position T - 1 sees: */
    const size_t cmp = (size_t)nsaNumCmpBlocks(T, c->cmp_len, c->cmp_stride);
    const int blocks = nsaNumSelBlocks(T, c->sel_len);
    const size_t sel = (size_t)(blocks < nsaNumSelSlots(c->n_sel) ? blocks
                                                                  : nsaNumSelSlots(c->n_sel)) *
                       c->sel_len;
    const size_t win = (size_t)(T < c->window ? T : c->window);
    const size_t sel_tokens = sel < (size_t)T ? sel : (size_t)T;
    return (size_t)c->n_layers * kv * elem * (cmp + sel_tokens + win);
}
