/* artifacts.c - see artifacts.h; formats in proto/files.md. */
#include "artifacts.h"
#include "clockutil.h"
#include "fsutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>

#ifndef NSAD_GIT_COMMIT
#define NSAD_GIT_COMMIT "unknown"  /* built outside a git checkout */
#endif

struct Artifacts {
    char out_dir[4096];
    int heartbeat_fd, training_fd, val_fd;
};

/* The shortest of %.15g..%.17g that reads back as the same double, so the
 * CSV stays readable and still compares exactly. */
static void formatDouble(double v, char *out, size_t cap) {
    if (isnan(v)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(out, cap, v > 0 ? "inf" : "-inf");
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v) return;
    }
}

static int appendLine(int fd, const char *line, const char *what, NsaError *err) {
    if (fsWriteAll(fd, line, strlen(line)) != 0)
        return nsaErrorf(err, "append to %s: %s", what, strerror(errno));
    return 0;
}

/* Keeps the header and the rows whose step is <= keep_step, rewriting the
 * file in place (atomically). A missing or empty file gets just the header.
 * A file with another header is refused: it is not ours to rewrite. */
static int trimCsv(const char *path, const char *header, int64_t keep_step, NsaError *err) {
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    if (!out) return nsaErrorf(err, "out of memory trimming %s", path);
    len = (size_t)snprintf(out, cap, "%s\n", header);
    FILE *f = fopen(path, "r");
    if (!f && errno != ENOENT) {
        free(out);
        return nsaErrorf(err, "open %s: %s", path, strerror(errno));
    }
    if (f) {
        char *line = NULL;
        size_t line_cap = 0;
        ssize_t n;
        int first = 1;
        while ((n = getline(&line, &line_cap, f)) > 0) {
            if (first) {
                first = 0;
                line[strcspn(line, "\r\n")] = 0;
                if (strcmp(line, header) != 0) {
                    nsaErrorf(err, "%s starts with '%.80s'; expected the header '%s'", path, line, header);
                    free(line);
                    fclose(f);
                    free(out);
                    return -1;
                }
                continue;
            }
            char *end;
            long long step = strtoll(line, &end, 10);
            if (end == line || *end != ',' || step > keep_step) continue;
            if (len + (size_t)n + 1 > cap) {
                while (len + (size_t)n + 1 > cap) cap *= 2;
                char *grown = realloc(out, cap);
                if (!grown) {
                    free(line);
                    fclose(f);
                    free(out);
                    return nsaErrorf(err, "out of memory trimming %s", path);
                }
                out = grown;
            }
            memcpy(out + len, line, (size_t)n);
            len += (size_t)n;
            if (out[len - 1] != '\n') out[len++] = '\n';
        }
        free(line);
        fclose(f);
    }
    int rc = fsWriteFileAtomic(path, out, len, 0644, err);
    free(out);
    return rc;
}

/* CSV columns nsad reads, with the header names it accepts for each. */
enum { COL_STEP, COL_TS, COL_LOSS, COL_LR, COL_GNORM, COL_TOKS, COL_MEM, COL_VAL, COL_BPB, COL_COUNT };
static const char *const column_names[COL_COUNT][4] = {
    [COL_STEP] = {"step", NULL},
    [COL_TS] = {"ts", "time", "timestamp", "unix_time"},
    [COL_LOSS] = {"loss", "train_loss", NULL},
    [COL_LR] = {"lr", "learning_rate", NULL},
    [COL_GNORM] = {"grad_norm", "gnorm", NULL},
    [COL_TOKS] = {"toks_per_s", "tokens_per_s", "tok_per_s", "tok_s"},
    [COL_MEM] = {"mem_bytes", "memory_bytes", NULL},
    [COL_VAL] = {"val_loss", NULL},
    [COL_BPB] = {"bits_per_byte", "bpb", "val_bpb", NULL},
};

static int columnOf(const char *name) {
    for (int c = 0; c < COL_COUNT; c++)
        for (int k = 0; k < 4 && column_names[c][k]; k++)
            if (!strcmp(name, column_names[c][k])) return c;
    return -1;
}

