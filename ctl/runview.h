/* runview.h - how nsactl shows a run object in one line, shared by status,
 * list (commands.c) and watch (watch.c). */
#ifndef NSACTL_RUNVIEW_H
#define NSACTL_RUNVIEW_H

#include <stddef.h>
#include "ctl.h"

/* One line describing a run object (shared by status, list and watch):
 * "ID  running  step 120/1000 (12%)  loss 3.9100  val 4.0200  15.2K tok/s (MFU 41.3%)  ETA 1m01s"
 * (the MFU only when the run has one). The ETA is the daemon's eta_s ("-"
 * while it has none): the dashboard and /metrics show the same estimate. */
void ctlRunLine(const cJSON *run, char *buf, size_t cap);

/* Where a run trains: "cuda:0,1" for a CUDA run with its GPUs (the run
 * object's gpus), else its device ("cpu", "cuda"), "-" when unknown. */
void ctlRunDevice(const cJSON *run, char *buf, size_t cap);

/* True for the states a run does not leave on its own. */
int ctlRunStateFinal(const char *state);

#endif
