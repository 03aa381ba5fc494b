/* nsa_config.c - model configuration defaults and validation. */
#include "nsa.h"

#include <math.h>
#include <stdio.h>

void nsaModelConfigDefaults(NsaModelConfig *cfg) {
    cfg->vocab_size = 256;
    cfg->dim = 768;
    cfg->n_layers = 12;
    cfg->n_heads = 12;
    cfg->n_kv_groups = 2;
    cfg->d_k = 64;
    cfg->d_v = 64;
    cfg->mlp_hidden = 0;
    cfg->mlp = NSA_MLP_SILU;
    cfg->cmp_len = 32;
    cfg->cmp_stride = 16;
    cfg->sel_len = 64;
    cfg->n_sel = 16;
    cfg->window = 512;
    cfg->phi = NSA_PHI_AVG;
    cfg->rope_base = 10000.0f;
    cfg->norm_eps = 1e-6f;
}

/* Sizes are bounded so that every int product the engines form (H*d_k,
 * l*d_k, 3*H, ...) stays far from INT_MAX. */
#define SIZE_LIMIT 65536
#define VOCAB_LIMIT (1 << 24)

static int checkRange(const char *field, int value, int limit, NsaError *err) {
    if (value < 1 || value > limit)
        return nsaErrorf(err, "nsa config: %s = %d is out of range; allowed: 1 to %d", field,
                          value, limit);
    return 0;
}

int nsaModelConfigValidate(const NsaModelConfig *cfg, NsaError *err) {
    if (!cfg) return nsaErrorf(err, "nsa config: no config given");
    if (checkRange("vocab_size", cfg->vocab_size, VOCAB_LIMIT, err)) return -1;
    if (checkRange("dim", cfg->dim, SIZE_LIMIT, err)) return -1;
    if (checkRange("n_layers", cfg->n_layers, 1024, err)) return -1;
    if (checkRange("n_heads", cfg->n_heads, 1024, err)) return -1;
    if (checkRange("n_kv_groups", cfg->n_kv_groups, 1024, err)) return -1;
    if (cfg->n_heads % cfg->n_kv_groups != 0)
        return nsaErrorf(err,
                          "nsa config: n_kv_groups = %d does not divide n_heads (%d); "
                          "allowed: a divisor of n_heads",
                          cfg->n_kv_groups, cfg->n_heads);
    if (checkRange("d_k", cfg->d_k, 1024, err)) return -1;
    if (cfg->d_k % 2 != 0)
        return nsaErrorf(err,
                          "nsa config: d_k = %d is odd; allowed: an even number "
                          "(RoPE rotates dimension pairs)",
                          cfg->d_k);
    if (checkRange("d_v", cfg->d_v, 1024, err)) return -1;
    if (cfg->mlp_hidden < 0 || cfg->mlp_hidden > 4 * SIZE_LIMIT)
        return nsaErrorf(err,
                          "nsa config: mlp_hidden = %d is out of range; allowed: 0 (means 4*dim) "
                          "or 1 to %d",
                          cfg->mlp_hidden, 4 * SIZE_LIMIT);
    if (cfg->mlp != NSA_MLP_SILU && cfg->mlp != NSA_MLP_SWIGLU)
        return nsaErrorf(err, "nsa config: mlp = %d is unknown; allowed: %d (silu) or %d (swiglu)",
                          (int)cfg->mlp, NSA_MLP_SILU, NSA_MLP_SWIGLU);
    if (checkRange("cmp_len", cfg->cmp_len, SIZE_LIMIT, err)) return -1;
    if (checkRange("cmp_stride", cfg->cmp_stride, SIZE_LIMIT, err)) return -1;
    if (cfg->cmp_len % cfg->cmp_stride != 0)
        return nsaErrorf(err,
                          "nsa config: cmp_stride = %d does not divide cmp_len (%d); "
                          "allowed: a divisor of cmp_len and sel_len",
                          cfg->cmp_stride, cfg->cmp_len);
    if (checkRange("sel_len", cfg->sel_len, SIZE_LIMIT, err)) return -1;
    if (cfg->sel_len % cfg->cmp_stride != 0)
        return nsaErrorf(err,
                          "nsa config: cmp_stride = %d does not divide sel_len (%d); "
                          "allowed: a divisor of cmp_len and sel_len",
                          cfg->cmp_stride, cfg->sel_len);
    if (checkRange("n_sel", cfg->n_sel, SIZE_LIMIT, err)) return -1;
    if (checkRange("window", cfg->window, 1 << 30, err)) return -1;
    if (cfg->phi != NSA_PHI_AVG && cfg->phi != NSA_PHI_MLP)
        return nsaErrorf(err, "nsa config: phi = %d is unknown; allowed: %d (avg) or %d (mlp)",
                          (int)cfg->phi, NSA_PHI_AVG, NSA_PHI_MLP);
    if (!isfinite(cfg->rope_base) || cfg->rope_base <= 1.0f)
        return nsaErrorf(err,
                          "nsa config: rope_base = %g is not allowed; allowed: a finite number > 1",
                          (double)cfg->rope_base);
    if (!isfinite(cfg->norm_eps) || cfg->norm_eps <= 0.0f || cfg->norm_eps > 1.0f)
        return nsaErrorf(err,
                          "nsa config: norm_eps = %g is not allowed; allowed: a finite number in "
                          "(0, 1]",
                          (double)cfg->norm_eps);
    return 0;
}

