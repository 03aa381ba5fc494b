/* watchdog.h - the thread that watches the trainers and the HTTP loop.
 *
 * Every tick (250 ms) it compares how long each busy trainer has been in its
 * current phase with that phase's deadline (the active job's `watchdog:`
 * config). On an overrun it writes every thread's stack, the phase and how
 * long it has lasted to a dump file in the run's out_dir and to the log,
 * marks the run hung (event "hang"), and then, by the job's policy
 * (watchdog.on_hang), keeps reporting (the run returns to running if the
 * phase ends) or exits with status WATCHDOG_EXIT_HUNG so systemd restarts
 * nsad, which resumes the run from its latest checkpoint.
 *
 * It also speaks to systemd: WATCHDOG=1 pings (only while both the HTTP
 * thread and the trainers show signs of life) and STATUS= lines. */
#ifndef NSAD_WATCHDOG_H
#define NSAD_WATCHDOG_H

#include <stdint.h>
#include "service.h"

/* EX_SOFTWARE: the unit's Restart=on-failure brings nsad back. */
#define WATCHDOG_EXIT_HUNG 70

typedef struct Watchdog Watchdog;

/* Starts the watchdog thread over svc. Returns NULL with err when the
 * thread cannot start. Stop with watchdogStop. */
Watchdog *watchdogStart(Service *svc, NsaError *err);
/* Stops and joins the thread and frees it. NULL is a no-op. */
void watchdogStop(Watchdog *wd);

/* One watchdog pass at monotonic time now_ns, without the systemd part:
 * flags an overrun (dump, log, hung, event), notices a recovery. Returns 1
 * when it flagged a new hang, 0 otherwise. Used by the thread and by tests.
 * When the policy is exit it does not return after a hang. dump_path (may
 * be NULL) receives the dump file's path. */
int watchdogCheck(Service *svc, int64_t now_ns, char *dump_path, size_t cap);

/* Writes a stack dump with a header naming the run, phase and times to
 * <dir>/stacks-<unix>-<reason>.txt. Returns 0 and fills path, or -1 with
 * err. Used for hangs and for POST /api/v1/debug/stacks. */
int watchdogWriteDump(const char *dir, const char *reason, const char *header, const char *stacks, char *path,
                      size_t cap, NsaError *err);

#endif
