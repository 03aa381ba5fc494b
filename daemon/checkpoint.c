/* checkpoint.c - safetensors read/write and training checkpoints; see
 * checkpoint.h for the formats and contracts. */
#include "checkpoint.h"
#include "fsutil.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint.c writes host floats as safetensors' little-endian data"
#endif

/* safetensors' own loader refuses headers above 100 MB */
#define SAFETENSORS_MAX_HEADER (100u * 1024u * 1024u)

/* ---- small file-system helpers ------------------------------------------ */

static void parentDir(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(out, cap, ".");
    } else if (slash == path) {
        snprintf(out, cap, "/");
    } else {
        snprintf(out, cap, "%.*s", (int)(slash - path), path);
    }
}

/* Removes a checkpoint directory: its plain files, then itself. A missing
 * directory is fine. Checkpoint directories hold no subdirectories. */
static int removeCheckpointDir(const char *dir, NsaError *err) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        return nsaErrorf(err, "opendir %s: %s", dir, strerror(errno));
    }
    struct dirent *e;
    char path[4096];
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (fsPathf(err, path, sizeof path, "%s/%s", dir, e->d_name) != 0) {
            rc = -1;
            break;
        }
        if (unlink(path) != 0) {
            rc = nsaErrorf(err, "remove %s: %s", path, strerror(errno));
            break;
        }
    }
    closedir(d);
    if (rc == 0 && rmdir(dir) != 0) rc = nsaErrorf(err, "rmdir %s: %s", dir, strerror(errno));
    return rc;
}

static int fileExists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* ---- safetensors writer ---------------------------------------------------- */

static char *buildHeader(const SafetensorsTensor *tensors, int n, const SafetensorsMeta *meta,
                         int n_meta, NsaError *err) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return nsaErrorf(err, "out of memory building a safetensors header"), NULL;
    if (n_meta > 0) {
        cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; md && i < n_meta; i++)
            if (!cJSON_AddStringToObject(md, meta[i].key, meta[i].value)) md = NULL;
        if (!md) goto oom;
    }
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        const SafetensorsTensor *t = &tensors[i];
        if (t->ndim < 0 || t->ndim > SAFETENSORS_MAX_DIMS) {
            cJSON_Delete(root);
            return nsaErrorf(err, "tensor %s: ndim %d; allowed: 0..%d", t->name, t->ndim,
                        SAFETENSORS_MAX_DIMS), NULL;
        }
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d];
        if (numel != t->numel) {
            cJSON_Delete(root);
            return nsaErrorf(err, "tensor %s: shape holds %zu elements but numel is %zu", t->name,
                        numel, t->numel), NULL;
        }
        if (cJSON_GetObjectItemCaseSensitive(root, t->name)) {
            cJSON_Delete(root);
            return nsaErrorf(err, "tensor name %s appears twice", t->name), NULL;
        }
        cJSON *obj = cJSON_AddObjectToObject(root, t->name);
        if (!obj || !cJSON_AddStringToObject(obj, "dtype", "F32")) goto oom;
        cJSON *shape = cJSON_AddArrayToObject(obj, "shape");
        cJSON *offs = cJSON_AddArrayToObject(obj, "data_offsets");
        if (!shape || !offs) goto oom;
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        size_t end = offset + numel * sizeof(float);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)end));
        offset = end;
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return nsaErrorf(err, "out of memory printing a safetensors header"), NULL;
    return json;
oom:
    cJSON_Delete(root);
    return nsaErrorf(err, "out of memory building a safetensors header"), NULL;
}

/* Where the bytes of tensor i come from: a pointer to its numel floats,
 * either its own storage or scratch (room for the largest tensor) after
 * filling it. NULL on error, with err filled. */
typedef const float *(*TensorSource)(void *ctx, int i, float *scratch, NsaError *err);

static const float *fromArrays(void *ctx, int i, float *scratch, NsaError *err) {
    (void)scratch; (void)err;
    return ((const SafetensorsTensor *)ctx)[i].data;
}

/* The writer behind safetensorsWrite and checkpointSave: header, then each
 * tensor's bytes as `source` hands them over, so a checkpoint of a large
 * model needs one tensor of memory, not the whole arena. */
