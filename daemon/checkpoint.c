/* checkpoint.c - safetensors read/write and training checkpoints; see
 * checkpoint.h for the formats and contracts. */
#include "checkpoint.h"
#include "crc32c.h"
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

/* An nsad header is a few hundred bytes per tensor (a 1024-layer model's
 * state file: ~5 MB); safetensors' own loader stops at 100 MB. */
#define SAFETENSORS_MAX_HEADER (16u * 1024u * 1024u)
/* manifest.json: two file entries and a few fields */
#define MANIFEST_MAX_BYTES 65536
#define MANIFEST_NAME "manifest.json"

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

/* Appends the number v to array. Returns 0, or -1 out of memory (nothing
 * appended, nothing leaked). */
static int appendNumber(cJSON *array, double v) {
    cJSON *item = cJSON_CreateNumber(v);
    if (!item) return -1;
    if (!cJSON_AddItemToArray(array, item)) {
        cJSON_Delete(item);
        return -1;
    }
    return 0;
}

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
            if (appendNumber(shape, (double)t->shape[d]) != 0) goto oom;
        size_t end = offset + numel * sizeof(float);
        if (appendNumber(offs, (double)offset) != 0 || appendNumber(offs, (double)end) != 0)
            goto oom;
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
                          void *ctx, uint32_t *crc_out, uint64_t *bytes_out, NsaError *err) {
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
    /* the checksum of exactly the bytes written, as they go out */
    uint32_t crc = crc32cUpdate(0, header, 8 + header_len);
    uint64_t bytes = 8 + header_len;
    for (int i = 0; i < n; i++) {
        if (!tensors[i].numel) continue;
        const float *data = source(ctx, i, scratch, err);
        if (!data) goto fail_file;
        size_t len = tensors[i].numel * sizeof(float);
        if (fsWriteAll(fd, data, len) != 0) goto fail_write;
        crc = crc32cUpdate(crc, data, len);
        bytes += len;
    }
    if (crc_out) *crc_out = crc;
    if (bytes_out) *bytes_out = bytes;
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
    return writeStreaming(path, tensors, n, meta, n_meta, fromArrays, (void *)tensors, NULL, NULL, err);
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
    if (st->meta_keys) return nsaErrorf(err, "%s: __metadata__ appears twice; allowed: once", path);
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
        char *key = strdup(kv->string), *value = strdup(kv->valuestring);
        if (!key || !value) {
            free(key);
            free(value);
            return nsaErrorf(err, "%s: out of memory", path);
        }
        st->meta_keys[st->n_meta] = key;
        st->meta_values[st->n_meta] = value;
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
    if (numel > SIZE_MAX / sizeof(float))
        return nsaErrorf(err,
                         "%s: tensor %s: shape holds %zu elements, whose byte size overflows; "
                         "allowed: at most %zu elements",
                         path, name, numel, SIZE_MAX / sizeof(float));
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
    struct stat sb;
    int fd = fsOpenRegular(path, &sb, err);
    if (fd < 0) return NULL;
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
        nsaErrorf(err, "%s: header length %" PRIu64 " exceeds the file (%zu bytes) or %u bytes; allowed: at most "
             "%u bytes within the file", path, header_len, size, SAFETENSORS_MAX_HEADER, SAFETENSORS_MAX_HEADER);
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

/* A model alone as a CheckpointTensors. */
static const NsaTensorInfo *modelInfo(void *ctx, int i) { return nsaModelTensorInfo(ctx, i); }
static int modelGet(void *ctx, NsaArena arena, int i, float *dst, NsaError *err) {
    return nsaModelGetTensor(ctx, arena, i, dst, err);
}
static int modelSet(void *ctx, NsaArena arena, int i, const float *src, NsaError *err) {
    return nsaModelSetTensor(ctx, arena, i, src, err);
}
static CheckpointTensors modelTensors(NsaModel *m) {
    CheckpointTensors t = {m, nsaModelNumTensors(m), modelInfo, modelGet, modelSet};
    return t;
}

/* The tensors of one safetensors file: each arena's tensors in layout
 * order, names prefixed per arena ("adam_m." ...). */
typedef struct ArenaFile {
    const CheckpointTensors *src;
    const NsaArena *arenas;
    int n_per_arena;
} ArenaFile;

static const float *fromModel(void *ctx, int i, float *scratch, NsaError *err) {
    const ArenaFile *f = ctx;
    NsaArena arena = f->arenas[i / f->n_per_arena];
    if (f->src->get(f->src->ctx, arena, i % f->n_per_arena, scratch, err) != 0) return NULL;
    return scratch;
}

/* Writes one safetensors file of the given arenas (1 or 2), reading one
 * tensor at a time through src. */
static int writeArenas(const CheckpointTensors *src, const char *path, const NsaArena *arenas,
                       const char *const *prefixes, int n_arenas, const SafetensorsMeta *meta,
                       int n_meta, uint32_t *crc, uint64_t *bytes, NsaError *err) {
    int n = src->n;
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
            const NsaTensorInfo *info = src->info(src->ctx, i);
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
    ArenaFile file = {src, arenas, n};
    rc = writeStreaming(path, tensors, (int)total, meta, n_meta, fromModel, &file, crc, bytes, err);
out:
    if (names)
        for (size_t k = 0; k < total; k++) free(names[k]);
    free(names);
    free(tensors);
    return rc;
}

static int writeLatest(const char *ck_dir, const char *name, NsaError *err) {
    char path[4096], line[64];
    if (fsPathf(err, path, sizeof path, "%s/latest", ck_dir) != 0) return -1;
    int len = snprintf(line, sizeof line, "%s\n", name);
    return fsWriteFileAtomic(path, line, (size_t)len, 0644, err);
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

/* ".step_N.old" (a replacement's old copy) -> N; -1 for any other name. */
static int64_t parseCutStepDir(const char *name) {
    const size_t len = strlen(name);
    char step[64];
    if (len < 6 + 4 || len - 5 >= sizeof step || strncmp(name, ".step_", 6) != 0 ||
        strcmp(name + len - 4, ".old") != 0)
        return -1;
    memcpy(step, name + 1, len - 5); /* ".step_N.old" -> "step_N" */
    step[len - 5] = '\0';
    return parseStepDir(step);
}

/* The steps parse finds in the names in ck_dir (-1: not one), ascending,
 * into a malloc'd array (the caller frees; NULL with *n = 0 when there are
 * none, or no ck_dir). Returns 0, or -1 with err. */
static int listStepsBy(const char *ck_dir, int64_t (*parse)(const char *name), int64_t **steps_out,
                       size_t *n_out, NsaError *err) {
    *steps_out = NULL;
    *n_out = 0;
    DIR *d = opendir(ck_dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        return nsaErrorf(err, "opendir %s: %s", ck_dir, strerror(errno));
    }
    size_t cap = 0, n = 0;
    int64_t *steps = NULL;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        int64_t s = parse(e->d_name);
        if (s < 0) continue;
        if (n == cap) {
            size_t grown_cap = cap ? 2 * cap : 16;
            int64_t *grown = realloc(steps, grown_cap * sizeof *steps);
            if (!grown) {
                rc = nsaErrorf(err, "out of memory listing %s", ck_dir);
                break;
            }
            steps = grown;
            cap = grown_cap;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (rc != 0) {
        free(steps);
        return -1;
    }
    if (n > 1) qsort(steps, n, sizeof *steps, cmpInt64);
    *steps_out = steps;
    *n_out = n;
    return 0;
}

/* The steps of ck_dir's step_* directories (listStepsBy). */
static int listSteps(const char *ck_dir, int64_t **steps_out, size_t *n_out, NsaError *err) {
    return listStepsBy(ck_dir, parseStepDir, steps_out, n_out, err);
}

/* Moves a step directory out of the way (one rename: a kill never leaves
 * it half deleted under its own name), then removes it. A leftover
 * .step_N.del is removed by the next save. */
static int retireStepDir(const char *ck_dir, const char *name, NsaError *err) {
    char path[4096], gone[4096];
    if (fsPathf(err, path, sizeof path, "%s/%s", ck_dir, name) != 0 ||
        fsPathf(err, gone, sizeof gone, "%s/.%s.del", ck_dir, name) != 0)
        return -1;
    if (removeCheckpointDir(gone, err) != 0) return -1;
    if (rename(path, gone) != 0) {
        if (errno == ENOENT) return 0;
        return nsaErrorf(err, "rename %s: %s", path, strerror(errno));
    }
    if (fsFsyncDir(ck_dir, err) != 0) return -1;
    return removeCheckpointDir(gone, err);
}

/* Removes what crashed saves and prunes left: .step_*.tmp, .old, .del
 * (sweepCheckpoints first keeps the copy a cut replacement needs). */
static int sweepLeftovers(const char *ck_dir, NsaError *err) {
    DIR *d = opendir(ck_dir);
    if (!d) return nsaErrorf(err, "opendir %s: %s", ck_dir, strerror(errno));
    struct dirent *e;
    char path[4096];
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        const char *dot = strrchr(e->d_name, '.');
        if (strncmp(e->d_name, ".step_", 6) != 0 || !dot || dot == e->d_name) continue;
        if (strcmp(dot, ".tmp") && strcmp(dot, ".old") && strcmp(dot, ".del")) continue;
        rc = fsPathf(err, path, sizeof path, "%s/%s", ck_dir, e->d_name);
        if (rc == 0) rc = removeCheckpointDir(path, err);
    }
    closedir(d);
    return rc;
}

/* Keeps keep_last step_* directories: the one just saved (latest names it)
 * and the newest keep_last - 1 before it. Those after it belong to a
 * timeline a resume from an older checkpoint abandoned (latest-valid never
 * takes them): they are retired first, or they would count among the kept
 * and push out the checkpoints of the run as it is. */
static int pruneCheckpoints(const char *ck_dir, int64_t saved_step, int keep_last, NsaError *err) {
    if (keep_last <= 0) return 0;
    int64_t *all;
    size_t n_all;
    if (listSteps(ck_dir, &all, &n_all, err) != 0) return -1;
    size_t n_before = 0; /* listSteps sorts ascending: the older ones first */
    while (n_before < n_all && all[n_before] < saved_step) n_before++;
    const size_t keep_before = (size_t)keep_last - 1;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n_all; i++) {
        const int abandoned = all[i] > saved_step;
        const int too_old = i < n_before && i + keep_before < n_before;
        if (!abandoned && !too_old) continue;
        char name[64];
        stepDirName(all[i], name, sizeof name);
        rc = retireStepDir(ck_dir, name, err);
    }
    free(all);
    return rc;
}

/* ---- manifests ------------------------------------------------------------------------ */

/* What a checkpoint's manifest.json says, and what the files' metadata must
 * repeat. */
typedef struct Manifest {
    int64_t step;
    uint64_t config_hash;
    char version[64];
    int legacy;               /* CHECKPOINT_FORMAT_LEGACY: no manifest, read from the metadata */
} Manifest;

typedef struct ManifestFile {
    const char *name;
    uint64_t bytes;
    uint32_t crc;
} ManifestFile;

static const char *const checkpoint_files[] = {"model.safetensors", "state.safetensors"};
#define N_CHECKPOINT_FILES 2

/* Writes DIR/manifest.json (atomically) for the files just written. */
static int writeManifest(const char *dir, const ResumeState *st, const ManifestFile *files, NsaError *err) {
    char path[4096], hash[32], crc[16];
    if (fsPathf(err, path, sizeof path, "%s/" MANIFEST_NAME, dir) != 0) return -1;
    cJSON *o = cJSON_CreateObject();
    cJSON *list = o ? cJSON_CreateObject() : NULL;
    if (!list) {
        cJSON_Delete(o);
        return nsaErrorf(err, "out of memory writing %s", path);
    }
    snprintf(hash, sizeof hash, "%016" PRIx64, st->config_hash);
    cJSON_AddStringToObject(o, "nsad_format", CHECKPOINT_FORMAT);
    cJSON_AddStringToObject(o, "nsad_version", NSA_VERSION);
    cJSON_AddNumberToObject(o, "step", (double)st->step);
    cJSON_AddStringToObject(o, "config_hash", hash);
    cJSON_AddItemToObject(o, "files", list);
    for (int i = 0; i < N_CHECKPOINT_FILES; i++) {
        cJSON *f = cJSON_AddObjectToObject(list, files[i].name);
        snprintf(crc, sizeof crc, "%08" PRIx32, files[i].crc);
        cJSON_AddNumberToObject(f, "bytes", (double)files[i].bytes);
        cJSON_AddStringToObject(f, "crc32c", crc);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return nsaErrorf(err, "out of memory writing %s", path);
    int rc = fsWriteFileAtomic(path, text, strlen(text), 0644, err);
    free(text);
    return rc;
}

/* Parses exactly 2*n lowercase or uppercase hex digits into *out. */
static int parseHex(const char *s, int digits, uint64_t *out) {
    if (!s || (int)strlen(s) != digits) return -1;
    uint64_t v = 0;
    for (int i = 0; i < digits; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return 0;
}

/* The CRC-32C and size of a regular file, read in bounded chunks. */
static int checksumFile(const char *path, uint32_t *crc_out, uint64_t *bytes_out, NsaError *err) {
    struct stat sb;
    int fd = fsOpenRegular(path, &sb, err);
    if (fd < 0) return -1;
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return nsaErrorf(err, "%s: out of memory", path);
    }
    uint32_t crc = 0;
    uint64_t total = 0;
    int rc = 0;
    for (;;) {
        ssize_t got = read(fd, buf, CHUNK);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            rc = nsaErrorf(err, "%s: read error: %s", path, strerror(errno));
            break;
        }
        if (got == 0) break;
        crc = crc32cUpdate(crc, buf, (size_t)got);
        total += (uint64_t)got;
    }
    free(buf);
    close(fd);
    *crc_out = crc;
    *bytes_out = total;
    return rc;
}

/* The step a directory's own name gives (step_N), or -1 when it has
 * another name (a checkpoint copied elsewhere). */
static int64_t stepOfDir(const char *dir) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && dir[start - 1] != '/') start--;
    char name[64];
    if (len - start >= sizeof name) return -1;
    memcpy(name, dir + start, len - start);
    name[len - start] = '\0';
    return parseStepDir(name);
}

