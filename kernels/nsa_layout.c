/* nsa_layout.c - the ordered parameter table shared by every engine. */
#include "nsa_layout.h"
#include "nsa_rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nsaLayoutMlpHidden(const NsaModelConfig *cfg) {
    return cfg->mlp_hidden > 0 ? cfg->mlp_hidden : 4 * cfg->dim;
}

/* Appends one tensor; returns its index. The caller sized entries for the
 * worst case, so this cannot overflow. */
static int layoutAdd(NsaLayout *lay, const char *name, int ndim, int64_t d0, int64_t d1,
                     int weight_decay, NsaInitKind init, double init_std) {
    int i = lay->n_tensors++;
    NsaLayoutEntry *e = &lay->entries[i];
    memset(e, 0, sizeof(*e));
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->info.name = e->name;
    e->info.ndim = ndim;
    e->info.shape[0] = d0;
    e->info.shape[1] = ndim > 1 ? d1 : 0;
    e->info.numel = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
    e->info.offset = lay->total;
    e->info.weight_decay = weight_decay;
    e->init = init;
    e->init_std = init_std;
    size_t padded = (e->info.numel + NSA_LAYOUT_ALIGN - 1) / NSA_LAYOUT_ALIGN * NSA_LAYOUT_ALIGN;
    lay->total += padded;
    lay->n_params += e->info.numel;
    return i;
}

/* Matrices: decayed, N(0, std). */
static int addMatrix(NsaLayout *lay, const char *name, int64_t rows, int64_t cols, double std) {
    return layoutAdd(lay, name, 2, rows, cols, 1, NSA_INIT_NORMAL, std);
}

/* Norm weights: not decayed, ones. */
static int addNorm(NsaLayout *lay, const char *name, int64_t n) {
    return layoutAdd(lay, name, 1, n, 0, 0, NSA_INIT_ONES, 0.0);
}

/* The CUDA engine reads a layer's wq .. w_gate as one [rows][C] matrix
 * with rows rounded up to a multiple of 8 (16-byte aligned GEMM operands):
 * zero padding after w_gate (index gate) makes that matrix whole. */
static void padFusedProjection(NsaLayout *lay, int gate, int64_t rows, int64_t C) {
    const NsaTensorInfo *g = &lay->entries[gate].info;
    const size_t end = g->offset + g->numel + (size_t)((rows + 7) / 8 * 8 - rows) * (size_t)C;
    if (lay->total < end)
        lay->total = (end + NSA_LAYOUT_ALIGN - 1) / NSA_LAYOUT_ALIGN * NSA_LAYOUT_ALIGN;
}

/* Opens a bucket at the current end of the arena. */
static void bucketBegin(NsaLayout *lay, int b) {
    lay->buckets[b].offset = lay->total;
    lay->buckets[b].first = lay->n_tensors;
}

/* Closes bucket b: pads the arena so the bucket splits into lay->ranks
 * aligned slices (no padding beyond the tensors' own with one rank). */
static void bucketEnd(NsaLayout *lay, int b) {
    NsaLayoutBucket *bk = &lay->buckets[b];
    const size_t quantum = (size_t)lay->ranks * NSA_LAYOUT_ALIGN;
    size_t count = lay->total - bk->offset;
    count = (count + quantum - 1) / quantum * quantum;
    bk->count = count;
    bk->end = lay->n_tensors;
    lay->total = bk->offset + count;
}

int nsaLayoutBuild(NsaLayout *lay, const NsaModelConfig *cfg, NsaError *err) {
    return nsaLayoutBuildRanks(lay, cfg, 1, err);
}

