/* cmd_demo.c - placeholder until the subcommand lands (this session). */
#include <stdio.h>
#include "commands.h"

int cmdDemo(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "nsad: 'demo' is not built yet\n");
    return 1;
}