static int metaInt(const Safetensors *st, const char *key, const char *path, int base,
                   uint64_t *out, NsaError *err);

/* A checkpoint without manifest.json whose state.safetensors says format
 * CHECKPOINT_FORMAT_LEGACY: fills man from that file's metadata (what a
 * manifest would have said) and checks its step against the directory's
 * name and that model.safetensors is there. Returns 1 when it is such a
 * checkpoint, 0 when it is not (err untouched), -1 with err when it says
 * it is but does not hold together. */
static int readLegacyManifest(const char *dir, Manifest *man, NsaError *err) {
    char path[4096];
    NsaError ignored;
    if (fsPathf(&ignored, path, sizeof path, "%s/state.safetensors", dir) != 0) return 0;
    Safetensors *st = safetensorsRead(path, &ignored);
    if (!st) return 0;
    const char *format = safetensorsMeta(st, "nsad_format");
    const char *version = safetensorsMeta(st, "nsad_version");
    int rc = 0;
    uint64_t step = 0, hash = 0;
    if (!format || strcmp(format, CHECKPOINT_FORMAT_LEGACY) != 0) goto out;
    rc = -1;
    if (metaInt(st, "step", path, 10, &step, err) || metaInt(st, "config_hash", path, 16, &hash, err)) goto out;
    if (!version || strlen(version) >= sizeof man->version || step > INT64_MAX) {
        nsaErrorf(err, "%s: format %s without nsad_version or with step out of range", path,
                  CHECKPOINT_FORMAT_LEGACY);
        goto out;
    }
    man->step = (int64_t)step;
    man->config_hash = hash;
    snprintf(man->version, sizeof man->version, "%s", version);
    man->legacy = 1;
    int64_t named = stepOfDir(dir);
    char model[4096];
    struct stat sb;
    if (named >= 0 && named != man->step)
        nsaErrorf(err, "%s: says step %" PRId64 " but the directory is step %" PRId64, path, man->step, named);
    else if (fsPathf(err, model, sizeof model, "%s/model.safetensors", dir) != 0)
        ;
    else if (stat(model, &sb) != 0 || !S_ISREG(sb.st_mode))
        nsaErrorf(err, "%s: missing or not a regular file (a %s checkpoint needs it)", model,
                  CHECKPOINT_FORMAT_LEGACY);
    else
        rc = 1;
out:
    safetensorsFree(st);
    return rc;
}

