#!/bin/sh
# test_systemd.sh - the systemd side of nsad, without needing systemd as PID 1:
#   - systemd/nsad.service passes `systemd-analyze verify` (on a copy whose
#     ExecStart points at the built binary, which verify requires to exist),
#     keeps the settings the design needs, and scores OK in
#     `systemd-analyze security`;
#   - every option ExecStart passes is one `nsad serve --help` documents;
#   - nsad.sysusers and nsad.tmpfiles create the user and directories in a
#     scratch root (needs root; skipped otherwise);
#   - nsad serve speaks the notify protocol to a fake $NOTIFY_SOCKET: READY=1
#     once it listens, STATUS= lines, WATCHDOG=1 pings at the asked rate,
#     STOPPING=1 on SIGTERM; its stderr lines carry <N> priority prefixes;
#     and a bad configuration exits 78 (which the unit will not restart).
# Prints TAP; exits non-zero when a test fails.
# shellcheck disable=SC2015  # "test && ok || not_ok": ok only echoes, so it cannot fail
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
NSAD="$ROOT/build/nsad"
UNIT=systemd/nsad.service

. "$ROOT/tests/integration/tap.sh"

TMP=$(mktemp -d /tmp/nsad-systemd-test.XXXXXX)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    for p in $PIDS; do
        i=0; while kill -0 "$p" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        kill -9 "$p" 2>/dev/null
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
trap 'exit 141' PIPE

# ---- the unit file --------------------------------------------------------------------
if ! command -v systemd-analyze >/dev/null 2>&1; then
    not_ok "systemd-analyze is installed" "make deps installs it (Debian package systemd)"
    echo "1..$n"; exit 1
fi
ok "systemd-analyze is installed"
[ -x "$NSAD" ] && ok "build/nsad is built" || { not_ok "build/nsad is built" "run make all"; echo "1..$n"; exit 1; }

sed "s#^ExecStart=/usr/local/bin/nsad #ExecStart=$NSAD #" "$UNIT" >"$TMP/nsad.service"
grep -q "^ExecStart=$NSAD " "$TMP/nsad.service" && ok "ExecStart starts /usr/local/bin/nsad (rewritten for verify)" \
    || not_ok "ExecStart starts /usr/local/bin/nsad (rewritten for verify)" "$(grep ExecStart "$UNIT")"
if (cd "$TMP" && systemd-analyze verify nsad.service) >"$TMP/verify.out" 2>&1 && [ ! -s "$TMP/verify.out" ]; then
    ok "systemd-analyze verify passes without a warning"
else
    not_ok "systemd-analyze verify passes without a warning" "$(cat "$TMP/verify.out")"
fi

for setting in "Type=notify" "NotifyAccess=main" "Restart=on-failure" "RestartPreventExitStatus=78" \
    "StateDirectory=nsad" "RuntimeDirectory=nsad" "LogsDirectory=nsad" "User=nsad" \
    "DevicePolicy=closed" "DeviceAllow=char-nvidia\\* rw" "NoNewPrivileges=yes" "ProtectSystem=strict"; do
    grep -q "^$setting\$" "$UNIT" && ok "the unit sets $setting" || not_ok "the unit sets $setting"
done
grep -q '^WatchdogSec=[1-9]' "$UNIT" && ok "the unit sets a WatchdogSec" || not_ok "the unit sets a WatchdogSec"
grep -Eq '^PrivateDevices=(yes|true|1)' "$UNIT" && not_ok "PrivateDevices stays off (it would hide /dev/nvidia*)" \
    || ok "PrivateDevices stays off (it would hide /dev/nvidia*)"
grep -q '^ProcSubset=pid' "$UNIT" && not_ok "ProcSubset stays off (CUDA reads /proc/driver/nvidia)" \
    || ok "ProcSubset stays off (CUDA reads /proc/driver/nvidia)"
if (cd "$TMP" && systemd-analyze security --offline=yes --threshold=25 nsad.service) >"$TMP/security.out" 2>&1; then
    ok "systemd-analyze security: exposure 2.5 or lower ($(grep -o 'level for nsad.service: [0-9.]*' "$TMP/security.out" | grep -o '[0-9.]*$'))"
else
    not_ok "systemd-analyze security: exposure 2.5 or lower" "$(tail -1 "$TMP/security.out")"
