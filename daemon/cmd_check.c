/* cmd_check.c - placeholder until the subcommand lands (this session). */
#include <stdio.h>
#include "commands.h"

int cmdCheck(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "nsad: 'check' is not built yet\n");
    return 1;
}