/* Keys the three branches visit for the query at position t (0-based):
 * the compressed blocks that have ended by t, the selected blocks' tokens
 * up to t (all visible ones while there are no more than n of them, else
 * n - 1 whole blocks and the current one's prefix) and the window. */
static double keysVisited(const NsaModelConfig *c, long t) {
    const long l = c->cmp_len, d = c->cmp_stride, ls = c->sel_len, n = c->n_sel;
    const long seen = t + 1;
    double cmp = seen >= l ? (double)((seen - l) / d + 1) : 0.0;
    long sel_blocks = (seen + ls - 1) / ls;
    double sel = sel_blocks <= n ? (double)seen : (double)((n - 1) * ls + (t % ls) + 1);
    double win = (double)(seen < c->window ? seen : c->window);
    return cmp + sel + win;
}

int nsaModelFlopsPerToken(const NsaModelConfig *cfg, int S, NsaFlops *out, NsaError *err) {
    if (!out) return nsaErrorf(err, "nsa flops: no output given");
    if (nsaModelConfigValidate(cfg, err)) return -1;
    if (S < 1) return nsaErrorf(err, "nsa flops: S = %d; allowed: 1 or more", S);
    const double C = cfg->dim, H = cfg->n_heads, G = cfg->n_kv_groups;
    const double dk = cfg->d_k, dv = cfg->d_v, V = cfg->vocab_size, L = cfg->n_layers;
    const double F = cfg->mlp_hidden > 0 ? cfg->mlp_hidden : 4.0 * C;
    double layer = C * H * dk            /* wq */
                   + 3.0 * C * G * dk    /* wk_cmp, wk_sel, wk_win */
                   + 3.0 * C * G * dv    /* wv_* */
                   + C * 3.0 * H         /* w_gate */
                   + H * dv * C          /* wo */
                   + C * F * (cfg->mlp == NSA_MLP_SWIGLU ? 2.0 : 1.0) + F * C;
    if (cfg->phi == NSA_PHI_MLP) {
        /* phi_k and phi_v: one (l d -> d) and one (d -> d) product per block,
         * a block every d tokens */
        double per_block = cfg->cmp_len * dk * dk + dk * dk + cfg->cmp_len * dv * dv + dv * dv;
        layer += per_block / cfg->cmp_stride * G;
    }
    out->matmul = 6.0 * (L * layer + V * C);
    double keys = 0.0, dense_keys = 0.0;
    for (long t = 0; t < S; t++) {
        keys += keysVisited(cfg, t);
        dense_keys += (double)(t + 1);
    }
    const double per_pair = 2.0 * (dk + dv) * H * L;
    out->attention = 3.0 * per_pair * keys / S;
    out->dense_attention = 3.0 * per_pair * dense_keys / S;
    out->total = out->matmul + out->attention;
    return 0;
}

int nsaBatchValidate(const NsaModelConfig *cfg, int max_batch, int max_seq_len,
                     const int32_t *tokens, const int32_t *targets, int B, int S,
                     size_t *counted, NsaError *err) {
    if (!tokens || !targets) return nsaErrorf(err, "nsa: tokens and targets must not be NULL");
    if (B < 1 || B > max_batch)
        return nsaErrorf(err, "nsa: batch B = %d; allowed: 1 to max_batch (%d)", B, max_batch);
    if (S < 1 || S > max_seq_len)
        return nsaErrorf(err, "nsa: sequence length S = %d; allowed: 1 to max_seq_len (%d)", S,
                         max_seq_len);
    const int V = cfg->vocab_size;
    const size_t N = (size_t)B * S;
    size_t n_counted = 0;
    for (size_t n = 0; n < N; n++) {
        if (tokens[n] < 0 || tokens[n] >= V)
            return nsaErrorf(err, "nsa: tokens[%zu] = %d; allowed: 0 to %d", n, (int)tokens[n],
                             V - 1);
        if (targets[n] < -1 || targets[n] >= V)
            return nsaErrorf(err, "nsa: targets[%zu] = %d; allowed: -1 (ignored) or 0 to %d", n,
                             (int)targets[n], V - 1);
        n_counted += targets[n] >= 0;
    }
    if (n_counted == 0)
        return nsaErrorf(err, "nsa: every target of the batch is -1; allowed: at least one "
                              "target in 0 to V-1");
    *counted = n_counted;
    return 0;
}
