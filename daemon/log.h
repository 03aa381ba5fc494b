/* log.h - nsad's log lines on stderr.
 *
 * When stderr is the journal (systemd's JOURNAL_STREAM names its device and
 * inode) each line starts with a syslog priority prefix "<N>"
 * (sd-daemon(3)), which journald turns into the entry's priority and
 * strips. Anywhere else - a terminal, a pipe, a file - a person reads the
 * lines, so they start with a timestamp and a short level word instead.
 *
 * The logger is a process singleton: no handle, no set-up. Its state is
 * process-wide - the level (logSetLevel) and the run sink (logSetRunSink) -
 * except the run a thread is bound to (logBindRun), which is the calling
 * thread's own (thread-local). Thread-safety:
 *   - logMsg / logRunMsg (and the macros) may be called from any thread at
 *     once: a line is formatted on the caller's stack (cut at 2047 bytes)
 *     and written with one write(2), so lines do not interleave. They are
 *     not async-signal-safe: never call them from a signal handler.
 *   - logSetLevel may be called from any thread at any time (an atomic); a
 *     line already being formatted keeps the level it read.
 *   - logSetRunSink stores the sink and its ctx as two atomics, not as one:
 *     a thread logging meanwhile could call the old sink with the new ctx
 *     (or NULL). Hence its rule below: set and clear it only while no thread
 *     logs lines of a run.
 *
 * Lines that belong to a run - logged with logRun* naming it, or by a
 * thread bound to it with logBindRun (the trainer thread while it runs the
 * run's job) - also go to the run sink, when one is set (nsad serve's
 * daemon/runlog.c, which keeps them per run for GET /api/v1/runs/{id}/logs). */
#ifndef NSAD_LOG_H
#define NSAD_LOG_H

enum { LOG_LVL_ERR = 3, LOG_LVL_WARNING = 4, LOG_LVL_NOTICE = 5, LOG_LVL_INFO = 6, LOG_LVL_DEBUG = 7 };

/* Lines above this priority number are dropped (default LOG_LVL_INFO). */
void logSetLevel(int level);
void logMsg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A line of run run_id (NULL or "": of the thread's bound run, if any). */
void logRunMsg(int level, const char *run_id, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* "error", "warning", "notice", "info" or "debug". Never NULL. */
const char *logLevelName(int level);

/* Receives each kept line of a run after it went to stderr, on the thread
 * that logged it: the run id, the level, the time (unix seconds) and the
 * message (one line, no prefix). It must be quick; what it logs itself
 * goes to stderr only. */
typedef void (*LogRunSink)(void *ctx, const char *run_id, int level, double ts, const char *message);
/* Sets the run sink (NULL: none). Set it before the threads that log for
 * runs start and clear it after they stopped: it is read without a lock. */
void logSetRunSink(LogRunSink sink, void *ctx);
/* Binds the calling thread's lines to run_id (copied; NULL or "" unbinds). */
void logBindRun(const char *run_id);

#define logError(...) logMsg(LOG_LVL_ERR, __VA_ARGS__)
#define logWarn(...) logMsg(LOG_LVL_WARNING, __VA_ARGS__)
#define logNotice(...) logMsg(LOG_LVL_NOTICE, __VA_ARGS__)
#define logInfo(...) logMsg(LOG_LVL_INFO, __VA_ARGS__)
#define logDebug(...) logMsg(LOG_LVL_DEBUG, __VA_ARGS__)

#define logRunError(id, ...) logRunMsg(LOG_LVL_ERR, id, __VA_ARGS__)
#define logRunWarn(id, ...) logRunMsg(LOG_LVL_WARNING, id, __VA_ARGS__)
#define logRunNotice(id, ...) logRunMsg(LOG_LVL_NOTICE, id, __VA_ARGS__)
#define logRunInfo(id, ...) logRunMsg(LOG_LVL_INFO, id, __VA_ARGS__)

#endif
