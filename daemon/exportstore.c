/* exportstore.c - see exportstore.h. */
#include "exportstore.h"
#include "fsutil.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const exportStoreFiles[EXPORT_STORE_FILES] = {"model.safetensors", "config.json",
                                                          "README.md"};

#define MAKING_PREFIX ".making-"

static uint32_t fnv1a(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* Whether name could be one exportStoreMake gives: letters, digits, '_'
 * and '-' only, not empty, not too long (so never "..", "." or a path). */
static int nameValid(const char *name) {
    const size_t n = strlen(name);
    return n > 0 && n < EXPORT_STORE_NAME_MAX &&
           strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == n;
}

/* The sizes of the three files of the export in path; 0 when every one
 * is a regular file, -1 when one is missing. */
static int fileSizes(const char *path, uint64_t bytes[EXPORT_STORE_FILES]) {
    for (int i = 0; i < EXPORT_STORE_FILES; i++) {
        char file[PATH_MAX];
        struct stat st;
        if (snprintf(file, sizeof file, "%s/%s", path, exportStoreFiles[i]) >= (int)sizeof file ||
            stat(file, &st) != 0 || !S_ISREG(st.st_mode))
            return -1;
        bytes[i] = (uint64_t)st.st_size;
    }
    return 0;
}

/* Removes what a crash left half made, and the oldest exports past
 * EXPORT_STORE_KEEP (keep: the one just made or reused). Failures are
 * logged: what stays takes disk, nothing more. */
static void prune(const char *dir, const char *keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    char names[256][EXPORT_STORE_NAME_MAX];
    time_t when[256];
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char path[PATH_MAX];
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path)
            continue;
        NsaError err;
        if (!strncmp(e->d_name, MAKING_PREFIX, strlen(MAKING_PREFIX))) {
            if (fsRemoveTree(path, &err)) logWarn("exports: %s", err.message);
            continue;
        }
        struct stat st;
        if (!nameValid(e->d_name) || !strcmp(e->d_name, keep) || n == 256 || stat(path, &st))
            continue;
        snprintf(names[n], sizeof names[n], "%s", e->d_name);
        when[n++] = st.st_mtime;
    }
    closedir(d);
    /* keep - 1 of the others: the newest first */
    for (int kept = 0; n > 0; kept++) {
        int newest = 0;
        for (int i = 1; i < n; i++)
            if (when[i] > when[newest]) newest = i;
        if (kept >= EXPORT_STORE_KEEP - 1) {
            char path[PATH_MAX];
            NsaError err;
            snprintf(path, sizeof path, "%s/%s", dir, names[newest]);
            if (fsRemoveTree(path, &err)) logWarn("exports: %s", err.message);
            else logInfo("exports: removed %s (the newest %d are kept)", names[newest],
                         EXPORT_STORE_KEEP);
        }
        when[newest] = when[n - 1];
        memcpy(names[newest], names[n - 1], sizeof names[0]);
        n--;
    }
}

/* What tells this checkpoint's weights from others at the same path: the
 * path, the run's config hash and model.safetensors' inode, size and
 * modification time (a run retrained into the same out_dir writes new
 * files). "" when model.safetensors cannot be stat'ed. */
static void identity(const Weights *w, char *out, size_t cap) {
    char model[PATH_MAX];
    struct stat st;
    out[0] = '\0';
    if (snprintf(model, sizeof model, "%s/model.safetensors", w->dir) < (int)sizeof model &&
        stat(model, &st) == 0)
        snprintf(out, cap, "%s|%016" PRIx64 "|%ju|%jd|%jd.%09ld", w->dir, w->state.config_hash,
                 (uintmax_t)st.st_ino, (intmax_t)st.st_size, (intmax_t)st.st_mtim.tv_sec,
                 st.st_mtim.tv_nsec);
}

int exportStoreMake(const char *dir, const Weights *w, ExportDtype dtype, char *name,
                    uint64_t bytes[EXPORT_STORE_FILES], int *reused, NsaError *err) {
    char id[PATH_MAX + 128];
    identity(w, id, sizeof id);
    if (!id[0]) return nsaErrorf(err, "exports: %s/model.safetensors: %s", w->dir, strerror(errno));
    snprintf(name, EXPORT_STORE_NAME_MAX, "step_%08" PRId64 "-%s-%08x", w->state.step,
             dtype == EXPORT_BF16 ? "bf16" : "f32", fnv1a(id));
    char path[PATH_MAX], making[PATH_MAX];
    if (fsMkdirs(dir, 0755, err) || fsPathf(err, path, sizeof path, "%s/%s", dir, name) ||
        fsPathf(err, making, sizeof making, "%s/" MAKING_PREFIX "%s", dir, name))
        return -1;
    *reused = fileSizes(path, bytes) == 0;
    if (*reused) {
        utimensat(AT_FDCWD, path, NULL, 0); /* the newest again, for the pruning */
    } else {
        if (access(path, F_OK) == 0 && fsRemoveTree(path, err)) return -1; /* half an old one */
        if (access(making, F_OK) == 0 && fsRemoveTree(making, err)) return -1;
        if (exportWrite(w, making, dtype, err)) {
            NsaError rerr;
            fsRemoveTree(making, &rerr);
            return -1;
        }
        if (rename(making, path) != 0) {
            nsaErrorf(err, "exports: cannot move %s into place: %s", making, strerror(errno));
            NsaError rerr;
            fsRemoveTree(making, &rerr);
            return -1;
        }
        if (fsFsyncDir(dir, err)) return -1;
        if (fileSizes(path, bytes)) return nsaErrorf(err, "exports: %s lost a file", path);
    }
    prune(dir, name);
    return 0;
}

int exportStoreOpen(const char *dir, const char *name, const char *file, int *fd, uint64_t *size) {
    int known = 0;
    for (int i = 0; i < EXPORT_STORE_FILES; i++) known |= !strcmp(file, exportStoreFiles[i]);
    char path[PATH_MAX];
    if (!known || !nameValid(name) ||
        snprintf(path, sizeof path, "%s/%s/%s", dir, name, file) >= (int)sizeof path)
        return -1;
    const int f = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (f < 0) return -1;
    if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(f);
        return -1;
    }
    *fd = f;
    *size = (uint64_t)st.st_size;
    return 0;
}