int nsaLayoutBuildRanks(NsaLayout *lay, const NsaModelConfig *cfg, int ranks, NsaError *err) {
    memset(lay, 0, sizeof(*lay));
    if (nsaModelConfigValidate(cfg, err) != 0) return -1;
    if (ranks < 1 || ranks > 4096)
        return nsaErrorf(err, "nsa: data-parallel ranks = %d; allowed: 1 to 4096", ranks);

    const int L = cfg->n_layers, C = cfg->dim, V = cfg->vocab_size;
    const int H = cfg->n_heads, G = cfg->n_kv_groups, dk = cfg->d_k, dv = cfg->d_v;
    const int F = nsaLayoutMlpHidden(cfg), l = cfg->cmp_len;
    const double std = 0.02;
    /* Residual-branch outputs are scaled down so the residual stream's
     * variance does not grow with depth (GPT-2). */
    const double std_out = 0.02 / sqrt(2.0 * L);

    const int per_layer_max = 20;
    lay->entries = calloc((size_t)L * per_layer_max + 3, sizeof(*lay->entries));
    lay->layers = calloc((size_t)L, sizeof(*lay->layers));
    lay->buckets = calloc((size_t)L + 2, sizeof(*lay->buckets));
    if (!lay->entries || !lay->layers || !lay->buckets) {
        nsaLayoutFree(lay);
        nsaErrorf(err, "nsa: out of memory building the parameter table (%d layers)", L);
        return -1;
    }
    lay->n_layers = L;
    lay->ranks = ranks;
    lay->n_buckets = L + 2;

    char name[NSA_LAYOUT_NAME_MAX];
#define LNAME(suffix) (snprintf(name, sizeof(name), "layers.%d." suffix, i), name)
    bucketBegin(lay, NSA_BUCKET_EMBED);
    lay->tok_emb = addMatrix(lay, "tok_emb", V, C, std);
    bucketEnd(lay, NSA_BUCKET_EMBED);
    for (int i = 0; i < L; i++) {
        NsaLayerIndex *li = &lay->layers[i];
        bucketBegin(lay, NSA_BUCKET_LAYER(i));
        li->attn_norm = addNorm(lay, LNAME("attn_norm"), C);
        li->wq = addMatrix(lay, LNAME("wq"), (int64_t)H * dk, C, std);
        li->wk_cmp = addMatrix(lay, LNAME("wk_cmp"), (int64_t)G * dk, C, std);
        li->wv_cmp = addMatrix(lay, LNAME("wv_cmp"), (int64_t)G * dv, C, std);
        li->wk_sel = addMatrix(lay, LNAME("wk_sel"), (int64_t)G * dk, C, std);
        li->wv_sel = addMatrix(lay, LNAME("wv_sel"), (int64_t)G * dv, C, std);
        li->wk_win = addMatrix(lay, LNAME("wk_win"), (int64_t)G * dk, C, std);
        li->wv_win = addMatrix(lay, LNAME("wv_win"), (int64_t)G * dv, C, std);
        li->phi_k_pos = li->phi_k_w1 = li->phi_k_w2 = -1;
        li->phi_v_pos = li->phi_v_w1 = li->phi_v_w2 = -1;
        if (cfg->phi == NSA_PHI_MLP) {
            /* The position table is an additive encoding, not a map: no decay. */
            li->phi_k_pos = layoutAdd(lay, LNAME("phi_k.pos"), 2, l, dk, 0, NSA_INIT_NORMAL, std);
            li->phi_k_w1 = addMatrix(lay, LNAME("phi_k.w1"), dk, (int64_t)l * dk, std);
            li->phi_k_w2 = addMatrix(lay, LNAME("phi_k.w2"), dk, dk, std);
            li->phi_v_pos = layoutAdd(lay, LNAME("phi_v.pos"), 2, l, dv, 0, NSA_INIT_NORMAL, std);
            li->phi_v_w1 = addMatrix(lay, LNAME("phi_v.w1"), dv, (int64_t)l * dv, std);
            li->phi_v_w2 = addMatrix(lay, LNAME("phi_v.w2"), dv, dv, std);
        }
        li->w_gate = addMatrix(lay, LNAME("w_gate"), 3 * (int64_t)H, C, std);
        padFusedProjection(lay, li->w_gate, (int64_t)H * dk + 3 * (int64_t)G * (dk + dv) + 3 * H,
                           C);
        li->wo = addMatrix(lay, LNAME("wo"), C, (int64_t)H * dv, std_out);
        li->mlp_norm = addNorm(lay, LNAME("mlp_norm"), C);
        li->w_fc = addMatrix(lay, LNAME("w_fc"), F, C, std);
        li->w_up = cfg->mlp == NSA_MLP_SWIGLU ? addMatrix(lay, LNAME("w_up"), F, C, std) : -1;
        li->w_proj = addMatrix(lay, LNAME("w_proj"), C, F, std_out);
        bucketEnd(lay, NSA_BUCKET_LAYER(i));
    }
#undef LNAME
    bucketBegin(lay, NSA_BUCKET_HEAD(L));
    lay->final_norm = addNorm(lay, "final_norm", C);
    lay->lm_head = addMatrix(lay, "lm_head", V, C, std);
    bucketEnd(lay, NSA_BUCKET_HEAD(L));
    return 0;
}

