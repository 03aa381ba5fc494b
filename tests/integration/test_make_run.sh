#!/bin/sh
# test_make_run.sh - what `make run` does after the build (scripts/run.sh),
# as a new user meets it: it starts nsad on this user's default state dir
# and socket with the default run; the README's commands - `nsactl list`,
# `nsactl status`, `nsactl dashboard` - then find that nsad with no flags
# or exports; a second `make run` says where the running nsad is and exits
# 0; a second `nsad serve` on the same state dir exits 75 at once with one
# line naming the first one's pid and address, and writes nothing into its
# runs; nsad's log lines (a file here, not the journal) carry no "<N>"
# priority prefixes; SIGTERM stops it, logged as SIGTERM.
# The user's places are made private to the test with XDG_STATE_HOME and
# XDG_RUNTIME_DIR (which daemon/paths.h honours, root included). Prints
# TAP; every wait is bounded; everything started is stopped on exit.
# shellcheck disable=SC2015  # "test && ok || not_ok": ok only echoes
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
NSAD="$ROOT/build/nsad"
CTL="$ROOT/build/nsactl"

. "$ROOT/tests/integration/tap.sh"

for f in "$NSAD" "$CTL"; do
    if [ ! -x "$f" ]; then echo "not ok 1 - $f exists (make all)"; echo "1..1"; exit 1; fi
done
[ -s build/data/fortunes.txt ] || ./scripts/make-corpus.sh >/dev/null || { echo "not ok 1 - build the corpus"; exit 1; }