/* Splits a CSV line in place on commas (no quoting: nsad's CSVs hold
 * numbers) and trims each field's spaces and line end. */
static int splitCsv(char *line, char **fields, int max) {
    int n = 0;
    char *p = line;
    while (n < max) {
        fields[n++] = p;
        char *comma = strchr(p, ',');
        if (!comma) break;
        *comma = '\0';
        p = comma + 1;
    }
    for (int i = 0; i < n; i++) {
        char *f = fields[i];
        while (*f == ' ') f++;
        size_t len = strlen(f);
        while (len && (f[len - 1] == ' ' || f[len - 1] == '\r' || f[len - 1] == '\n')) f[--len] = '\0';
        fields[i] = f;
    }
    return n;
}

/* The number in column idx, or NAN when the row has no such column or the
 * cell is empty or not a number. */
static double csvCell(char **fields, int n, int idx) {
    if (idx < 0 || idx >= n || !*fields[idx]) return NAN;
    char *end;
    double v = strtod(fields[idx], &end);
    return *end ? NAN : v;
}

int artifactsReadCsv(const char *out_dir, const char *name, ArtifactCsvRowFn fn, void *ctx,
                     NsaError *err) {
    char path[4096];
    if (fsPathf(err, path, sizeof path, "%s/%s", out_dir, name) != 0) return -1;
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? 0 : nsaErrorf(err, "%s: %s", path, strerror(errno));
    int col[COL_COUNT];
    for (int c = 0; c < COL_COUNT; c++) col[c] = -1;
    char *line = NULL, *fields[64];
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        int n = splitCsv(line, fields, 64);
        if (lineno == 1) {
            for (int i = 0; i < n; i++) {
                int c = columnOf(fields[i]);
                if (c >= 0 && col[c] < 0) col[c] = i;
            }
            if (col[COL_STEP] < 0) {
                rc = nsaErrorf(err, "%s line 1: no \"step\" column in the header", path);
                break;
            }
            continue;
        }
        double step = csvCell(fields, n, col[COL_STEP]);
        if (!isfinite(step)) continue; /* a torn last line after a kill */
        ArtifactCsvRow row = {
            .step = (int64_t)step,
            .ts = csvCell(fields, n, col[COL_TS]),
            .loss = csvCell(fields, n, col[COL_LOSS]),
            .lr = csvCell(fields, n, col[COL_LR]),
            .grad_norm = csvCell(fields, n, col[COL_GNORM]),
            .toks_per_s = csvCell(fields, n, col[COL_TOKS]),
            .mem_bytes = csvCell(fields, n, col[COL_MEM]),
            .val_loss = csvCell(fields, n, col[COL_VAL] >= 0 ? col[COL_VAL] : col[COL_LOSS]),
            .bits_per_byte = csvCell(fields, n, col[COL_BPB]),
        };
        if (fn(ctx, &row, err) != 0) {
            rc = -1;
            break;
        }
    }
    if (rc == 0 && ferror(f)) rc = nsaErrorf(err, "%s: read error", path);
    free(line);
    fclose(f);
    return rc;
}

static int openAppend(const char *out_dir, const char *name, int *fd, NsaError *err) {
    char path[4096];
    if (fsPathf(err, path, sizeof path, "%s/%s", out_dir, name) != 0) return -1;
    *fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (*fd < 0) return nsaErrorf(err, "open %s: %s", path, strerror(errno));
    return 0;
}