/* Reads DIR/manifest.json, checks its fields, that the directory's name
 * (step_N) agrees with its step, and that every file it lists has its
 * size and CRC-32C. Fills man. Returns 0 or -1 with err naming the file
 * and what does not match. A legacy checkpoint (readLegacyManifest) fills
 * man with legacy set and returns 0: nothing to verify it against. */
static int verifyManifest(const char *dir, Manifest *man, NsaError *err) {
    char path[4096];
    man->legacy = 0;
    if (fsPathf(err, path, sizeof path, "%s/" MANIFEST_NAME, dir) != 0) return -1;
    size_t len;
    NsaError rerr;
    char *text = fsReadRegular(path, MANIFEST_MAX_BYTES, &len, &rerr);
    if (!text) {
        if (errno == ENOENT) {
            int legacy = readLegacyManifest(dir, man, err);
            if (legacy != 0) return legacy > 0 ? 0 : -1;
            return nsaErrorf(err, "%s: no " MANIFEST_NAME ": the checkpoint is incomplete (the manifest is "
                             "written last)", dir);
        }
        return nsaErrorf(err, "%s", rerr.message);
    }
    cJSON *o = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(o, "nsad_format");
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(o, "nsad_version");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    const cJSON *hash = cJSON_GetObjectItemCaseSensitive(o, "config_hash");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(o, "files");
    size_t step_v = 0;
    int rc = 0;
    if (!cJSON_IsObject(o)) {
        rc = nsaErrorf(err, "%s: not a JSON object (the manifest is damaged)", path);
    } else if (!cJSON_IsString(format) || strcmp(format->valuestring, CHECKPOINT_FORMAT) != 0) {
        rc = nsaErrorf(err, "%s: nsad_format is %s; allowed: %s", path,
                       cJSON_IsString(format) ? format->valuestring : "missing", CHECKPOINT_FORMAT);
    } else if (!cJSON_IsString(version) || strlen(version->valuestring) >= sizeof man->version ||
               !cJSON_IsObject(files) || jsonSize(step, &step_v) != 0 || !cJSON_IsString(hash) ||
               parseHex(hash->valuestring, 16, &man->config_hash) != 0 ||
               cJSON_GetArraySize(files) != N_CHECKPOINT_FILES) {
        rc = nsaErrorf(err, "%s: malformed; allowed: nsad_version, step, config_hash (16 hex digits) and "
                       "files {model.safetensors, state.safetensors: {bytes, crc32c}} (the manifest is damaged)",
                       path);
    } else {
        man->step = (int64_t)step_v;
        snprintf(man->version, sizeof man->version, "%s", version->valuestring);
        int64_t named = stepOfDir(dir);
        if (named >= 0 && named != man->step)
            rc = nsaErrorf(err, "%s: says step %" PRId64 " but the directory is step %" PRId64
                           " (a manifest from another checkpoint)", path, man->step, named);
    }
    for (int i = 0; rc == 0 && i < N_CHECKPOINT_FILES; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(files, checkpoint_files[i]);
        const cJSON *crc_item = cJSON_GetObjectItemCaseSensitive(f, "crc32c");
        size_t want_bytes;
        uint64_t want_crc;
        if (!cJSON_IsObject(f) || jsonSize(cJSON_GetObjectItemCaseSensitive(f, "bytes"), &want_bytes) != 0 ||
            !cJSON_IsString(crc_item) || parseHex(crc_item->valuestring, 8, &want_crc) != 0) {
            rc = nsaErrorf(err, "%s: no valid entry {bytes, crc32c} for %s (the manifest is damaged)", path,
                           checkpoint_files[i]);
            break;
        }
        char file[4096];
        uint32_t crc = 0;
        uint64_t bytes = 0;
        if (fsPathf(err, file, sizeof file, "%s/%s", dir, checkpoint_files[i]) != 0 ||
            checksumFile(file, &crc, &bytes, err) != 0) {
            rc = -1;
        } else if (bytes != (uint64_t)want_bytes) {
            rc = nsaErrorf(err, "%s: %" PRIu64 " bytes, the manifest says %zu (the file is truncated or "
                           "replaced)", file, bytes, want_bytes);
        } else if (crc != (uint32_t)want_crc) {
            rc = nsaErrorf(err, "%s: CRC-32C %08" PRIx32 ", the manifest says %08" PRIx32
                           " (the file is damaged)", file, crc, (uint32_t)want_crc);
        }
    }
    cJSON_Delete(o);
    return rc;
}

