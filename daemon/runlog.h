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
 * order: the service's lock, then this one, then a stream's. Under this
 * lock a line is appended and a reader's files are opened, never read: a
 * reader reads them after dropping it (runlogReadFinish). */
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
/* Ends every follower's stream (waiting for reads in runlogReadFinish:
 * theirs end after their stored lines), stops the thread, frees. NULL:
 * no-op. */
void runlogClose(RunLog *rl);

/* A LogRunSink (log.h; ctx is the RunLog): appends the line to the run's
 * log.jsonl and writes it to the run's followers. A run whose directory
 * is gone (deleted) keeps nothing; a write that fails is reported on
 * stderr. Cannot fail otherwise. */
void runlogAppend(void *ctx, const char *run_id, int level, double ts, const char *message);

/* A read of the run's log comes in two steps, so that no lock is held
 * while the files are read (up to 2 x RUNLOG_FILE_MAX bytes, from a disk
 * that may be slow). */
typedef struct RunLogRead RunLogRead;

/* Step one, under the caller's locks (the service's, which decides
 * `follow`: the run's job is active): opens the run's stored files and
 * takes their sizes - which lines are stored - and, when follow, registers
 * the reader for each line logged from then on (held for it until step two
 * has written the stored ones: none is lost, doubled or early). Reads
 * nothing. NULL with err when out of memory, a file cannot be opened or is
 * over RUNLOG_FILE_MAX + 64 KiB, or RUNLOG_FOLLOWERS_MAX followers exist.
 * The caller checked that the run exists. A read returned must go to
 * runlogReadFinish, once. */
RunLogRead *runlogReadStart(RunLog *rl, const char *run_id, long tail, int follow, NsaError *err);

/* Step two, with no lock held: reads the lines rd stored and returns a
 * stream (for the consumer; release with streamRelease) holding them - the
 * last `tail` of them, or all (tail < 0) - then, when follow, each new
 * line until runlogEnd(run_id) (one that came before now: at once), else
 * its end. Frees rd, also on error: NULL with err when a file cannot be
 * read or out of memory. */
Stream *runlogReadFinish(RunLog *rl, RunLogRead *rd, NsaError *err);

/* Ends the streams that follow run_id (its job ended, or it was deleted):
 * their readers get what was written, then the end. Cannot fail. */
void runlogEnd(RunLog *rl, const char *run_id);

/* Tests: fn(ctx) runs in each runlogReadFinish before it reads, with no
 * lock held (a slow disk, simulated); NULL: none. Set it while no read is
 * under way. */
typedef void (*RunLogReadHook)(void *ctx);
void runlogSetReadHook(RunLog *rl, RunLogReadHook fn, void *ctx);

#endif
