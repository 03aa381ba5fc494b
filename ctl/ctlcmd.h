/* ctlcmd.h - nsactl's commands (not nsad's: those are daemon/commands.h):
 * the command table with its help text and aliases (cmdtable.c) and the
 * commands it points to (commands.c, use.c). Each command takes the
 * arguments after its name (global options already removed) and returns
 * nsactl's exit code (ctl.h). */
#ifndef NSACTL_CTLCMD_H
#define NSACTL_CTLCMD_H

#include "ctl.h"

typedef struct CtlCommand {
    const char *name;
    const char *synopsis;  /* "start CONFIG [--name NAME] [--watch]" */
    const char *summary;   /* one line for `nsactl --help` */
    const char *help;      /* the rest of `nsactl CMD --help` */
    int (*run)(Ctl *ctl, int argc, char **argv);
} CtlCommand;

/* ---- the table (cmdtable.c) ---- */

/* The command table, terminated by an entry with name == NULL. */
extern const CtlCommand ctlCommands[];

/* Other names people type from habit (ps, ls, rm, stop), terminated by an
 * entry with alias == NULL. */
typedef struct CtlAlias {
    const char *alias, *command;
} CtlAlias;
extern const CtlAlias ctlAliases[];

/* Returns the command of that name or alias, or NULL. */
const CtlCommand *ctlFindCommand(const char *name);

/* Writes "ps, ls" (the aliases of command) into buf (cap > 0); "" when it
 * has none. Returns buf. */
char *ctlAliasesOf(const char *command, char *buf, size_t cap);

/* Prints "nsactl: unknown command 'NAME'; did you mean 'X'? (...)" - the
 * commands and aliases closest to name - on stderr, one line. */
void ctlUnknownCommand(const char *name);

/* ---- the commands ---- */

/* The largest config file `start` sends: nsad refuses a bigger body
 * (proto/api.md), so start says so before sending. Must equal nsad's
 * YAML_LIMIT_BYTES (daemon/yamllimit.h). nsactl does not include that
 * header: it is not header-only (it declares yamllimit.c's libyaml
 * checks), and nsactl links no daemon module but paths.c and strbuf.c.
 * tests/unit/test_ctl_limits.c fails to compile when the two differ. */
#define CTL_CONFIG_FILE_LIMIT ((size_t)1 << 20)

/* The most continuations `sample --n` asks for: nsad's SAMPLE_MAX_PROMPTS
 * (daemon/sampler.h, not header-only either); test_ctl_limits.c fails to
 * compile when the two differ. */
#define CTL_SAMPLE_MAX_N 16

/* Ask nsad once and print (commands.c); watch (commands.c) parses its
 * arguments and follows the run with ctlWatchRun (watch.c). */
int ctlCmdStart(Ctl *ctl, int argc, char **argv);
int ctlCmdStatus(Ctl *ctl, int argc, char **argv);
int ctlCmdList(Ctl *ctl, int argc, char **argv);
int ctlCmdFront(Ctl *ctl, int argc, char **argv);
int ctlCmdHalt(Ctl *ctl, int argc, char **argv);
int ctlCmdResume(Ctl *ctl, int argc, char **argv);
int ctlCmdDelete(Ctl *ctl, int argc, char **argv);
int ctlCmdMetrics(Ctl *ctl, int argc, char **argv);
int ctlCmdEvents(Ctl *ctl, int argc, char **argv);
int ctlCmdLogs(Ctl *ctl, int argc, char **argv);
int ctlCmdStacks(Ctl *ctl, int argc, char **argv);
int ctlCmdWatch(Ctl *ctl, int argc, char **argv);
int ctlCmdDashboard(Ctl *ctl, int argc, char **argv);
int ctlCmdVersion(Ctl *ctl, int argc, char **argv);

/* The commands that use a trained checkpoint (use.c). */
int ctlCmdSample(Ctl *ctl, int argc, char **argv);
int ctlCmdEval(Ctl *ctl, int argc, char **argv);
int ctlCmdExport(Ctl *ctl, int argc, char **argv);

#endif