Artifacts *artifactsOpen(const char *out_dir, int64_t resume_step, NsaError *err) {
    if (fsMkdirs(out_dir, 0755, err) != 0) return NULL;
    Artifacts *a = calloc(1, sizeof *a);
    if (!a) return nsaErrorf(err, "out of memory"), NULL;
    a->heartbeat_fd = a->training_fd = a->val_fd = -1;
    if (fsPathf(err, a->out_dir, sizeof a->out_dir, "%s", out_dir) != 0) goto fail;
    char path[4096];
    /* a fresh run keeps no rows: every step is logged again from 1 */
    int64_t keep = resume_step < 0 ? INT64_MIN : resume_step;
    if (fsPathf(err, path, sizeof path, "%s/%s", out_dir, ARTIFACT_TRAINING_CSV) != 0 ||
        trimCsv(path, TRAINING_CSV_HEADER, keep, err) != 0)
        goto fail;
    if (fsPathf(err, path, sizeof path, "%s/%s", out_dir, ARTIFACT_VAL_CSV) != 0 ||
        trimCsv(path, VAL_CSV_HEADER, keep, err) != 0)
        goto fail;
    if (openAppend(out_dir, ARTIFACT_HEARTBEAT, &a->heartbeat_fd, err) != 0 ||
        openAppend(out_dir, ARTIFACT_TRAINING_CSV, &a->training_fd, err) != 0 ||
        openAppend(out_dir, ARTIFACT_VAL_CSV, &a->val_fd, err) != 0)
        goto fail;
    return a;
fail:
    artifactsClose(a);
    return NULL;
}

void artifactsClose(Artifacts *a) {
    if (!a) return;
    if (a->heartbeat_fd >= 0) close(a->heartbeat_fd);
    if (a->training_fd >= 0) close(a->training_fd);
    if (a->val_fd >= 0) close(a->val_fd);
    free(a);
}

/* Prints obj as one line and appends it to the heartbeat; frees obj. */
static int heartbeatAppend(Artifacts *a, cJSON *obj, NsaError *err) {
    char *json = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!json) return nsaErrorf(err, "out of memory formatting a heartbeat line");
    size_t n = strlen(json);
    char *line = malloc(n + 2);
    if (!line) {
        free(json);
        return nsaErrorf(err, "out of memory formatting a heartbeat line");
    }
    memcpy(line, json, n);
    line[n] = '\n';
    line[n + 1] = 0;
    free(json);
    int rc = appendLine(a->heartbeat_fd, line, ARTIFACT_HEARTBEAT, err);
    free(line);
    return rc;
}

int artifactsLogStep(Artifacts *a, const TrainStepLog *s, const char *phase, NsaError *err) {
    cJSON *o = cJSON_CreateObject();
    if (o) {
        cJSON_AddNumberToObject(o, "ts", s->ts);
        cJSON_AddStringToObject(o, "event", "step");
        cJSON_AddNumberToObject(o, "step", (double)s->step);
        cJSON_AddNumberToObject(o, "total_steps", (double)s->total_steps);
        cJSON_AddNumberToObject(o, "loss", s->loss);  /* non-finite prints as null */
        cJSON_AddNumberToObject(o, "lr", s->lr);
        cJSON_AddNumberToObject(o, "grad_norm", s->grad_norm);
        cJSON_AddNumberToObject(o, "toks_per_s", s->toks_per_s);
        cJSON_AddNumberToObject(o, "step_seconds", s->step_seconds);
        cJSON_AddNumberToObject(o, "tokens_seen", (double)s->tokens_seen);
        cJSON_AddStringToObject(o, "phase", phase);
        cJSON_AddNumberToObject(o, "memory", (double)s->mem_bytes);
    }
    if (heartbeatAppend(a, o, err) != 0) return -1;
    char loss[40], lr[40], tps[40], row[160];
    formatDouble(s->loss, loss, sizeof loss);
    formatDouble(s->lr, lr, sizeof lr);
    snprintf(tps, sizeof tps, "%.1f", s->toks_per_s);
    snprintf(row, sizeof row, "%" PRId64 ",%s,%s,%s\n", s->step, loss, lr, tps);
    return appendLine(a->training_fd, row, ARTIFACT_TRAINING_CSV, err);
}