fi

# Every --option of ExecStart must be one nsad serve knows.
"$NSAD" serve --help >"$TMP/serve-help.out" 2>&1
opts=$(grep '^ExecStart=' "$UNIT" | tr ' ' '\n' | grep '^--' | sed 's/=.*//' | tr '\n' ' ')
missing=""
for o in $opts; do grep -q -- "$o" "$TMP/serve-help.out" || missing="$missing $o"; done
[ -n "$opts" ] && [ -z "$missing" ] && ok "nsad serve --help documents every ExecStart option (${opts% })" \
    || not_ok "nsad serve --help documents every ExecStart option" "missing:$missing" "$(head -5 "$TMP/serve-help.out")"

# ---- sysusers and tmpfiles in a scratch root ----------------------------------------------
if [ "$(id -u)" -ne 0 ]; then
    skip "sysusers creates the nsad user" "needs root"
    skip "tmpfiles creates the state and logs dirs" "needs root"
else
    R="$TMP/root"
    mkdir -p "$R/etc/sysusers.d" "$R/etc/tmpfiles.d"
    cp systemd/nsad.sysusers "$R/etc/sysusers.d/nsad.conf"
    cp systemd/nsad.tmpfiles "$R/etc/tmpfiles.d/nsad.conf"
    if systemd-sysusers --root="$R" >"$TMP/sysusers.out" 2>&1 &&
        grep -q '^nsad:x:[0-9]*:[0-9]*:[^:]*:/var/lib/nsad:/usr/sbin/nologin$' "$R/etc/passwd" &&
        grep -q '^video:x:[0-9]*:.*nsad' "$R/etc/group"; then
        ok "sysusers creates the nsad user (no login shell, in group video)"
    else
        not_ok "sysusers creates the nsad user (no login shell, in group video)" "$(cat "$TMP/sysusers.out" "$R/etc/passwd" 2>&1)"
    fi
    uid=$(grep '^nsad:' "$R/etc/passwd" | cut -d: -f3)
    if systemd-tmpfiles --root="$R" --create >"$TMP/tmpfiles.out" 2>&1 &&
        [ "$(stat -c '%a %u' "$R/var/lib/nsad")" = "750 $uid" ] &&
        [ "$(stat -c '%a %u' "$R/var/log/nsad")" = "750 $uid" ] && [ -d "$R/etc/nsad" ]; then
        ok "tmpfiles creates /var/lib/nsad and /var/log/nsad (0750, owned by nsad) and /etc/nsad"
    else
        not_ok "tmpfiles creates /var/lib/nsad and /var/log/nsad (0750, owned by nsad) and /etc/nsad" \
            "$(cat "$TMP/tmpfiles.out"; ls -ln "$R/var/lib" "$R/var/log" 2>&1)"
    fi
fi

# ---- the notify protocol, against a fake NOTIFY_SOCKET --------------------------------------
NOTIFY="$TMP/notify.sock"
python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a") as out:
    while True:
        msg = s.recv(4096).decode("utf-8", "replace")
        out.write(msg.replace("\n", "|") + "\n")
        out.flush()
