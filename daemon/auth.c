/* auth.c - token file and constant-time comparison; see auth.h. */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static int tokenCharAllowed(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           strchr("._~+/=-", c) != NULL;
}

static int fail(NsaError *err, const char *fmt, const char *path, const char *why) {
    nsaErrorf(err, fmt, path, why);
    return -1;
}

/* Fills buf with n random bytes from the kernel. Returns 0 or -1. */
static int randomBytes(unsigned char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(buf + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

static int createTokenFile(const char *path, NsaError *err) {
    unsigned char raw[AUTH_TOKEN_HEX / 2];
    if (randomBytes(raw, sizeof raw) != 0) return fail(err, "token file %s: %s", path, "getrandom failed");
    char hex[AUTH_TOKEN_HEX + 2];
    for (size_t i = 0; i < sizeof raw; i++) snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    hex[AUTH_TOKEN_HEX] = '\n';
    hex[AUTH_TOKEN_HEX + 1] = '\0';

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return fail(err, "token file %s: %s", path, "path too long");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return fail(err, "token file %s: cannot create: %s", path, strerror(errno));
    size_t len = AUTH_TOKEN_HEX + 1;
    ssize_t w = write(fd, hex, len);
    int ok = w == (ssize_t)len && fchmod(fd, 0600) == 0 && fsync(fd) == 0;
    int saved = errno;
    close(fd);
    if (!ok) {
        unlink(tmp);
        return fail(err, "token file %s: cannot write: %s", path, strerror(saved));
    }
    /* link (not rename) so that two daemons starting at once cannot replace
     * each other's token: the loser reads the winner's file */
    if (link(tmp, path) != 0 && errno != EEXIST) {
        saved = errno;
        unlink(tmp);
        return fail(err, "token file %s: cannot create: %s", path, strerror(saved));
    }
    unlink(tmp);
    return 0;
}

int authLoadOrCreateToken(const char *path, char *token, size_t cap, int *created, NsaError *err) {
    if (created) *created = 0;
    if (!path || !*path) return fail(err, "token file%s: %s", "", "the path is empty");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); /* a FIFO must not block */
    if (fd < 0 && errno == ENOENT) {
        if (createTokenFile(path, err) != 0) return -1;
        if (created) *created = 1;
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); /* a FIFO must not block */
    }
    if (fd < 0) return fail(err, "token file %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(err, "token file %s: %s", path, "not a regular file");
    }
    if (st.st_mode & 077) {
        close(fd);
        nsaErrorf(err, "token file %s has mode %04o; allowed: 0600 or stricter (chmod 600 %s)",
                  path, (unsigned)(st.st_mode & 07777), path);
        return -1;
    }
    char buf[AUTH_TOKEN_MAX + 2];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0) return fail(err, "token file %s: cannot read: %s", path, strerror(errno));
    buf[n] = '\0';
    size_t start = 0, end = (size_t)n;
    while (start < end && strchr(" \t\r\n", buf[start])) start++;
    char *nl = memchr(buf + start, '\n', end - start);
    if (nl) end = (size_t)(nl - buf);
    while (end > start && strchr(" \t\r\n", buf[end - 1])) end--;
    size_t len = end - start;
    if (len == 0) return fail(err, "token file %s: %s", path, "empty; delete it to get a new token");
    if (len >= AUTH_TOKEN_MAX || len >= cap)
        return fail(err, "token file %s: %s", path, "token longer than 255 characters");
    for (size_t i = start; i < end; i++)
        if (!tokenCharAllowed(buf[i]))
            return fail(err, "token file %s: %s", path, "token has a character outside [A-Za-z0-9._~+/=-]");
    memcpy(token, buf + start, len);
    token[len] = '\0';
    return 0;
}

int authTokenEqual(const char *given, size_t given_len, const char *token) {
    size_t token_len = strlen(token);
    if (given_len == 0 || token_len == 0) return 0;
    /* Walk the whole token whatever the input: the time reveals lengths,
     * never where the first difference is. */
    unsigned char diff = (unsigned char)(given_len != token_len);
    for (size_t i = 0; i < token_len; i++) {
        unsigned char g = i < given_len ? (unsigned char)given[i] : 0;
        diff |= (unsigned char)(g ^ (unsigned char)token[i]);
    }
    return diff == 0;
}

int authCheckBearer(const char *header, const char *token) {
    if (!header) return 0;
    while (*header == ' ' || *header == '\t') header++;
    if (strncasecmp(header, "Bearer", 6) != 0) return 0;
    header += 6;
    if (*header != ' ' && *header != '\t') return 0;
    while (*header == ' ' || *header == '\t') header++;
    size_t len = strlen(header);
    while (len > 0 && (header[len - 1] == ' ' || header[len - 1] == '\t')) len--;
    return authTokenEqual(header, len, token);
}