static int writeStreaming(const char *path, const SafetensorsTensor *tensors, int n,
                          const SafetensorsMeta *meta, int n_meta, TensorSource source,
                          void *ctx, NsaError *err) {
    char *json = buildHeader(tensors, n, meta, n_meta, err);
    if (!json) return -1;
    size_t json_len = strlen(json);
    /* pad with spaces so the data starts 8-byte aligned */
    size_t header_len = (json_len + 7) & ~(size_t)7;
    size_t largest = 1;
    for (int i = 0; i < n; i++)
        if (tensors[i].numel > largest) largest = tensors[i].numel;
    char *header = malloc(8 + header_len);
    float *scratch = source == fromArrays ? NULL : malloc(largest * sizeof(float));
    if (!header || (source != fromArrays && !scratch)) {
        free(json);
        free(header);
        free(scratch);
        return nsaErrorf(err, "out of memory writing %s", path);
    }
    uint64_t hl = header_len;
    for (int b = 0; b < 8; b++) header[b] = (char)((hl >> (8 * b)) & 0xff);
    memcpy(header + 8, json, json_len);
    memset(header + 8 + json_len, ' ', header_len - json_len);
    free(json);

    char tmp[4096], dir[4096];
    int fd = -1;
    if (fsPathf(err, tmp, sizeof tmp, "%s.tmp", path) != 0) goto fail_early;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        nsaErrorf(err, "create %s: %s", tmp, strerror(errno));
        goto fail_early;
    }
    if (fsWriteAll(fd, header, 8 + header_len) != 0) goto fail_write;
    for (int i = 0; i < n; i++) {
        if (!tensors[i].numel) continue;
        const float *data = source(ctx, i, scratch, err);
        if (!data) goto fail_file;
        if (fsWriteAll(fd, data, tensors[i].numel * sizeof(float)) != 0) goto fail_write;
    }
    if (fsync(fd) != 0) {
        nsaErrorf(err, "fsync %s: %s", tmp, strerror(errno));
        goto fail_file;
    }
    int closed = close(fd);
    fd = -1;
    if (closed != 0) {
        nsaErrorf(err, "close %s: %s", tmp, strerror(errno));
        goto fail_file;
    }
    if (rename(tmp, path) != 0) {
        nsaErrorf(err, "rename %s to %s: %s", tmp, path, strerror(errno));
        goto fail_file;
    }
    free(header);
    free(scratch);
    parentDir(path, dir, sizeof dir);
    return fsFsyncDir(dir, err);
fail_write:
    nsaErrorf(err, "write %s: %s", tmp, strerror(errno));
fail_file:
    if (fd >= 0) close(fd);
    unlink(tmp);
fail_early:
    free(header);
    free(scratch);
    return -1;
}

int safetensorsWrite(const char *path, const SafetensorsTensor *tensors, int n,
                     const SafetensorsMeta *meta, int n_meta, NsaError *err) {
    return writeStreaming(path, tensors, n, meta, n_meta, fromArrays, (void *)tensors, err);
}

/* ---- safetensors reader ------------------------------------------------------ */

typedef struct StEntry {
    SafetensorsTensor t;
    size_t begin, end;   /* byte offsets inside the data section */
} StEntry;

struct Safetensors {
    unsigned char *map;
    size_t map_len;
    size_t data_start;   /* 8 + header length */
    StEntry *entries;
    int n;
    char **meta_keys, **meta_values;
    int n_meta;
};

void safetensorsFree(Safetensors *st) {
    if (!st) return;
    if (st->map) munmap(st->map, st->map_len);
    for (int i = 0; i < st->n; i++) free((char *)st->entries[i].t.name);
    free(st->entries);
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->meta_keys);
    free(st->meta_values);
    free(st);
}

