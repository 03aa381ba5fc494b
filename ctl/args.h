/* args.h - nsactl's per-command argument parsing: a command's options
 * ("--x V", "--x=V", flags) and positional arguments, the numbers options
 * take, and the "did you mean" line for a mistyped option. (nsactl.c splits
 * off the global options first; use.c adds sample/eval/export's required
 * option on top of argsParse.)
 *
 * Each parser prints one line on stderr ("nsactl CMD: ...") and returns -1
 * when the command line is wrong; the command then exits CTL_EXIT_USAGE.
 * Nothing to free: results point into argv or into caller storage. */
#ifndef NSACTL_ARGS_H
#define NSACTL_ARGS_H

/* The most option names of one command that a "did you mean" looks at. */
#define ARGS_MAX_OPTIONS 16

/* One option a command takes: value set for one that takes a value, flag
 * for one that does not (the other NULL). */
typedef struct ArgsOption {
    const char *name;   /* "--since" */
    const char **value; /* set to the option's value (pointing into argv) */
    int *flag;          /* set to 1 when given */
} ArgsOption;

/* Splits argv into options from opts[0..n_opts) and positional arguments
 * (at least min_pos, at most max_pos, stored in pos[], their count in
 * *n_pos). cmd names the command in messages and for its synopsis. Returns
 * 0, or prints one usage line and returns -1. */
int argsParse(const char *cmd, int argc, char **argv, const ArgsOption *opts, int n_opts,
              const char **pos, int min_pos, int max_pos, int *n_pos);

/* For the commands that take no argument (the global options aside).
 * Returns 0, or prints one usage line and returns -1. */
int argsParseNone(const char *cmd, int argc, char **argv);

/* Parses --interval: seconds from 0.05 to 3600 into *out. Returns 0, or
 * prints and returns -1 (*out untouched). */
int argsParseInterval(const char *cmd, const char *text, double *out);

/* Parses option opt's value text as an integer >= 0 into *out. Returns 0,
 * or prints and returns -1 (*out untouched). */
int argsParseCount(const char *cmd, const char *opt, const char *text, long long *out);

/* Prints "nsactl CMD: unknown option 'TYPED'; did you mean 'X'? (see
 * nsactl CMD --help)" on stderr, one line: the closest of the command's
 * option names opts[0..n_opts) (the first ARGS_MAX_OPTIONS) and nsactl's
 * global options. Cannot fail. */
void argsUnknownOption(const char *cmd, const char *typed, const char *const *opts, int n_opts);

#endif
