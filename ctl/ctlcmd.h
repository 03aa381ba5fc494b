/* ctlcmd.h - nsactl's commands (not nsad's: those are daemon/commands.h).
 * Each takes the arguments after its name (global options already removed)
 * and returns nsactl's exit code (ctl.h). */
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

/* The commands that use a trained checkpoint (use.c). */
int ctlCmdSample(Ctl *ctl, int argc, char **argv);
int ctlCmdEval(Ctl *ctl, int argc, char **argv);
int ctlCmdExport(Ctl *ctl, int argc, char **argv);

#endif
