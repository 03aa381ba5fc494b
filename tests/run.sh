#!/bin/sh
# run.sh - runs every CPU test and prints one total line: "N passed, N failed".
#
# Each test program speaks TAP ("ok N - name" / "not ok N - name"): the C unit
# tests through cmocka (CMOCKA_MESSAGE_OUTPUT=TAP), the integration and
# browser tests on their own. A program that exits non-zero without reporting
# a failure (a crash, a missing plan) counts as one failure. A test line with
# a "# SKIP" directive (cmocka writes "not ok N # SKIP" for a skipped test)
# counts as skipped, neither passed nor failed.
#   tests/run.sh            everything
#   tests/run.sh unit       C unit tests only
#   tests/run.sh integration | browser
set -u
cd "$(dirname "$0")/.."
only="${1:-all}"
log_dir=build/test-logs
mkdir -p "$log_dir"
passed=0
failed=0
skipped=0
failures=""

run_one() {  # name, command...
    name="$1"; shift
    log="$log_dir/$(echo "$name" | tr / _).log"
    start=$(date +%s)
    CMOCKA_MESSAGE_OUTPUT=TAP "$@" >"$log" 2>&1
    rc=$?
    skip=$(grep -Ec '^(not )?ok .*# SKIP' "$log")
    ok=$(grep '^ok ' "$log" | grep -vc '# SKIP')
    bad=$(grep '^not ok ' "$log" | grep -vc '# SKIP')
    if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; echo "not ok - $name exited $rc" >>"$log"; fi
    if [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ] && [ "$skip" -eq 0 ]; then bad=1; echo "not ok - $name ran no test" >>"$log"; fi
    passed=$((passed + ok)); failed=$((failed + bad)); skipped=$((skipped + skip))
    secs=$(( $(date +%s) - start ))
    if [ "$bad" -eq 0 ]; then
        if [ "$skip" -eq 0 ]; then
            printf '  PASS  %-34s %4d tests  %4ds\n' "$name" "$ok" "$secs"
        else
            printf '  PASS  %-34s %4d tests  %4ds  (%d skipped)\n' "$name" "$ok" "$secs" "$skip"
        fi
    else
        printf '  FAIL  %-34s %4d ok, %d failed  %ds  (log: %s)\n' "$name" "$ok" "$bad" "$secs" "$log"
        grep -E '^not ok|^# ' "$log" | grep -v '^# ok' | head -20 | sed 's/^/        /'
        failures="$failures $name"
    fi
}

if [ "$only" = all ] || [ "$only" = unit ]; then
    for t in build/tests/test_*; do
        [ -x "$t" ] || continue
        run_one "$(basename "$t")" "$t"
    done
fi
if [ "$only" = all ] || [ "$only" = integration ]; then
    for t in tests/integration/test_*; do
        [ -x "$t" ] || continue
        run_one "integration/$(basename "$t")" "$t"
    done
fi
if [ "$only" = all ] || [ "$only" = browser ]; then
    for t in tests/browser/test_*; do
        [ -x "$t" ] || continue
        run_one "browser/$(basename "$t")" "$t"
    done
fi

[ -n "$failures" ] && echo "failed:$failures"
[ "$skipped" -gt 0 ] && echo "$skipped skipped (see the logs in $log_dir)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
