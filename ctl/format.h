/* format.h - how nsactl shows numbers and tables to a person. Scripts use
 * --json instead, so nothing here is a stable format. */
#ifndef NSACTL_FORMAT_H
#define NSACTL_FORMAT_H

#include <stddef.h>
#include <stdio.h>

/* Seconds as "850ms", "42s", "3m05s", "2h07m", "3d04h"; "-" for a negative
 * or non-finite value. Returns buf. */
char *formatDuration(double seconds, char *buf, size_t cap);

/* A rate or count with an SI suffix and 3 significant digits: "812", "12.4K",
 * "1.05M", "3.20G"; "-" when non-finite. Returns buf. */
char *formatSi(double value, char *buf, size_t cap);

/* A byte count: "512B", "3.4KiB", "1.2GiB". Returns buf. */
char *formatBytes(double bytes, char *buf, size_t cap);

/* A loss-like value: 4 decimals below 100, "nan"/"inf" spelled out, "-" for
 * "no value". Returns buf. */
char *formatLoss(double value, int have_value, char *buf, size_t cap);

/* Unix seconds as local "YYYY-MM-DD HH:MM:SS"; "-" for 0. Returns buf. */
char *formatTimestamp(double unix_seconds, char *buf, size_t cap);

/* A table printed with every column as wide as its widest cell, two spaces
 * between columns, the header row first. Cells are copied. */
typedef struct FormatTable FormatTable;

/* Returns a table with n_cols columns named by headers, or NULL when out of
 * memory. Free with formatTableFree. */
FormatTable *formatTableNew(int n_cols, const char *const *headers);
/* Appends a row of n_cols cells (NULL cells print as "-").
 * Returns 0, or -1 when out of memory (the table is unchanged). */
int formatTableAdd(FormatTable *t, const char *const *cells);
/* Number of rows added (the header not counted). */
size_t formatTableRows(const FormatTable *t);
/* Prints header and rows. Right-aligns columns whose cells all look like
 * numbers. */
void formatTablePrint(const FormatTable *t, FILE *out);
void formatTableFree(FormatTable *t);

#endif
