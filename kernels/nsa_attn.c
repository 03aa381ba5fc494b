/* nsa_attn.c - the standalone NSA attention op of nsa.h on the CPU (fp32).
 *
 * The op chains the CPU reference ops of kernels/cpu/attn_*.c:
 *   kc, vc  = avg-pool(k_cmp, v_cmp)                  attn_pool_avg.c
 *   o_cmp   = compressed attention (q, kc, vc)        attn_cmp.c
 *   sel_idx = selection from the compressed softmax   attn_select.c
 *   o_sel   = attention over the selected blocks      attn_sel.c
 *   o_win   = sliding window attention                attn_win.c
 *   out     = gate-weighted sum of the three          attn_gate.c
 * It is a test and benchmark oracle, not the training hot path, so it
 * allocates its scratch on every call. Backward recomputes the forward. */
#include "nsa.h"
#include "cpu/cpu_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nsaNumCmpBlocks(int S, int cmp_len, int cmp_stride) {
    if (S < cmp_len) return 0;
    return (S - cmp_len) / cmp_stride + 1;
}

int nsaNumSelBlocks(int S, int sel_len) { return S <= 0 ? 0 : (S - 1) / sel_len + 1; }

int nsaNumSelSlots(int n_sel) { return n_sel < 3 ? 3 : n_sel; }

/* Bounds keep every int index the ops form (j*l' + l', i*d + l, t + w)
 * far from INT_MAX. */
#define ATTN_SIZE_LIMIT 65536
#define ATTN_SEQ_LIMIT (1 << 28)

static int checkDim(const char *field, int value, int limit, NsaError *err) {
    if (value < 1 || value > limit)
        return nsaErrorf(err, "nsa attention: %s = %d is out of range; allowed: 1 to %d", field,
                        value, limit);
    return 0;
}

int nsaAttnDimsValidate(const NsaAttnDims *dims, NsaError *err) {
    if (!dims) return nsaErrorf(err, "nsa attention: no dims given");
    if (checkDim("B", dims->B, ATTN_SIZE_LIMIT, err)) return -1;
    if (checkDim("S", dims->S, ATTN_SEQ_LIMIT, err)) return -1;
    if (checkDim("H", dims->H, 1024, err)) return -1;
    if (checkDim("G", dims->G, 1024, err)) return -1;
    if (dims->H % dims->G != 0)
        return nsaErrorf(err, "nsa attention: G = %d does not divide H (%d); allowed: a divisor of H",
                        dims->G, dims->H);
    if (checkDim("d_k", dims->d_k, 1024, err)) return -1;
    if (checkDim("d_v", dims->d_v, 1024, err)) return -1;
    if (checkDim("cmp_len", dims->cmp_len, ATTN_SIZE_LIMIT, err)) return -1;
    if (checkDim("cmp_stride", dims->cmp_stride, ATTN_SIZE_LIMIT, err)) return -1;
    if (dims->cmp_len % dims->cmp_stride != 0)
        return nsaErrorf(err,
                        "nsa attention: cmp_stride = %d does not divide cmp_len (%d); "
                        "allowed: a divisor of cmp_len and sel_len",
                        dims->cmp_stride, dims->cmp_len);
    if (checkDim("sel_len", dims->sel_len, ATTN_SIZE_LIMIT, err)) return -1;
    if (dims->sel_len % dims->cmp_stride != 0)
        return nsaErrorf(err,
                        "nsa attention: cmp_stride = %d does not divide sel_len (%d); "
                        "allowed: a divisor of cmp_len and sel_len",
                        dims->cmp_stride, dims->sel_len);
    if (checkDim("n_sel", dims->n_sel, ATTN_SIZE_LIMIT, err)) return -1;
    if (checkDim("window", dims->window, ATTN_SEQ_LIMIT, err)) return -1;
    return 0;
}

/* Everything the forward computes besides out; backward needs all of it. */
typedef struct AttnScratch {
    float *kc, *vc;                /* [B][Nc][G][d_k|d_v] */
    float *o_cmp, *o_sel, *o_win;  /* [B][S][H][d_v] */
    float *lse_cmp, *lse_sel, *lse_win;  /* [B][S][H] */
    int32_t *sel_idx;              /* [B][S][G][slots] */
} AttnScratch;

static void scratchFree(AttnScratch *s) {
    free(s->kc);
    free(s->vc);
    free(s->o_cmp);
    free(s->o_sel);
    free(s->o_win);
    free(s->lse_cmp);
    free(s->lse_sel);
    free(s->lse_win);
    free(s->sel_idx);
    memset(s, 0, sizeof(*s));
}

