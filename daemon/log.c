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

/* process-wide state, shared by every thread (log.h says what is safe) */
static _Atomic int log_level = LOG_LVL_INFO;
/* the run sink: ctx is stored before the function and cleared after it */
static _Atomic(LogRunSink) run_sink;
static _Atomic(void *) run_sink_ctx;
/* the run the calling thread's lines belong to ("" none) */
static _Thread_local char bound_run[72];
/* the calling thread is inside the sink: what it logs goes to stderr only */
static _Thread_local int in_sink;

void logSetLevel(int level) { atomic_store(&log_level, level); }

void logSetRunSink(LogRunSink sink, void *ctx) {
    if (sink) {
        atomic_store(&run_sink_ctx, ctx);
        atomic_store(&run_sink, sink);
    } else {
        atomic_store(&run_sink, NULL);
        atomic_store(&run_sink_ctx, NULL);
    }
}

void logBindRun(const char *run_id) { snprintf(bound_run, sizeof bound_run, "%s", run_id ? run_id : ""); }

const char *logLevelName(int level) {
    switch (level) {
    case LOG_LVL_ERR: return "error";
    case LOG_LVL_WARNING: return "warning";
    case LOG_LVL_NOTICE: return "notice";
    case LOG_LVL_INFO: return "info";
    default: return "debug";
    }
}

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

static void logLine(int level, const char *run_id, const char *fmt, va_list ap) {
    if (level > atomic_load(&log_level)) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char line[2048];
    size_t n;
    if (!stderrIsJournal()) {
        struct tm tm;
        localtime_r(&ts.tv_sec, &tm);
        n = strftime(line, sizeof line, "%H:%M:%S ", &tm);
        n += (size_t)snprintf(line + n, sizeof line - n, "%s ", levelWord(level));
    } else {
        n = (size_t)snprintf(line, sizeof line, "<%d>", level);
    }
    const size_t start = n;
    int k = vsnprintf(line + n, sizeof line - n, fmt, ap);
    if (k < 0) return;
    n += (size_t)k;
    if (n > sizeof line - 2) n = sizeof line - 2;
    /* one line per entry: journald splits on newlines */
    for (size_t i = 0; i < n; i++)
        if (line[i] == '\n') line[i] = ' ';
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
    const char *run = run_id && *run_id ? run_id : bound_run;
    LogRunSink sink = atomic_load(&run_sink);
    if (sink && *run && !in_sink) {
        line[n - 1] = '\0';
        in_sink = 1;
        sink(atomic_load(&run_sink_ctx), run, level, (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9,
             line + start);
        in_sink = 0;
    }
}

void logMsg(int level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    logLine(level, NULL, fmt, ap);
    va_end(ap);
}

void logRunMsg(int level, const char *run_id, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    logLine(level, run_id, fmt, ap);
    va_end(ap);
}
