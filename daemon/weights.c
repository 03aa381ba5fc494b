/* weights.c - a checkpoint opened for use; see weights.h. */
#include "weights.h"
#include "artifacts.h"
#include "fsutil.h"
#include "log.h"
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* dir's grandparent when dir is OUT/checkpoints/step_N, else "". */
static void runDirOf(const char *dir, char *out, size_t cap) {
    out[0] = '\0';
    char real[PATH_MAX];
    if (!realpath(dir, real)) return;
    char *last = strrchr(real, '/');
    if (!last || last == real) return;
    *last = '\0';
    char *parent = strrchr(real, '/');
    if (!parent || strcmp(parent + 1, "checkpoints") != 0) return;
    *parent = '\0';
    snprintf(out, cap, "%s", parent == real ? "/" : real);
}

/* env.json's config_yaml, loaded over the defaults: 1, or 0 when there is
 * none, or -1 with why (the checkpoint's own model config still holds, but
 * the run's tokenizer is then unknown). */
static int loadRunConfig(Weights *w, char *why, size_t cap) {
    char path[WEIGHTS_PATH_MAX + 16];
    if (!w->out_dir[0] || snprintf(path, sizeof path, "%s/env.json", w->out_dir) >= (int)sizeof path)
        return 0;
    char *text = fsReadFile(path, NULL);
    if (!text) return 0;
    cJSON *env = cJSON_Parse(text);
    free(text);
    const cJSON *yaml = env ? cJSON_GetObjectItemCaseSensitive(env, "config_yaml") : NULL;
    int ok = 0;
    if (cJSON_IsString(yaml)) {
        NsaError load_err;
        JobConfig job;
        configDefaults(&job);
        if (configLoadString(&job, yaml->valuestring, strlen(yaml->valuestring), &load_err) == 0) {
            w->job = job;
            w->config_yaml = strdup(yaml->valuestring);
            ok = w->config_yaml != NULL;
        } else {
            snprintf(why, cap, "env.json's config does not load here: %s", load_err.message);
            ok = -1;
        }
    }
    cJSON_Delete(env);
    return ok;
}

/* artifactsReadCsv's callback: keeps the last row at or before the
 * checkpoint's step. */
static int keepLastEval(void *ctx, const ArtifactCsvRow *row, NsaError *err) {
    Weights *w = ctx;
    if (row->step <= w->state.step && row->step >= w->val_step) {
        w->val_step = row->step;
        w->val_loss = row->val_loss;
        w->bits_per_byte = row->bits_per_byte;
    }
    return 0;
}

/* The last val.csv row at or before the checkpoint's step (val_step -1 when
 * there is none or no out_dir). Returns 0 or -1 with err (val.csv
 * unreadable). */
static int loadLastEval(Weights *w, NsaError *err) {
    w->val_step = -1;
    w->val_loss = w->bits_per_byte = NAN;
    if (!w->out_dir[0]) return 0;
    return artifactsReadCsv(w->out_dir, ARTIFACT_VAL_CSV, keepLastEval, w, err);
}

/* Every tensor of the layout in the file with its shape, and nothing else. */
static int checkTensors(const Weights *w, const char *path, NsaError *err) {
    const NsaLayout *lay = &w->layout;
    for (int i = 0; i < lay->n_tensors; i++) {
        const NsaTensorInfo *ti = &lay->entries[i].info;
        const SafetensorsTensor *t = safetensorsFind(w->st, ti->name);
        if (!t)
            return nsaErrorf(err, "%s: tensor '%s' is missing (the model config names it)", path,
                             ti->name);
        int same = t->ndim == ti->ndim;
        for (int k = 0; same && k < ti->ndim; k++) same = t->shape[k] == ti->shape[k];
        if (!same)
            return nsaErrorf(err, "%s: tensor '%s' has another shape than the model config gives",
                             path, ti->name);
    }
    if (safetensorsCount(w->st) != lay->n_tensors)
        return nsaErrorf(err, "%s: %d tensors where the model config has %d", path,
                         safetensorsCount(w->st), lay->n_tensors);
    return 0;
}

