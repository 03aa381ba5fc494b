/* format.c - durations, SI numbers and aligned tables for nsactl's human
 * output (see format.h). */
#include "format.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

char *formatDuration(double seconds, char *buf, size_t cap) {
    if (!isfinite(seconds) || seconds < 0) {
        snprintf(buf, cap, "-");
        return buf;
    }
    if (seconds < 1.0) {
        snprintf(buf, cap, "%dms", (int)lround(seconds * 1000.0));
        return buf;
    }
    /* Round once to whole seconds, then split: "59.7s" must become "1m00s",
     * not "60s". */
    double whole = floor(seconds + 0.5);
    if (whole > 1e12) whole = 1e12;
    long long s = (long long)whole;
    if (s < 60) snprintf(buf, cap, "%llds", s);
    else if (s < 3600) snprintf(buf, cap, "%lldm%02llds", s / 60, s % 60);
    else if (s < 86400) snprintf(buf, cap, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
    else snprintf(buf, cap, "%lldd%02lldh", s / 86400, (s % 86400) / 3600);
    return buf;
}

/* Shared by formatSi and formatBytes: value scaled by `base` until it is
 * below it, printed with 3 significant digits. */
static char *formatScaled(double value, double base, const char *const *suffixes, int n_suffixes,
                          char *buf, size_t cap) {
    if (!isfinite(value)) {
        snprintf(buf, cap, "-");
        return buf;
    }
    const char *sign = value < 0 ? "-" : "";
    double v = fabs(value);
    int i = 0;
    while (v >= base && i < n_suffixes - 1) {
        v /= base;
        i++;
    }
    /* 999.7 prints as "1000" at 3 digits: move up one suffix instead. */
    if (v >= 999.5 && i < n_suffixes - 1) {
        v /= base;
        i++;
    }
    if (i == 0 && v == floor(v)) snprintf(buf, cap, "%s%.0f%s", sign, v, suffixes[0]);
    else if (v < 10.0) snprintf(buf, cap, "%s%.2f%s", sign, v, suffixes[i]);
    else if (v < 100.0) snprintf(buf, cap, "%s%.1f%s", sign, v, suffixes[i]);
    else snprintf(buf, cap, "%s%.0f%s", sign, v, suffixes[i]);
    return buf;
}

char *formatSi(double value, char *buf, size_t cap) {
    static const char *const suffixes[] = {"", "K", "M", "G", "T", "P"};
    return formatScaled(value, 1000.0, suffixes, 6, buf, cap);
}

char *formatBytes(double bytes, char *buf, size_t cap) {
    static const char *const suffixes[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    return formatScaled(bytes, 1024.0, suffixes, 6, buf, cap);
}

char *formatLoss(double value, int have_value, char *buf, size_t cap) {
    if (!have_value) snprintf(buf, cap, "-");
    else if (isnan(value)) snprintf(buf, cap, "nan");
    else if (isinf(value)) snprintf(buf, cap, value > 0 ? "inf" : "-inf");
    else if (fabs(value) < 100.0) snprintf(buf, cap, "%.4f", value);
    else snprintf(buf, cap, "%.4g", value);
    return buf;
}

char *formatTimestamp(double unix_seconds, char *buf, size_t cap) {
    if (!isfinite(unix_seconds) || unix_seconds <= 0) {
        snprintf(buf, cap, "-");
        return buf;
    }
    time_t t = (time_t)unix_seconds;
    struct tm tm;
    if (!localtime_r(&t, &tm) || strftime(buf, cap, "%Y-%m-%d %H:%M:%S", &tm) == 0)
        snprintf(buf, cap, "%.0f", unix_seconds);
    return buf;
}

struct FormatTable {
    int n_cols;
    size_t n_rows, cap_rows; /* rows after the header */
    char **cells;            /* (n_rows + 1) * n_cols, row-major, header first */
};

static char *copyCell(const char *s) {
    return strdup(s ? s : "-");
}

FormatTable *formatTableNew(int n_cols, const char *const *headers) {
    FormatTable *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->n_cols = n_cols;
    t->cap_rows = 8;
    t->cells = calloc((t->cap_rows + 1) * (size_t)n_cols, sizeof *t->cells);
    if (!t->cells) {
        free(t);
        return NULL;
    }
    for (int c = 0; c < n_cols; c++) {
        t->cells[c] = copyCell(headers[c]);
        if (!t->cells[c]) {
            formatTableFree(t);
            return NULL;
        }
    }
    return t;
}

int formatTableAdd(FormatTable *t, const char *const *cells) {
    size_t cols = (size_t)t->n_cols;
    if (t->n_rows == t->cap_rows) {
        size_t cap = t->cap_rows * 2;
        char **grown = realloc(t->cells, (cap + 1) * cols * sizeof *grown);
        if (!grown) return -1;
        t->cells = grown;
        t->cap_rows = cap;
    }
    char **row = t->cells + (t->n_rows + 1) * cols;
    for (size_t c = 0; c < cols; c++) {
        row[c] = copyCell(cells[c]);
        if (!row[c]) {
            while (c-- > 0) free(row[c]);
            return -1;
        }
    }
    t->n_rows++;
    return 0;
}

size_t formatTableRows(const FormatTable *t) {
    return t->n_rows;
}

/* "12", "-3.5", "4.1K", "118MiB", "-": a number with at most a unit after it
 * reads better right-aligned; "0/30" or an id made of digits and dashes
 * does not. */
static int looksNumeric(const char *s) {
    if (!strcmp(s, "-") || !strcmp(s, "nan") || !strcmp(s, "inf") || !strcmp(s, "-inf")) return 1;
    char *end = NULL;
    strtod(s, &end);
    if (end == s) return 0;
    for (; *end; end++)
        if (!((*end >= 'a' && *end <= 'z') || (*end >= 'A' && *end <= 'Z') || *end == '%')) return 0;
    return 1;
}

void formatTablePrint(const FormatTable *t, FILE *out) {
    size_t cols = (size_t)t->n_cols;
    size_t *width = calloc(cols, sizeof *width);
    int *right = calloc(cols, sizeof *right);
    if (!width || !right) {
        /* Out of memory: still print, unaligned, rather than lose output. */
        for (size_t r = 0; r <= t->n_rows; r++)
            for (size_t c = 0; c < cols; c++)
                fprintf(out, "%s%s", t->cells[r * cols + c], c + 1 == cols ? "\n" : "  ");
        free(width);
        free(right);
        return;
    }
    for (size_t c = 0; c < cols; c++) {
        right[c] = t->n_rows > 0;
        for (size_t r = 0; r <= t->n_rows; r++) {
            const char *cell = t->cells[r * cols + c];
            size_t w = strlen(cell);
            if (w > width[c]) width[c] = w;
            if (r > 0 && !looksNumeric(cell)) right[c] = 0;
        }
    }
    for (size_t r = 0; r <= t->n_rows; r++) {
        for (size_t c = 0; c < cols; c++) {
            const char *cell = t->cells[r * cols + c];
            int last = c + 1 == cols;
            if (right[c]) fprintf(out, "%*s", (int)width[c], cell);
            else if (last) fputs(cell, out);
            else fprintf(out, "%-*s", (int)width[c], cell);
            fputs(last ? "\n" : "  ", out);
        }
    }
    free(width);
    free(right);
}

void formatTableFree(FormatTable *t) {
    if (!t) return;
    size_t total = (t->n_rows + 1) * (size_t)t->n_cols;
    for (size_t i = 0; i < total; i++) free(t->cells[i]);
    free(t->cells);
    free(t);
}