void nsaLayoutFree(NsaLayout *lay) {
    if (!lay) return;
    free(lay->entries);
    free(lay->layers);
    free(lay->buckets);
    memset(lay, 0, sizeof(*lay));
}

int nsaShardBuild(NsaShard *sh, const NsaLayout *lay, int rank, NsaError *err) {
    memset(sh, 0, sizeof(*sh));
    if (rank < 0 || rank >= lay->ranks)
        return nsaErrorf(err, "nsa: rank = %d; allowed: 0 to %d", rank, lay->ranks - 1);
    sh->rank = rank;
    sh->ranks = lay->ranks;
    sh->n_slices = lay->n_buckets;
    sh->slices = calloc((size_t)lay->n_buckets, sizeof(*sh->slices));
    sh->pieces = calloc((size_t)lay->n_tensors + 1, sizeof(*sh->pieces));
    sh->tensor_piece = calloc((size_t)lay->n_tensors + 1, sizeof(*sh->tensor_piece));
    if (!sh->slices || !sh->pieces || !sh->tensor_piece) {
        nsaShardFree(sh);
        return nsaErrorf(err, "nsa: out of memory for rank %d's shard table", rank);
    }
    for (int b = 0; b < lay->n_buckets; b++) {
        const NsaLayoutBucket *bk = &lay->buckets[b];
        NsaShardSlice *sl = &sh->slices[b];
        sl->count = bk->count / (size_t)lay->ranks;
        sl->offset = bk->offset + (size_t)rank * sl->count;
        sl->local = sh->total;
        sh->total += sl->count;
        for (int i = bk->first; i < bk->end; i++) {
            const NsaTensorInfo *ti = &lay->entries[i].info;
            const size_t t_end = ti->offset + ti->numel, s_end = sl->offset + sl->count;
            const size_t lo = ti->offset > sl->offset ? ti->offset : sl->offset;
            const size_t hi = t_end < s_end ? t_end : s_end;
            sh->tensor_piece[i] = -1;
            if (lo >= hi) continue;
            NsaShardPiece *p = &sh->pieces[sh->n_pieces];
            p->tensor = i;
            p->offset = lo;
            p->begin = lo - ti->offset;
            p->numel = hi - lo;
            p->local = sl->local + (lo - sl->offset);
            p->weight_decay = ti->weight_decay;
            sh->tensor_piece[i] = sh->n_pieces++;
        }
    }
    return 0;
}

void nsaShardFree(NsaShard *sh) {
    if (!sh) return;
    free(sh->slices);
    free(sh->pieces);
    free(sh->tensor_piece);
    memset(sh, 0, sizeof(*sh));
}

int nsaLayoutFind(const NsaLayout *lay, const char *name) {
    if (!name) return -1;
    for (int i = 0; i < lay->n_tensors; i++)
        if (!strcmp(lay->entries[i].name, name)) return i;
    return -1;
}

int nsaLayoutInitTensor(const NsaLayout *lay, int i, uint64_t seed, float *dst, NsaError *err) {
    if (i < 0 || i >= lay->n_tensors) {
        nsaErrorf(err, "nsa: tensor index %d out of range; allowed: 0 to %d", i,
                    lay->n_tensors - 1);
        return -1;
    }
    const NsaLayoutEntry *e = &lay->entries[i];
    if (e->init == NSA_INIT_ONES) {
        for (size_t j = 0; j < e->info.numel; j++) dst[j] = 1.0f;
        return 0;
    }
    NsaRng rng;
    nsaRngSeed(&rng, seed, (uint64_t)i);
    for (size_t j = 0; j < e->info.numel; j++) dst[j] = (float)(e->init_std * nsaRngNormal(&rng));
    return 0;
}

void nsaShardTensorRange(const NsaLayout *lay, int i, int rank, size_t *begin, size_t *end) {
    *begin = *end = 0;
    for (int b = 0; b < lay->n_buckets; b++) {
        const NsaLayoutBucket *bk = &lay->buckets[b];
        if (i < bk->first || i >= bk->end) continue;
        const NsaTensorInfo *ti = &lay->entries[i].info;
        const size_t count = bk->count / (size_t)lay->ranks;
        const size_t s_lo = bk->offset + (size_t)rank * count, s_hi = s_lo + count;
        const size_t t_lo = ti->offset, t_hi = ti->offset + ti->numel;
        const size_t lo = t_lo > s_lo ? t_lo : s_lo, hi = t_hi < s_hi ? t_hi : s_hi;
        if (lo < hi) {
            *begin = lo - t_lo;
            *end = hi - t_lo;
        }
        return;
    }
}
