/* test_flags.c - the commands' number flags (daemon/flags.c): the whole
 * text must be one number in range, anything else is refused with the
 * output untouched and a message naming the command, the flag and what is
 * allowed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"
#include "testutil.h"

/* Runs fn with its output captured; returns what it wrote. */
typedef struct NoArg {
    int (*fn)(void);
} NoArg;
static int callNoArg(void *arg) {
    return ((const NoArg *)arg)->fn();
}
static const char *capturedStderr(int (*fn)(void), int *rc) {
    static char text[512];
    NoArg call = {fn};
    *rc = testCaptureOutput(callNoArg, &call, text, sizeof text);
    return text;
}

static void test_integers(void **state) {
    (void)state;
    long long v = 7;
    assert_int_equal(flagsParseInt("42", 1, 100, &v), 0);
    assert_int_equal(v, 42);
    assert_int_equal(flagsParseInt("-3", -5, 5, &v), 0);
    assert_int_equal(v, -3);
    assert_int_equal(flagsParseInt("1", 1, 1, &v), 0);
    assert_int_equal(flagsParseInt("9223372036854775807", 0, LLONG_MAX, &v), 0);
    assert_true(v == LLONG_MAX);
    /* refused, the output untouched */
    const char *bad[] = {"", "2.5", "12x", " 12x", "1e3", "0x10", "abc", "101", "0",
                         "9223372036854775808", "-9223372036854775809"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        v = 7;
        assert_int_equal(flagsParseInt(bad[i], 1, 100, &v), -1);
        assert_int_equal(v, 7);
    }
    assert_int_equal(flagsParseInt(NULL, 1, 100, &v), -1);
}

static int badInteger(void) {
    long long v = 7;
    return flagsInt("sample", "--n", "2.5", 1, 16, &v);
}
static int badSteps(void) {
    long long v = 7;
    return flagsInt("train", "--steps", "0", 1, LLONG_MAX, &v);
}
static int badNumber(void) {
    double v = 7;
    return flagsNumber("sample", "--top-p", "nan", 1e-9, 1, &v);
}

static void test_messages(void **state) {
    (void)state;
    int rc = 0;
    const char *msg = capturedStderr(badInteger, &rc);
    assert_int_equal(rc, -1);
    assert_string_equal(msg, "nsad sample: --n '2.5' is not allowed; allowed: an integer from 1 to 16\n");
    msg = capturedStderr(badSteps, &rc);
    assert_int_equal(rc, -1);
    assert_string_equal(msg, "nsad train: --steps '0' is not allowed; allowed: an integer of at least 1\n");
    msg = capturedStderr(badNumber, &rc);
    assert_int_equal(rc, -1);
    assert_string_equal(msg,
                        "nsad sample: --top-p 'nan' is not allowed; allowed: a number from 1e-09 to 1\n");
}

static int quietNumbers(void) {
    double v = 7;
    int ok = flagsNumber("sample", "--temperature", "0.7", 0, 1e6, &v) == 0 && v == 0.7;
    ok = ok && flagsNumber("sample", "--temperature", "0", 0, 1e6, &v) == 0 && v == 0.0;
    ok = ok && flagsNumber("sample", "--top-p", "1", 1e-9, 1, &v) == 0 && v == 1.0;
    return ok ? 0 : -1;
}

/* How many of the bad texts are refused with the output untouched. */
static const char *const bad_numbers[] = {"", "inf", "-inf", "nan", "1.5x", "2", "-0.1", "1e999"};
static int refusedNumbers(void) {
    int refused = 0;
    for (size_t i = 0; i < sizeof bad_numbers / sizeof bad_numbers[0]; i++) {
        double v = 0.5;
        refused += flagsNumber("sample", "--top-p", bad_numbers[i], 0, 1, &v) == -1 && v == 0.5;
    }
    return refused;
}

static void test_numbers(void **state) {
    (void)state;
    int rc = 0;
    /* in range: 0, nothing printed */
    const char *msg = capturedStderr(quietNumbers, &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(msg, "");
    capturedStderr(refusedNumbers, &rc);
    assert_int_equal(rc, (int)(sizeof bad_numbers / sizeof bad_numbers[0]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integers),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_numbers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