int artifactsLogEval(Artifacts *a, int64_t step, double val_loss, double bits_per_byte,
                     NsaError *err) {
    char vl[40], bpb[40], row[128], detail[160];
    formatDouble(val_loss, vl, sizeof vl);
    formatDouble(bits_per_byte, bpb, sizeof bpb);
    snprintf(row, sizeof row, "%" PRId64 ",%s,%s\n", step, vl, bpb);
    if (appendLine(a->val_fd, row, ARTIFACT_VAL_CSV, err) != 0) return -1;
    cJSON *d = cJSON_CreateObject();
    if (!d) return nsaErrorf(err, "out of memory formatting an eval event");
    cJSON_AddNumberToObject(d, "val_loss", val_loss);
    cJSON_AddNumberToObject(d, "bits_per_byte", bits_per_byte);
    int ok = cJSON_PrintPreallocated(d, detail, sizeof detail, 0);
    cJSON_Delete(d);
    if (!ok) return nsaErrorf(err, "eval event too long");
    return artifactsLogEvent(a, "eval", step, "eval", detail, err);
}

int artifactsLogEvent(Artifacts *a, const char *type, int64_t step, const char *phase,
                      const char *detail_json, NsaError *err) {
    cJSON *detail = NULL;
    if (detail_json) {
        detail = cJSON_Parse(detail_json);
        if (!cJSON_IsObject(detail)) {
            cJSON_Delete(detail);
            return nsaErrorf(err, "heartbeat event %s: detail is not a JSON object: %.120s", type,
                        detail_json);
        }
    }
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        cJSON_Delete(detail);
        return nsaErrorf(err, "out of memory formatting a heartbeat event");
    }
    cJSON_AddNumberToObject(o, "ts", clockUnixSeconds());
    cJSON_AddStringToObject(o, "event", type);
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddStringToObject(o, "phase", phase ? phase : "");
    if (detail) cJSON_AddItemToObject(o, "detail", detail);
    else cJSON_AddItemToObject(o, "detail", cJSON_CreateObject());
    return heartbeatAppend(a, o, err);
}

/* ---- whole files ------------------------------------------------------------- */

static const char *phiName(NsaPhi p) { return p == NSA_PHI_MLP ? "mlp" : "avg"; }
static const char *mlpName(NsaMlpKind k) { return k == NSA_MLP_SWIGLU ? "swiglu" : "silu"; }
static const char *sourceName(DataSource s) {
    return s == DATA_TEXT ? "text" : s == DATA_SHARDS ? "shards" : "synthetic";
}
static const char *nanPolicyName(NanPolicy p) {
    return p == NAN_SKIP ? "skip" : p == NAN_ROLLBACK ? "rollback" : "halt";
}
static const char *faultKindName(FaultKind k) {
    return k == FAULT_NAN_LOSS ? "loss" : k == FAULT_NAN_GRAD ? "grad" : "none";
}