' "$NOTIFY" "$TMP/notify.log" &
PIDS="$PIDS $!"
i=0; while [ ! -S "$NOTIFY" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The example daemon config loads; flags override its address and paths.
# stderr plays the journal: systemd names it in JOURNAL_STREAM (device:inode)
: >"$TMP/nsad.err"
JOURNAL_STREAM=$(stat -L -c '%d:%i' "$TMP/nsad.err") NOTIFY_SOCKET="$NOTIFY" WATCHDOG_USEC=1000000 \
    "$NSAD" serve --config systemd/nsad.yaml --listen "127.0.0.1:$PORT" \
    --state-dir "$TMP/state" --socket "$TMP/nsad.sock" >"$TMP/nsad.out" 2>>"$TMP/nsad.err" &
SERVE_PID=$!
PIDS="$PIDS $SERVE_PID"
i=0; while ! grep -q 'READY=1' "$TMP/notify.log" 2>/dev/null && kill -0 "$SERVE_PID" 2>/dev/null && [ $i -lt 200 ]; do
    sleep 0.1; i=$((i + 1))
done
if grep -q 'READY=1' "$TMP/notify.log" 2>/dev/null; then
    ok "nsad sends READY=1"
    curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/v1/health" >"$TMP/health.code" 2>/dev/null
    [ "$(cat "$TMP/health.code")" = 200 ] && ok "after READY=1 the API answers" || not_ok "after READY=1 the API answers" "HTTP $(cat "$TMP/health.code")"
else
    not_ok "nsad sends READY=1" "$(cat "$TMP/notify.log" 2>/dev/null)" "$(tail -5 "$TMP/nsad.err")"
fi
# A long run: STATUS= (sent every few seconds) must then carry the step
# (and loss and tokens/s). SIGTERM below checkpoints and stops it.
sed -e "s|^  steps: .*|  steps: 100000|" -e "s|^  path: .*|  path: $ROOT/build/data/fortunes.txt|" \
    -e "s|^  log_every: .*|  log_every: 1|" configs/tiny-cpu.yaml >"$TMP/long.yaml"
[ -s build/data/fortunes.txt ] || ./scripts/make-corpus.sh >/dev/null 2>&1
build/nsactl --socket "$TMP/nsad.sock" start "$TMP/long.yaml" >"$TMP/start.out" 2>&1
i=0; while ! grep -q 'STATUS=.*step' "$TMP/notify.log" 2>/dev/null && kill -0 "$SERVE_PID" 2>/dev/null && [ $i -lt 600 ]; do
    sleep 0.1; i=$((i + 1))
done
grep -q 'STATUS=.*step' "$TMP/notify.log" 2>/dev/null && ok "nsad sends STATUS= with the run's step ($(grep -o 'STATUS=[^|]*step[^|]*' "$TMP/notify.log" | tail -1))" \
    || not_ok "nsad sends STATUS= with the run's step" "$(cat "$TMP/start.out")" "$(grep STATUS "$TMP/notify.log" | tail -3)"
# With WATCHDOG_USEC=1 s, pings must come at least every second: 3 s give >= 3.
before=$(grep -c 'WATCHDOG=1' "$TMP/notify.log" 2>/dev/null)
sleep 3
after=$(grep -c 'WATCHDOG=1' "$TMP/notify.log" 2>/dev/null)
[ $((after - before)) -ge 3 ] && ok "nsad pets the watchdog at least once a second when asked for 1 s ($((after - before)) in 3 s)" \
    || not_ok "nsad pets the watchdog at least once a second when asked for 1 s" "$((after - before)) pings in 3 s"
kill "$SERVE_PID" 2>/dev/null
i=0; while kill -0 "$SERVE_PID" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
wait "$SERVE_PID" 2>/dev/null
rc=$?
[ $rc -eq 0 ] && ok "nsad exits 0 on SIGTERM (with a run active)" || not_ok "nsad exits 0 on SIGTERM (with a run active)" "exit $rc" "$(tail -5 "$TMP/nsad.err")"
grep -q 'STOPPING=1' "$TMP/notify.log" && ok "nsad sends STOPPING=1 on SIGTERM" || not_ok "nsad sends STOPPING=1 on SIGTERM" "$(tail -3 "$TMP/notify.log")"
if [ -s "$TMP/nsad.err" ] && ! grep -qv '^<[0-7]>' "$TMP/nsad.err"; then
    ok "every stderr line of nsad starts with a <N> priority prefix when stderr is the journal"
else
    not_ok "every stderr line of nsad starts with a <N> priority prefix when stderr is the journal" "$(grep -v '^<[0-7]>' "$TMP/nsad.err" | head -3)"
fi

# ---- exit 78 on a bad configuration ------------------------------------------------------------
# proto/api.md: a non-loopback bind without auth is refused at start with 78.
timeout 20 "$NSAD" serve --listen "0.0.0.0:$PORT" --no-auth --state-dir "$TMP/state2" --socket none >"$TMP/bad.out" 2>&1
rc=$?
[ $rc -eq 78 ] && ok "nsad serve refusing a non-loopback bind without auth exits 78" \
    || not_ok "nsad serve refusing a non-loopback bind without auth exits 78" "exit $rc" "$(tail -3 "$TMP/bad.out")"

echo "1..$n"
[ "$failed" -eq 0 ]
