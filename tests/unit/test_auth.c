/* test_auth.c - the bearer token file, the constant-time comparison and the
 * sd_notify datagram (daemon/auth.c, daemon/sdnotify.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "auth.h"
#include "testutil.h"
#include "sdnotify.h"

static void test_token_created_once_with_mode_0600(void **state) {
    (void)state;
    char *dir = testTempDir("auth");
    char path[512], token[AUTH_TOKEN_MAX], again[AUTH_TOKEN_MAX];
    snprintf(path, sizeof path, "%s/token", dir);
    int created = 0;
    NsaError err = {""};
    assert_int_equal(authLoadOrCreateToken(path, token, sizeof token, &created, &err), 0);
    assert_int_equal(created, 1);
    assert_int_equal(strlen(token), AUTH_TOKEN_HEX);
    for (size_t i = 0; i < AUTH_TOKEN_HEX; i++) assert_non_null(strchr("0123456789abcdef", token[i]));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(authLoadOrCreateToken(path, again, sizeof again, &created, &err), 0);
    assert_int_equal(created, 0);
    assert_string_equal(token, again);
    testRemoveTree(dir);
    free(dir);
}

static void test_two_tokens_differ(void **state) {
    (void)state;
    char *dir = testTempDir("auth");
    char a[512], b[512], ta[AUTH_TOKEN_MAX], tb[AUTH_TOKEN_MAX];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    assert_int_equal(authLoadOrCreateToken(a, ta, sizeof ta, NULL, NULL), 0);
    assert_int_equal(authLoadOrCreateToken(b, tb, sizeof tb, NULL, NULL), 0);
    assert_string_not_equal(ta, tb);
    testRemoveTree(dir);
    free(dir);
}

static void writeFile(const char *path, const char *text, mode_t mode) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

static void test_token_file_refusals(void **state) {
    (void)state;
    char *dir = testTempDir("auth");
    char path[512], token[AUTH_TOKEN_MAX];
    NsaError err = {""};
    snprintf(path, sizeof path, "%s/token", dir);

    writeFile(path, "secret-token\n", 0644);
    assert_int_equal(authLoadOrCreateToken(path, token, sizeof token, NULL, &err), -1);
    assert_non_null(strstr(err.message, "0644"));
    assert_non_null(strstr(err.message, path));

    writeFile(path, "  \n", 0600);
    assert_int_equal(authLoadOrCreateToken(path, token, sizeof token, NULL, &err), -1);
    assert_non_null(strstr(err.message, "empty"));

    writeFile(path, "bad token\n", 0600);
    assert_int_equal(authLoadOrCreateToken(path, token, sizeof token, NULL, &err), -1);
    assert_non_null(strstr(err.message, "character"));

    writeFile(path, "  my-token_1.2~x  \nsecond line ignored\n", 0600);
    assert_int_equal(authLoadOrCreateToken(path, token, sizeof token, NULL, &err), 0);
    assert_string_equal(token, "my-token_1.2~x");

    char missing_dir[600];
    snprintf(missing_dir, sizeof missing_dir, "%s/no/such/dir/token", dir);
    assert_int_equal(authLoadOrCreateToken(missing_dir, token, sizeof token, NULL, &err), -1);
    assert_non_null(strstr(err.message, missing_dir));

    /* a FIFO as the token file is refused at once, not waited on */
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(authLoadOrCreateToken(path, token, sizeof token, NULL, &err), -1);
    assert_non_null(strstr(err.message, "not a regular file"));
    testRemoveTree(dir);
    free(dir);
}

static void test_token_comparison(void **state) {
    (void)state;
    const char *token = "abcdef0123";
    assert_int_equal(authTokenEqual("abcdef0123", 10, token), 1);
    assert_int_equal(authTokenEqual("abcdef0124", 10, token), 0);
    assert_int_equal(authTokenEqual("abcdef012", 9, token), 0);
    assert_int_equal(authTokenEqual("abcdef01234", 11, token), 0);
    assert_int_equal(authTokenEqual("", 0, token), 0);
    assert_int_equal(authTokenEqual("", 0, ""), 0);
    /* the length given counts, not the NUL */
    assert_int_equal(authTokenEqual("abcdef0123XYZ", 10, token), 1);
}

static void test_bearer_header(void **state) {
    (void)state;
    const char *token = "tok123";
    assert_int_equal(authCheckBearer("Bearer tok123", token), 1);
    assert_int_equal(authCheckBearer("bearer tok123", token), 1);
    assert_int_equal(authCheckBearer("  Bearer   tok123  ", token), 1);
    assert_int_equal(authCheckBearer("Bearer tok1234", token), 0);
    assert_int_equal(authCheckBearer("Bearer", token), 0);
    assert_int_equal(authCheckBearer("Bearertok123", token), 0);
    assert_int_equal(authCheckBearer("Basic tok123", token), 0);
    assert_int_equal(authCheckBearer("tok123", token), 0);
    assert_int_equal(authCheckBearer(NULL, token), 0);
}

static void test_sd_notify_sends_to_the_socket(void **state) {
    (void)state;
    char *dir = testTempDir("auth");
    char path[512];
    snprintf(path, sizeof path, "%s/notify", dir);
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    assert_true(snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path) < (int)sizeof addr.sun_path);
    assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);

    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(sdNotify("READY=1"), 0);
    setenv("NOTIFY_SOCKET", path, 1);
    assert_int_equal(sdNotify("READY=1\nSTATUS=hello"), 1);
    char buf[128];
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    assert_true(n > 0);
    buf[n] = '\0';
    assert_string_equal(buf, "READY=1\nSTATUS=hello");
    setenv("NOTIFY_SOCKET", "relative/path", 1);
    assert_int_equal(sdNotify("READY=1"), -1);
    unsetenv("NOTIFY_SOCKET");
    close(fd);
    testRemoveTree(dir);
    free(dir);
}

static void test_sd_watchdog_interval(void **state) {
    (void)state;
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    assert_int_equal(sdWatchdogUsec(), 0);
    setenv("WATCHDOG_USEC", "3000000", 1);
    assert_int_equal(sdWatchdogUsec(), 3000000);
    char pid[32];
    snprintf(pid, sizeof pid, "%ld", (long)getpid() + 1);
    setenv("WATCHDOG_PID", pid, 1);
    assert_int_equal(sdWatchdogUsec(), 0); /* meant for another process */
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    assert_int_equal(sdWatchdogUsec(), 3000000);
    setenv("WATCHDOG_USEC", "soon", 1);
    assert_int_equal(sdWatchdogUsec(), 0);
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_created_once_with_mode_0600),
        cmocka_unit_test(test_two_tokens_differ),
        cmocka_unit_test(test_token_file_refusals),
        cmocka_unit_test(test_token_comparison),
        cmocka_unit_test(test_bearer_header),
        cmocka_unit_test(test_sd_notify_sends_to_the_socket),
        cmocka_unit_test(test_sd_watchdog_interval),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
