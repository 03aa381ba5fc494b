/* commands.h - nsactl's commands. Each takes the arguments after its name
 * (global options already removed) and returns nsactl's exit code (ctl.h). */
#ifndef NSACTL_COMMANDS_H
#define NSACTL_COMMANDS_H

#include "ctl.h"

typedef struct CtlCommand {
    const char *name;
    const char *synopsis;  /* "start CONFIG [--name NAME] [--watch]" */
    const char *summary;   /* one line for `nsactl --help` */
    const char *help;      /* the rest of `nsactl CMD --help` */
    int (*run)(Ctl *ctl, int argc, char **argv);
} CtlCommand;

/* The command table, terminated by an entry with name == NULL. */
extern const CtlCommand ctlCommands[];

/* Returns the command of that name, or NULL. */
const CtlCommand *ctlFindCommand(const char *name);

/* The commands that use a trained checkpoint (use.c). */
int ctlCmdSample(Ctl *ctl, int argc, char **argv);
int ctlCmdEval(Ctl *ctl, int argc, char **argv);

/* Follows a run until it ends (watch.c): a live line on a terminal, a line
 * per change otherwise, a run object per change with --json. Returns 0 when
 * the run completed or halted, CTL_EXIT_ERROR when it failed or was stopped
 * by the NaN guard, or the exit code of a request that failed for good. */
int ctlWatchRun(Ctl *ctl, const char *run_id, double interval_s);

/* One line describing a run object (shared by status, list and watch):
 * "ID  running  step 120/1000 (12%)  loss 3.9100  val 4.0200  15.2K tok/s  ETA 1m01s".
 * The ETA is the daemon's eta_s ("-" while it has none): the dashboard and
 * /metrics show the same estimate. */
void ctlRunLine(const cJSON *run, char *buf, size_t cap);

/* True for the states a run does not leave on its own. */
int ctlRunStateFinal(const char *state);

#endif
