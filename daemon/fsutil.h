/* fsutil.h - the file-system steps nsad repeats: bounded path formatting,
 * mkdir -p, whole writes, and crash-safe replacement of a file (temp name,
 * fsync, rename, fsync of the directory). Every function that takes an
 * NsaError returns 0, or -1 with err naming the path and the errno text. */
#ifndef NSAD_FSUTIL_H
#define NSAD_FSUTIL_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "nsa.h"

/* snprintf into a path buffer; truncation is an error, never a silently
 * shorter path. */
int fsPathf(NsaError *err, char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* mkdir -p: parents get 0755, the last component `mode`. An existing
 * directory is fine; an existing non-directory is an error. Each directory
 * made is fsynced into its parent. Returns 0, or -1 with err. */
int fsMkdirs(const char *path, mode_t mode, NsaError *err);

/* write(2) until done, retrying EINTR. Returns 0, or -1 with errno set. */
int fsWriteAll(int fd, const void *buf, size_t len);

/* fsync of a directory, so a rename inside it survives a crash. */
int fsFsyncDir(const char *dir, NsaError *err);

/* Replaces path with data: path.tmp, fsync, rename, fsync of the parent
 * directory. On error the old file is untouched and the temp is removed. */
int fsWriteFileAtomic(const char *path, const void *data, size_t len, mode_t mode, NsaError *err);

/* Opens path for reading, refusing anything but a regular file (a FIFO, a
 * device, a directory or a socket is named in err: none of them can hang or
 * flood the caller). The open never blocks (O_NONBLOCK, cleared again).
 * Fills st when not NULL. Returns the descriptor (the caller closes), or -1
 * with err. */
int fsOpenRegular(const char *path, struct stat *st, NsaError *err);

/* Reads a whole regular file of at most max_bytes into a malloc'd
 * NUL-terminated buffer (the caller frees); *len (if not NULL) gets its
 * length. A larger file, one that grows past its size while being read,
 * or a file that is not regular is refused with err naming the limit.
 * Returns NULL with err (and errno) on error. */
char *fsReadRegular(const char *path, size_t max_bytes, size_t *len, NsaError *err);

/* The largest file fsReadFile reads: nsad's own state files are far smaller. */
#define FS_READ_FILE_MAX ((size_t)64 << 20)

/* fsReadRegular(path, FS_READ_FILE_MAX, len) for callers that report the
 * error themselves: NULL with errno on error. */
char *fsReadFile(const char *path, size_t *len);

/* "a FIFO", "a directory", ... for messages about what a path is. */
const char *fsKindName(mode_t mode);

/* rm -r: removes path and everything below it, not following symbolic
 * links (a link is removed, never its target). A missing path is fine.
 * On error err names the first entry that could not be removed; what could
 * be removed is gone. */
int fsRemoveTree(const char *path, NsaError *err);

#endif