static int entryByBegin(const void *a, const void *b) {
    const StEntry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    /* empty tensors share a begin with their neighbour: shorter first */
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Reads a JSON number that must be a non-negative integer below 2^53. */
static int jsonSize(const cJSON *item, size_t *out) {
    if (!cJSON_IsNumber(item)) return -1;
    double v = item->valuedouble;
    if (!(v >= 0) || v > 9007199254740992.0 || v != (double)(uint64_t)v) return -1;
    *out = (size_t)v;
    return 0;
}

static int parseMetadata(Safetensors *st, const cJSON *md, const char *path, NsaError *err) {
    if (!cJSON_IsObject(md))
        return nsaErrorf(err, "%s: __metadata__ is not an object; allowed: {string: string}", path);
    int count = cJSON_GetArraySize(md);
    st->meta_keys = calloc((size_t)count + 1, sizeof(char *));
    st->meta_values = calloc((size_t)count + 1, sizeof(char *));
    if (!st->meta_keys || !st->meta_values) return nsaErrorf(err, "%s: out of memory", path);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, md) {
        if (!cJSON_IsString(kv))
            return nsaErrorf(err, "%s: __metadata__.%s is not a string; allowed: string values", path,
                        kv->string);
        st->meta_keys[st->n_meta] = strdup(kv->string);
        st->meta_values[st->n_meta] = strdup(kv->valuestring);
        if (!st->meta_keys[st->n_meta] || !st->meta_values[st->n_meta])
            return nsaErrorf(err, "%s: out of memory", path);
        st->n_meta++;
    }
    return 0;
}

static int parseEntry(StEntry *e, const cJSON *obj, const char *path, NsaError *err) {
    const char *name = obj->string;
    if (!cJSON_IsObject(obj)) return nsaErrorf(err, "%s: tensor %s: entry is not an object", path, name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(obj, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(obj, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(obj, "data_offsets");
    if (!cJSON_IsString(dtype)) return nsaErrorf(err, "%s: tensor %s: no dtype string", path, name);
    if (strcmp(dtype->valuestring, "F32") != 0)
        return nsaErrorf(err, "%s: tensor %s: dtype %s; allowed: F32", path, name, dtype->valuestring);
    if (!cJSON_IsArray(shape)) return nsaErrorf(err, "%s: tensor %s: no shape array", path, name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > SAFETENSORS_MAX_DIMS)
        return nsaErrorf(err, "%s: tensor %s: %d dimensions; allowed: at most %d", path, name, ndim,
                    SAFETENSORS_MAX_DIMS);
    e->t.ndim = ndim;
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        size_t dim;
        if (jsonSize(cJSON_GetArrayItem(shape, d), &dim) != 0)
            return nsaErrorf(err, "%s: tensor %s: shape[%d] is not a non-negative integer", path, name, d);
        e->t.shape[d] = (int64_t)dim;
        if (dim && numel > SIZE_MAX / dim)
            return nsaErrorf(err, "%s: tensor %s: shape overflows", path, name);
        numel *= dim;
    }
    e->t.numel = numel;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        jsonSize(cJSON_GetArrayItem(offs, 0), &e->begin) != 0 ||
        jsonSize(cJSON_GetArrayItem(offs, 1), &e->end) != 0 || e->end < e->begin)
        return nsaErrorf(err, "%s: tensor %s: data_offsets must be [begin, end] with begin <= end", path,
                    name);
    if (e->end - e->begin != numel * sizeof(float))
        return nsaErrorf(err, "%s: tensor %s: data_offsets span %zu bytes but shape needs %zu", path,
                    name, e->end - e->begin, numel * sizeof(float));
    return 0;
}

static int parseHeader(Safetensors *st, const char *json, size_t len, const char *path,
                       NsaError *err) {
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return nsaErrorf(err, "%s: header is not valid JSON", path);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return nsaErrorf(err, "%s: header is not a JSON object", path);
    }
    int count = cJSON_GetArraySize(root);
    st->entries = calloc((size_t)count + 1, sizeof(StEntry));
    if (!st->entries) {
        cJSON_Delete(root);
        return nsaErrorf(err, "%s: out of memory", path);
    }
    int rc = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (!strcmp(item->string, "__metadata__")) {
            rc = parseMetadata(st, item, path, err);
        } else {
            StEntry *e = &st->entries[st->n];
            e->t.name = strdup(item->string);
            if (!e->t.name) {
                rc = nsaErrorf(err, "%s: out of memory", path);
                break;
            }
            st->n++;
            rc = parseEntry(e, item, path, err);
        }
        if (rc) break;
    }
    cJSON_Delete(root);
    return rc;
}

