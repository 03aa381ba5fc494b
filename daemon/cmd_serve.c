/* cmd_serve.c - placeholder until the subcommand lands (this session). */
#include <stdio.h>
#include "commands.h"

int cmdServe(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "nsad: 'serve' is not built yet\n");
    return 1;
}
