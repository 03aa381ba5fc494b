/* test_ctl_suggest.c - nsactl's "did you mean ...?" (ctl/suggest.c): the
 * edit distance (swaps count one), which words are suggested and in what
 * order, and how the list reads.
 *
 * The test binaries link the daemon's objects, not nsactl's (which need
 * libcurl), so suggest.c, which needs only libc, is compiled in here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "../../ctl/suggest.c"

static const char *const kWords[] = {"start", "status", "list", "halt", "resume", "delete", "metrics",
                                     "events", "stacks", "watch", "logs", "front", "ps", "ls", "rm", "stop"};
#define N_WORDS (sizeof kWords / sizeof kWords[0])

static void test_distance(void **state) {
    (void)state;
    assert_int_equal(suggestDistance("status", "status"), 0);
    assert_int_equal(suggestDistance("stauts", "status"), 1); /* a swap is one edit */
    assert_int_equal(suggestDistance("staus", "status"), 1);
    assert_int_equal(suggestDistance("statuss", "status"), 1);
    assert_int_equal(suggestDistance("STATUS", "status"), 0);  /* case does not count */
    assert_int_equal(suggestDistance("", "list"), 4);
    assert_int_equal(suggestDistance("lsit", "list"), 1);
    assert_int_equal(suggestDistance("abc", "xyz"), 3);
    assert_int_equal(suggestDistance("ca", "abc"), 3); /* OSA: no edit of a swapped pair */
}

/* Joins what suggestWords returned, for one comparison. */
static void expectSuggestions(const char *word, const char *want) {
    const char *out[SUGGEST_MAX];
    int n = suggestWords(word, kWords, N_WORDS, out);
    char got[256] = "";
    for (int i = 0; i < n; i++) {
        if (i) strcat(got, " ");
        strcat(got, out[i]);
    }
    if (strcmp(got, want) != 0) fail_msg("suggestions for '%s': '%s', wanted '%s'", word, got, want);
}

static void test_words(void **state) {
    (void)state;
    expectSuggestions("stauts", "status");
    expectSuggestions("lst", "list ls");      /* 1 edit from list, 1 from ls */
    expectSuggestions("hlat", "halt");
    expectSuggestions("metric", "metrics");
    expectSuggestions("evnets", "events");
    expectSuggestions("frobnicate", "");
    expectSuggestions("sta", "start status stacks"); /* nothing 1 edit away: the words it begins, at most 3 */
    expectSuggestions("dele", "delete");
    expectSuggestions("stpo", "stop");        /* the nearest only: not start, 2 edits away */
    expectSuggestions("watch", "");           /* a known word is not a typo of itself */
    expectSuggestions("x", "");
}

static void test_list(void **state) {
    (void)state;
    char buf[128];
    const char *one[] = {"status"}, *two[] = {"list", "ls"}, *three[] = {"a", "b", "c"};
    assert_string_equal(suggestList(one, 1, buf, sizeof buf), "'status'");
    assert_string_equal(suggestList(two, 2, buf, sizeof buf), "'list' or 'ls'");
    assert_string_equal(suggestList(three, 3, buf, sizeof buf), "'a', 'b' or 'c'");
    assert_string_equal(suggestList(three, 3, buf, 6), "'a', ");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distance),
        cmocka_unit_test(test_words),
        cmocka_unit_test(test_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
