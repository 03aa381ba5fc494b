/* test_ctl_http.c - the request headers nsactl sends (ctl/http.c): what
 * they are, and that running out of memory part-way through the list frees
 * what was built instead of losing it (curl_slist_append returns NULL and
 * keeps the list), so newRequest fails with nothing left to free.
 *
 * The test binaries link the daemon's objects, not nsactl's, so http.c
 * (libcurl, which the tests link, and daemon/paths.c) is compiled in here,
 * with curl_slist_append and curl_slist_free_all wrapped: the wrapper can
 * refuse the Nth append and counts the list nodes alive. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <curl/curl.h>
#include <string.h>

static int appends_left = -1; /* appends that succeed before one fails; -1 all */
static int live_nodes;        /* nodes appended and not yet freed */

static struct curl_slist *countedAppend(struct curl_slist *list, const char *line) {
    if (appends_left == 0) return NULL;
    if (appends_left > 0) appends_left--;
    struct curl_slist *grown = curl_slist_append(list, line);
    if (grown) live_nodes++;
    return grown;
}

static void countedFreeAll(struct curl_slist *list) {
    for (const struct curl_slist *p = list; p; p = p->next)
        live_nodes--;
    curl_slist_free_all(list);
}

#define curl_slist_append countedAppend
#define curl_slist_free_all countedFreeAll
#include "../../ctl/http.c"
#undef curl_slist_append
#undef curl_slist_free_all

static void targetWithToken(HttpTarget *t) {
    memset(t, 0, sizeof *t);
    snprintf(t->base_url, sizeof t->base_url, "http://127.0.0.1:8470");
    snprintf(t->token, sizeof t->token, "secret");
}

static void test_headers(void **state) {
    (void)state;
    HttpTarget t;
    targetWithToken(&t);
    appends_left = -1;
    live_nodes = 0;
    struct curl_slist *list = requestHeaders(&t, 1, "application/yaml");
    assert_non_null(list);
    const char *want[] = {"Accept: application/json", "Authorization: Bearer secret",
                          "Content-Type: application/yaml", "Expect:"};
    const struct curl_slist *p = list;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++, p = p->next) {
        assert_non_null(p);
        assert_string_equal(p->data, want[i]);
    }
    assert_null(p);
    countedFreeAll(list);
    assert_int_equal(live_nodes, 0);

    /* no token, no body: Accept and Expect only */
    t.token[0] = '\0';
    list = requestHeaders(&t, 0, NULL);
    assert_non_null(list);
    assert_string_equal(list->data, "Accept: application/json");
    assert_non_null(list->next);
    assert_string_equal(list->next->data, "Expect:");
    assert_null(list->next->next);
    countedFreeAll(list);
    assert_int_equal(live_nodes, 0);
}

static void test_headers_out_of_memory(void **state) {
    (void)state;
    HttpTarget t;
    targetWithToken(&t);
    for (int ok_appends = 0; ok_appends < 4; ok_appends++) {
        appends_left = ok_appends;
        live_nodes = 0;
        assert_null(requestHeaders(&t, 1, NULL));
        if (live_nodes != 0)
            fail_msg("the append after %d failed: %d header nodes left", ok_appends, live_nodes);
    }
    appends_left = -1;
}

static void test_new_request_out_of_memory(void **state) {
    (void)state;
    HttpTarget t;
    targetWithToken(&t);
    struct curl_slist *headers = (struct curl_slist *)&t; /* must be reset */
    char *url = (char *)&t;
    char detail[CURL_ERROR_SIZE];
    appends_left = 2;
    live_nodes = 0;
    assert_null(newRequest(&t, "POST", "/api/v1/runs", "{}", 2, NULL, &headers, &url, detail));
    assert_null(headers);
    assert_null(url);
    assert_int_equal(live_nodes, 0);

    appends_left = -1;
    CURL *curl = newRequest(&t, "GET", "/api/v1/runs", NULL, 0, NULL, &headers, &url, detail);
    assert_non_null(curl);
    assert_string_equal(url, "http://127.0.0.1:8470/api/v1/runs");
    assert_non_null(headers);
    curl_easy_cleanup(curl);
    countedFreeAll(headers);
    free(url);
    assert_int_equal(live_nodes, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_headers),
        cmocka_unit_test(test_headers_out_of_memory),
        cmocka_unit_test(test_new_request_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
