/* exportstore.h - the exports nsad serve makes for its clients to download
 * (POST /api/v1/export, GET /api/v1/exports/NAME/FILE; `nsactl export`).
 *
 * An export is `nsad export`'s three files (export.h) in a directory of
 * their own, <state-dir>/exports/NAME, NAME = step_<N>-<dtype>-<8 hex
 * digits of the checkpoint's identity: its path, its run's config hash and
 * its model.safetensors' inode, size and modification time>: one
 * checkpoint in one dtype is made once and then served again (reused);
 * another written at the same path (a run retrained there) is another. It is written into a hidden
 * directory beside it and renamed into place when complete, so a reader
 * never sees half an export. The newest EXPORT_STORE_KEEP stay; making
 * another removes the oldest past that. */
#ifndef NSAD_EXPORTSTORE_H
#define NSAD_EXPORTSTORE_H

#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "weights.h"

#define EXPORT_STORE_KEEP 8
#define EXPORT_STORE_NAME_MAX 64
#define EXPORT_STORE_FILES 3

/* The three files' names, in the order an export lists them. */
extern const char *const exportStoreFiles[EXPORT_STORE_FILES];

/* Makes (or finds) the export of w's checkpoint in dtype under dir (created
 * when missing): its name into name (EXPORT_STORE_NAME_MAX bytes), its
 * files' sizes into bytes, and whether it was there already into *reused.
 * Returns 0, or -1 with err (a write failed; nothing is left half made).
 * Not for two threads at once on one dir (nsad serve makes them on its
 * inference thread). */
int exportStoreMake(const char *dir, const Weights *w, ExportDtype dtype, char *name,
                    uint64_t bytes[EXPORT_STORE_FILES], int *reused, NsaError *err);

/* Opens file `file` (one of exportStoreFiles) of export `name` under dir
 * for reading: the descriptor (the caller closes it) and its size. Returns
 * 0, or -1 when name is not a well-formed export name, file not one of the
 * three, or the file is not there. Cannot fail otherwise. */
int exportStoreOpen(const char *dir, const char *name, const char *file, int *fd, uint64_t *size);

#endif
