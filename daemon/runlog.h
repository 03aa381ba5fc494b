/* runlog.h - each run's own log: the lines nsad logs for a run (log.h's
 * run sink) kept in <state-dir>/runs/<id>/log.jsonl, one JSON object a line
 * ({"ts","level","message"}; past RUNLOG_FILE_MAX bytes the file becomes
 * log.1.jsonl, replacing the one before), and handed to readers: GET
 * /api/v1/runs/{id}/logs, with ?follow=1 as a stream that gets each new
 * line until the run's job ends (runlogEnd).
 *
 * A follower's stream gets an empty line every RUNLOG_KEEPALIVE_S seconds
 * when nothing else came, so that a client that went away is noticed (its
 * connection fails) rather than held open until the run's next line.
 *
 * Threads: runlogAppend runs on whichever thread logged the line; readers
 * on the HTTP threads; a keep-alive thread of its own. Thread-safe. Lock
 * order: the service's lock, then this one, then a stream's. */
#ifndef NSAD_RUNLOG_H
#define NSAD_RUNLOG_H

#include "nsa.h"
#include "stream.h"

#define RUNLOG_FILE_MAX ((size_t)4 << 20)
#define RUNLOG_KEEPALIVE_S 10
#define RUNLOG_FOLLOWERS_MAX 128

typedef struct RunLog RunLog;

/* A run log over runs_dir (<state-dir>/runs; its run directories must
 * exist for their lines to be kept) and its keep-alive thread. NULL with
 * err when out of memory or the thread cannot start. Free with runlogClose. */
RunLog *runlogOpen(const char *runs_dir, NsaError *err);
/* Ends every follower's stream, stops the thread, frees. NULL: no-op. */
void runlogClose(RunLog *rl);

/* A LogRunSink (log.h; ctx is the RunLog): appends the line to the run's
 * log.jsonl and writes it to the run's followers. A run whose directory
 * is gone (deleted) keeps nothing; a write that fails is reported on
 * stderr. Cannot fail otherwise. */
void runlogAppend(void *ctx, const char *run_id, int level, double ts, const char *message);

/* A reader of the run's log: a stream (for the consumer; release with
 * streamRelease) holding its stored lines - the last `tail` of them, or
 * all (tail < 0; at most 2 x RUNLOG_FILE_MAX bytes) - then, when follow,
 * each new line until runlogEnd(run_id), else its end. NULL with err when
 * out of memory, the file cannot be read, or RUNLOG_FOLLOWERS_MAX
 * followers exist. The caller checked that the run exists. */
Stream *runlogRead(RunLog *rl, const char *run_id, long tail, int follow, NsaError *err);

/* Ends the streams that follow run_id (its job ended, or it was deleted):
 * their readers get what was written, then the end. Cannot fail. */
void runlogEnd(RunLog *rl, const char *run_id);

#endif