TMP=$(mktemp -d /tmp/nsad-make-run.XXXXXX)
RUN_PID=""
cleanup() {
    if [ -n "$RUN_PID" ] && kill -0 "$RUN_PID" 2>/dev/null; then
        kill -TERM "$RUN_PID" 2>/dev/null
        i=0; while kill -0 "$RUN_PID" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    fi
    pid=$(sed -n 's/^pid=//p' "$TMP/state-home/nsad/nsad.pid" 2>/dev/null)
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    [ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# This user's places, private to the test; nothing else points nsactl at nsad.
mkdir -p "$TMP/run" "$TMP/state-home"
chmod 700 "$TMP/run"
export XDG_RUNTIME_DIR="$TMP/run" XDG_STATE_HOME="$TMP/state-home"
unset NSAD_SOCKET NSAD_URL NSAD_STATE_DIR NSAD_TOKEN NSAD_TOKEN_FILE STATE_DIRECTORY RUNTIME_DIRECTORY \
    JOURNAL_STREAM NSAD_DEVICE
STATE="$XDG_STATE_HOME/nsad"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
export NSAD_PORT="$PORT"
# the default run, long enough to be running throughout
sed -e 's|^  steps: .*|  steps: 100000|' -e 's|^  threads: .*|  threads: 1|' configs/default-run.yaml >"$TMP/job.yaml"
export NSAD_RUN_CONFIG="$TMP/job.yaml"

# ---- make run ---------------------------------------------------------------------------------
./scripts/run.sh >"$TMP/run1.out" 2>&1 &
RUN_PID=$!
i=0
while ! grep -q 'nsad is running' "$TMP/run1.out" && kill -0 "$RUN_PID" 2>/dev/null && [ $i -lt 1200 ]; do
    sleep 0.1; i=$((i + 1))
done
if grep -q 'nsad is running' "$TMP/run1.out"; then
    ok "make run starts nsad and the default run on this user's default state dir and socket"
else
    not_ok "make run starts nsad and the default run on this user's default state dir and socket" "$(tail -15 "$TMP/run1.out")"
    echo "1..$n"
    exit 1
fi
RID=$(sed -n 's/.*training run \([^ ]*\) on the.*/\1/p' "$TMP/run1.out")
NSAD_PID=$(sed -n 's/.*nsad is running (pid \([0-9]*\)).*/\1/p' "$TMP/run1.out")
[ -S "$XDG_RUNTIME_DIR/nsad/nsad.sock" ] && [ -f "$STATE/token" ] &&
    ok "the socket is \$XDG_RUNTIME_DIR/nsad/nsad.sock and the state \$XDG_STATE_HOME/nsad" ||
    not_ok "the socket is \$XDG_RUNTIME_DIR/nsad/nsad.sock and the state \$XDG_STATE_HOME/nsad" "$(ls -la "$XDG_RUNTIME_DIR" "$STATE" 2>&1)"

# ---- the README's commands, as they are ------------------------------------------------------
if "$CTL" list >"$TMP/out" 2>"$TMP/err" && grep -q "$RID" "$TMP/out"; then
    ok "nsactl list (no flags, no exports) finds the nsad make run started and its run"
else
    not_ok "nsactl list (no flags, no exports) finds the nsad make run started and its run" "$(cat "$TMP/err" "$TMP/out")"
fi
"$CTL" status "$RID" >"$TMP/out" 2>"$TMP/err" && ok "nsactl status ID works as written" ||
    not_ok "nsactl status ID works as written" "$(cat "$TMP/err")"
TOKEN=$(cat "$STATE/token" 2>/dev/null)
if "$CTL" dashboard >"$TMP/out" 2>"$TMP/err" && [ "$(cat "$TMP/out")" = "http://127.0.0.1:$PORT/#token=$TOKEN" ]; then
    ok "nsactl dashboard prints this nsad's URL (its port) with its token"
else
    not_ok "nsactl dashboard prints this nsad's URL (its port) with its token" "got: $(cat "$TMP/out" "$TMP/err")" "want: http://127.0.0.1:$PORT/#token=..."
fi
grep -q "build/nsactl watch $RID" "$TMP/run1.out" && ! grep -q 'NSAD_SOCKET' "$TMP/run1.out" &&
    ok "the banner's commands need no export" || not_ok "the banner's commands need no export" "$(tail -20 "$TMP/run1.out")"

# ---- a second make run, a second nsad serve ----------------------------------------------------
EVENTS="$STATE/runs/$RID/events.jsonl"
before=$(wc -l <"$EVENTS" 2>/dev/null)
timeout 60 ./scripts/run.sh >"$TMP/run2.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "already running (pid $NSAD_PID)" "$TMP/run2.out" && grep -q "http://127.0.0.1:$PORT" "$TMP/run2.out" &&
    grep -q "$RID" "$TMP/run2.out"; then
    ok "a second make run says where nsad runs (pid, address, active run) and exits 0"
else
    not_ok "a second make run says where nsad runs (pid, address, active run) and exits 0" "exit $rc" "$(cat "$TMP/run2.out")"
fi
PORT2=$(free_port)
timeout 30 "$NSAD" serve --listen "127.0.0.1:$PORT2" >"$TMP/serve2.out" 2>&1
rc=$?
lines=$(wc -l <"$TMP/serve2.out")
if [ $rc -eq 75 ] && [ "$lines" -eq 1 ] && grep -q "in use by nsad pid $NSAD_PID (http://127.0.0.1:$PORT, unix:$XDG_RUNTIME_DIR/nsad/nsad.sock)" "$TMP/serve2.out"; then
    ok "a second nsad serve on the state dir exits 75 with one line naming the first's pid and address"
else
    not_ok "a second nsad serve on the state dir exits 75 with one line naming the first's pid and address" "exit $rc, $lines lines" "$(cat "$TMP/serve2.out")"
fi
timeout 30 "$NSAD" serve --listen none --socket "$TMP/other.sock" --state-dir "$STATE" >"$TMP/serve3.out" 2>&1
rc=$?
[ $rc -eq 75 ] && ok "... also with its own socket and no TCP" || not_ok "... also with its own socket and no TCP" "exit $rc" "$(cat "$TMP/serve3.out")"
# (the first nsad goes on adding its own events: no restart, no seq twice)
dups=$(python3 -c 'import json,sys; s=[json.loads(l)["seq"] for l in open(sys.argv[1]) if l.strip()]; print(len(s) - len(set(s)))' "$EVENTS" 2>&1)
if [ -n "$before" ] && [ "$dups" = 0 ] && ! grep -q '"restart"' "$EVENTS"; then
    ok "the second nsad wrote nothing into the live run (no restart event, no seq twice)"
else
    not_ok "the second nsad wrote nothing into the live run (no restart event, no seq twice)" "duplicate seqs: $dups" "$(tail -3 "$EVENTS")"
fi
"$CTL" status "$RID" --json >"$TMP/out" 2>&1 && grep -q '"state":"running"' "$TMP/out" &&
    ok "the first nsad still serves its running run" || not_ok "the first nsad still serves its running run" "$(cat "$TMP/out")"

# ---- its log, and SIGTERM ---------------------------------------------------------------------
if grep -q 'listening on' "$TMP/run1.out" && ! grep -q '^<[0-7]>' "$TMP/run1.out"; then
    ok "nsad's log lines, written to a file (not the journal), carry no <N> prefixes"
else
    not_ok "nsad's log lines, written to a file (not the journal), carry no <N> prefixes" "$(grep '^<' "$TMP/run1.out" | head -3)"
fi
kill -TERM "$RUN_PID"
i=0; while kill -0 "$RUN_PID" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 "$RUN_PID" 2>/dev/null; then
    not_ok "SIGTERM stops make run's nsad" "still running after 60 s"
else
    wait "$RUN_PID"
    rc=$?
    RUN_PID=""
    if [ $rc -eq 0 ] && grep -q 'SIGTERM: shutting down' "$TMP/run1.out" && grep -q 'for the shutdown (SIGTERM)' "$TMP/run1.out"; then
        ok "SIGTERM stops make run's nsad (exit 0), logged as SIGTERM"
    else
        not_ok "SIGTERM stops make run's nsad (exit 0), logged as SIGTERM" "exit $rc" "$(tail -8 "$TMP/run1.out")"
    fi
fi

echo "1..$n"
[ "$failed" -eq 0 ]
