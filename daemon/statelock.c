/* statelock.c - see statelock.h. */
#include "statelock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

/* Rewrites the file's text in place. Returns 0 or -1 (errno). */
static int writeText(int fd, const char *text) {
    size_t n = strlen(text);
    if (ftruncate(fd, 0) != 0) return -1;
    return pwrite(fd, text, n, 0) == (ssize_t)n ? 0 : -1;
}

/* "pid N (http://..., unix:...)" from a holder's file text. */
static void describeHolder(const char *text, char *out, size_t cap) {
    char pid[32] = "", listen[512] = "", sock[512] = "";
    for (const char *line = text; line && *line;) {
        size_t len = strcspn(line, "\n");
        if (!strncmp(line, "pid=", 4)) snprintf(pid, sizeof pid, "%.*s", (int)(len - 4), line + 4);
        if (!strncmp(line, "listen=", 7)) snprintf(listen, sizeof listen, "%.*s", (int)(len - 7), line + 7);
        if (!strncmp(line, "socket=", 7)) snprintf(sock, sizeof sock, "%.*s", (int)(len - 7), line + 7);
        line += len + (line[len] == '\n');
    }
    if (!pid[0]) {
        snprintf(out, cap, "another nsad (still starting: its pid is not written yet)");
        return;
    }
    if (!listen[0] && !sock[0]) {
        snprintf(out, cap, "nsad pid %s (still starting: not listening yet)", pid);
        return;
    }
    snprintf(out, cap, "nsad pid %s (%s%s%s%s)", pid, listen, listen[0] && sock[0] ? ", " : "",
             sock[0] ? "unix:" : "", sock);
}

int statelockAcquire(const char *state_dir, int *held, NsaError *err) {
    *held = 0;
    char path[4200];
    if (snprintf(path, sizeof path, "%s/%s", state_dir, STATELOCK_FILE) >= (int)sizeof path)
        return nsaErrorf(err, "state dir %s: path too long", state_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) return nsaErrorf(err, "%s: cannot open the state dir's lock file: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        if (e != EWOULDBLOCK) {
            close(fd);
            return nsaErrorf(err, "%s: cannot lock: %s", path, strerror(e));
        }
        char text[1200];
        ssize_t n = pread(fd, text, sizeof text - 1, 0);
        text[n > 0 ? n : 0] = '\0';
        close(fd);
        char who[1100];
        describeHolder(text, who, sizeof who);
        *held = 1;
        return nsaErrorf(err, "state dir %s is in use by %s; stop that one first, or give this one another "
                        "--state-dir", state_dir, who);
    }
    char text[64];
    snprintf(text, sizeof text, "pid=%ld\n", (long)getpid());
    if (writeText(fd, text) != 0) {
        int e = errno;
        close(fd);
        return nsaErrorf(err, "%s: cannot write: %s", path, strerror(e));
    }
    return fd;
}

int statelockDescribe(int fd, const char *listen_url, const char *socket_path, NsaError *err) {
    char text[9000];
    snprintf(text, sizeof text, "pid=%ld\nlisten=%s\nsocket=%s\n", (long)getpid(),
             listen_url ? listen_url : "", socket_path ? socket_path : "");
    if (writeText(fd, text) != 0)
        return nsaErrorf(err, "the state dir's lock file: cannot write: %s", strerror(errno));
    return 0;
}