/* weightsOpen and weightsOpenUnverified: verify says whether the
 * manifest's sizes and checksums are checked first. */
static int openWeights(const char *spec, int verify, Weights *w, NsaError *err) {
    memset(w, 0, sizeof *w);
    if (!spec || !*spec || !strcmp(spec, "latest"))
        return nsaErrorf(err, "checkpoint: '%s'; allowed: a checkpoint directory or a run's out_dir",
                         spec ? spec : "");
    int found = checkpointResolve(NULL, spec, w->dir, sizeof w->dir, err);
    if (found < 0) return -1;
    if (found == 0) return nsaErrorf(err, "checkpoint: %s holds no checkpoint yet", spec);
    /* a damaged or incomplete checkpoint is refused here too, not used */
    const int unverified = verify ? checkpointVerify(w->dir, err) : 0;
    if (unverified < 0) return -1;
    if (unverified)
        logWarn("checkpoint %s: format %s (before manifests): loaded unverified, no sizes or checksums "
                "to check it against", w->dir, CHECKPOINT_FORMAT_LEGACY);
    runDirOf(w->dir, w->out_dir, sizeof w->out_dir);
    configDefaults(&w->job);
    char run_config_why[700] = "";
    const int run_config = loadRunConfig(w, run_config_why, sizeof run_config_why);
    w->have_run_config = run_config == 1;

    char path[WEIGHTS_PATH_MAX + 32];
    if (fsPathf(err, path, sizeof path, "%s/model.safetensors", w->dir)) goto fail;
    if (!(w->st = safetensorsRead(path, err))) goto fail;
    const char *mc = safetensorsMeta(w->st, "model_config");
    if (!mc) {
        nsaErrorf(err, "%s: __metadata__ has no 'model_config'", path);
        goto fail;
    }
    /* the checkpoint's model config is the truth; the run's other sections
     * stay. It is checked as a model alone: its vocabulary is the data's
     * (shards of 100 token ids make a 100-token model), not the default
     * byte tokenizer's */
    JobConfig model;
    configDefaults(&model);
    NsaError cerr;
    if (configLoadModelString(&model, mc, strlen(mc), &cerr)) {
        nsaErrorf(err, "%s: model_config does not load: %s", path, cerr.message);
        goto fail;
    }
    w->job.model = model.model;
    /* without the run's config the tokenizer is taken to be bytes: say so,
     * and refuse where that cannot be (a vocabulary of another size) */
    if (run_config < 0 && w->job.model.vocab_size != 256) {
        nsaErrorf(err, "%s: %s; the run's tokenizer is unknown, and this model's vocabulary (%d) "
                       "is not the byte tokenizer's (256)",
                  w->out_dir, run_config_why, w->job.model.vocab_size);
        goto fail;
    }
    if (run_config < 0)
        logWarn("%s: %s; reading the model with the byte tokenizer, as its vocabulary of 256 says",
                w->out_dir, run_config_why);
    if (nsaLayoutBuild(&w->layout, &w->job.model, err)) goto fail;
    if (checkTensors(w, path, err)) goto fail;
    if (checkpointReadState(w->dir, &w->state, err)) goto fail;
    if (loadLastEval(w, err)) goto fail;
    return 0;
fail:
    weightsClose(w);
    return -1;
}

int weightsOpen(const char *spec, Weights *w, NsaError *err) {
    return openWeights(spec, 1, w, err);
}

int weightsOpenUnverified(const char *spec, Weights *w, NsaError *err) {
    return openWeights(spec, 0, w, err);
}

int weightsCpuThreads(const Weights *w) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = w->job.runtime.threads;
    if (cores >= 1 && n > cores) n = (int)cores;
    return n < 1 ? 1 : n > 256 ? 256 : n;
}

