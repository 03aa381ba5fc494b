/* cmd_export.c - `nsad export CHECKPOINT --out DIR [--dtype f32|bf16]`:
 * writes a checkpoint's weights as safetensors with a config.json and a
 * model card (daemon/export.c). CHECKPOINT is a checkpoint directory or a
 * run's out_dir (its latest checkpoint). Exit 0 on success, 1 on failure
 * (one line naming what was wrong), 2 on a usage error. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "export.h"
#include "weights.h"

static void exportUsage(FILE *out) {
    fprintf(out,
            "usage: nsad export CHECKPOINT --out DIR [--dtype f32|bf16]\n"
            "\n"
            "Writes the checkpoint's weights for other tools: DIR/model.safetensors (every\n"
            "tensor under its engine name, f32 by default or bf16), DIR/config.json (every\n"
            "size, the RoPE convention, the tokenizer) and DIR/README.md (a model card).\n"
            "CHECKPOINT: a checkpoint directory (out/checkpoints/step_N) or a run's out_dir\n"
            "(its latest checkpoint). DIR is created; existing files are never overwritten.\n");
}

int cmdExport(int argc, char **argv) {
    const char *spec = NULL, *out = NULL, *dtype_name = "f32";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            exportUsage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            dtype_name = argv[++i];
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "nsad export: unknown option or missing value: '%s'\n", argv[i]);
            exportUsage(stderr);
            return EXIT_USAGE;
        } else if (spec) {
            fprintf(stderr, "nsad export: one CHECKPOINT only (got '%s' and '%s')\n", spec, argv[i]);
            return EXIT_USAGE;
        } else {
            spec = argv[i];
        }
    }
    NsaError err = {{0}};
    ExportDtype dtype;
    if (!spec || !out) {
        fprintf(stderr, "nsad export: %s is required\n", spec ? "--out DIR" : "CHECKPOINT");
        exportUsage(stderr);
        return EXIT_USAGE;
    }
    if (exportDtypeParse(dtype_name, &dtype, &err)) {
        fprintf(stderr, "nsad export: %s\n", err.message);
        return EXIT_USAGE;
    }
    Weights w;
    if (weightsOpen(spec, &w, &err)) {
        fprintf(stderr, "nsad export: %s\n", err.message);
        return 1;
    }
    int rc = exportWrite(&w, out, dtype, &err);
    if (rc)
        fprintf(stderr, "nsad export: %s\n", err.message);
    else
        printf("exported %s (step %lld, %d tensors, %s) to %s\n", w.dir, (long long)w.state.step,
               weightsNumTensors(&w), dtype == EXPORT_BF16 ? "bf16" : "f32", out);
    weightsClose(&w);
    return rc ? 1 : 0;
}