/* Checks that a file's __metadata__ repeats the manifest: format, version,
 * step and config hash. */
static int checkMetaAgrees(const Safetensors *st, const char *path, const Manifest *man, NsaError *err) {
    char step[32], hash[32];
    snprintf(step, sizeof step, "%" PRId64, man->step);
    snprintf(hash, sizeof hash, "%016" PRIx64, man->config_hash);
    const char *const keys[] = {"nsad_format", "nsad_version", "step", "config_hash"};
    const char *const want[] = {man->legacy ? CHECKPOINT_FORMAT_LEGACY : CHECKPOINT_FORMAT, man->version,
                                step, hash};
    for (int i = 0; i < 4; i++) {
        const char *v = safetensorsMeta(st, keys[i]);
        if (!v || strcmp(v, want[i]) != 0)
            return nsaErrorf(err, "%s: __metadata__.%s is '%.40s' but the manifest says '%s'", path, keys[i],
                             v ? v : "(none)", want[i]);
    }
    return 0;
}

int checkpointVerify(const char *dir, NsaError *err) {
    Manifest man;
    if (verifyManifest(dir, &man, err) != 0) return -1;
    return man.legacy;
}

/* A checkpoint directory whose manifest is there (it may still be
 * damaged): complete as far as the save went. */
static int hasManifest(const char *ck_dir, const char *name) {
    char path[4096];
    NsaError ignored;
    if (fsPathf(&ignored, path, sizeof path, "%s/%s/" MANIFEST_NAME, ck_dir, name) != 0) return 0;
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* ---- saving ------------------------------------------------------------------------------ */

/* Reads the step name in ck_dir/<file> (`latest`, REPLACING_NAME) into
 * name (cap bytes). 1 read, 0 no such file, -1 with err (not a regular
 * file, unreadable, not a step name: the message shows its bytes escaped,
 * never raw). */
static int readStepName(const char *ck_dir, const char *file, char *name, size_t cap,
                        NsaError *err) {
    char path[4096];
    if (fsPathf(err, path, sizeof path, "%s/%s", ck_dir, file) != 0) return -1;
    size_t len;
    NsaError rerr;
    char *text = fsReadRegular(path, 256, &len, &rerr);
    if (!text) {
        if (errno == ENOENT) return 0;
        if (errno == EFBIG) return nsaErrorf(err, "%s: over 256 bytes; expected a line like step_00000100", path);
        return nsaErrorf(err, "%s", rerr.message);
    }
    size_t line = strcspn(text, "\r\n");
    text[line] = '\0';
    int ok = line < cap && parseStepDir(text) >= 0 && strlen(text) == line;
    if (ok) snprintf(name, cap, "%s", text);
    if (!ok) {
        char shown[160];
        size_t n = 0;
        for (size_t i = 0; i < len && n + 5 < sizeof shown; i++) {
            unsigned char c = (unsigned char)text[i];
            if (c >= 0x20 && c < 0x7f)
                shown[n++] = (char)c;
            else
                n += (size_t)snprintf(shown + n, sizeof shown - n, "\\x%02x", c);
        }
        shown[n] = '\0';
        nsaErrorf(err, "%s holds '%s'; expected a line like step_00000100", path, shown);
    }
    free(text);
    return ok ? 1 : -1;
}

/* OUT/checkpoints/latest's step name: readStepName's contract. */
static int readLatestName(const char *ck_dir, char *name, size_t cap, NsaError *err) {
    return readStepName(ck_dir, "latest", name, cap, err);
}

/* Without RENAME_EXCHANGE, the replacement of the step `latest` names
 * moves `latest` off it first; this file ("step_N\n") says so until
 * `latest` is back on it, so that the sweep after a kill puts it back. */
#define REPLACING_NAME ".replacing"

static int writeReplacing(const char *ck_dir, const char *name, NsaError *err) {
    char path[4096], line[64];
    if (fsPathf(err, path, sizeof path, "%s/" REPLACING_NAME, ck_dir) != 0) return -1;
    int len = snprintf(line, sizeof line, "%s\n", name);
    return fsWriteFileAtomic(path, line, (size_t)len, 0644, err);
}

static int dropReplacing(const char *ck_dir, NsaError *err) {
    char path[4096];
    if (fsPathf(err, path, sizeof path, "%s/" REPLACING_NAME, ck_dir) != 0) return -1;
    if (unlink(path) != 0) {
        if (errno == ENOENT) return 0;
        return nsaErrorf(err, "remove %s: %s", path, strerror(errno));
    }
    return fsFsyncDir(ck_dir, err);
}

/* A replacement that failed after moving `latest` off name, with name in
 * place again: `latest` back on it. Best effort: what fails here the next
 * sweep does. */
static void restoreLatest(const char *ck_dir, const char *name) {
    NsaError ignored;
    if (writeLatest(ck_dir, name, &ignored) == 0) dropReplacing(ck_dir, &ignored);
}

/* Replaces ck_dir/name by tmp_dir (both complete checkpoints) so that
 * `latest` never names a missing directory: one atomic exchange of the two
 * directories where the file system has it. Elsewhere (NFS) it takes two
 * renames, the old directory to .name.old, then the new one into place;
 * when `latest` names this step it is first moved to the newest other
 * complete checkpoint (or removed when there is none), with REPLACING_NAME
 * written before and removed once `latest` is back. A kill anywhere in
 * between is finished by the next sweep (sweepCheckpoints): one complete
 * copy of the step, the new one once the first rename is done, and
 * `latest` on it again. */
static int replaceStepDir(const char *ck_dir, const char *name, const char *tmp_dir, const char *final_dir,
                          const char *old_dir, NsaError *err) {
    if (renameat2(AT_FDCWD, tmp_dir, AT_FDCWD, final_dir, RENAME_EXCHANGE) == 0) {
        if (fsFsyncDir(ck_dir, err) != 0) return -1;
        return removeCheckpointDir(tmp_dir, err); /* the old contents, now under the tmp name */
    }
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
        return nsaErrorf(err, "exchange %s and %s: %s", tmp_dir, final_dir, strerror(errno));
    char latest[64];
    NsaError ignored;
    const int moved =
        readLatestName(ck_dir, latest, sizeof latest, &ignored) == 1 && !strcmp(latest, name);
    if (moved) {
        if (writeReplacing(ck_dir, name, err) != 0) return -1;
        int64_t *steps;
        size_t n;
        if (listSteps(ck_dir, &steps, &n, err) != 0) return -1;
        char other[64] = "";
        long long replaced = -1; /* older ones only: newer ones are an abandoned timeline */
        if (sscanf(name, "step_%lld", &replaced) != 1) replaced = -1;
        for (size_t i = n; i-- > 0 && !other[0];) {
            if (steps[i] >= replaced) continue;
            char candidate[64];
            stepDirName(steps[i], candidate, sizeof candidate);
            if (strcmp(candidate, name) && hasManifest(ck_dir, candidate)) snprintf(other, sizeof other, "%s", candidate);
        }
        free(steps);
        char path[4096];
        if (other[0]) {
            if (writeLatest(ck_dir, other, err) != 0) return -1;
        } else if (fsPathf(err, path, sizeof path, "%s/latest", ck_dir) != 0 ||
                   (unlink(path) != 0 && errno != ENOENT) || fsFsyncDir(ck_dir, err) != 0) {
            return nsaErrorf(err, "remove %s/latest: %s", ck_dir, strerror(errno));
        }
    }
    if (rename(final_dir, old_dir) != 0) {
        nsaErrorf(err, "rename %s: %s", final_dir, strerror(errno));
        if (moved) restoreLatest(ck_dir, name);
        return -1;
    }
    if (rename(tmp_dir, final_dir) != 0) {
        const int saved = errno;
        /* the old one back under its name, or the next sweep puts one there */
        if (rename(old_dir, final_dir) != 0)
            return nsaErrorf(err, "rename %s to %s: %s; and the old checkpoint could not be put "
                                  "back from %s: %s",
                             tmp_dir, final_dir, strerror(saved), old_dir, strerror(errno));
        if (moved) restoreLatest(ck_dir, name);
        return nsaErrorf(err, "rename %s to %s: %s", tmp_dir, final_dir, strerror(saved));
    }
    if (fsFsyncDir(ck_dir, err) != 0) return -1;
    if (moved && (writeLatest(ck_dir, name, err) != 0 || dropReplacing(ck_dir, err) != 0))
        return -1;
    return removeCheckpointDir(old_dir, err);
}

static int isDir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* 1 when dir is a complete checkpoint of step (checkpointVerify: its
 * manifest, sizes and checksums), else 0. */
static int copyVerifies(const char *dir, int64_t step) {
    Manifest man;
    NsaError ignored;
    return verifyManifest(dir, &man, &ignored) == 0 && man.step == step;
}

/* Finishes the replacement of step's directory that a kill cut after its
 * first rename (.step_N.old is there): the new copy - step_N itself once
 * the second rename is done, else .step_N.tmp - when it verifies, else the
 * old one, ends up as step_N (each move one rename, so a kill here leaves
 * a state this finishes too). With neither verifying nothing moves (the
 * sweep then removes the leftovers). Returns 0, or -1 with err. */
static int finishReplacement(const char *ck_dir, int64_t step, NsaError *err) {
    char name[64], final_dir[4096], tmp_dir[4096], old_dir[4096];
    stepDirName(step, name, sizeof name);
    if (fsPathf(err, final_dir, sizeof final_dir, "%s/%s", ck_dir, name) != 0 ||
        fsPathf(err, tmp_dir, sizeof tmp_dir, "%s/.%s.tmp", ck_dir, name) != 0 ||
        fsPathf(err, old_dir, sizeof old_dir, "%s/.%s.old", ck_dir, name) != 0)
        return -1;
    const int has_final = isDir(final_dir);
    if (has_final ? copyVerifies(final_dir, step) : isDir(tmp_dir) && copyVerifies(tmp_dir, step)) {
        if (has_final) return 0;
        if (rename(tmp_dir, final_dir) != 0)
            return nsaErrorf(err, "rename %s to %s: %s", tmp_dir, final_dir, strerror(errno));
        return fsFsyncDir(ck_dir, err);
    }
    if (!copyVerifies(old_dir, step)) return 0;
    if (has_final && retireStepDir(ck_dir, name, err) != 0) return -1; /* the new one, damaged */
    if (rename(old_dir, final_dir) != 0)
        return nsaErrorf(err, "rename %s to %s: %s", old_dir, final_dir, strerror(errno));
    return fsFsyncDir(ck_dir, err);
}

/* The steps N of ck_dir's .step_N.old directories (listStepsBy). */
static int listCutReplacements(const char *ck_dir, int64_t **steps_out, size_t *n_out,
                               NsaError *err) {
    return listStepsBy(ck_dir, parseCutStepDir, steps_out, n_out, err);
}

/* What a kill in the middle of a save or prune left in ck_dir: a
 * replacement cut between or after its renames is finished
 * (finishReplacement), `latest` goes back on the step REPLACING_NAME
 * names, then the leftovers (.step_N.tmp, .old, .del) are removed. Returns
 * 0, or -1 with err. */
static int sweepCheckpoints(const char *ck_dir, NsaError *err) {
    int64_t *cut;
    size_t n_cut;
    if (listCutReplacements(ck_dir, &cut, &n_cut, err) != 0) return -1;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n_cut; i++)
        rc = finishReplacement(ck_dir, cut[i], err);
    free(cut);
    if (rc != 0) return -1;
    char name[64], path[4096];
    NsaError ignored;
    if (readStepName(ck_dir, REPLACING_NAME, name, sizeof name, &ignored) == 1) {
        if (fsPathf(err, path, sizeof path, "%s/%s", ck_dir, name) != 0) return -1;
        if (isDir(path) && writeLatest(ck_dir, name, err) != 0) return -1;
    }
    if (dropReplacing(ck_dir, err) != 0) return -1;
    if (fsPathf(err, path, sizeof path, "%s/" REPLACING_NAME ".tmp", ck_dir) != 0) return -1;
    if (unlink(path) != 0 && errno != ENOENT)
        return nsaErrorf(err, "remove %s: %s", path, strerror(errno));
    return sweepLeftovers(ck_dir, err);
}

