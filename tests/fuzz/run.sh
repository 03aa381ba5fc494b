#!/bin/sh
# run.sh SECONDS NAME... - fuzzes each harness build/fuzz/fuzz_NAME for
# SECONDS (make fuzz runs it), growing build/fuzz/corpus/NAME from the seeds
# in tests/fuzz/corpus/NAME, and prints one line per harness: executions,
# the edges its corpus covers in the modules it is aimed at (and in all of
# the daemon), features and corpus size. A crash,
# leak, sanitizer report or timeout stops it with status 1; the input that
# did it is kept as build/fuzz/crashes/NAME-*. Keep a fixed finding as a
# seed in tests/fuzz/corpus/NAME so that `make test` replays it.
set -u
cd "$(dirname "$0")/../.."
seconds="$1"
shift
mkdir -p build/fuzz/crashes
status=0
for name in "$@"; do
    mkdir -p "build/fuzz/corpus/$name"
    log="build/fuzz/fuzz_$name.log"
    dict=""
    [ -f "tests/fuzz/$name.dict" ] && dict="-dict=tests/fuzz/$name.dict"
    # shellcheck disable=SC2086
    "build/fuzz/fuzz_$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 -artifact_prefix="build/fuzz/crashes/$name-" $dict \
        "build/fuzz/corpus/$name" "tests/fuzz/corpus/$name" >"$log" 2>&1
    rc=$?
    edges=$(sed -n 's/.*Loaded 1 modules *(\([0-9]*\) inline 8-bit counters).*/\1/p' "$log" | head -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    corp=$(echo "$last" | sed -n 's/.* corp: \([0-9]*\).*/\1/p')
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    case "$name" in
    config) aimed="config.c yamllimit.c" ;;
    api) aimed="server.c api.c service.c" ;;
    checkpoint) aimed="checkpoint.c crc32c.c fsutil.c" ;;
    *) aimed="" ;;
    esac
    # edges per function of the grown corpus, summed per file of the daemon
    per_file=$("build/fuzz/fuzz_$name" -runs=0 -print_coverage=1 "build/fuzz/corpus/$name" \
        "tests/fuzz/corpus/$name" 2>&1 | grep -E '^(UN)?COVERED_FUNC' |
        awk -v aimed="$aimed" '{ f = $NF; sub(/:[0-9]+$/, "", f); sub(/.*\//, "", f); split($5, e, "/");
                 c[f] += e[1]; t[f] += e[2] }
             END { n = split(aimed, a, " ");
                   for (i = 1; i <= n; i++) printf "%s%s %d/%d (%.0f%%)", (i > 1 ? ", " : ""), a[i], c[a[i]], t[a[i]],
                                                  (t[a[i]] ? 100 * c[a[i]] / t[a[i]] : 0) }')
    printf 'fuzz_%s: %s executions in %s s; edges covered: %s; all of nsad: %s/%s; %s features, corpus %s\n' \
        "$name" "${execs:-?}" "$seconds" "${per_file:-?}" "${cov:-?}" "${edges:-?}" "${ft:-?}" "${corp:-?}"
    if [ "$rc" -ne 0 ]; then
        echo "fuzz_$name FAILED (status $rc); the log is $log:"
        grep -E 'ERROR|SUMMARY|fuzz_[a-z]+:|Test unit written' "$log" | head -20 | sed 's/^/    /'
        status=1
    fi
done
exit $status
