/* cmd_train.c - placeholder until the subcommand lands (this session). */
#include <stdio.h>
#include "commands.h"

int cmdTrain(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "nsad: 'train' is not built yet\n");
    return 1;
}
