/* sdnotify.c - see sdnotify.h. */
#include "sdnotify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int sdNotify(const char *state) {
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path) return 0;
    size_t path_len = strlen(path);
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if ((path[0] != '/' && path[0] != '@') || path_len >= sizeof addr.sun_path) {
        errno = EINVAL;
        return -1;
    }
    memcpy(addr.sun_path, path, path_len);
    /* '@' names a socket in the abstract namespace: a leading NUL byte */
    if (path[0] == '@') addr.sun_path[0] = '\0';
    socklen_t addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + path_len);

    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    ssize_t sent = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&addr, addr_len);
    int saved = errno;
    close(fd);
    if (sent < 0) {
        errno = saved;
        return -1;
    }
    return 1;
}

uint64_t sdWatchdogUsec(void) {
    const char *usec = getenv("WATCHDOG_USEC");
    if (!usec || !*usec) return 0;
    const char *pid = getenv("WATCHDOG_PID");
    if (pid && *pid) {
        char *end;
        long p = strtol(pid, &end, 10);
        if (*end || p != (long)getpid()) return 0;
    }
    char *end;
    unsigned long long v = strtoull(usec, &end, 10);
    if (*end || v == 0) return 0;
    return (uint64_t)v;
}