Safetensors *safetensorsRead(const char *path, NsaError *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nsaErrorf(err, "open %s: %s", path, strerror(errno)), NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int saved = errno;
        close(fd);
        return nsaErrorf(err, "stat %s: %s", path, strerror(saved)), NULL;
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return nsaErrorf(err, "%s: %zu bytes, too short for a safetensors header length", path, size),
               NULL;
    }
    Safetensors *st = calloc(1, sizeof *st);
    if (!st) {
        close(fd);
        return nsaErrorf(err, "%s: out of memory", path), NULL;
    }
    st->map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd);
    if (st->map == MAP_FAILED) {
        st->map = NULL;
        safetensorsFree(st);
        return nsaErrorf(err, "mmap %s: %s", path, strerror(saved)), NULL;
    }
    st->map_len = size;
    uint64_t header_len = 0;
    for (int b = 7; b >= 0; b--) header_len = (header_len << 8) | st->map[b];
    if (header_len > SAFETENSORS_MAX_HEADER || header_len > size - 8) {
        nsaErrorf(err, "%s: header length %" PRIu64 " exceeds the file (%zu bytes) or 100 MB", path,
             header_len, size);
        safetensorsFree(st);
        return NULL;
    }
    st->data_start = 8 + (size_t)header_len;
    if (parseHeader(st, (const char *)st->map + 8, (size_t)header_len, path, err) != 0) {
        safetensorsFree(st);
        return NULL;
    }
    qsort(st->entries, (size_t)st->n, sizeof(StEntry), entryByBegin);
    size_t expect = 0;
    for (int i = 0; i < st->n; i++) {
        if (st->entries[i].begin != expect) {
            nsaErrorf(err, "%s: tensor %s starts at byte %zu of the data, expected %zu (gap or overlap)",
                 path, st->entries[i].t.name, st->entries[i].begin, expect);
            safetensorsFree(st);
            return NULL;
        }
        expect = st->entries[i].end;
    }
    if (expect != size - st->data_start) {
        nsaErrorf(err, "%s: tensors cover %zu data bytes but the file holds %zu (truncated or padded)",
             path, expect, size - st->data_start);
        safetensorsFree(st);
        return NULL;
    }
    return st;
}

int safetensorsCount(const Safetensors *st) { return st->n; }

const SafetensorsTensor *safetensorsTensor(const Safetensors *st, int i) {
    if (i < 0 || i >= st->n) return NULL;
    return &st->entries[i].t;
}

const SafetensorsTensor *safetensorsFind(const Safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->entries[i].t.name, name)) return &st->entries[i].t;
    return NULL;
}

void safetensorsCopy(const Safetensors *st, const SafetensorsTensor *t, float *dst) {
    const StEntry *e = (const StEntry *)t;  /* t is the first member of its entry */
    if (t->numel) memcpy(dst, st->map + st->data_start + e->begin, t->numel * sizeof(float));
}

const char *safetensorsMeta(const Safetensors *st, const char *key) {
    for (int i = 0; i < st->n_meta; i++)
        if (!strcmp(st->meta_keys[i], key)) return st->meta_values[i];
    return NULL;
}

/* ---- training checkpoints -------------------------------------------------------- */

static void stepDirName(int64_t step, char *out, size_t cap) {
    snprintf(out, cap, "step_%08" PRId64, step);
}

/* The tensors of one safetensors file: each arena's tensors in layout
 * order, names prefixed per arena ("adam_m." ...). */
typedef struct ArenaFile {
    NsaModel *m;
    const NsaArena *arenas;
    int n_per_arena;
} ArenaFile;

static const float *fromModel(void *ctx, int i, float *scratch, NsaError *err) {
    const ArenaFile *f = ctx;
    NsaArena arena = f->arenas[i / f->n_per_arena];
    if (nsaModelGetTensor(f->m, arena, i % f->n_per_arena, scratch, err) != 0) return NULL;
    return scratch;
}

