/* paths.c - see paths.h. */
#include "paths.h"

#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

/* A set, non-empty environment variable, or NULL. */
static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static int fits(int n, size_t cap, char *out) {
    if (n >= 0 && (size_t)n < cap) return 0;
    if (cap > 0) out[0] = '\0';
    errno = ENAMETOOLONG;
    return -1;
}

int pathsStateDir(char *out, size_t cap) {
    const char *sd = env("STATE_DIRECTORY"), *xdg = env("XDG_STATE_HOME");
    if (sd) /* systemd may list several, colon-separated: the first is ours */
        return fits(snprintf(out, cap, "%.*s", (int)strcspn(sd, ":"), sd), cap, out);
    if (xdg) return fits(snprintf(out, cap, "%s/nsad", xdg), cap, out);
    if (geteuid() == 0) return fits(snprintf(out, cap, "%s", PATHS_SYSTEM_STATE_DIR), cap, out);
    const char *home = env("HOME");
    if (!home) {
        const struct passwd *pw = getpwuid(geteuid());
        home = pw && pw->pw_dir && *pw->pw_dir ? pw->pw_dir : "/tmp";
    }
    return fits(snprintf(out, cap, "%s/.local/state/nsad", home), cap, out);
}

int pathsSocket(char *out, size_t cap) {
    const char *rd = env("RUNTIME_DIRECTORY"), *xdg = env("XDG_RUNTIME_DIR");
    int n;
    if (rd) {
        n = snprintf(out, cap, "%.*s/nsad.sock", (int)strcspn(rd, ":"), rd);
    } else if (xdg) {
        n = snprintf(out, cap, "%s/nsad/nsad.sock", xdg);
    } else if (geteuid() == 0) {
        n = snprintf(out, cap, "%s", PATHS_SYSTEM_SOCKET);
    } else {
        char state[4096];
        if (pathsStateDir(state, sizeof state) != 0) return fits(-1, cap, out);
        n = snprintf(out, cap, "%s/nsad.sock", state);
    }
    struct sockaddr_un sa;
    if (n >= 0 && (size_t)n >= sizeof sa.sun_path) n = -1;
    return fits(n, cap, out);
}
