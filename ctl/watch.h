/* watch.h - `nsactl watch ID` and `nsactl start --watch`: follow a run
 * until it ends. */
#ifndef NSACTL_WATCH_H
#define NSACTL_WATCH_H

#include "ctl.h"

/* Follows a run until it ends: a live line on a terminal, a line
 * per change otherwise, a run object per change with --json. Returns 0 when
 * the run completed or halted, CTL_EXIT_ERROR when it failed or was stopped
 * by the NaN guard, or the exit code of a request that failed for good. */
int ctlWatchRun(Ctl *ctl, const char *run_id, double interval_s);

#endif