int checkpointSweep(const char *out_dir, NsaError *err) {
    char ck_dir[4096];
    if (fsPathf(err, ck_dir, sizeof ck_dir, "%s/checkpoints", out_dir) != 0) return -1;
    if (!isDir(ck_dir)) return 0;
    return sweepCheckpoints(ck_dir, err);
}

int checkpointSave(NsaModel *m, const char *out_dir, const ResumeState *st, int keep_last,
                   const char *model_config_json, char *saved_dir, size_t cap, NsaError *err) {
    const CheckpointTensors src = modelTensors(m);
    return checkpointSaveTensors(&src, out_dir, st, keep_last, model_config_json, saved_dir, cap,
                                 err);
}

int checkpointSaveTensors(const CheckpointTensors *m, const char *out_dir, const ResumeState *st,
                          int keep_last, const char *model_config_json, char *saved_dir,
                          size_t cap, NsaError *err) {
    char ck_dir[4096], name[64], tmp_dir[4096], final_dir[4096], old_dir[4096], path[4096];
    stepDirName(st->step, name, sizeof name);
    if (fsPathf(err, ck_dir, sizeof ck_dir, "%s/checkpoints", out_dir) != 0 ||
        fsPathf(err, tmp_dir, sizeof tmp_dir, "%s/.%s.tmp", ck_dir, name) != 0 ||
        fsPathf(err, final_dir, sizeof final_dir, "%s/%s", ck_dir, name) != 0 ||
        fsPathf(err, old_dir, sizeof old_dir, "%s/.%s.old", ck_dir, name) != 0 ||
        fsPathf(err, path, sizeof path, "%s/model.safetensors", tmp_dir) != 0)
        return -1;
    if (fsMkdirs(ck_dir, 0755, err) != 0) return -1;
    /* what a crash in the middle of an earlier save or prune left */
    if (sweepCheckpoints(ck_dir, err) != 0) return -1;
    if (mkdir(tmp_dir, 0755) != 0) return nsaErrorf(err, "mkdir %s: %s", tmp_dir, strerror(errno));

    char step_s[32], pos_s[32], seed_s[32], hash_s[32], tokens_s[32], anomalies_s[32], ranks_s[32];
    snprintf(step_s, sizeof step_s, "%" PRId64, st->step);
    snprintf(pos_s, sizeof pos_s, "%" PRIu64, st->data_position);
    snprintf(seed_s, sizeof seed_s, "%" PRIu64, st->seed);
    snprintf(hash_s, sizeof hash_s, "%016" PRIx64, st->config_hash);
    snprintf(tokens_s, sizeof tokens_s, "%" PRId64, st->tokens_seen);
    snprintf(anomalies_s, sizeof anomalies_s, "%d", st->anomalies);
    snprintf(ranks_s, sizeof ranks_s, "%d", st->ranks > 0 ? st->ranks : 1);

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
        {"ranks", ranks_s},
    };
    const NsaArena params[] = {NSA_ARENA_PARAMS};
    const char *const no_prefix[] = {""};
    const NsaArena moments[] = {NSA_ARENA_ADAM_M, NSA_ARENA_ADAM_V};
    const char *const moment_prefixes[] = {"adam_m.", "adam_v."};
    ManifestFile files[N_CHECKPOINT_FILES] = {{checkpoint_files[0], 0, 0}, {checkpoint_files[1], 0, 0}};

    if (writeArenas(m, path, params, no_prefix, 1, model_meta,
                    (int)(sizeof model_meta / sizeof *model_meta), &files[0].crc, &files[0].bytes, err) != 0)
        goto fail_tmp;
    if (fsPathf(err, path, sizeof path, "%s/state.safetensors", tmp_dir) != 0) goto fail_tmp;
    if (writeArenas(m, path, moments, moment_prefixes, 2, state_meta,
                    (int)(sizeof state_meta / sizeof *state_meta), &files[1].crc, &files[1].bytes, err) != 0)
        goto fail_tmp;
    /* last: a directory with a manifest is complete */
    if (writeManifest(tmp_dir, st, files, err) != 0) goto fail_tmp;

    if (fileExists(final_dir)) {
        if (replaceStepDir(ck_dir, name, tmp_dir, final_dir, old_dir, err) != 0) goto fail_tmp;
    } else {
        if (rename(tmp_dir, final_dir) != 0) {
            nsaErrorf(err, "rename %s to %s: %s", tmp_dir, final_dir, strerror(errno));
            goto fail_tmp;
        }
        if (fsFsyncDir(ck_dir, err) != 0) return -1;
    }
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