cJSON *artifactsConfigJson(const JobConfig *cfg) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    const NsaModelConfig *m = &cfg->model;
    cJSON *o = cJSON_AddObjectToObject(root, "model");
    cJSON_AddNumberToObject(o, "dim", m->dim);
    cJSON_AddNumberToObject(o, "n_layers", m->n_layers);
    cJSON_AddNumberToObject(o, "n_heads", m->n_heads);
    cJSON_AddNumberToObject(o, "n_kv_groups", m->n_kv_groups);
    cJSON_AddNumberToObject(o, "d_k", m->d_k);
    cJSON_AddNumberToObject(o, "d_v", m->d_v);
    cJSON_AddNumberToObject(o, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(o, "mlp_hidden", m->mlp_hidden);
    cJSON_AddStringToObject(o, "mlp", mlpName(m->mlp));
    cJSON_AddNumberToObject(o, "rope_base", m->rope_base);
    cJSON_AddNumberToObject(o, "norm_eps", m->norm_eps);
    o = cJSON_AddObjectToObject(root, "nsa");
    cJSON_AddNumberToObject(o, "l", m->cmp_len);
    cJSON_AddNumberToObject(o, "d", m->cmp_stride);
    cJSON_AddNumberToObject(o, "l_sel", m->sel_len);
    cJSON_AddNumberToObject(o, "n_sel", m->n_sel);
    cJSON_AddNumberToObject(o, "w", m->window);
    cJSON_AddStringToObject(o, "phi", phiName(m->phi));
    const TrainConfig *t = &cfg->train;
    o = cJSON_AddObjectToObject(root, "train");
    cJSON_AddNumberToObject(o, "steps", (double)t->steps);
    cJSON_AddNumberToObject(o, "seq_len", t->seq_len);
    cJSON_AddNumberToObject(o, "batch_size", t->batch_size);
    cJSON_AddNumberToObject(o, "accumulate_grad_batches", t->accumulate_grad_batches);
    cJSON_AddNumberToObject(o, "lr", t->lr);
    cJSON_AddNumberToObject(o, "min_lr", t->min_lr);
    cJSON_AddStringToObject(o, "lr_schedule", "cosine");  /* nsad's one schedule (train.lr_schedule) */
    cJSON_AddNumberToObject(o, "warmup_steps", (double)t->warmup_steps);
    cJSON_AddNumberToObject(o, "weight_decay", t->weight_decay);
    cJSON_AddNumberToObject(o, "grad_clip", t->grad_clip);
    cJSON_AddNumberToObject(o, "beta1", t->beta1);
    cJSON_AddNumberToObject(o, "beta2", t->beta2);
    cJSON_AddNumberToObject(o, "eps", t->eps);
    cJSON_AddNumberToObject(o, "seed", (double)t->seed);
    cJSON_AddNumberToObject(o, "log_every", (double)t->log_every);
    cJSON_AddNumberToObject(o, "eval_every", (double)t->eval_every);
    cJSON_AddNumberToObject(o, "eval_batches", (double)t->eval_batches);
    cJSON_AddNumberToObject(o, "save_every", (double)t->save_every);
    cJSON_AddNumberToObject(o, "keep_last", t->keep_last);
    cJSON_AddStringToObject(o, "out_dir", t->out_dir);
    o = cJSON_AddObjectToObject(root, "runtime");
    cJSON_AddStringToObject(o, "device", configDeviceName(cfg->runtime.device));
    cJSON_AddStringToObject(o, "precision", configPrecisionName(cfg->runtime.precision));
    cJSON_AddNumberToObject(o, "threads", cfg->runtime.threads);
    /* the config's own values: false, true or "selective" */
    if (cfg->runtime.gradient_checkpointing == NSA_RECOMPUTE_SELECTIVE)
        cJSON_AddStringToObject(o, "gradient_checkpointing", "selective");
    else
        cJSON_AddBoolToObject(o, "gradient_checkpointing", cfg->runtime.gradient_checkpointing);
    o = cJSON_AddObjectToObject(root, "data");
    cJSON_AddStringToObject(o, "source", sourceName(cfg->data.source));
    cJSON_AddStringToObject(o, "path", cfg->data.path);
    cJSON_AddStringToObject(o, "tokenizer", cfg->data.tokenizer);
    cJSON_AddNumberToObject(o, "val_fraction", cfg->data.val_fraction);
    o = cJSON_AddObjectToObject(root, "nan");
    cJSON_AddStringToObject(o, "policy", nanPolicyName(cfg->nan.policy));
    cJSON_AddNumberToObject(o, "max_skips", cfg->nan.max_skips);
    o = cJSON_AddObjectToObject(root, "fault");
    cJSON_AddNumberToObject(o, "nan_at_step", (double)cfg->fault.nan_at_step);
    cJSON_AddStringToObject(o, "nan_kind", faultKindName(cfg->fault.nan_kind));
    cJSON_AddNumberToObject(o, "stall_at_step", (double)cfg->fault.stall_at_step);
    cJSON_AddStringToObject(o, "stall_phase", cfg->fault.stall_phase);
    cJSON_AddNumberToObject(o, "stall_seconds", cfg->fault.stall_seconds);
    o = cJSON_AddObjectToObject(root, "watchdog");
    cJSON_AddNumberToObject(o, "data", cfg->watchdog.data);
    cJSON_AddNumberToObject(o, "forward", cfg->watchdog.forward);
    cJSON_AddNumberToObject(o, "backward", cfg->watchdog.backward);
    cJSON_AddNumberToObject(o, "optimizer", cfg->watchdog.optimizer);
    cJSON_AddNumberToObject(o, "checkpoint", cfg->watchdog.checkpoint);
    cJSON_AddNumberToObject(o, "eval", cfg->watchdog.eval);
    cJSON_AddStringToObject(o, "on_hang", cfg->watchdog.on_hang == HANG_EXIT ? "exit" : "report");
    return root;
}

