/* nsa_cpu_plan.c - plans and allocates the CPU engine's buffers once.
 * (Not under kernels/cpu/: that directory is compiled once per precision,
 * and the plan is the same for both.) */
#include "cpu/cpu_model.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bump allocator over element offsets; every region is rounded up to 16
 * elements so rows of different buffers never share a cache line. */
static size_t planTake(size_t *cursor, size_t elems) {
    size_t at = *cursor;
    *cursor += (elems + 15) / 16 * 16;
    return at;
}

static int cmpBlocks(int S, int l, int d) { return S < l ? 0 : (S - l) / d + 1; }

int nsaCpuModelAlloc(NsaCpuModel *cm, const NsaModelConfig *cfg, const NsaLayout *layout,
                     int f64, int max_batch, int max_seq, int threads, size_t state_elems,
                     NsaError *err) {
    memset(cm, 0, sizeof(*cm));
    if (max_batch < 1 || max_seq < 1)
        return nsaErrorf(err, "nsa: max_batch = %d, max_seq_len = %d; allowed: both >= 1",
                         max_batch, max_seq);
    if ((size_t)max_batch * max_seq > INT_MAX)
        return nsaErrorf(err,
                         "nsa: max_batch x max_seq_len = %d x %d tokens; allowed: at most %d "
                         "tokens per micro-batch",
                         max_batch, max_seq, INT_MAX);
    cm->cfg = *cfg;
    cm->layout = layout;
    cm->f64 = f64;
    cm->real_size = f64 ? sizeof(double) : sizeof(float);
    cm->max_batch = max_batch;
    cm->max_seq = max_seq;
    cm->max_cmp_blocks = cmpBlocks(max_seq, cfg->cmp_len, cfg->cmp_stride);

    const size_t N = (size_t)max_batch * max_seq, C = cfg->dim, V = cfg->vocab_size;
    const size_t H = cfg->n_heads, G = cfg->n_kv_groups, dk = cfg->d_k, dv = cfg->d_v;
    const size_t F = nsaLayoutMlpHidden(cfg), L = cfg->n_layers;
    const size_t Nc = (size_t)max_batch * cm->max_cmp_blocks;
    const int mlp_phi = cfg->phi == NSA_PHI_MLP, swiglu = cfg->mlp == NSA_MLP_SWIGLU;

    cm->layer_acts = calloc(L, sizeof(*cm->layer_acts));
    if (!cm->layer_acts) return nsaErrorf(err, "nsa: out of memory planning %zu layers", L);

    size_t a = 0;
    for (size_t i = 0; i < L; i++) {
        NsaCpuLayerActs *la = &cm->layer_acts[i];
        la->res = planTake(&a, N * C);
        la->attn_xn = planTake(&a, N * C);
        la->attn_rstd = planTake(&a, N);
        la->q = planTake(&a, N * H * dk);
        for (int c = 0; c < 3; c++) {
            la->k[c] = planTake(&a, N * G * dk);
            la->v[c] = planTake(&a, N * G * dv);
        }
        la->kc = planTake(&a, Nc * G * dk);
        la->vc = planTake(&a, Nc * G * dv);
        la->hk = planTake(&a, mlp_phi ? Nc * G * dk : 0);
        la->hv = planTake(&a, mlp_phi ? Nc * G * dv : 0);
        la->gates = planTake(&a, N * H * 3);
        for (int c = 0; c < 3; c++) {
            la->o[c] = planTake(&a, N * H * dv);
            la->lse[c] = planTake(&a, N * H);
        }
        la->y_attn = planTake(&a, N * H * dv);
        la->res_mid = planTake(&a, N * C);
        la->mlp_xn = planTake(&a, N * C);
        la->mlp_rstd = planTake(&a, N);
        la->fc = planTake(&a, N * F);
        la->up = planTake(&a, swiglu ? N * F : 0);
        la->act = planTake(&a, N * F);
    }
    /* Layer i writes its output straight into layer i+1's res (the last
     * layer into final_res), so no copy is needed between layers. */
    cm->final_res = planTake(&a, N * C);
    cm->final_xn = planTake(&a, N * C);
    cm->final_rstd = planTake(&a, N);
    cm->logits = planTake(&a, N * V);
    cm->ce_lse = planTake(&a, N);
    cm->acts_elems = a;

    size_t s = 0;
    NsaCpuScratch *sc = &cm->sc;
    sc->proj = planTake(&s, N * C);
    sc->dres = planTake(&s, N * C);
    sc->dxn = planTake(&s, N * C);
    sc->dq = planTake(&s, N * H * dk);
    for (int c = 0; c < 3; c++) {
        sc->dk[c] = planTake(&s, N * G * dk);
        sc->dv[c] = planTake(&s, N * G * dv);
        sc->d_o[c] = planTake(&s, N * H * dv);
    }
    sc->dkc = planTake(&s, Nc * G * dk);
    sc->dvc = planTake(&s, Nc * G * dv);
    sc->dgates = planTake(&s, N * H * 3);
    sc->dgate_logits = planTake(&s, N * H * 3);
    sc->dy_attn = planTake(&s, N * H * dv);
    sc->dfc = planTake(&s, N * F);
    sc->dup = planTake(&s, swiglu ? N * F : 0);
    sc->dact = planTake(&s, N * F);
    sc->dlogits = planTake(&s, N * V);
    size_t largest_weight = 0;
    for (int i = 0; i < layout->n_tensors; i++)
        if (layout->entries[i].info.numel > largest_weight)
            largest_weight = layout->entries[i].info.numel;
    sc->wt = planTake(&s, largest_weight);
    /* the widest linear output: logits, MLP hidden, heads, gates or C */
    size_t widest = V > F ? V : F;
    const size_t outs[5] = {H * dk, H * dv, 3 * H, G * (dk > dv ? dk : dv), C};
    for (int i = 0; i < 5; i++)
        if (outs[i] > widest) widest = outs[i];
    sc->dyt = planTake(&s, N * widest);
    cm->rope = planTake(&s, (size_t)max_seq * dk);
    cm->scratch_elems = s;

    const size_t P = layout->total, rs = cm->real_size;
    cm->params = calloc(P, rs);
    cm->grads = calloc(P, rs);
    cm->state_elems = state_elems;
    cm->adam_m = calloc(state_elems ? state_elems : 1, rs);
    cm->adam_v = calloc(state_elems ? state_elems : 1, rs);
    cm->acts = calloc(cm->acts_elems, rs);
    cm->scratch = calloc(cm->scratch_elems, rs);
    cm->sel_idx = calloc(L * N * G * (size_t)nsaNumSelSlots(cfg->n_sel), sizeof(int32_t));
    cm->tokens = calloc(N, sizeof(int32_t));
    cm->targets = calloc(N, sizeof(int32_t));
    if (!cm->params || !cm->grads || !cm->adam_m || !cm->adam_v || !cm->acts || !cm->scratch ||
        !cm->sel_idx || !cm->tokens || !cm->targets) {
        size_t total = (2 * P + 2 * state_elems + cm->acts_elems + cm->scratch_elems) * rs;
        nsaCpuModelRelease(cm);
        return nsaErrorf(err,
                         "nsa: out of memory allocating the CPU engine (%.1f MiB for "
                         "max_batch %d x max_seq_len %d)",
                         total / 1048576.0, max_batch, max_seq);
    }
    cm->pool = nsaCpuPoolCreate(threads, err);
    if (!cm->pool) {
        nsaCpuModelRelease(cm);
        return -1;
    }
    return 0;
}

void nsaCpuModelRelease(NsaCpuModel *cm) {
    free(cm->params);
    free(cm->grads);
    free(cm->adam_m);
    free(cm->adam_v);
    free(cm->acts);
    free(cm->scratch);
    free(cm->sel_idx);
    free(cm->tokens);
    free(cm->targets);
    free(cm->layer_acts);
    nsaCpuPoolFree(cm->pool);
    memset(cm, 0, sizeof(*cm));
}

size_t nsaCpuModelActivationBytes(const NsaCpuModel *cm) { return cm->acts_elems * cm->real_size; }

size_t nsaCpuModelWorkspaceBytes(const NsaCpuModel *cm) {
    return cm->scratch_elems * cm->real_size +
           (size_t)cm->cfg.n_layers * cm->max_batch * cm->max_seq * cm->cfg.n_kv_groups *
               (size_t)nsaNumSelSlots(cm->cfg.n_sel) * sizeof(int32_t);
}
