/* export.c - see export.h. */
#include "export.h"
#include "fsutil.h"
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "export.c writes host values as safetensors' little-endian data"
#endif

uint16_t exportBf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

int exportDtypeParse(const char *s, ExportDtype *out, NsaError *err) {
    if (s && !strcmp(s, "f32")) *out = EXPORT_F32;
    else if (s && !strcmp(s, "bf16")) *out = EXPORT_BF16;
    else return nsaErrorf(err, "--dtype: '%s'; allowed: bf16 or f32", s ? s : "");
    return 0;
}

static const char *phiName(NsaPhi p) { return p == NSA_PHI_MLP ? "mlp" : "avg"; }
static const char *mlpName(NsaMlpKind k) { return k == NSA_MLP_SWIGLU ? "swiglu" : "silu"; }

/* ---- model.safetensors ---------------------------------------------------------- */

/* The header: {name: {dtype, shape, data_offsets}} in layout order, then
 * __metadata__, padded with spaces to a multiple of 8 (with the 8-byte
 * length before it). Returns the malloc'd header or NULL. */
static char *safetensorsHeader(const Weights *w, ExportDtype dtype, size_t *len) {
    const size_t elem = dtype == EXPORT_BF16 ? 2 : 4;
    cJSON *h = cJSON_CreateObject();
    size_t offset = 0;
    for (int i = 0; h && i < weightsNumTensors(w); i++) {
        const NsaTensorInfo *ti;
        weightsTensor(w, i, &ti, NULL, NULL);
        cJSON *t = cJSON_AddObjectToObject(h, ti->name);
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddStringToObject(t, "dtype", dtype == EXPORT_BF16 ? "BF16" : "F32");
        for (int k = 0; k < ti->ndim; k++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)ti->shape[k]));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        offset += ti->numel * elem;
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
    }
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    char step[32];
    snprintf(step, sizeof step, "%" PRId64, w->state.step);
    cJSON_AddStringToObject(meta, "format", "pt");
    cJSON_AddStringToObject(meta, "nsad_format", EXPORT_FORMAT);
    cJSON_AddStringToObject(meta, "nsad_version", NSA_VERSION);
    cJSON_AddStringToObject(meta, "step", step);
    char *json = h ? cJSON_PrintUnformatted(h) : NULL;
    cJSON_Delete(h);
    if (!json) return NULL;
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    char *out = realloc(json, padded + 1);
    if (!out) {
        free(json);
        return NULL;
    }
    memset(out + n, ' ', padded - n);
    out[padded] = '\0';
    *len = padded;
    return out;
}