/* Writes one safetensors file of the given arenas (1 or 2) of m, reading
 * one tensor at a time with nsaModelGetTensor. */
static int writeArenas(NsaModel *m, const char *path, const NsaArena *arenas,
                       const char *const *prefixes, int n_arenas, const SafetensorsMeta *meta,
                       int n_meta, NsaError *err) {
    int n = nsaModelNumTensors(m);
    size_t total = (size_t)n * (size_t)n_arenas;
    SafetensorsTensor *tensors = calloc(total + 1, sizeof *tensors);
    char **names = calloc(total + 1, sizeof(char *));
    int rc = -1;
    if (!tensors || !names) {
        nsaErrorf(err, "out of memory writing %s", path);
        goto out;
    }
    for (int a = 0; a < n_arenas; a++) {
        for (int i = 0; i < n; i++) {
            const NsaTensorInfo *info = nsaModelTensorInfo(m, i);
            size_t k = (size_t)a * (size_t)n + (size_t)i;
            size_t len = strlen(prefixes[a]) + strlen(info->name) + 1;
            names[k] = malloc(len);
            if (!names[k]) {
                nsaErrorf(err, "out of memory writing %s", path);
                goto out;
            }
            snprintf(names[k], len, "%s%s", prefixes[a], info->name);
            tensors[k].name = names[k];
            tensors[k].ndim = info->ndim;
            for (int d = 0; d < info->ndim; d++) tensors[k].shape[d] = info->shape[d];
            tensors[k].numel = info->numel;
        }
    }
    ArenaFile file = {m, arenas, n};
    rc = writeStreaming(path, tensors, (int)total, meta, n_meta, fromModel, &file, err);
out:
    if (names)
        for (size_t k = 0; k < total; k++) free(names[k]);
    free(names);
    free(tensors);
    return rc;
}

