/* test_ctl_format.c - nsactl's human formatting (ctl/format.c): durations,
 * SI numbers, bytes, losses and table alignment.
 *
 * The test binaries link the daemon's objects, not nsactl's (which need
 * libcurl), so format.c, which needs only libc and libm, is compiled in here
 * directly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../ctl/format.c"

static void assertFormats(char *(*fn)(double, char *, size_t), double value, const char *want) {
    char buf[64];
    fn(value, buf, sizeof buf);
    if (strcmp(buf, want) != 0) fail_msg("formatting %.17g gave '%s', wanted '%s'", value, buf, want);
}

static void test_format_duration(void **state) {
    (void)state;
    assertFormats(formatDuration, 0.0, "0ms");
    assertFormats(formatDuration, 0.85, "850ms");
    assertFormats(formatDuration, 42.0, "42s");
    assertFormats(formatDuration, 59.7, "1m00s"); /* rounds before splitting */
    assertFormats(formatDuration, 185.0, "3m05s");
    assertFormats(formatDuration, 7620.0, "2h07m");
    assertFormats(formatDuration, 3 * 86400.0 + 4 * 3600.0 + 59, "3d04h");
    assertFormats(formatDuration, -1.0, "-");
    assertFormats(formatDuration, NAN, "-");
    assertFormats(formatDuration, INFINITY, "-");
}

static void test_format_si(void **state) {
    (void)state;
    assertFormats(formatSi, 0.0, "0");
    assertFormats(formatSi, 812.0, "812");
    assertFormats(formatSi, 999.7, "1.00K"); /* not "1000" */
    assertFormats(formatSi, 12400.0, "12.4K");
    assertFormats(formatSi, 15234.5, "15.2K");
    assertFormats(formatSi, 1.05e6, "1.05M");
    assertFormats(formatSi, 3.2e9, "3.20G");
    assertFormats(formatSi, -2500.0, "-2.50K");
    assertFormats(formatSi, 2.5, "2.50");
    assertFormats(formatSi, NAN, "-");
}

static void test_format_bytes(void **state) {
    (void)state;
    assertFormats(formatBytes, 512.0, "512B");
    assertFormats(formatBytes, 3.4 * 1024, "3.40KiB");
    assertFormats(formatBytes, 123456789.0, "118MiB");
    assertFormats(formatBytes, 1.2 * 1024 * 1024 * 1024, "1.20GiB");
}

static void test_format_loss(void **state) {
    (void)state;
    char buf[32];
    assert_string_equal(formatLoss(3.91, 1, buf, sizeof buf), "3.9100");
    assert_string_equal(formatLoss(3.91, 0, buf, sizeof buf), "-");
    assert_string_equal(formatLoss(NAN, 1, buf, sizeof buf), "nan");
    assert_string_equal(formatLoss(-INFINITY, 1, buf, sizeof buf), "-inf");
    assert_string_equal(formatLoss(12345.0, 1, buf, sizeof buf), "1.234e+04");
}

/* Prints the table into a string (open_memstream); the caller frees. */
static char *renderTable(const FormatTable *t) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    formatTablePrint(t, f);
    fclose(f);
    return text;
}

static void test_format_table_alignment(void **state) {
    (void)state;
    static const char *const headers[] = {"ID", "STATE", "STEP", "LOSS"};
    FormatTable *t = formatTableNew(4, headers);
    assert_non_null(t);
    const char *row1[] = {"20261122-004512-3f9a", "running", "120/1000", "3.9100"};
    const char *row2[] = {"r2", "completed", "5/5", NULL};
    assert_int_equal(formatTableAdd(t, row1), 0);
    assert_int_equal(formatTableAdd(t, row2), 0);
    assert_int_equal(formatTableRows(t), 2);
    char *text = renderTable(t);
    /* ids made of digits and dashes and "120/1000" stay left-aligned; the
     * loss column (numbers and "-") is right-aligned; no trailing blanks. */
    const char *want =
        "ID                    STATE      STEP        LOSS\n"
        "20261122-004512-3f9a  running    120/1000  3.9100\n"
        "r2                    completed  5/5            -\n";
    if (strcmp(text, want) != 0) fail_msg("table:\n%s\nwanted:\n%s", text, want);
    free(text);
    formatTableFree(t);
}

static void test_format_table_grows(void **state) {
    (void)state;
    static const char *const headers[] = {"N"};
    FormatTable *t = formatTableNew(1, headers);
    assert_non_null(t);
    char cell[16];
    for (int i = 0; i < 100; i++) {
        snprintf(cell, sizeof cell, "%d", i);
        const char *row[] = {cell};
        assert_int_equal(formatTableAdd(t, row), 0);
    }
    char *text = renderTable(t);
    /* 101 lines, numbers right-aligned to the widest ("99" under " N"). */
    int lines = 0;
    for (const char *p = text; *p; p++) lines += *p == '\n';
    assert_int_equal(lines, 101);
    assert_non_null(strstr(text, " N\n 0\n 1\n"));
    assert_non_null(strstr(text, "\n99\n"));
    free(text);
    formatTableFree(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_duration),       cmocka_unit_test(test_format_si),
        cmocka_unit_test(test_format_bytes),          cmocka_unit_test(test_format_loss),
        cmocka_unit_test(test_format_table_alignment),
        cmocka_unit_test(test_format_table_grows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