static int writeSafetensors(const Weights *w, const char *path, ExportDtype dtype, NsaError *err) {
    size_t hlen = 0, largest = 1;
    char *header = safetensorsHeader(w, dtype, &hlen);
    if (!header) return nsaErrorf(err, "%s: out of memory for the header", path);
    for (int i = 0; i < weightsNumTensors(w); i++) {
        const NsaTensorInfo *ti;
        weightsTensor(w, i, &ti, NULL, NULL);
        if (ti->numel > largest) largest = ti->numel;
    }
    float *buf = malloc(largest * sizeof(float));
    uint16_t *half = dtype == EXPORT_BF16 ? malloc(largest * sizeof(uint16_t)) : NULL;
    char tmp[WEIGHTS_PATH_MAX + 64];
    int fd = -1, rc = 0;
    if (!buf || (dtype == EXPORT_BF16 && !half))
        rc = nsaErrorf(err, "%s: out of memory for a %zu-value tensor", path, largest);
    else if (fsPathf(err, tmp, sizeof tmp, "%s.tmp", path))
        rc = -1;
    else if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
        rc = nsaErrorf(err, "%s: %s", tmp, strerror(errno));
    uint8_t len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (uint8_t)((uint64_t)hlen >> (8 * k));
    if (rc == 0 && (fsWriteAll(fd, len8, 8) || fsWriteAll(fd, header, hlen)))
        rc = nsaErrorf(err, "%s: write: %s", tmp, strerror(errno));
    for (int i = 0; rc == 0 && i < weightsNumTensors(w); i++) {
        const NsaTensorInfo *ti;
        if (weightsTensor(w, i, &ti, buf, err)) {
            rc = -1;
            break;
        }
        const void *data = buf;
        size_t bytes = ti->numel * sizeof(float);
        if (dtype == EXPORT_BF16) {
            for (size_t j = 0; j < ti->numel; j++) half[j] = exportBf16(buf[j]);
            data = half;
            bytes = ti->numel * sizeof(uint16_t);
        }
        if (fsWriteAll(fd, data, bytes)) rc = nsaErrorf(err, "%s: write: %s", tmp, strerror(errno));
    }
    if (rc == 0 && fsync(fd) != 0) rc = nsaErrorf(err, "%s: fsync: %s", tmp, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && rc == 0) rc = nsaErrorf(err, "%s: close: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0) rc = nsaErrorf(err, "rename %s: %s", tmp, strerror(errno));
    if (rc != 0 && fd >= 0) unlink(tmp);
    free(header);
    free(buf);
    free(half);
    return rc;
}

/* ---- config.json ----------------------------------------------------------------- */

static cJSON *configJson(const Weights *w, ExportDtype dtype) {
    const NsaModelConfig *m = &w->job.model;
    const Tokenizer *tok = tokenizerFind(weightsTokenizer(w));
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "format", EXPORT_FORMAT);
    cJSON_AddStringToObject(c, "architecture", "nsa-transformer");
    cJSON_AddStringToObject(c, "dtype", dtype == EXPORT_BF16 ? "bfloat16" : "float32");
    cJSON_AddNumberToObject(c, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(c, "dim", m->dim);
    cJSON_AddNumberToObject(c, "n_layers", m->n_layers);
    cJSON_AddNumberToObject(c, "n_heads", m->n_heads);
    cJSON_AddNumberToObject(c, "n_kv_groups", m->n_kv_groups);
    cJSON_AddNumberToObject(c, "d_k", m->d_k);
    cJSON_AddNumberToObject(c, "d_v", m->d_v);
    cJSON_AddNumberToObject(c, "mlp_hidden", nsaLayoutMlpHidden(m));
    cJSON_AddStringToObject(c, "mlp", mlpName(m->mlp));
    cJSON_AddBoolToObject(c, "tied_embeddings", 0);
    cJSON_AddBoolToObject(c, "bias", 0);
    cJSON_AddStringToObject(c, "linear_layout", "[out][in]: y = x W^T (torch.nn.Linear)");
    cJSON *norm = cJSON_AddObjectToObject(c, "norm");
    cJSON_AddStringToObject(norm, "type", "rmsnorm");
    cJSON_AddNumberToObject(norm, "eps", m->norm_eps);
    cJSON_AddStringToObject(norm, "placement", "pre-norm: attn_norm, mlp_norm per layer, final_norm");
    cJSON *nsa = cJSON_AddObjectToObject(c, "nsa");
    cJSON_AddNumberToObject(nsa, "cmp_len", m->cmp_len);
    cJSON_AddNumberToObject(nsa, "cmp_stride", m->cmp_stride);
    cJSON_AddNumberToObject(nsa, "sel_len", m->sel_len);
    cJSON_AddNumberToObject(nsa, "n_sel", m->n_sel);
    cJSON_AddNumberToObject(nsa, "window", m->window);
    cJSON_AddStringToObject(nsa, "phi", phiName(m->phi));
    cJSON_AddStringToObject(nsa, "gates", "sigmoid(x_norm w_gate^T), row h*3 + c: c = 0 cmp, 1 sel, 2 win");
    cJSON_AddStringToObject(nsa, "selection",
                            "blocks 0, t/sel_len and t/sel_len - 1 always, then the complete blocks "
                            "with the highest compressed-attention scores (ties: lower index), "
                            "n_sel in all; proto/model.md");
    cJSON *rope = cJSON_AddObjectToObject(c, "rope");
    cJSON_AddNumberToObject(rope, "base", m->rope_base);
    cJSON_AddStringToObject(rope, "pairing", "split_halves");
    cJSON_AddStringToObject(rope, "rule",
                            "per head vector of size d_k at absolute position t (from 0): pairs "
                            "(i, i + d_k/2) rotated by t * base^(-2i/d_k)");
    cJSON_AddStringToObject(rope, "applies_to",
                            "q and the keys of all three branches (compressed keys before pooling); "
                            "never values");
    cJSON *tk = cJSON_AddObjectToObject(c, "tokenizer");
    cJSON_AddStringToObject(tk, "type", tok ? tok->name : weightsTokenizer(w));
    cJSON_AddNumberToObject(tk, "vocab_size", tok ? tok->vocab_size : m->vocab_size);
    if (tok && !strcmp(tok->name, "byte"))
        cJSON_AddStringToObject(tk, "rule", "every byte of the UTF-8 text is one token (its value)");
    cJSON *tensors = cJSON_AddArrayToObject(c, "tensors");
    for (int i = 0; i < weightsNumTensors(w); i++) {
        const NsaTensorInfo *ti;
        weightsTensor(w, i, &ti, NULL, NULL);
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "name", ti->name);
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int k = 0; k < ti->ndim; k++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)ti->shape[k]));
        cJSON_AddItemToArray(tensors, t);
    }
    cJSON *src = cJSON_AddObjectToObject(c, "source");
    cJSON_AddStringToObject(src, "checkpoint", w->dir);
    cJSON_AddNumberToObject(src, "step", (double)w->state.step);
    cJSON_AddNumberToObject(src, "tokens_seen", (double)w->state.tokens_seen);
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, w->state.config_hash);
    cJSON_AddStringToObject(src, "config_hash", hash);
    return c;
}

/* ---- README.md ---------------------------------------------------------------- */