static int writeLatest(const char *ck_dir, const char *name, NsaError *err) {
    char path[4096], tmp[4096], line[64];
    if (fsPathf(err, path, sizeof path, "%s/latest", ck_dir) != 0 ||
        fsPathf(err, tmp, sizeof tmp, "%s/latest.tmp", ck_dir) != 0)
        return -1;
    int len = snprintf(line, sizeof line, "%s\n", name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return nsaErrorf(err, "create %s: %s", tmp, strerror(errno));
    if (fsWriteAll(fd, line, (size_t)len) != 0 || fsync(fd) != 0) {
        int saved = errno;
        close(fd);
        unlink(tmp);
        return nsaErrorf(err, "write %s: %s", tmp, strerror(saved));
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        int saved = errno;
        unlink(tmp);
        return nsaErrorf(err, "rename %s: %s", tmp, strerror(saved));
    }
    return fsFsyncDir(ck_dir, err);
}

/* Parses "step_" followed by digits only; returns the step or -1. */
static int64_t parseStepDir(const char *name) {
    if (strncmp(name, "step_", 5) != 0 || !name[5]) return -1;
    int64_t v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > INT64_MAX / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static int cmpInt64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Deletes step_* directories beyond keep_last, never the one just saved. */
static int pruneCheckpoints(const char *ck_dir, int64_t saved_step, int keep_last, NsaError *err) {
    if (keep_last <= 0) return 0;
    DIR *d = opendir(ck_dir);
    if (!d) return nsaErrorf(err, "opendir %s: %s", ck_dir, strerror(errno));
    size_t cap = 16, n = 0;
    int64_t *steps = malloc(cap * sizeof *steps);
    struct dirent *e;
    while (steps && (e = readdir(d)) != NULL) {
        int64_t s = parseStepDir(e->d_name);
        if (s < 0 || s == saved_step) continue;
        if (n == cap) {
            int64_t *grown = realloc(steps, 2 * cap * sizeof *steps);
            if (!grown) {
                free(steps);
                steps = NULL;
                break;
            }
            steps = grown;
            cap *= 2;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (!steps) return nsaErrorf(err, "out of memory listing %s", ck_dir);
    qsort(steps, n, sizeof *steps, cmpInt64);
    size_t keep_others = (size_t)keep_last - 1;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i + keep_others < n; i++) {
        char name[64], path[4096];
        stepDirName(steps[i], name, sizeof name);
        rc = fsPathf(err, path, sizeof path, "%s/%s", ck_dir, name);
        if (rc == 0) rc = removeCheckpointDir(path, err);
    }
    free(steps);
    return rc;
}

int checkpointSave(NsaModel *m, const char *out_dir, const ResumeState *st, int keep_last,
                   const char *model_config_json, char *saved_dir, size_t cap, NsaError *err) {
    char ck_dir[4096], name[64], tmp_dir[4096], final_dir[4096], old_dir[4096], path[4096];
    stepDirName(st->step, name, sizeof name);
    if (fsPathf(err, ck_dir, sizeof ck_dir, "%s/checkpoints", out_dir) != 0 ||
        fsPathf(err, tmp_dir, sizeof tmp_dir, "%s/.%s.tmp", ck_dir, name) != 0 ||
        fsPathf(err, final_dir, sizeof final_dir, "%s/%s", ck_dir, name) != 0 ||
        fsPathf(err, old_dir, sizeof old_dir, "%s/.%s.old", ck_dir, name) != 0 ||
        fsPathf(err, path, sizeof path, "%s/model.safetensors", tmp_dir) != 0)
        return -1;
    if (fsMkdirs(ck_dir, 0755, err) != 0) return -1;
    /* leftovers of a crash in the middle of an earlier save */
    if (removeCheckpointDir(tmp_dir, err) != 0 || removeCheckpointDir(old_dir, err) != 0)
        return -1;
    if (mkdir(tmp_dir, 0755) != 0) return nsaErrorf(err, "mkdir %s: %s", tmp_dir, strerror(errno));

    char step_s[32], pos_s[32], seed_s[32], hash_s[32], tokens_s[32], anomalies_s[32];
    snprintf(step_s, sizeof step_s, "%" PRId64, st->step);
    snprintf(pos_s, sizeof pos_s, "%" PRIu64, st->data_position);
    snprintf(seed_s, sizeof seed_s, "%" PRIu64, st->seed);
    snprintf(hash_s, sizeof hash_s, "%016" PRIx64, st->config_hash);
    snprintf(tokens_s, sizeof tokens_s, "%" PRId64, st->tokens_seen);
    snprintf(anomalies_s, sizeof anomalies_s, "%d", st->anomalies);

    SafetensorsMeta model_meta[] = {
        {"format", "pt"},  /* what torch-side loaders expect */
        {"nsad_format", CHECKPOINT_FORMAT},
        {"nsad_version", NSA_VERSION},
        {"step", step_s},
        {"config_hash", hash_s},
        {"model_config", model_config_json ? model_config_json : "{}"},
    };
    SafetensorsMeta state_meta[] = {
        {"nsad_format", CHECKPOINT_FORMAT},
        {"nsad_version", NSA_VERSION},
        {"step", step_s},
        {"data_position", pos_s},
        {"seed", seed_s},
        {"config_hash", hash_s},
        {"tokens_seen", tokens_s},
        {"anomalies", anomalies_s},
    };
    const NsaArena params[] = {NSA_ARENA_PARAMS};
    const char *const no_prefix[] = {""};
    const NsaArena moments[] = {NSA_ARENA_ADAM_M, NSA_ARENA_ADAM_V};
    const char *const moment_prefixes[] = {"adam_m.", "adam_v."};

    if (writeArenas(m, path, params, no_prefix, 1, model_meta,
                    (int)(sizeof model_meta / sizeof *model_meta), err) != 0)
        goto fail_tmp;
    if (fsPathf(err, path, sizeof path, "%s/state.safetensors", tmp_dir) != 0) goto fail_tmp;
    if (writeArenas(m, path, moments, moment_prefixes, 2, state_meta,
                    (int)(sizeof state_meta / sizeof *state_meta), err) != 0)
        goto fail_tmp;

    int replacing = fileExists(final_dir);
    if (replacing && rename(final_dir, old_dir) != 0) {
        nsaErrorf(err, "rename %s: %s", final_dir, strerror(errno));
        goto fail_tmp;
    }
    if (rename(tmp_dir, final_dir) != 0) {
        nsaErrorf(err, "rename %s to %s: %s", tmp_dir, final_dir, strerror(errno));
        goto fail_tmp;
    }
    if (fsFsyncDir(ck_dir, err) != 0) return -1;
    if (replacing && removeCheckpointDir(old_dir, err) != 0) return -1;
    if (writeLatest(ck_dir, name, err) != 0) return -1;
    if (pruneCheckpoints(ck_dir, st->step, keep_last, err) != 0) return -1;
    if (saved_dir && fsPathf(err, saved_dir, cap, "%s", final_dir) != 0) return -1;
    return 0;
fail_tmp: {
        NsaError ignored;
        removeCheckpointDir(tmp_dir, &ignored);
    }
    return -1;
}

/* Reads OUT/checkpoints/latest into dir. 1 found, 0 no pointer, -1 error. */
static int readLatest(const char *run_dir, char *dir, size_t cap, NsaError *err) {
    char path[4096], name[256];
    if (fsPathf(err, path, sizeof path, "%s/checkpoints/latest", run_dir) != 0) return -1;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) return 0;
        return nsaErrorf(err, "open %s: %s", path, strerror(errno));
    }
    char *line = fgets(name, sizeof name, f);
    fclose(f);
    if (!line) return nsaErrorf(err, "%s is empty; expected a line like step_00000100", path);
    name[strcspn(name, "\r\n")] = 0;
    if (parseStepDir(name) < 0)
        return nsaErrorf(err, "%s holds '%s'; expected a line like step_00000100", path, name);
    char model[4096];
    if (fsPathf(err, dir, cap, "%s/checkpoints/%s", run_dir, name) != 0 ||
        fsPathf(err, model, sizeof model, "%s/model.safetensors", dir) != 0)
        return -1;
    if (!fileExists(model))
        return nsaErrorf(err, "%s points at %s, which has no model.safetensors", path, dir);
    return 1;
}

int checkpointResolve(const char *out_dir, const char *spec, char *dir, size_t cap,
                      NsaError *err) {
    if (!spec || !strcmp(spec, "latest")) return readLatest(out_dir, dir, cap, err);
    char path[4096];
    if (fsPathf(err, path, sizeof path, "%s/model.safetensors", spec) != 0) return -1;
    if (fileExists(path)) {
        if (fsPathf(err, dir, cap, "%s", spec) != 0) return -1;
        return 1;
    }
    int rc = readLatest(spec, dir, cap, err);
    if (rc == 0)
        return nsaErrorf(err, "resume: '%s' is neither a checkpoint directory (no model.safetensors) "
                         "nor a run directory (no checkpoints/latest)", spec);
    return rc;
}

static int metaInt(const Safetensors *st, const char *key, const char *path, int base,
                   uint64_t *out, NsaError *err) {
    const char *v = safetensorsMeta(st, key);
    if (!v) return nsaErrorf(err, "%s: __metadata__ has no '%s'", path, key);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, base);
    if (!*v || *end || errno || *v == '-')
        return nsaErrorf(err, "%s: __metadata__.%s is '%s'; allowed: a non-negative integer", path,
                    key, v);
    *out = (uint64_t)x;
    return 0;
}