void weightsClose(Weights *w) {
    if (!w) return;
    safetensorsFree(w->st);
    nsaLayoutFree(&w->layout);
    free(w->config_yaml);
    memset(w, 0, sizeof *w);
}

const char *weightsTokenizer(const Weights *w) {
    if (w->have_run_config && w->job.data.tokenizer[0]) return w->job.data.tokenizer;
    return w->job.model.vocab_size >= tokenizerVocabOf("byte") ? "byte" : WEIGHTS_TOKENIZER_UNKNOWN;
}

const Tokenizer *weightsTextTokenizer(const Weights *w, NsaError *err) {
    const char *name = weightsTokenizer(w);
    const Tokenizer *tok = tokenizerFind(name);
    const int V = w->job.model.vocab_size;
    if (!w->have_run_config && !strcmp(name, WEIGHTS_TOKENIZER_UNKNOWN)) {
        nsaErrorf(err,
                  "%s: the model's tokenizer is unknown (no run config beside the checkpoint, and "
                  "its vocabulary of %d is smaller than the byte tokenizer's %d): it has no text "
                  "form, only token ids",
                  w->dir, V, tokenizerVocabOf("byte"));
        return NULL;
    }
    if (!tok) {
        nsaErrorf(err,
                  "the run's tokenizer '%s' (data.tokenizer, vocabulary %d) is not one nsad can "
                  "encode or decode text with (allowed: %s): the model has no text form here, "
                  "only token ids",
                  name, V, tokenizerNames());
        return NULL;
    }
    if (tok->vocab_size > V) {
        nsaErrorf(err, "the %s tokenizer's %d ids do not fit the model's vocabulary (%d)",
                  tok->name, tok->vocab_size, V);
        return NULL;
    }
    return tok;
}

int weightsNumTensors(const Weights *w) { return w->layout.n_tensors; }

int weightsTensor(const Weights *w, int i, const NsaTensorInfo **info, float *dst, NsaError *err) {
    if (i < 0 || i >= w->layout.n_tensors)
        return nsaErrorf(err, "checkpoint: tensor %d out of range", i);
    const NsaTensorInfo *ti = &w->layout.entries[i].info;
    if (info) *info = ti;
    if (dst) safetensorsCopy(w->st, safetensorsFind(w->st, ti->name), dst);
    return 0;
}