static char *modelCard(const Weights *w, ExportDtype dtype) {
    const NsaModelConfig *m = &w->job.model;
    size_t params = 0;
    for (int i = 0; i < weightsNumTensors(w); i++) {
        const NsaTensorInfo *ti;
        weightsTensor(w, i, &ti, NULL, NULL);
        params += ti->numel;
    }
    char bpb[160];
    if (isfinite(w->bits_per_byte))
        snprintf(bpb, sizeof bpb, "%.4f (val loss %.4f nats/token, at step %" PRId64 ")",
                 w->bits_per_byte, w->val_loss, w->val_step);
    else if (w->val_step >= 0) /* token shards: no bytes to count */
        snprintf(bpb, sizeof bpb,
                 "none: token shards, whose text is unknown (val loss %.4f nats/token, at step "
                 "%" PRId64 ")",
                 w->val_loss, w->val_step);
    else
        snprintf(bpb, sizeof bpb, "not recorded (no val.csv row at or before this step)");
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f) return NULL;
    fprintf(f,
            "# NSA transformer, step %" PRId64 "\n\n"
            "A decoder-only transformer with Native Sparse Attention (compressed, selected and\n"
            "sliding-window branches, gated), trained by nsad %s. Files: `model.safetensors`\n"
            "(%s, %zu parameters, names as in `config.json` and nsad's proto/model.md),\n"
            "`config.json` (every size, the RoPE convention, the tokenizer).\n\n"
            "## Use\n\n"
            "nsad's `scripts/nsa_numpy.py` runs this directory with NumPy alone, reading\n"
            "nothing but these files: `nsa_numpy.py DIR sample --prompt TEXT` and\n"
            "`nsa_numpy.py DIR eval --data FILE.txt` (byte tokenizer); from Python, for any\n"
            "tokenizer, `NsaModel(DIR).logits(ids)`.\n"
            "Its ~200 lines of model are the reference for porting the model elsewhere.\n\n"
            "## Model\n\n"
            "| | |\n|---|---|\n"
            "| vocab | %d (%s tokenizer) |\n| dim | %d |\n| layers | %d |\n"
            "| heads / KV groups | %d / %d |\n| d_k / d_v | %d / %d |\n| MLP | %s, %d wide |\n"
            "| NSA l / d / l' / n / w | %d / %d / %d / %d / %d, phi %s |\n"
            "| RoPE | base %g, split halves |\n\n"
            "## Training\n\n"
            "| | |\n|---|---|\n"
            "| optimizer steps | %" PRId64 " |\n| tokens seen | %" PRId64 " |\n"
            "| final val bits/byte | %s |\n| seed | %" PRIu64 " |\n"
            "| config hash | %016" PRIx64 " |\n| checkpoint | `%s` |\n\n",
            w->state.step, NSA_VERSION, dtype == EXPORT_BF16 ? "bf16" : "fp32", params,
            m->vocab_size, weightsTokenizer(w), m->dim, m->n_layers, m->n_heads, m->n_kv_groups,
            m->d_k, m->d_v, mlpName(m->mlp), nsaLayoutMlpHidden(m), m->cmp_len, m->cmp_stride,
            m->sel_len, m->n_sel, m->window, phiName(m->phi), (double)m->rope_base, w->state.step,
            w->state.tokens_seen, bpb, w->state.seed, w->state.config_hash, w->dir);
    if (w->config_yaml)
        fprintf(f, "### Training config\n\n```yaml\n%s%s```\n", w->config_yaml,
                w->config_yaml[0] && w->config_yaml[strlen(w->config_yaml) - 1] == '\n' ? "" : "\n");
    else
        fprintf(f, "The run's training config was not found (no env.json next to the checkpoint).\n");
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}

/* ---- the export ------------------------------------------------------------------- */

int exportWrite(const Weights *w, const char *out_dir, ExportDtype dtype, NsaError *err) {
    static const char *const names[3] = {"model.safetensors", "config.json", "README.md"};
    char paths[3][WEIGHTS_PATH_MAX + 32];
    if (fsMkdirs(out_dir, 0755, err)) return -1;
    for (int i = 0; i < 3; i++) {
        if (fsPathf(err, paths[i], sizeof paths[i], "%s/%s", out_dir, names[i])) return -1;
        if (access(paths[i], F_OK) == 0)
            return nsaErrorf(err, "--out %s: %s exists; allowed: a new or empty directory (nothing "
                                  "is overwritten)",
                             out_dir, names[i]);
    }
    if (writeSafetensors(w, paths[0], dtype, err)) return -1;
    cJSON *cfg = configJson(w, dtype);
    char *json = cfg ? cJSON_Print(cfg) : NULL;
    cJSON_Delete(cfg);
    char *card = modelCard(w, dtype);
    int rc = 0;
    if (!json || !card)
        rc = nsaErrorf(err, "export: out of memory");
    else if (fsWriteFileAtomic(paths[1], json, strlen(json), 0644, err) ||
             fsWriteFileAtomic(paths[2], card, strlen(card), 0644, err))
        rc = -1;
    free(json);
    free(card);
    if (rc == 0) rc = fsFsyncDir(out_dir, err);
    if (rc != 0) /* nothing half made: a retry finds the directory as it was */
        for (int i = 0; i < 3; i++) unlink(paths[i]);
    return rc;
}
