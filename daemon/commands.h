/* commands.h - nsad's subcommands. Each returns the process exit status:
 * 0 success, 1 runtime failure, 2 usage error, 75 (EX_TEMPFAIL) the state
 * dir held by another nsad serve, 78 (EX_CONFIG) bad config; nsad serve
 * also exits 70 (EX_SOFTWARE) when its watchdog ends a hung process
 * (watchdog.h). */
#ifndef NSAD_COMMANDS_H
#define NSAD_COMMANDS_H

#define EXIT_USAGE 2
#define EXIT_IN_USE 75  /* EX_TEMPFAIL: another nsad serve holds the state dir */
#define EXIT_CONFIG 78

int cmdCheck(int argc, char **argv);   /* nsad check CONFIG.yaml      (daemon/cmd_check.c) */
int cmdTrain(int argc, char **argv);   /* nsad train CONFIG.yaml ...  (daemon/cmd_train.c) */
int cmdServe(int argc, char **argv);   /* nsad serve ...              (daemon/cmd_serve.c) */
int cmdDemo(int argc, char **argv);    /* nsad demo: one forward/backward (daemon/cmd_demo.c) */
int cmdExport(int argc, char **argv);  /* nsad export CHECKPOINT --out DIR (daemon/cmd_export.c) */
int cmdEval(int argc, char **argv);    /* nsad eval CHECKPOINT --data PATH (daemon/cmd_eval.c) */
int cmdSample(int argc, char **argv);  /* nsad sample CHECKPOINT --prompt TEXT (daemon/cmd_sample.c) */

#endif