/* ---- finding checkpoints ------------------------------------------------------------------ */

/* OUT/checkpoints/latest as a directory. 1 found, 0 no pointer and no
 * step directory, -1 error (including a pointer at a missing directory, and
 * step directories without a pointer: only latest-valid picks one then). */
static int readLatest(const char *run_dir, char *dir, size_t cap, NsaError *err) {
    char ck_dir[4096], name[64];
    if (fsPathf(err, ck_dir, sizeof ck_dir, "%s/checkpoints", run_dir) != 0) return -1;
    int rc = readLatestName(ck_dir, name, sizeof name, err);
    if (rc < 0) return -1;
    if (rc == 0) {
        int64_t *steps;
        size_t n;
        if (listSteps(ck_dir, &steps, &n, err) != 0) return -1;
        free(steps);
        if (n == 0) return 0;
        return nsaErrorf(err, "%s/latest is missing but %zu step_* director%s exist (a save was interrupted); "
                         "resume with latest-valid or name a checkpoint directory", ck_dir, n, n == 1 ? "y" : "ies");
    }
    if (fsPathf(err, dir, cap, "%s/%s", ck_dir, name) != 0) return -1;
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return nsaErrorf(err, "%s/latest points at %s, which is not a directory", ck_dir, dir);
    return 1;
}