/* calloc that never returns NULL for a zero count (Nc = 0 when S < l). */
static void *zeroAlloc(size_t count, size_t size) { return calloc(count ? count : 1, size); }

static int scratchAlloc(AttnScratch *s, const NsaAttnDims *dims, NsaError *err) {
    size_t Nc = (size_t)nsaNumCmpBlocks(dims->S, dims->cmp_len, dims->cmp_stride);
    size_t tokens = (size_t)dims->B * dims->S;
    size_t rows = tokens * dims->H;
    memset(s, 0, sizeof(*s));
    s->kc = zeroAlloc((size_t)dims->B * Nc * dims->G * dims->d_k, sizeof(float));
    s->vc = zeroAlloc((size_t)dims->B * Nc * dims->G * dims->d_v, sizeof(float));
    s->o_cmp = zeroAlloc(rows * dims->d_v, sizeof(float));
    s->o_sel = zeroAlloc(rows * dims->d_v, sizeof(float));
    s->o_win = zeroAlloc(rows * dims->d_v, sizeof(float));
    s->lse_cmp = zeroAlloc(rows, sizeof(float));
    s->lse_sel = zeroAlloc(rows, sizeof(float));
    s->lse_win = zeroAlloc(rows, sizeof(float));
    s->sel_idx = zeroAlloc(tokens * dims->G * nsaNumSelSlots(dims->n_sel), sizeof(int32_t));
    if (!s->kc || !s->vc || !s->o_cmp || !s->o_sel || !s->o_win || !s->lse_cmp || !s->lse_sel ||
        !s->lse_win || !s->sel_idx) {
        scratchFree(s);
        return nsaErrorf(err, "nsa attention: out of memory for the scratch of B=%d S=%d H=%d",
                        dims->B, dims->S, dims->H);
    }
    return 0;
}

