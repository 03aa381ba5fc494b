/* log.c - see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Atomic int log_level = LOG_LVL_INFO;

void logSetLevel(int level) { atomic_store(&log_level, level); }

static const char *levelWord(int level) {
    switch (level) {
    case LOG_LVL_ERR: return "error";
    case LOG_LVL_WARNING: return "warn ";
    case LOG_LVL_NOTICE: return "note ";
    case LOG_LVL_INFO: return "info ";
    default: return "debug";
    }
}

/* systemd.exec(5): JOURNAL_STREAM is "DEVICE:INODE" of the stream it
 * connected to the journal; stderr is the journal when it is that file
 * (not when nsad's stderr was redirected since, or the variable was
 * inherited by a child writing elsewhere). */
static int stderrIsJournal(void) {
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) != 0) return 0;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void logMsg(int level, const char *fmt, ...) {
    if (level > atomic_load(&log_level)) return;
    char line[2048];
    size_t n;
    if (!stderrIsJournal()) {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        localtime_r(&ts.tv_sec, &tm);
        n = strftime(line, sizeof line, "%H:%M:%S ", &tm);
        n += (size_t)snprintf(line + n, sizeof line - n, "%s ", levelWord(level));
    } else {
        n = (size_t)snprintf(line, sizeof line, "<%d>", level);
    }
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    n += (size_t)k;
    if (n > sizeof line - 2) n = sizeof line - 2;
    /* one line per entry: journald splits on newlines */
    for (size_t i = 0; i < n; i++)
        if (line[i] == '\n') line[i] = ' ';
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
}
