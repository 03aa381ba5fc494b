#!/bin/sh
# run.sh - what `make run` does after the build: starts nsad in the foreground
# on 127.0.0.1:8470 with a default training run on real English text (the
# fortunes corpus), on the GPU when there is one and the build has CUDA, else
# on the CPU engine; prints the dashboard URL and nsactl commands to try.
# Ctrl-C stops nsad (the run checkpoints first; `make run` again starts a new
# one, `nsactl resume ID` continues the old one).
#
# Environment: NSAD_PORT (default 8470), NSAD_RUN_CONFIG (default
# configs/default-run.yaml), NSAD_DEVICE (cpu|cuda: skip the detection).
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PORT="${NSAD_PORT:-8470}"
CONFIG="${NSAD_RUN_CONFIG:-configs/default-run.yaml}"
STATE="$ROOT/build/state"
NSAD="$ROOT/build/nsad"
CTL="$ROOT/build/nsactl"
URL="http://127.0.0.1:$PORT"

say() { printf 'run: %s\n' "$*"; }
die() { printf 'run: %s\n' "$*" >&2; exit 1; }

for f in "$NSAD" "$CTL"; do [ -x "$f" ] || die "$f is missing; run make all"; done
[ -f "$CONFIG" ] || die "NSAD_RUN_CONFIG: $CONFIG not found"
case "$PORT" in ''|*[!0-9]*) die "NSAD_PORT: '$PORT' is not a port number" ;; esac

# The corpus is built once from the fortunes packages; a machine without
# them (a GPU node without a package index) can be handed the file instead.
[ -s build/data/fortunes.txt ] || ./scripts/make-corpus.sh
mkdir -p "$STATE"

# A socket path must fit in 108 bytes; deep checkouts use the default place.
SOCK="$STATE/nsad.sock"
if [ "${#SOCK}" -gt 100 ]; then
    SOCK="${XDG_RUNTIME_DIR:-/tmp}/nsad-$(id -u)-$PORT.sock"
fi

"$NSAD" serve --listen "127.0.0.1:$PORT" --state-dir "$STATE" --socket "$SOCK" &
NSAD_PID=$!
# A background job of a script ignores SIGINT, so Ctrl-C reaches nsad
# through this trap (as SIGTERM: finish the step, checkpoint, exit).
stop() { kill -TERM "$NSAD_PID" 2>/dev/null || true; }
trap stop INT TERM HUP

export NSAD_SOCKET="$SOCK"
i=0
until "$CTL" --timeout 1 status >/dev/null 2>&1; do
    kill -0 "$NSAD_PID" 2>/dev/null || { wait "$NSAD_PID" || true; die "nsad serve exited before it was ready (is port $PORT taken? NSAD_PORT picks another)"; }
    i=$((i + 1))
    [ "$i" -lt 300 ] || { stop; wait "$NSAD_PID" || true; die "nsad serve did not answer within 30 s"; }
    sleep 0.1
done

# The device: CUDA when a GPU is listed and this nsad was built with CUDA.
device="${NSAD_DEVICE:-}"
if [ -z "$device" ]; then
    device=cpu
    built_with_cuda=$("$CTL" version --json | python3 -c 'import json,sys; print(int(bool(json.load(sys.stdin).get("cuda"))))')
    if [ "$built_with_cuda" = 1 ] && command -v nvidia-smi >/dev/null 2>&1 &&
        nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        device=cuda
    elif [ "$built_with_cuda" = 1 ]; then
        say "this nsad has CUDA but nvidia-smi lists no GPU: training on the CPU engine"
    fi
fi
case "$device" in cpu|cuda) ;; *) stop; wait "$NSAD_PID" || true; die "NSAD_DEVICE: '$device' is not valid; allowed: cpu, cuda" ;; esac

# The job config with this machine's device and an absolute corpus path
# (nsad may run from another directory than this checkout).
job="$STATE/default-run.yaml"
sed -e "s|^  device: .*|  device: $device|" \
    -e "s|^  path: build/data/|  path: $ROOT/build/data/|" "$CONFIG" >"$job"
# nsad resumes by itself a run that a previous Ctrl-C interrupted; then
# that one is shown instead of starting a second (the trainer runs one).
run_id=$("$CTL" status --json | python3 -c 'import json,sys; a=json.load(sys.stdin)["active"]; print(a["id"] if a else "")')
if [ -n "$run_id" ]; then
    say "nsad resumed run $run_id, interrupted last time (build/nsactl halt $run_id, then make run, starts afresh)"
    device=$("$CTL" status "$run_id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["device"])')
else
    started=$("$CTL" start "$job" --name default --json) ||
        { stop; wait "$NSAD_PID" || true; die "could not start the default run from $CONFIG (see the message above)"; }
    run_id=$(printf '%s' "$started" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
fi
# Device or data trouble shows within the first seconds: say so rather than
# leave a failed run behind a banner that says it trains.
i=0
while :; do
    state=$("$CTL" status "$run_id" --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["state"] + "\t" + (r.get("error") or ""))')
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
dashboard=$("$CTL" --url "$URL" --state-dir "$STATE" dashboard)

cat <<EOF

  nsad is running (pid $NSAD_PID), training run $run_id on the $device engine

  dashboard   $dashboard

  try, in another shell:
    export NSAD_SOCKET=$SOCK
    build/nsactl watch $run_id          # live step, loss, tok/s, ETA
    build/nsactl status $run_id
    build/nsactl metrics $run_id
    build/nsactl list
    build/nsactl halt $run_id --wait    # checkpoint and stop; then: build/nsactl resume $run_id
    curl -s -H "Authorization: Bearer \$(cat build/state/token)" $URL/metrics | grep nsad_run

  Ctrl-C stops nsad (the run checkpoints first).

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