int weightsFitJob(const Weights *w, const JobConfig *job, char *notes, size_t cap, NsaError *err) {
    const NsaModelConfig *c = &w->job.model, *m = &job->model;
    if (w->have_run_config && strcmp(weightsTokenizer(w), job->data.tokenizer))
        return nsaErrorf(err,
                         "%s was trained on data.tokenizer '%s'; this job's is '%s' (the "
                         "token ids must mean the same: the two must be equal)",
                         w->dir, weightsTokenizer(w), job->data.tokenizer);
    const struct {
        const char *key;
        int have, want, shapes;
    } ints[] = {
        {"model.vocab_size", c->vocab_size, m->vocab_size, 1},
        {"model.dim", c->dim, m->dim, 1},
        {"model.n_layers", c->n_layers, m->n_layers, 1},
        {"model.n_heads", c->n_heads, m->n_heads, 1},
        {"model.n_kv_groups", c->n_kv_groups, m->n_kv_groups, 1},
        {"model.d_k", c->d_k, m->d_k, 1},
        {"model.d_v", c->d_v, m->d_v, 1},
        {"model.mlp_hidden", nsaLayoutMlpHidden(c), nsaLayoutMlpHidden(m), 1},
        {"nsa.l", c->cmp_len, m->cmp_len, m->phi == NSA_PHI_MLP},
        {"nsa.d", c->cmp_stride, m->cmp_stride, 0},
        {"nsa.l_sel", c->sel_len, m->sel_len, 0},
        {"nsa.n_sel", c->n_sel, m->n_sel, 0},
        {"nsa.w", c->window, m->window, 0},
    };
    static const char *const mlp_names[] = {"silu", "swiglu"}, *const phi_names[] = {"avg", "mlp"};
    if (c->mlp != m->mlp || c->phi != m->phi)
        return nsaErrorf(err,
                         "%s holds a model with %s = %s; this job's is %s (it shapes the "
                         "weights: the two must be equal)",
                         w->dir, c->mlp != m->mlp ? "model.mlp" : "nsa.phi",
                         c->mlp != m->mlp ? mlp_names[c->mlp] : phi_names[c->phi],
                         c->mlp != m->mlp ? mlp_names[m->mlp] : phi_names[m->phi]);
    size_t at = 0;
    if (notes && cap) notes[0] = '\0';
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (ints[i].have == ints[i].want) continue;
        if (ints[i].shapes)
            return nsaErrorf(err,
                             "%s holds a model with %s = %d; this job's is %d (it shapes the "
                             "weights: the two must be equal)",
                             w->dir, ints[i].key, ints[i].have, ints[i].want);
        if (notes && at < cap)
            at += (size_t)snprintf(notes + at, cap - at, "%s%s %d -> %d", at ? ", " : "",
                                   ints[i].key, ints[i].have, ints[i].want);
    }
    const struct {
        const char *key;
        float have, want;
    } reals[] = {{"model.rope_base", c->rope_base, m->rope_base},
                 {"model.norm_eps", c->norm_eps, m->norm_eps}};
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
        if (notes && reals[i].have != reals[i].want && at < cap)
            at += (size_t)snprintf(notes + at, cap - at, "%s%s %g -> %g", at ? ", " : "",
                                   reals[i].key, reals[i].have, reals[i].want);
    return 0;
}

/* Copies every tensor through one buffer of the largest size into set(). */
typedef int (*SetFn)(void *target, int i, const float *src, NsaError *err);

static int copyAll(const Weights *w, void *target, SetFn set, NsaError *err) {
    size_t largest = 1;
    for (int i = 0; i < w->layout.n_tensors; i++)
        if (w->layout.entries[i].info.numel > largest) largest = w->layout.entries[i].info.numel;
    float *buf = malloc(largest * sizeof(float));
    if (!buf) return nsaErrorf(err, "checkpoint: out of memory for a %zu-float tensor", largest);
    int rc = 0;
    for (int i = 0; i < w->layout.n_tensors && rc == 0; i++)
        rc = weightsTensor(w, i, NULL, buf, err) || set(target, i, buf, err) ? -1 : 0;
    free(buf);
    return rc;
}

static int setDecoder(void *d, int i, const float *src, NsaError *err) {
    return nsaDecoderSetTensor(d, i, src, err);
}

static int setModel(void *m, int i, const float *src, NsaError *err) {
    return nsaModelSetTensor(m, NSA_ARENA_PARAMS, i, src, err);
}

int weightsToDecoder(const Weights *w, NsaDecoder *d, NsaError *err) {
    return copyAll(w, d, setDecoder, err);
}

int weightsToModel(const Weights *w, NsaModel *m, NsaError *err) {
    return copyAll(w, m, setModel, err);
}

NsaDecoder *weightsNewDecoder(const Weights *w, NsaDevice device, int gpu, int slots, int context,
                              int threads, NsaError *err) {
    NsaDecoderOptions o = {.device = device,
                           .device_ordinal = gpu,
                           .precision = device == NSA_DEVICE_CUDA ? NSA_PREC_BF16 : NSA_PREC_F32,
                           .max_batch = slots,
                           .max_context = context,
                           .threads = threads};
    NsaDecoder *d = nsaDecoderCreate(&w->job.model, &o, err);
    if (d && weightsToDecoder(w, d, err)) {
        nsaDecoderFree(d);
        return NULL;
    }
    return d;
}
