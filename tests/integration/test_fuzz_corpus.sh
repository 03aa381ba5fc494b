#!/bin/sh
# test_fuzz_corpus.sh - replays each fuzz harness's seed corpus
# (tests/fuzz/corpus/NAME) through build/fuzz/fuzz_NAME, which is built with
# ASan and UBSan: every input must run without a crash, a leak, a sanitizer
# report or a broken promise the harness checks (one-line errors, resolved
# configs that reload, HTTP answers within 10 s). Inputs `make fuzz` found
# and that were fixed belong in the corpus, so they stay fixed.
# The harnesses need clang (`make deps` installs it); without it each test
# reports a TAP SKIP. TAP output.
set -u
cd "$(dirname "$0")/../.."
n=0
failed=0
for dir in tests/fuzz/corpus/*/; do
    name=$(basename "$dir")
    n=$((n + 1))
    bin="build/fuzz/fuzz_$name"
    if [ ! -x "$bin" ]; then
        echo "ok $n - fuzz_$name seed corpus # SKIP $bin not built (clang is not installed; make deps installs it)"
        continue
    fi
    log="build/test-logs/fuzz_corpus_$name.log"
    mkdir -p build/test-logs
    count=$(find "$dir" -type f | wc -l)
    # shellcheck disable=SC2046
    if "$bin" -timeout=10 -rss_limit_mb=2048 $(find "$dir" -type f | sort) >"$log" 2>&1; then
        echo "ok $n - fuzz_$name: $count seed inputs run clean under ASan/UBSan"
    else
        echo "not ok $n - fuzz_$name: a seed input failed (log: $log)"
        grep -E 'ERROR|SUMMARY|fuzz_[a-z]+:|Running:' "$log" | tail -8 | sed 's/^/#   /'
        failed=$((failed + 1))
    fi
done
echo "1..$n"
[ "$failed" -eq 0 ]