static int parseState(const Safetensors *st, const char *path, ResumeState *out, NsaError *err) {
    const char *format = safetensorsMeta(st, "nsad_format");
    if (!format || strcmp(format, CHECKPOINT_FORMAT) != 0)
        return nsaErrorf(err, "%s: nsad_format is '%s'; allowed: %s", path, format ? format : "(none)",
                    CHECKPOINT_FORMAT);
    uint64_t step, pos, seed, hash, tokens, anomalies;
    if (metaInt(st, "step", path, 10, &step, err) || metaInt(st, "data_position", path, 10, &pos, err) ||
        metaInt(st, "seed", path, 10, &seed, err) || metaInt(st, "config_hash", path, 16, &hash, err) ||
        metaInt(st, "tokens_seen", path, 10, &tokens, err) ||
        metaInt(st, "anomalies", path, 10, &anomalies, err))
        return -1;
    out->step = (int64_t)step;
    out->data_position = pos;
    out->seed = seed;
    out->config_hash = hash;
    out->tokens_seen = (int64_t)tokens;
    out->anomalies = (int)anomalies;
    return 0;
}

int checkpointReadState(const char *dir, ResumeState *st_out, NsaError *err) {
    char path[4096];
    if (fsPathf(err, path, sizeof path, "%s/state.safetensors", dir) != 0) return -1;
    Safetensors *st = safetensorsRead(path, err);
    if (!st) return -1;
    int rc = parseState(st, path, st_out, err);
    safetensorsFree(st);
    return rc;
}