static int checkInputs(const NsaAttnDims *dims, const NsaAttnInputs *in, NsaError *err) {
    if (nsaAttnDimsValidate(dims, err)) return -1;
    if (!in) return nsaErrorf(err, "nsa attention: no inputs given");
    const struct { const char *name; const float *ptr; } fields[] = {
        {"q", in->q},         {"k_cmp", in->k_cmp}, {"v_cmp", in->v_cmp}, {"k_sel", in->k_sel},
        {"v_sel", in->v_sel}, {"k_win", in->k_win}, {"v_win", in->v_win}, {"gates", in->gates},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        if (!fields[i].ptr)
            return nsaErrorf(err, "nsa attention: input %s is NULL; all eight inputs are required",
                            fields[i].name);
    return 0;
}

/* Runs the three branches into s (allocated by the caller) and, if out is
 * not NULL, the gate combine into out. */
static int attnForwardPass(const NsaAttnDims *dims, const NsaAttnInputs *in, AttnScratch *s,
                           float *out, NsaError *err) {
    nsaCpuPoolAvgForwardF32(s->kc, in->k_cmp, dims->B, dims->S, dims->G, dims->d_k, dims->cmp_len,
                            dims->cmp_stride);
    nsaCpuPoolAvgForwardF32(s->vc, in->v_cmp, dims->B, dims->S, dims->G, dims->d_v, dims->cmp_len,
                            dims->cmp_stride);
    nsaCpuCmpAttnForwardF32(s->o_cmp, s->lse_cmp, in->q, s->kc, s->vc, dims);
    if (nsaCpuSelectBlocksF32(s->sel_idx, NULL, in->q, s->kc, s->lse_cmp, dims))
        return nsaErrorf(err, "nsa attention: out of memory for the selection scores (S=%d)",
                        dims->S);
    nsaCpuSelAttnForwardF32(s->o_sel, s->lse_sel, in->q, in->k_sel, in->v_sel, s->sel_idx, dims);
    nsaCpuWinAttnForwardF32(s->o_win, s->lse_win, in->q, in->k_win, in->v_win, dims);
    if (out) nsaCpuGateCombineForwardF32(out, in->gates, s->o_cmp, s->o_sel, s->o_win, dims);
    return 0;
}

int nsaAttnForwardCpu(const NsaAttnDims *dims, const NsaAttnInputs *in, float *out,
                      int32_t *sel_idx, float *lse_cmp, NsaError *err) {
    if (checkInputs(dims, in, err)) return -1;
    if (!out) return nsaErrorf(err, "nsa attention: output out is NULL; it is required");
    AttnScratch s;
    if (scratchAlloc(&s, dims, err)) return -1;
    int rc = attnForwardPass(dims, in, &s, out, err);
    if (rc == 0 && sel_idx)
        memcpy(sel_idx, s.sel_idx,
               (size_t)dims->B * dims->S * dims->G * nsaNumSelSlots(dims->n_sel) * sizeof(int32_t));
    if (rc == 0 && lse_cmp)
        memcpy(lse_cmp, s.lse_cmp, (size_t)dims->B * dims->S * dims->H * sizeof(float));
    scratchFree(&s);
    return rc;
}

int nsaAttnBackwardCpu(const NsaAttnDims *dims, const NsaAttnInputs *in, const float *dout,
                       const NsaAttnGrads *grads, NsaError *err) {
    if (checkInputs(dims, in, err)) return -1;
    if (!dout) return nsaErrorf(err, "nsa attention: dout is NULL; it is required");
    if (!grads) return nsaErrorf(err, "nsa attention: no gradient outputs given");
    const struct { const char *name; float *ptr; size_t n; } fields[] = {
        {"dq", grads->dq, (size_t)dims->H * dims->d_k},
        {"dk_cmp", grads->dk_cmp, (size_t)dims->G * dims->d_k},
        {"dv_cmp", grads->dv_cmp, (size_t)dims->G * dims->d_v},
        {"dk_sel", grads->dk_sel, (size_t)dims->G * dims->d_k},
        {"dv_sel", grads->dv_sel, (size_t)dims->G * dims->d_v},
        {"dk_win", grads->dk_win, (size_t)dims->G * dims->d_k},
        {"dv_win", grads->dv_win, (size_t)dims->G * dims->d_v},
        {"dgates", grads->dgates, (size_t)dims->H * 3},
    };
    size_t tokens = (size_t)dims->B * dims->S;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (!fields[i].ptr)
            return nsaErrorf(err,
                            "nsa attention: gradient %s is NULL; all eight gradients are required",
                            fields[i].name);
        memset(fields[i].ptr, 0, tokens * fields[i].n * sizeof(float));
    }

    AttnScratch s;
    if (scratchAlloc(&s, dims, err)) return -1;
    size_t Nc = (size_t)nsaNumCmpBlocks(dims->S, dims->cmp_len, dims->cmp_stride);
    size_t rows = tokens * dims->H;
    float *do_cmp = zeroAlloc(rows * dims->d_v, sizeof(float));
    float *do_sel = zeroAlloc(rows * dims->d_v, sizeof(float));
    float *do_win = zeroAlloc(rows * dims->d_v, sizeof(float));
    float *dkc = zeroAlloc((size_t)dims->B * Nc * dims->G * dims->d_k, sizeof(float));
    float *dvc = zeroAlloc((size_t)dims->B * Nc * dims->G * dims->d_v, sizeof(float));
    int rc;
    if (!do_cmp || !do_sel || !do_win || !dkc || !dvc)
        rc = nsaErrorf(err, "nsa attention: out of memory for the backward scratch of B=%d S=%d H=%d",
                      dims->B, dims->S, dims->H);
    else
        rc = attnForwardPass(dims, in, &s, NULL, err);
    if (rc == 0) {
        nsaCpuGateCombineBackwardF32(grads->dgates, do_cmp, do_sel, do_win, dout, in->gates,
                                     s.o_cmp, s.o_sel, s.o_win, dims);
        nsaCpuWinAttnBackwardF32(grads->dq, grads->dk_win, grads->dv_win, do_win, in->q,
                                 in->k_win, in->v_win, s.o_win, s.lse_win, dims);
        nsaCpuSelAttnBackwardF32(grads->dq, grads->dk_sel, grads->dv_sel, do_sel, in->q,
                                 in->k_sel, in->v_sel, s.sel_idx, s.o_sel, s.lse_sel, dims);
        nsaCpuCmpAttnBackwardF32(grads->dq, dkc, dvc, do_cmp, in->q, s.kc, s.vc, s.o_cmp,
                                 s.lse_cmp, dims);
        nsaCpuPoolAvgBackwardF32(grads->dk_cmp, dkc, dims->B, dims->S, dims->G, dims->d_k,
                                 dims->cmp_len, dims->cmp_stride);
        nsaCpuPoolAvgBackwardF32(grads->dv_cmp, dvc, dims->B, dims->S, dims->G, dims->d_v,
                                 dims->cmp_len, dims->cmp_stride);
    }
    free(do_cmp);
    free(do_sel);
    free(do_win);
    free(dkc);
    free(dvc);
    scratchFree(&s);
    return rc;
}
