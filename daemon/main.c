/* main.c - nsad's entry point: dispatches to a subcommand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "commands.h"
#include "nsa.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: nsad COMMAND [ARGS]\n"
            "\n"
            "commands:\n"
            "  serve [--config FILE] [--listen ADDR:PORT] [--state-dir DIR]\n"
            "                          run the daemon (JSON/HTTP API, dashboard)\n"
            "  train CONFIG [--steps N] [--out DIR] [--resume DIR|latest|latest-valid] [--device cpu|cuda]\n"
            "                          run one training job in the foreground\n"
            "  check CONFIG            validate a job config and print it resolved\n"
            "  demo [CONFIG]           one forward/backward on the CPU engine, loss printed\n"
            "  export CHECKPOINT --out DIR [--dtype f32|bf16]\n"
            "                          write the weights as safetensors + config.json + model card\n"
            "  eval CHECKPOINT --data PATH [--seq-len N] [--batch N] [--device cpu|cuda]\n"
            "                          held-out loss and bits per byte on a file\n"
            "  sample CHECKPOINT --prompt TEXT [--max-tokens N] [--temperature T] [--seed S]\n"
            "                          generate text from a checkpoint, printed as it comes\n"
            "  version                 print the version\n"
            "\n"
            "Each command takes --help.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    /* NVLink multicast stays off unless the user set it (libnsa does the
     * same when it loads NCCL; here it happens before any thread exists,
     * so no setenv ever runs beside another thread's getenv) */
    if (setenv("NCCL_NVLS_ENABLE", "0", 0) != 0) perror("nsad: setenv NCCL_NVLS_ENABLE");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "serve")) return cmdServe(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return cmdTrain(argc - 1, argv + 1);
    if (!strcmp(cmd, "check")) return cmdCheck(argc - 1, argv + 1);
    if (!strcmp(cmd, "demo")) return cmdDemo(argc - 1, argv + 1);
    if (!strcmp(cmd, "export")) return cmdExport(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return cmdEval(argc - 1, argv + 1);
    if (!strcmp(cmd, "sample")) return cmdSample(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("nsad %s\n", NSA_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "nsad: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return EXIT_USAGE;
}