/* Sets arena `arena` of m from the file's tensors named prefix + name. */
static int loadArena(NsaModel *m, const Safetensors *st, const char *path, NsaArena arena,
                     const char *prefix, float *scratch, NsaError *err) {
    int n = nsaModelNumTensors(m);
    char name[512];
    for (int i = 0; i < n; i++) {
        const NsaTensorInfo *info = nsaModelTensorInfo(m, i);
        snprintf(name, sizeof name, "%s%s", prefix, info->name);
        const SafetensorsTensor *t = safetensorsFind(st, name);
        if (!t) return nsaErrorf(err, "%s: tensor %s is missing", path, name);
        int same = t->ndim == info->ndim;
        for (int d = 0; same && d < info->ndim; d++) same = t->shape[d] == info->shape[d];
        if (!same) {
            char want[96] = "", got[96] = "";
            for (int d = 0; d < info->ndim; d++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%" PRId64,
                         d ? "," : "", info->shape[d]);
            for (int d = 0; d < t->ndim; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%" PRId64, d ? "," : "",
                         t->shape[d]);
            return nsaErrorf(err, "%s: tensor %s has shape [%s]; the model needs [%s]", path, name,
                        got, want);
        }
        safetensorsCopy(st, t, scratch);
        if (nsaModelSetTensor(m, arena, i, scratch, err) != 0) return -1;
    }
    return 0;
}

static int loadFile(NsaModel *m, const char *path, const NsaArena *arenas,
                    const char *const *prefixes, int n_arenas, ResumeState *state, NsaError *err) {
    Safetensors *st = safetensorsRead(path, err);
    if (!st) return -1;
    int n = nsaModelNumTensors(m);
    int rc = -1;
    float *scratch = NULL;
    if (safetensorsCount(st) != n * n_arenas) {
        nsaErrorf(err, "%s holds %d tensors; this model has %d (a checkpoint of another model?)", path,
             safetensorsCount(st), n * n_arenas);
        goto out;
    }
    size_t largest = 1;
    for (int i = 0; i < n; i++)
        if (nsaModelTensorInfo(m, i)->numel > largest) largest = nsaModelTensorInfo(m, i)->numel;
    scratch = malloc(largest * sizeof(float));
    if (!scratch) {
        nsaErrorf(err, "%s: out of memory", path);
        goto out;
    }
    for (int a = 0; a < n_arenas; a++)
        if (loadArena(m, st, path, arenas[a], prefixes[a], scratch, err) != 0) goto out;
    rc = state ? parseState(st, path, state, err) : 0;
out:
    free(scratch);
    safetensorsFree(st);
    return rc;
}

int checkpointLoad(NsaModel *m, const char *dir, ResumeState *st, NsaError *err) {
    char path[4096];
    const NsaArena params[] = {NSA_ARENA_PARAMS};
    const char *const no_prefix[] = {""};
    const NsaArena moments[] = {NSA_ARENA_ADAM_M, NSA_ARENA_ADAM_V};
    const char *const moment_prefixes[] = {"adam_m.", "adam_v."};
    if (fsPathf(err, path, sizeof path, "%s/model.safetensors", dir) != 0 ||
        loadFile(m, path, params, no_prefix, 1, NULL, err) != 0 ||
        fsPathf(err, path, sizeof path, "%s/state.safetensors", dir) != 0)
        return -1;
    return loadFile(m, path, moments, moment_prefixes, 2, st, err);
}