int checkpointResolveValid(const char *out_dir, char *dir, size_t cap, char *skipped, size_t skipped_cap,
                           NsaError *err) {
    char ck_dir[4096], latest[64];
    if (skipped && skipped_cap) skipped[0] = '\0';
    if (fsPathf(err, ck_dir, sizeof ck_dir, "%s/checkpoints", out_dir) != 0) return -1;
    NsaError latest_err;
    int have_latest = readLatestName(ck_dir, latest, sizeof latest, &latest_err) == 1;
    int64_t latest_step = have_latest ? parseStepDir(latest) : INT64_MAX;
    int64_t *steps;
    size_t n;
    if (listSteps(ck_dir, &steps, &n, err) != 0) return -1;
    /* newest first, from the one latest names down; newer ones than that
     * belong to a timeline a resume from an older checkpoint abandoned */
    size_t tried = 0, used = 0;
    char why[1024] = "";
    int found = 0;
    for (size_t i = n; i-- > 0 && !found;) {
        if (steps[i] > latest_step) continue;
        char name[64], path[4096];
        stepDirName(steps[i], name, sizeof name);
        NsaError verr;
        Manifest man;
        if (fsPathf(err, path, sizeof path, "%s/%s", ck_dir, name) != 0) {
            free(steps);
            return -1;
        }
        tried++;
        if (verifyManifest(path, &man, &verr) == 0) {
            if (fsPathf(err, dir, cap, "%s", path) != 0) {
                free(steps);
                return -1;
            }
            found = 1;
        } else {
            if (used < sizeof why)
                used += (size_t)snprintf(why + used, sizeof why - used, "%s%s", used ? "; " : "", verr.message);
            if (skipped && skipped_cap) snprintf(skipped, skipped_cap, "%s", why);
        }
    }
    free(steps);
    if (found) return 1;
    if (tried == 0) return 0;
    return nsaErrorf(err, "no valid checkpoint in %s: %s", ck_dir, why);
}

