#!/bin/sh
# run.sh - what `make run` does after the build: starts nsad in the foreground
# on 127.0.0.1:8470 with a default training run on real English text (the
# fortunes corpus), on the GPU when nsad finds a usable one, else on the CPU
# engine; prints the dashboard URL and nsactl commands to try.
#
# nsad keeps this user's default state dir and Unix socket (daemon/paths.h:
# ~/.local/state/nsad and $XDG_RUNTIME_DIR/nsad/nsad.sock, or /var/lib/nsad
# and /run/nsad/nsad.sock as root), where nsactl looks by itself: the
# commands printed below work in any shell as they are. When an nsad already
# serves there, make run says where it is and how to reach it, and exits 0.
# Ctrl-C stops nsad (the run checkpoints first; the next `make run` resumes
# it).
#
# Environment: NSAD_PORT (default 8470), NSAD_RUN_CONFIG (default
# configs/default-run.yaml), NSAD_DEVICE (cpu|cuda: skip the detection).
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PORT="${NSAD_PORT:-8470}"
CONFIG="${NSAD_RUN_CONFIG:-configs/default-run.yaml}"
NSAD="$ROOT/build/nsad"
CTL="$ROOT/build/nsactl"

say() { printf 'run: %s\n' "$*"; }
die() { printf 'run: %s\n' "$*" >&2; exit 1; }
# json EXPR: evaluates a Python expression over the JSON document d on stdin.
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

for f in "$NSAD" "$CTL"; do [ -x "$f" ] || die "$f is missing; run make all"; done
[ -f "$CONFIG" ] || die "NSAD_RUN_CONFIG: $CONFIG not found"
case "$PORT" in ''|*[!0-9]*) die "NSAD_PORT: '$PORT' is not a port number" ;; esac

# The corpus is built once from the fortunes packages; a machine without
# them (a GPU node without a package index) can be handed the file instead.
[ -s build/data/fortunes.txt ] || ./scripts/make-corpus.sh

# An nsad that already answers on this user's default socket: say where it
# is and what it runs, and leave it be.
already_running() {
    version=$("$CTL" --timeout 5 version --json 2>/dev/null) || return 1
    pid=$(printf '%s' "$version" | json 'd.get("pid", "?")')
    listen=$(printf '%s' "$version" | json 'd.get("listen") or "no TCP listener"')
    socket=$(printf '%s' "$version" | json 'd.get("socket") or "none"')
    state=$(printf '%s' "$version" | json 'd.get("state_dir", "?")')
    active=$("$CTL" --timeout 5 status --json 2>/dev/null | json '(d.get("active") or {}).get("id") or "none"' ||
        echo "?")
    cat <<EOT

  nsad is already running (pid $pid); make run leaves it as it is.

  API, dashboard   $listen   (build/nsactl dashboard prints the URL with its token)
  Unix socket      $socket
  state dir        $state
  active run       $active

  build/nsactl list, build/nsactl watch ID, build/nsactl start CONFIG;
  stop it with: kill -TERM $pid   (its active run checkpoints first)

EOT
}
if already_running; then exit 0; fi

"$NSAD" serve --listen "127.0.0.1:$PORT" &
NSAD_PID=$!
# A background job of a script ignores SIGINT, so Ctrl-C reaches nsad
# through this trap (as SIGTERM: finish the step, checkpoint, exit).
stop() { kill -TERM "$NSAD_PID" 2>/dev/null || true; }
trap stop INT TERM HUP

i=0
until "$CTL" --timeout 1 status >/dev/null 2>&1; do
    if ! kill -0 "$NSAD_PID" 2>/dev/null; then
        rc=0
        wait "$NSAD_PID" || rc=$?
        # 75: another nsad holds the state dir (nsad's line above names it)
        if [ "$rc" -eq 75 ]; then
            already_running || say "it does not answer on this user's default socket yet; try again shortly"
            exit 0
        fi
        die "nsad serve exited ($rc) before it was ready (is port $PORT taken? NSAD_PORT picks another)"
    fi
    i=$((i + 1))
    [ "$i" -lt 300 ] || { stop; wait "$NSAD_PID" || true; die "nsad serve did not answer within 30 s"; }
    sleep 0.1
