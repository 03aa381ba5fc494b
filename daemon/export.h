/* export.h - a checkpoint's weights for other tools (`nsad export`):
 *   OUT/model.safetensors  every weight under its engine name (proto/model.md
 *                          lists them; linear weights [out][in], y = x W^T),
 *                          in F32 or BF16 (round to nearest even)
 *   OUT/config.json        every dimension and NSA size, the RoPE convention,
 *                          the tokenizer, the tensor table
 *   OUT/README.md          a model card: the model, the training config,
 *                          steps, tokens, the last val bits/byte
 * proto/files.md documents the format. */
#ifndef NSAD_EXPORT_H
#define NSAD_EXPORT_H

#include "../kernels/nsa.h"
#include "weights.h"

#define EXPORT_FORMAT "nsad-export-1"

typedef enum ExportDtype { EXPORT_F32 = 0, EXPORT_BF16 = 1 } ExportDtype;

/* Writes the three files for the open checkpoint w into out_dir (created
 * when missing). Refuses, writing nothing, when out_dir already holds any
 * of them. Each file is written atomically, and a failure leaves none of
 * the three. Returns 0, or -1 with err naming the file and the problem. */
int exportWrite(const Weights *w, const char *out_dir, ExportDtype dtype, NsaError *err);

/* "f32" or "bf16" into *out; -1 with err naming the value otherwise. */
int exportDtypeParse(const char *s, ExportDtype *out, NsaError *err);

/* The bf16 bits of f, rounded to nearest even (NaN stays NaN). */
uint16_t exportBf16(float f);

#endif