int checkpointResolve(const char *out_dir, const char *spec, char *dir, size_t cap,
                      NsaError *err) {
    const int keyword = !spec || !strcmp(spec, "latest") || !strcmp(spec, "latest-valid");
    if (keyword && !out_dir)
        return nsaErrorf(err, "checkpoint: '%s' needs a run to be the latest of; allowed: a run id, "
                              "a checkpoint directory or a run's out_dir",
                         spec ? spec : "latest");
    if (!spec || !strcmp(spec, "latest")) return readLatest(out_dir, dir, cap, err);
    if (!strcmp(spec, "latest-valid")) return checkpointResolveValid(out_dir, dir, cap, NULL, 0, err);
    char path[4096];
    if (fsPathf(err, path, sizeof path, "%s/model.safetensors", spec) != 0) return -1;
    if (fileExists(path)) {
        if (fsPathf(err, dir, cap, "%s", spec) != 0) return -1;
        return 1;
    }
    int rc = readLatest(spec, dir, cap, err);
    if (rc == 0)
        return nsaErrorf(err, "checkpoint: '%s' is neither a checkpoint directory (no model.safetensors) "
                         "nor a run directory (no checkpoints/latest)", spec);
    return rc;
}

/* ---- loading --------------------------------------------------------------------------------- */

static int metaInt(const Safetensors *st, const char *key, const char *path, int base,
                   uint64_t *out, NsaError *err) {
    const char *v = safetensorsMeta(st, key);
    if (!v) return nsaErrorf(err, "%s: __metadata__ has no '%s'", path, key);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, base);
    if (!*v || *end || errno || *v == '-')
        return nsaErrorf(err, "%s: __metadata__.%s is '%.40s'; allowed: a non-negative integer", path,
                    key, v);
    *out = (uint64_t)x;
    return 0;
}

static int parseState(const Safetensors *st, const char *path, ResumeState *out, NsaError *err) {
    const char *format = safetensorsMeta(st, "nsad_format");
    int legacy = format && !strcmp(format, CHECKPOINT_FORMAT_LEGACY);
    if (!format || (strcmp(format, CHECKPOINT_FORMAT) != 0 && !legacy))
        return nsaErrorf(err, "%s: nsad_format is '%.40s'; allowed: %s (or %s, unverified)", path,
                         format ? format : "(none)", CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_LEGACY);
    uint64_t step, pos, seed, hash, tokens, anomalies;
    if (metaInt(st, "step", path, 10, &step, err) || metaInt(st, "data_position", path, 10, &pos, err) ||
        metaInt(st, "seed", path, 10, &seed, err) || metaInt(st, "config_hash", path, 16, &hash, err) ||
        metaInt(st, "tokens_seen", path, 10, &tokens, err) ||
        metaInt(st, "anomalies", path, 10, &anomalies, err))
        return -1;
    if (step > INT64_MAX || tokens > INT64_MAX || anomalies > INT32_MAX)
        return nsaErrorf(err, "%s: __metadata__ step, tokens_seen or anomalies out of range", path);
    out->step = (int64_t)step;
    out->data_position = pos;
    out->seed = seed;
    out->config_hash = hash;
    out->tokens_seen = (int64_t)tokens;
    out->anomalies = (int)anomalies;
    /* written since data parallelism; older checkpoints come from one rank */
    uint64_t ranks = 1;
    if (safetensorsMeta(st, "ranks") && metaInt(st, "ranks", path, 10, &ranks, err)) return -1;
    if (ranks < 1 || ranks > 1u << 20)
        return nsaErrorf(err, "%s: __metadata__.ranks is %llu; allowed: 1 to %u", path,
                         (unsigned long long)ranks, 1u << 20);
    out->ranks = (int)ranks;
    out->legacy = legacy;
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

/* Sets arena `arena` through m from the file's tensors named prefix + name. */
static int loadArena(const CheckpointTensors *m, const Safetensors *st, const char *path,
                     NsaArena arena, const char *prefix, float *scratch, NsaError *err) {
    int n = m->n;
    char name[512];
    for (int i = 0; i < n; i++) {
        const NsaTensorInfo *info = m->info(m->ctx, i);
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
        if (m->set(m->ctx, arena, i, scratch, err) != 0) return -1;
    }
    return 0;
}

static int loadFile(const CheckpointTensors *m, const char *path, const NsaArena *arenas,
                    const char *const *prefixes, int n_arenas, const Manifest *man, ResumeState *state,
                    NsaError *err) {
    Safetensors *st = safetensorsRead(path, err);
    if (!st) return -1;
    int n = m->n;
    int rc = -1;
    float *scratch = NULL;
    if (checkMetaAgrees(st, path, man, err) != 0) goto out;
    if (safetensorsCount(st) != n * n_arenas) {
        nsaErrorf(err, "%s holds %d tensors; this model has %d (a checkpoint of another model?)", path,
             safetensorsCount(st), n * n_arenas);
        goto out;
    }
    size_t largest = 1;
    for (int i = 0; i < n; i++)
        if (m->info(m->ctx, i)->numel > largest) largest = m->info(m->ctx, i)->numel;
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

int checkpointLoad(NsaModel *model, const char *dir, ResumeState *st, NsaError *err) {
    const CheckpointTensors dst = modelTensors(model);
    return checkpointLoadTensors(&dst, dir, st, err);
}

int checkpointLoadTensors(const CheckpointTensors *m, const char *dir, ResumeState *st,
                          NsaError *err) {
    char path[4096];
    const NsaArena params[] = {NSA_ARENA_PARAMS};
    const char *const no_prefix[] = {""};
    const NsaArena moments[] = {NSA_ARENA_ADAM_M, NSA_ARENA_ADAM_V};
    const char *const moment_prefixes[] = {"adam_m.", "adam_v."};
    Manifest man;
    if (verifyManifest(dir, &man, err) != 0) return -1;
    if (fsPathf(err, path, sizeof path, "%s/model.safetensors", dir) != 0 ||
        loadFile(m, path, params, no_prefix, 1, &man, NULL, err) != 0 ||
        fsPathf(err, path, sizeof path, "%s/state.safetensors", dir) != 0)
        return -1;
    return loadFile(m, path, moments, moment_prefixes, 2, &man, st, err);
}
