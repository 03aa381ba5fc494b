/* fuzzutil.c - see fuzzutil.h. */
#include "fuzzutil.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void fuzzDie(const char *what, const char *detail) {
    fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, detail);
    abort();
}

/* atexit takes no argument: the one scratch directory of the process */
static char scratch[128];

static int removeEntry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void removeScratch(void) {
    if (nftw(scratch, removeEntry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        fprintf(stderr, "%s: could not remove %s\n", program_invocation_short_name, scratch);
}

const char *fuzzScratchDir(const char *prefix) {
    struct stat st;
    const int shm = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0;
    snprintf(scratch, sizeof scratch, "%s/%s-XXXXXX", shm ? "/dev/shm" : "/tmp", prefix);
    if (!mkdtemp(scratch)) fuzzDie("mkdtemp", strerror(errno));
    atexit(removeScratch);
    return scratch;
}