static int writeJsonFile(const char *out_dir, const char *name, cJSON *root, NsaError *err) {
    char path[4096];
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return nsaErrorf(err, "out of memory formatting %s", name);
    size_t n = strlen(text);
    char *withNewline = realloc(text, n + 2);
    if (!withNewline) {
        free(text);
        return nsaErrorf(err, "out of memory formatting %s", name);
    }
    withNewline[n] = '\n';
    withNewline[n + 1] = 0;
    int rc = fsPathf(err, path, sizeof path, "%s/%s", out_dir, name);
    if (rc == 0) rc = fsWriteFileAtomic(path, withNewline, n + 1, 0644, err);
    free(withNewline);
    return rc;
}

int artifactsWriteEnv(const char *out_dir, const JobConfig *cfg, const NsaMemoryReport *mem,
                      const char *resumed_from, NsaError *err) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return nsaErrorf(err, "out of memory formatting env.json");
    cJSON_AddNumberToObject(root, "ts", clockUnixSeconds());
    cJSON *v = cJSON_AddObjectToObject(root, "versions");
    cJSON_AddStringToObject(v, "nsad", NSA_VERSION);
    cJSON_AddStringToObject(v, "libnsa", NSA_VERSION);
    cJSON_AddStringToObject(v, "cjson", cJSON_Version());
    cJSON_AddStringToObject(v, "libyaml", yaml_get_version_string());
    cJSON_AddStringToObject(v, "libmicrohttpd", MHD_get_version());
    cJSON_AddStringToObject(v, "compiler", __VERSION__);
    cJSON_AddStringToObject(root, "git_commit", NSAD_GIT_COMMIT);
    struct utsname un;
    cJSON *h = cJSON_AddObjectToObject(root, "host");
    if (uname(&un) == 0) {
        cJSON_AddStringToObject(h, "hostname", un.nodename);
        cJSON_AddStringToObject(h, "os", un.sysname);
        cJSON_AddStringToObject(h, "kernel", un.release);
        cJSON_AddStringToObject(h, "machine", un.machine);
    }
    cJSON_AddNumberToObject(h, "cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_AddNumberToObject(h, "pid", (double)getpid());
    cJSON *d = cJSON_AddObjectToObject(root, "device");
    cJSON_AddStringToObject(d, "kind", configDeviceName(cfg->runtime.device));
    cJSON_AddStringToObject(d, "precision", configPrecisionName(cfg->runtime.precision));
    cJSON_AddNumberToObject(d, "threads", cfg->runtime.threads);
    if (mem) {
        cJSON_AddNumberToObject(d, "model_bytes", (double)mem->total);
        cJSON_AddNumberToObject(d, "params_bytes", (double)mem->params);
        cJSON_AddNumberToObject(d, "activations_bytes", (double)mem->activations);
        cJSON_AddNumberToObject(d, "grads_bytes", (double)mem->grads);
        cJSON_AddNumberToObject(d, "optimizer_bytes", (double)mem->optimizer);
        cJSON_AddNumberToObject(d, "workspace_bytes", (double)mem->workspace);
        if (cfg->runtime.device == NSA_DEVICE_CUDA) {
            cJSON_AddNumberToObject(d, "device_total_bytes", (double)mem->device_total);
            cJSON_AddNumberToObject(d, "device_free_bytes", (double)mem->device_free);
            cJSON_AddStringToObject(d, "attention_path", mem->attention_path);
        }
    }
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, configHash(cfg));
    cJSON_AddStringToObject(root, "config_hash", hash);
    cJSON *c = artifactsConfigJson(cfg);
    if (c) cJSON_AddItemToObject(root, "config", c);
    char *yaml = configToYaml(cfg);
    if (yaml) cJSON_AddStringToObject(root, "config_yaml", yaml);
    free(yaml);
    if (resumed_from) cJSON_AddStringToObject(root, "resumed_from", resumed_from);
    else cJSON_AddNullToObject(root, "resumed_from");
    if (!c || !yaml) {
        cJSON_Delete(root);
        return nsaErrorf(err, "out of memory formatting env.json");
    }
    return writeJsonFile(out_dir, ARTIFACT_ENV, root, err);
}

