/* fsutil.c - see fsutil.h. */
#include "fsutil.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fsPathf(NsaError *err, char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap)
        return nsaErrorf(err, "path too long (over %zu bytes): %s...", cap, out);
    return 0;
}

/* Makes path (a directory) unless it is one; a new one's entry is made
 * durable in its parent (a crash must not lose the directory a checkpoint
 * or a run was written into). */
static int mkdirOne(const char *path, mode_t mode, NsaError *err) {
    if (mkdir(path, mode) == 0) {
        char parent[PATH_MAX];
        const char *slash = strrchr(path, '/');
        if (!slash) return fsFsyncDir(".", err);
        if (slash == path) return fsFsyncDir("/", err);
        if (fsPathf(err, parent, sizeof parent, "%.*s", (int)(slash - path), path) != 0) return -1;
        return fsFsyncDir(parent, err);
    }
    if (errno != EEXIST) return nsaErrorf(err, "cannot create directory %s: %s", path, strerror(errno));
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return nsaErrorf(err, "%s: exists and is not a directory", path);
    return 0;
}

int fsMkdirs(const char *path, mode_t mode, NsaError *err) {
    char buf[PATH_MAX];
    if (fsPathf(err, buf, sizeof buf, "%s", path) != 0) return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdirOne(buf, 0755, err) != 0) return -1;
        *p = '/';
    }
    return mkdirOne(buf, mode, err);
}

int fsWriteAll(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        /* write(2) moves at most about 2 GiB at once on Linux */
        size_t chunk = len > (1u << 30) ? (1u << 30) : len;
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int fsFsyncDir(const char *dir, NsaError *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return nsaErrorf(err, "open directory %s: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int saved = errno;
    close(fd);
    if (rc != 0) return nsaErrorf(err, "fsync directory %s: %s", dir, strerror(saved));
    return 0;
}

int fsWriteFileAtomic(const char *path, const void *data, size_t len, mode_t mode, NsaError *err) {
    char tmp[PATH_MAX], dir[PATH_MAX];
    if (fsPathf(err, tmp, sizeof tmp, "%s.tmp", path) != 0) return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) return nsaErrorf(err, "cannot create %s: %s", tmp, strerror(errno));
    if (fsWriteAll(fd, data, len) != 0 || fsync(fd) != 0) {
        int saved = errno;
        close(fd);
        unlink(tmp);
        return nsaErrorf(err, "cannot write %s: %s", tmp, strerror(saved));
    }
    if (close(fd) != 0) {
        int saved = errno;
        unlink(tmp);
        return nsaErrorf(err, "cannot write %s: %s", tmp, strerror(saved));
    }
    if (rename(tmp, path) != 0) {
        int saved = errno;
        unlink(tmp);
        return nsaErrorf(err, "cannot rename %s to %s: %s", tmp, path, strerror(saved));
    }
    const char *slash = strrchr(path, '/');
    if (!slash) return fsFsyncDir(".", err);
    if (slash == path) return fsFsyncDir("/", err);
    if (fsPathf(err, dir, sizeof dir, "%.*s", (int)(slash - path), path) != 0) return -1;
    return fsFsyncDir(dir, err);
}

const char *fsKindName(mode_t mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "not a file";
}

int fsOpenRegular(const char *path, struct stat *st, NsaError *err) {
    /* O_NONBLOCK: opening a FIFO for reading must not wait for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int saved = errno;
        nsaErrorf(err, "%s: cannot open: %s", path, strerror(saved));
        errno = saved;
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int saved = errno;
        close(fd);
        nsaErrorf(err, "%s: cannot stat: %s", path, strerror(saved));
        errno = saved;
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        nsaErrorf(err, "%s: is %s; allowed: a regular file", path, fsKindName(sb.st_mode));
        errno = S_ISDIR(sb.st_mode) ? EISDIR : EINVAL;
        return -1;
    }
    /* back to blocking reads (a regular file never blocks, but mmap and
     * read callers should not see a surprising flag) */
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    if (st) *st = sb;
    return fd;
}

char *fsReadRegular(const char *path, size_t max_bytes, size_t *len_out, NsaError *err) {
    struct stat st;
    int fd = fsOpenRegular(path, &st, err);
    if (fd < 0) return NULL;
    if ((uint64_t)st.st_size > (uint64_t)max_bytes) {
        close(fd);
        nsaErrorf(err, "%s: %lld bytes; allowed: at most %zu bytes", path, (long long)st.st_size, max_bytes);
        errno = EFBIG;
        return NULL;
    }
    /* one byte more than stat said: a file that grew since is caught */
    size_t cap = (size_t)st.st_size + 1, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        nsaErrorf(err, "%s: out of memory for %zu bytes", path, cap);
        errno = ENOMEM;
        return NULL;
    }
    while (len < cap) {
        ssize_t got = read(fd, buf + len, cap - len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int saved = errno;
            close(fd);
            free(buf);
            nsaErrorf(err, "%s: read error: %s", path, strerror(saved));
            errno = saved;
            return NULL;
        }
        if (got == 0) break;
        len += (size_t)got;
    }
    close(fd);
    if (len > max_bytes || len == cap) {
        free(buf);
        nsaErrorf(err, "%s: grew while nsad read it (over %zu bytes); allowed: a file nobody is writing",
                  path, len > max_bytes ? max_bytes : (size_t)st.st_size);
        errno = EFBIG;
        return NULL;
    }
    buf[len] = 0;
    if (len_out) *len_out = len;
    return buf;
}

char *fsReadFile(const char *path, size_t *len_out) {
    NsaError err;
    return fsReadRegular(path, FS_READ_FILE_MAX, len_out, &err);
}

/* The first failure of a tree removal: the entry's name and errno. */
typedef struct RemoveFailure {
    char name[256];
    int errno_value;
} RemoveFailure;

static void removeFailed(RemoveFailure *f, const char *name) {
    if (f->errno_value) return;
    f->errno_value = errno;
    snprintf(f->name, sizeof f->name, "%s", name);
}

/* Removes name under the directory dirfd, depth first, never following a
 * symbolic link; carries on past failures and records the first. */
static void removeAt(int dirfd, const char *name, RemoveFailure *f) {
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno != ENOENT) removeFailed(f, name);
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
        if (!d) {
            removeFailed(f, name);
            if (fd >= 0) close(fd);
            return;
        }
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) removeAt(fd, e->d_name, f);
        closedir(d);
        if (unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) removeFailed(f, name);
    } else if (unlinkat(dirfd, name, 0) != 0 && errno != ENOENT) {
        removeFailed(f, name);
    }
}

int fsRemoveTree(const char *path, NsaError *err) {
    RemoveFailure f = {"", 0};
    removeAt(AT_FDCWD, path, &f);
    if (f.errno_value) {
        nsaErrorf(err, "cannot remove %s (at %s): %s", path, f.name, strerror(f.errno_value));
        return -1;
    }
    return 0;
}