done
version=$("$CTL" version --json)
URL=$(printf '%s' "$version" | json 'd.get("listen") or ""')
SOCK=$(printf '%s' "$version" | json 'd.get("socket") or "none"')
STATE=$(printf '%s' "$version" | json 'd["state_dir"]')

# The device: CUDA when nsad found a usable GPU (its start-up probe).
device="${NSAD_DEVICE:-}"
if [ -z "$device" ]; then
    device=$(printf '%s' "$version" | json '"cuda" if "cuda" in d.get("devices", []) else "cpu"')
    if [ "$device" = cpu ] && [ "$(printf '%s' "$version" | json 'int(bool(d.get("cuda")))')" = 1 ]; then
        say "this nsad has CUDA but no usable GPU ($(printf '%s' "$version" | json 'd.get("device_probe", "")')): training on the CPU engine"
    fi
fi
case "$device" in cpu|cuda) ;; *) stop; wait "$NSAD_PID" || true; die "NSAD_DEVICE: '$device' is not valid; allowed: cpu, cuda" ;; esac

# The job config with this machine's device and an absolute corpus path
# (nsad may run from another directory than this checkout).
job="$ROOT/build/default-run.yaml"
sed -e "s|^  device: .*|  device: $device|" \
    -e "s|^  path: build/data/|  path: $ROOT/build/data/|" "$CONFIG" >"$job"
# nsad resumes by itself a run that a previous Ctrl-C interrupted; then
# that one is shown instead of starting a second (the trainer runs one).
run_id=$("$CTL" status --json | json '(d.get("active") or {}).get("id") or ""')
if [ -n "$run_id" ]; then
    say "nsad resumed run $run_id, interrupted last time (build/nsactl halt $run_id, then make run, starts afresh)"
    device=$("$CTL" status "$run_id" --json | json 'd["device"]')
else
    started=$("$CTL" start "$job" --name default --json) ||
        { stop; wait "$NSAD_PID" || true; die "could not start the default run from $CONFIG (see the message above)"; }
    run_id=$(printf '%s' "$started" | json 'd["id"]')
fi
# Device or data trouble shows within the first seconds: say so rather than
# leave a failed run behind a banner that says it trains.
i=0
while :; do
    state=$("$CTL" status "$run_id" --json | json 'd["state"] + "\t" + (d.get("error") or "")')
    case "$state" in starting*) ;; *) break ;; esac
    i=$((i + 1))
    [ "$i" -lt 600 ] || break
    sleep 0.1
done
case "$state" in
    failed*)
        stop; wait "$NSAD_PID" || true
        hint=""
        [ "$device" = cuda ] && hint="; NSAD_DEVICE=cpu make run trains on the CPU engine instead"
        die "the default run failed: $(printf '%s' "$state" | cut -f2)$hint" ;;
esac
dashboard=$("$CTL" dashboard)

cat <<EOF

  nsad is running (pid $NSAD_PID), training run $run_id on the $device engine

  dashboard   $dashboard

  try, in another shell (nsactl finds this nsad by itself):
    build/nsactl watch $run_id          # live step, loss, tok/s, ETA
    build/nsactl status $run_id
    build/nsactl metrics $run_id
    build/nsactl list
    build/nsactl dashboard              # the URL above, with its token
    build/nsactl halt $run_id --wait    # checkpoint and stop; then: build/nsactl resume $run_id
    curl -s -H "Authorization: Bearer \$(cat $STATE/token)" $URL/metrics | grep nsad_run

  state dir $STATE, Unix socket $SOCK
  Ctrl-C stops nsad (the run checkpoints first; the next make run resumes it).

EOF

# Stay in the foreground until nsad exits; a trapped signal interrupts
# `wait`, so wait again for nsad to finish its checkpoint.
set +e
while :; do
    wait "$NSAD_PID"
    status=$?
    kill -0 "$NSAD_PID" 2>/dev/null || break
done
# A wait cut short by the trap returns 128+signal, not nsad's status.
if [ "$status" -gt 128 ]; then
    wait "$NSAD_PID" 2>/dev/null
    late=$?
    [ "$late" -ne 127 ] && status=$late
fi
exit "$status"