static void addNumberOrNull(cJSON *o, const char *key, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

int artifactsWriteMetrics(const char *out_dir, const RunSummary *s, NsaError *err) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return nsaErrorf(err, "out of memory formatting metrics.json");
    cJSON_AddNumberToObject(o, "ts", clockUnixSeconds());
    cJSON_AddStringToObject(o, "outcome", s->outcome);
    cJSON_AddNumberToObject(o, "step", (double)s->step);
    cJSON_AddNumberToObject(o, "total_steps", (double)s->total_steps);
    addNumberOrNull(o, "final_loss", s->final_loss);
    addNumberOrNull(o, "first_val_loss", s->first_val_loss);
    addNumberOrNull(o, "first_bits_per_byte", s->first_bits_per_byte);
    addNumberOrNull(o, "final_val_loss", s->final_val_loss);
    addNumberOrNull(o, "final_bits_per_byte", s->final_bits_per_byte);
    addNumberOrNull(o, "best_val_loss", s->best_val_loss);
    cJSON_AddNumberToObject(o, "tokens_seen", (double)s->tokens_seen);
    cJSON_AddNumberToObject(o, "wall_seconds", s->wall_seconds);
    addNumberOrNull(o, "mean_toks_per_s", s->mean_toks_per_s);
    cJSON_AddNumberToObject(o, "anomalies", s->anomalies);
    cJSON_AddStringToObject(o, "anomaly", s->anomaly ? s->anomaly : "");
    cJSON_AddStringToObject(o, "last_checkpoint", s->last_checkpoint ? s->last_checkpoint : "");
    cJSON_AddStringToObject(o, "error", s->error ? s->error : "");
    return writeJsonFile(out_dir, ARTIFACT_METRICS, o, err);
}

static int writeSmallFile(const char *out_dir, const char *name, const char *text, NsaError *err) {
    char path[4096];
    if (fsPathf(err, path, sizeof path, "%s/%s", out_dir, name) != 0) return -1;
    return fsWriteFileAtomic(path, text, strlen(text), 0644, err);
}

int artifactsWriteAnomaly(const char *out_dir, const char *type, NsaError *err) {
    char line[64];
    snprintf(line, sizeof line, "%s\n", type);
    return writeSmallFile(out_dir, ARTIFACT_ANOMALY, line, err);
}

int artifactsWriteHalt(const char *out_dir, const char *reason, NsaError *err) {
    char line[256];
    snprintf(line, sizeof line, "%s\n", reason);
    return writeSmallFile(out_dir, ARTIFACT_HALT, line, err);
}

int artifactsHaltRequested(const char *out_dir) {
    char path[4096];
    if (fsPathf(NULL, path, sizeof path, "%s/%s", out_dir, ARTIFACT_HALT) != 0) return 0;
    return access(path, F_OK) == 0;
}

int artifactsClearStale(const char *out_dir, NsaError *err) {
    const char *names[] = {ARTIFACT_HALT, ARTIFACT_ANOMALY};
    int removed = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[4096];
        if (fsPathf(err, path, sizeof path, "%s/%s", out_dir, names[i]) != 0) return -1;
        if (unlink(path) == 0) removed++;
        else if (errno != ENOENT) return nsaErrorf(err, "remove stale %s: %s", path, strerror(errno));
    }
    return removed;
}

void artifactsAnomalyName(double value, const char *what, char *out, size_t cap) {
    snprintf(out, cap, "%s_%s", isinf(value) ? "inf" : "nan", what);
}
