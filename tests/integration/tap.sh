# tap.sh - the TAP helpers every shell test sources (sh and bash):
#   ok NAME                  a passing line
#   skip NAME WHY            a skipped line (TAP "# SKIP": neither passed nor failed)
#   not_ok NAME [DETAIL...]  a failing line, each DETAIL a comment line under it
# $n counts the lines so far and $failed the failures; print "1..$n" at the end.
n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }
