#!/bin/sh
# test_nsactl.sh - nsactl against a real nsad: starts `build/nsad serve` with a
# temporary state dir on a free loopback port and its own Unix socket, runs
# tiny CPU jobs on the fortunes corpus, and exercises every nsactl command in
# human and --json form, plus the exit codes (daemon down, unknown run, bad
# config file, 4xx answers, bad usage). Prints TAP; exits non-zero when a test
# fails. Every wait is bounded; nsad is always killed on exit.
# shellcheck disable=SC2015  # "test && ok || not_ok": ok only echoes, so it cannot fail
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
NSAD="$ROOT/build/nsad"
CTL="$ROOT/build/nsactl"

. "$ROOT/tests/integration/tap.sh"
# check NAME COMMAND...: ok when the command succeeds.
check() { name="$1"; shift; if "$@" >"$TMP/check.out" 2>&1; then ok "$name"; else not_ok "$name" "$(head -c 600 "$TMP/check.out")"; fi; }
# expect_rc NAME RC COMMAND...: ok when nsactl exits with RC.
expect_rc() {
    name="$1"; want="$2"; shift 2
    "$@" >"$TMP/out" 2>"$TMP/err"; got=$?
    if [ "$got" -eq "$want" ]; then ok "$name"; else not_ok "$name" "exit $got, wanted $want" "stdout: $(head -c 400 "$TMP/out")" "stderr: $(head -c 400 "$TMP/err")"; fi
}
# json EXPR: evaluates a Python expression over the JSON document `d` read from $TMP/out.
json() { python3 -c "import json,sys; d=json.load(open('$TMP/out')); sys.exit(0 if ($1) else 1)"; }
json_get() { python3 -c "import json,sys; d=json.load(open('$TMP/out')); print($1)"; }

for f in "$NSAD" "$CTL"; do
    if [ ! -x "$f" ]; then echo "1..0 # SKIP $f not built (make all)"; echo "not ok 1 - $f exists"; exit 1; fi
done
if [ ! -s build/data/fortunes.txt ]; then
    ./scripts/make-corpus.sh >/dev/null || { echo "not ok 1 - build the fortunes corpus"; exit 1; }
fi

# Short paths: a Unix socket path must fit in 108 bytes.
TMP=$(mktemp -d /tmp/nsactl-test.XXXXXX)
STATE="$TMP/state"
SOCK="$TMP/nsad.sock"
NSAD_PID=""
WATCH_PID=""
cleanup() {
    [ -n "$WATCH_PID" ] && kill "$WATCH_PID" 2>/dev/null
    if [ -n "$NSAD_PID" ] && kill -0 "$NSAD_PID" 2>/dev/null; then
        kill "$NSAD_PID" 2>/dev/null
        i=0; while kill -0 "$NSAD_PID" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        kill -9 "$NSAD_PID" 2>/dev/null
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
trap 'exit 141' PIPE

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
URL="http://127.0.0.1:$PORT"

# Two tiny jobs from the tiny-cpu config: a long one to halt and resume,
# a short one to watch to completion.
make_config() {  # steps out
    sed -e "s|^  steps: .*|  steps: $1|" -e "s|^  path: .*|  path: $ROOT/build/data/fortunes.txt|" \
        -e "s|^  log_every: .*|  log_every: 1|" -e "s|^  save_every: .*|  save_every: 5|" \
        -e "s|^  eval_every: .*|  eval_every: 10|" -e "s|^  threads: .*|  threads: 1|" \
        configs/tiny-cpu.yaml >"$2"
}
make_config 100000 "$TMP/long.yaml"
make_config 12 "$TMP/short.yaml"

export NSAD_SOCKET="$SOCK"
unset NSAD_URL NSAD_TOKEN NSAD_TOKEN_FILE NSAD_STATE_DIR
C() { "$CTL" --timeout 20 "$@"; }

start_nsad() {
    "$NSAD" serve --listen "127.0.0.1:$PORT" --state-dir "$STATE" --socket "$SOCK" >>"$TMP/nsad.log" 2>&1 &
    NSAD_PID=$!
    i=0
    while [ $i -lt 200 ]; do
        "$CTL" --timeout 1 status >/dev/null 2>&1 && return 0
        kill -0 "$NSAD_PID" 2>/dev/null || return 1
        sleep 0.1; i=$((i + 1))
    done
    return 1
}
stop_nsad() {
    kill "$NSAD_PID" 2>/dev/null
    i=0; while kill -0 "$NSAD_PID" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    ! kill -0 "$NSAD_PID" 2>/dev/null
}

# ---- before the daemon: cannot reach it ------------------------------------------
expect_rc "daemon down: status over the socket exits 3" 3 C status
expect_rc "daemon down: list over TCP exits 3" 3 C --url "$URL" --token x list
grep -q "$SOCK" "$TMP/err" 2>/dev/null || grep -q "127.0.0.1:$PORT" "$TMP/err" && ok "daemon down: the message names where nsactl looked" || not_ok "daemon down: the message names where nsactl looked" "$(cat "$TMP/err")"

if ! start_nsad; then
    not_ok "nsad serve answers on its socket within 20 s" "$(tail -20 "$TMP/nsad.log")"
    echo "1..$n"; exit 1
fi
ok "nsad serve answers on its socket within 20 s"

# ---- help and usage --------------------------------------------------------------
expect_rc "--help exits 0" 0 C --help
grep -q "exit codes" "$TMP/out" && ok "--help documents the exit codes" || not_ok "--help documents the exit codes"
for cmd in start status list halt resume delete metrics events stacks watch dashboard version; do
    expect_rc "$cmd --help exits 0 and shows its usage" 0 C "$cmd" --help
    grep -q "usage: nsactl $cmd" "$TMP/out" || not_ok "$cmd --help names the command" "$(head -3 "$TMP/out")"
done
expect_rc "no command exits 2" 2 C
expect_rc "unknown command exits 2" 2 C frobnicate
[ "$(wc -l <"$TMP/err")" -eq 1 ] && ! grep -q "did you mean" "$TMP/err" && ok "an unknown command gets one line, not the usage" ||
    not_ok "an unknown command gets one line, not the usage" "$(head -5 "$TMP/err")"
expect_rc "a mistyped command exits 2" 2 C stauts
[ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "did you mean 'status'?" "$TMP/err" && ok "a mistyped command gets: did you mean 'status'?" ||
    not_ok "a mistyped command gets: did you mean 'status'?" "$(head -5 "$TMP/err")"
expect_rc "help of a mistyped command exits 2" 2 C help lsit
grep -q "did you mean 'list'?" "$TMP/err" && ok "help lsit: did you mean 'list'?" || not_ok "help lsit: did you mean 'list'?" "$(cat "$TMP/err")"
expect_rc "a mistyped option exits 2" 2 C list --jsno
grep -q "did you mean '--json'?" "$TMP/err" && ok "list --jsno: did you mean '--json'?" || not_ok "list --jsno: did you mean '--json'?" "$(cat "$TMP/err")"
expect_rc "a mistyped option of sample exits 2" 2 C sample run-1 --promt hi
grep -q "did you mean '--prompt'?" "$TMP/err" && ok "sample --promt: did you mean '--prompt'?" ||
    not_ok "sample --promt: did you mean '--prompt'?" "$(cat "$TMP/err")"
for alias in ps ls rm stop; do
    expect_rc "$alias --help exits 0" 0 C "$alias" --help
done
grep -q "usage: nsactl halt" "$TMP/out" && ok "stop is halt" || not_ok "stop is halt" "$(head -3 "$TMP/out")"
expect_rc "start without CONFIG exits 2" 2 C start
expect_rc "unknown option exits 2" 2 C list --bogus
expect_rc "a malformed run id exits 2" 2 C status '../etc'
expect_rc "--url and --socket together exit 2" 2 C --url "$URL" --socket "$SOCK" list
expect_rc "a --url that is not http:// exits 2" 2 C --url "ftp://127.0.0.1:$PORT" list
expect_rc "--interval 0 exits 2" 2 C watch some-run --interval 0

# ---- status and version -----------------------------------------------------------
expect_rc "status exits 0" 0 C status
grep -q "trainer idle" "$TMP/out" && ok "status says the trainer is idle" || not_ok "status says the trainer is idle" "$(cat "$TMP/out")"
expect_rc "status --json exits 0" 0 C status --json
json 'd["health"]["status"] == "ok" and d["active"] is None and d["runs"] == 0' && ok "status --json: health ok, no active run" || not_ok "status --json: health ok, no active run" "$(cat "$TMP/out")"
expect_rc "version --json exits 0" 0 C version --json
json 'd["api"] == "v1" and isinstance(d["version"], str)' && ok "version --json parses" || not_ok "version --json parses" "$(cat "$TMP/out")"

# ---- bad config files -----------------------------------------------------------------
expect_rc "start of a missing config file exits 78" 78 C start "$TMP/nope.yaml"
printf 'model:\n  dim: 64\n  bogus_key: 3\n' >"$TMP/bad.yaml"
expect_rc "start of a config nsad rejects exits 78" 78 C start "$TMP/bad.yaml"
grep -q "bogus_key" "$TMP/err" && ok "the rejection names the bad key" || not_ok "the rejection names the bad key" "$(cat "$TMP/err")"
# a run this nsad cannot run: refused at submit, one line, exit 78
if C version --json >"$TMP/out" 2>&1 && json '"cuda" not in d.get("devices", [])'; then
    sed -e 's|^  device: .*|  device: cuda|' -e 's|^  precision: .*|  precision: bf16|' "$TMP/short.yaml" >"$TMP/cuda.yaml"
    expect_rc "start of a cuda run on an nsad without a usable GPU exits 78" 78 C start "$TMP/cuda.yaml"
    [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "runtime.device: cuda, but this nsad has no usable GPU" "$TMP/err" &&
        ok "... with one line saying so" || not_ok "... with one line saying so" "$(cat "$TMP/err")"
else
    ok "start of a cuda run on an nsad without a usable GPU exits 78 # SKIP this nsad has a GPU"
    ok "... with one line saying so # SKIP this nsad has a GPU"
fi
sed -e "s|^  path: .*|  path: $TMP/no-such-corpus.txt|" "$TMP/short.yaml" >"$TMP/nodata.yaml"
expect_rc "start of a run whose data.path does not exist exits 78" 78 C start "$TMP/nodata.yaml"
grep -q "data.path: \"$TMP/no-such-corpus.txt\": does not exist" "$TMP/err" && ok "... naming the path" ||
    not_ok "... naming the path" "$(cat "$TMP/err")"
# --gpus sets runtime.gpus over the file's; the daemon checks it like the file
expect_rc "start --gpus on a cpu run exits 78" 78 C start "$TMP/short.yaml" --gpus 0,1
grep -q "runtime.gpus: 2 GPUs on device cpu" "$TMP/err" && ok "... naming runtime.gpus and the device" ||
    not_ok "... naming runtime.gpus and the device" "$(cat "$TMP/err")"
expect_rc "start --gpus with a malformed value exits 78" 78 C start "$TMP/short.yaml" --gpus gpu1
grep -q "gpus: 'gpu1'; allowed: all, a GPU count, or GPU ordinals" "$TMP/err" && ok "... saying what is allowed" ||
    not_ok "... saying what is allowed" "$(cat "$TMP/err")"
printf '{"model": {"dim": 64,}}' >"$TMP/bad.json"
expect_rc "start of malformed JSON exits 78" 78 C start "$TMP/bad.json"
expect_rc "a 400 invalid_argument from nsad (bad --name) exits 1" 1 C start "$TMP/short.yaml" --name "no spaces allowed"
grep -q "invalid_argument" "$TMP/err" && ok "the 400 names invalid_argument" || not_ok "the 400 names invalid_argument" "$(cat "$TMP/err")"

# ---- a long run: start, list, status, metrics, events, stacks, halt, resume -----
expect_rc "start --json exits 0" 0 C start "$TMP/long.yaml" --name long-run --json
json 'd["state"] in ("starting", "running") and d["name"] == "long-run"' && ok "start --json returns the run object" || not_ok "start --json returns the run object" "$(cat "$TMP/out")"
ID=$(json_get 'd["id"]' 2>/dev/null)
[ -n "$ID" ] || ID=missing
expect_rc "a second start --no-queue while busy exits 5" 5 C start "$TMP/short.yaml" --no-queue
grep -q "busy" "$TMP/err" && ok "the conflict says busy" || not_ok "the conflict says busy" "$(cat "$TMP/err")"

# ---- the queue: while the long run trains, later starts wait their turn -------------
expect_rc "a second start while busy queues it (exit 0)" 0 C start "$TMP/short.yaml" --name q1
grep -q "^queued run .* (q1) on cpu at position 1" "$TMP/out" && ok "start says queued at position 1" || not_ok "start says queued at position 1" "$(cat "$TMP/out")"
expect_rc "a third start --json exits 0" 0 C start "$TMP/short.yaml" --name q2 --json
json 'd["state"] == "queued" and d["queue_position"] == 2' && ok "start --json: state queued, queue_position 2" || not_ok "start --json: state queued, queue_position 2" "$(head -c 600 "$TMP/out")"
Q2=$(json_get 'd["id"]' 2>/dev/null); [ -n "$Q2" ] || Q2=missing
expect_rc "list --json with a queue exits 0" 0 C list --json
Q1=$(json_get '[r["id"] for r in d["runs"] if r["name"] == "q1"][0]' 2>/dev/null); [ -n "$Q1" ] || Q1=missing
json "d['queue'] == ['$Q1', '$Q2'] and d['active'] == '$ID'" && ok "list --json: the queue in order, the long run active" || not_ok "list --json: the queue in order, the long run active" "$(head -c 600 "$TMP/out")"
expect_rc "list with a queue exits 0" 0 C list
grep "$Q1" "$TMP/out" | grep -q "queued #1" && grep "$Q2" "$TMP/out" | grep -q "queued #2" && ok "list shows each queued run's place" || not_ok "list shows each queued run's place" "$(cat "$TMP/out")"
expect_rc "front of the second queued run exits 0" 0 C front "$Q2"
C list --json >"$TMP/out" 2>/dev/null
json "d['queue'] == ['$Q2', '$Q1']" && ok "front: it is first in the queue now" || not_ok "front: it is first in the queue now" "$(head -c 600 "$TMP/out")"
expect_rc "front of the active run exits 5" 5 C front "$ID"
grep -q "invalid_state" "$TMP/err" && ok "the refusal names invalid_state" || not_ok "the refusal names invalid_state" "$(cat "$TMP/err")"
expect_rc "front of an unknown run exits 4" 4 C front 20000101-000000-dead
expect_rc "fornt: a typo gets a suggestion, exit 2" 2 C fornt "$Q2"
grep -q "did you mean 'front'" "$TMP/err" && ok "the typo suggests front" || not_ok "the typo suggests front" "$(cat "$TMP/err")"
expect_rc "halt of a queued run exits 0" 0 C halt "$Q1" --json
json 'd["state"] == "halted" and d["queue_position"] is None' && ok "halt takes a queued run out of the queue (halted)" || not_ok "halt takes a queued run out of the queue (halted)" "$(head -c 600 "$TMP/out")"
expect_rc "rm of a queued run exits 0 (cancelled)" 0 C rm "$Q2"
[ ! -e "$STATE/runs/$Q2" ] && ok "the cancelled run's directory is gone" || not_ok "the cancelled run's directory is gone"
expect_rc "rm of the halted one exits 0" 0 C rm "$Q1"
C list --json >"$TMP/out" 2>/dev/null
json "d['queue'] == [] and d['active'] == '$ID'" && ok "the queue is empty again" || not_ok "the queue is empty again" "$(head -c 600 "$TMP/out")"

# wait (bounded) until a few steps are logged
i=0
while [ $i -lt 600 ]; do
    C status "$ID" --json >"$TMP/out" 2>/dev/null && json '(d["step"] or 0) >= 3' && break
    json 'd["state"] in ("failed", "nan_halted", "completed")' 2>/dev/null && break
    sleep 0.1; i=$((i + 1))
done
json 'd["state"] == "running" and d["step"] >= 3' && ok "the run reaches step 3 within 60 s" || not_ok "the run reaches step 3 within 60 s" "$(cat "$TMP/out")" "$(tail -5 "$TMP/nsad.log")"

expect_rc "list exits 0" 0 C list
grep -q "$ID" "$TMP/out" && grep -q "long-run" "$TMP/out" && ok "list shows the run and its name" || not_ok "list shows the run and its name" "$(cat "$TMP/out")"
for alias in ps ls; do
    expect_rc "$alias exits 0" 0 C "$alias"
    grep -q "$ID" "$TMP/out" && ok "$alias lists the runs as list does" || not_ok "$alias lists the runs as list does" "$(cat "$TMP/out")"
done
expect_rc "list --json exits 0" 0 C list --json
json "d['active'] == '$ID' and d['runs'][0]['id'] == '$ID'" && ok "list --json: the run is active and newest" || not_ok "list --json: the run is active and newest" "$(cat "$TMP/out")"
expect_rc "status ID exits 0" 0 C status "$ID"
grep -q "running" "$TMP/out" && grep -q "tok/s" "$TMP/out" && ok "status ID shows state and speed" || not_ok "status ID shows state and speed" "$(cat "$TMP/out")"
expect_rc "status (daemon) shows the active run" 0 C status
grep -q "active: $ID" "$TMP/out" && ok "status names the active run" || not_ok "status names the active run" "$(cat "$TMP/out")"
expect_rc "status ID --json exits 0" 0 C status "$ID" --json
json "d['id'] == '$ID' and d['device'] == 'cpu' and 'config' in d" && ok "status ID --json is the run object with its config" || not_ok "status ID --json is the run object with its config" "$(head -c 600 "$TMP/out")"

expect_rc "metrics exits 0" 0 C metrics "$ID"
grep -q "STEP" "$TMP/out" && grep -q "LOSS" "$TMP/out" && ok "metrics prints a table" || not_ok "metrics prints a table" "$(cat "$TMP/out")"
expect_rc "metrics --json exits 0" 0 C metrics "$ID" --json
json 'len(d["train"]) >= 3 and [s["step"] for s in d["train"]] == sorted(s["step"] for s in d["train"]) and d["next"] == d["train"][-1]["step"] + 1' && ok "metrics --json: ordered samples and next" || not_ok "metrics --json: ordered samples and next" "$(head -c 600 "$TMP/out")"
NEXT=$(json_get 'd["next"]')
expect_rc "metrics --since exits 0" 0 C metrics "$ID" --since "$NEXT" --json
json "all(s['step'] >= $NEXT for s in d['train'])" && ok "metrics --since filters by step" || not_ok "metrics --since filters by step" "$(head -c 600 "$TMP/out")"
expect_rc "metrics --since -1 exits 2" 2 C metrics "$ID" --since -1

expect_rc "events exits 0" 0 C events "$ID"
grep -q "start" "$TMP/out" && ok "events shows the start event" || not_ok "events shows the start event" "$(cat "$TMP/out")"
expect_rc "events --json exits 0" 0 C events "$ID" --json
json 'd["events"][0]["type"] == "start" and d["events"][0]["seq"] == 1' && ok "events --json: seq 1 is start" || not_ok "events --json: seq 1 is start" "$(head -c 600 "$TMP/out")"

expect_rc "stacks exits 0" 0 C stacks
grep -q "phase" "$TMP/out" && grep -q "^last_step_done: " "$TMP/out" && grep -q "^device: cpu, " "$TMP/out" &&
    ok "stacks prints the phase, the device lines and stacks" || not_ok "stacks prints the phase, the device lines and stacks" "$(head -c 600 "$TMP/out")"
expect_rc "stacks --json exits 0" 0 C stacks --json
json "isinstance(d['stacks'], str) and len(d['stacks']) > 0 and d['run_id'] == '$ID' and d['device'].startswith('device: cpu, ')" && ok "stacks --json carries the stacks and device lines of the active run" || not_ok "stacks --json carries the stacks and device lines of the active run" "$(head -c 300 "$TMP/out")"

expect_rc "delete of the active run exits 5" 5 C delete "$ID"
grep -q "invalid_state" "$TMP/err" && [ -d "$STATE/runs/$ID" ] && ok "the refusal names invalid_state and the run stays" ||
    not_ok "the refusal names invalid_state and the run stays" "$(cat "$TMP/err")"
expect_rc "halt --wait exits 0" 0 timeout 60 "$CTL" halt "$ID" --wait
grep -q "halted" "$TMP/out" && ok "halt --wait reports halted" || not_ok "halt --wait reports halted" "$(cat "$TMP/out")"
expect_rc "halt of a halted run exits 5" 5 C halt "$ID"
grep -q "invalid_state" "$TMP/err" && ok "the 409 names invalid_state" || not_ok "the 409 names invalid_state" "$(cat "$TMP/err")"
HALT_STEP=$(C status "$ID" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')
expect_rc "resume --json exits 0" 0 C resume "$ID" --json
json "d['id'] == '$ID' and d['state'] in ('starting', 'running')" && ok "resume --json: same id, starting again" || not_ok "resume --json: same id, starting again" "$(head -c 600 "$TMP/out")"
i=0
while [ $i -lt 600 ]; do
    C status "$ID" --json >"$TMP/out" 2>/dev/null && json "d['state'] == 'running' and d['step'] > $HALT_STEP" && break
    sleep 0.1; i=$((i + 1))
done
json "d['state'] == 'running' and d['step'] > $HALT_STEP" && ok "the resumed run continues past step $HALT_STEP" || not_ok "the resumed run continues past step $HALT_STEP" "$(head -c 600 "$TMP/out")"
expect_rc "halt --wait --json exits 0" 0 timeout 60 "$CTL" halt "$ID" --wait --json
json 'd["state"] == "halted"' && ok "halt --wait --json ends halted" || not_ok "halt --wait --json ends halted" "$(head -c 600 "$TMP/out")"

# ---- unknown runs ---------------------------------------------------------------------
for cmd in status halt resume delete metrics events watch rm stop; do
    expect_rc "$cmd of an unknown run exits 4" 4 C "$cmd" 20000101-000000-dead
done
grep -q "not_found" "$TMP/err" && ok "the 404 names not_found" || not_ok "the 404 names not_found" "$(cat "$TMP/err")"

# ---- TCP, token, dashboard -------------------------------------------------------------
expect_rc "TCP without a token exits 1 (401)" 1 C --url "$URL" --state-dir "$TMP/none" list
grep -q "unauthorized" "$TMP/err" && ok "the 401 says unauthorized and what to do" || not_ok "the 401 says unauthorized and what to do" "$(cat "$TMP/err")"
expect_rc "TCP with a wrong token exits 1" 1 C --url "$URL" --token wrong list
# a streamed answer (logs) is refused the same way, with the same hint
expect_rc "logs over TCP without a token exits 1 (401)" 1 C --url "$URL" --state-dir "$TMP/none" logs "$ID"
grep -q "unauthorized.*no token found" "$TMP/err" && ok "the stream's 401 says what to do" || not_ok "the stream's 401 says what to do" "$(cat "$TMP/err")"
expect_rc "TCP with --token-file exits 0" 0 C --url "$URL" --token-file "$STATE/token" list --json
json "d['runs'][0]['id'] == '$ID'" && ok "TCP list --json sees the same runs" || not_ok "TCP list --json sees the same runs" "$(head -c 300 "$TMP/out")"
expect_rc "TCP with the state dir's token exits 0" 0 C --url "$URL" --state-dir "$STATE" status
expect_rc "an unreadable token file exits 1" 1 C --url "$URL" --token-file "$TMP/missing-token" list
expect_rc "dashboard exits 0" 0 C --url "$URL" --state-dir "$STATE" dashboard
[ "$(cat "$TMP/out")" = "$URL/#token=$(cat "$STATE/token")" ] && ok "dashboard prints URL/#token=TOKEN" || not_ok "dashboard prints URL/#token=TOKEN" "$(cat "$TMP/out")"
expect_rc "dashboard --json exits 0" 0 C --url "$URL" --state-dir "$STATE" dashboard --json
json "d['url'].startswith('$URL/#token=')" && ok "dashboard --json has the url" || not_ok "dashboard --json has the url" "$(cat "$TMP/out")"

# ---- a short run watched to the end -------------------------------------------------------
"$CTL" start - --json <"$TMP/short.yaml" >"$TMP/out" 2>"$TMP/err"
rc=$?
[ $rc -eq 0 ] && ok "start - reads the config from stdin" || not_ok "start - reads the config from stdin" "exit $rc: $(cat "$TMP/err")"
SHORT=$(json_get 'd["id"]' 2>/dev/null)
[ -n "$SHORT" ] || SHORT=missing
expect_rc "watch exits 0 when the run completes" 0 timeout 120 "$CTL" watch "$SHORT" --interval 0.2
tail -1 "$TMP/out" | grep -q "completed" && ok "watch's last line says completed" || not_ok "watch's last line says completed" "$(tail -3 "$TMP/out")"
grep -q "loss" "$TMP/out" && grep -q "tok/s" "$TMP/out" && ok "watch lines show loss and tok/s" || not_ok "watch lines show loss and tok/s" "$(head -3 "$TMP/out")"
expect_rc "watch --json of a finished run exits 0" 0 timeout 30 "$CTL" watch "$SHORT" --json
python3 -c "
import json, sys
lines = [json.loads(l) for l in open('$TMP/out') if l.strip()]
sys.exit(0 if lines and lines[-1]['state'] == 'completed' and lines[-1]['step'] == 12 and 'config' not in lines[-1] else 1)
" && ok "watch --json: one run object a line, ending completed at step 12" || not_ok "watch --json: one run object a line, ending completed at step 12" "$(tail -c 400 "$TMP/out")"
expect_rc "resume of a completed run exits 5" 5 C resume "$SHORT"
# On a terminal watch redraws one line in place (\r, erase to end of line).
if command -v script >/dev/null 2>&1; then
    timeout 30 script -qec "$CTL watch $SHORT" /dev/null >"$TMP/out" 2>&1
    rc=$?
    [ $rc -eq 0 ] && grep -q "$(printf '\r\033\\[K')" "$TMP/out" && grep -q completed "$TMP/out" &&
        ok "watch on a terminal redraws its line and ends completed" ||
        not_ok "watch on a terminal redraws its line and ends completed" "exit $rc" "$(od -c "$TMP/out" | head -5)"
else
    ok "watch on a terminal redraws its line # SKIP script(1) not installed"
fi
expect_rc "delete of a completed run exits 0" 0 C delete "$SHORT"
grep -q "^deleted $SHORT" "$TMP/out" && [ ! -e "$STATE/runs/$SHORT" ] &&
    ok "delete says so and the run's directory is gone" ||
    not_ok "delete says so and the run's directory is gone" "$(cat "$TMP/out" "$TMP/err")"
expect_rc "status of the deleted run exits 4" 4 C status "$SHORT"
expect_rc "delete without ID exits 2" 2 C delete
expect_rc "start --watch follows a run to completion" 0 timeout 120 "$CTL" start "$TMP/short.yaml" --watch --interval 0.2
grep -q "^started run" "$TMP/out" && tail -1 "$TMP/out" | grep -q completed && ok "start --watch prints the id, then the run to completed" ||
    not_ok "start --watch prints the id, then the run to completed" "$(tail -3 "$TMP/out")"
head -c 1200000 /dev/zero | tr '\0' '#' >"$TMP/huge.yaml"
expect_rc "a config file over 1 MiB exits 78 before it is sent" 78 C start "$TMP/huge.yaml"
grep -q "larger than" "$TMP/err" && ok "the message says the file is too large" || not_ok "the message says the file is too large" "$(cat "$TMP/err")"
: >"$TMP/empty.yaml"
expect_rc "an empty config file exits 78" 78 C start "$TMP/empty.yaml"

# A server that accepts but never answers: --timeout turns that into exit 3.
SILENT_PORT=$(free_port)
python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8)
open(sys.argv[2], "w").close()
conns = []
end = time.time() + 20
while time.time() < end:
    s.settimeout(end - time.time())
    try: conns.append(s.accept()[0])
    except OSError: break
' "$SILENT_PORT" "$TMP/silent.ready" &
SILENT_PID=$!
i=0; while [ ! -e "$TMP/silent.ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
expect_rc "a daemon that does not answer within --timeout exits 3" 3 "$CTL" --timeout 1 --url "http://127.0.0.1:$SILENT_PORT" --token x list
grep -q "no answer" "$TMP/err" && ok "the message says nsad did not answer in time" || not_ok "the message says nsad did not answer in time" "$(cat "$TMP/err")"
kill "$SILENT_PID" 2>/dev/null

# ---- watch rides out a daemon restart -------------------------------------------------------
C start "$TMP/long.yaml" --name restart --json >"$TMP/out" 2>"$TMP/err"
RID=$(json_get 'd["id"]' 2>/dev/null)
[ -n "$RID" ] || RID=missing
i=0; while [ $i -lt 600 ]; do C status "$RID" --json >"$TMP/out" 2>/dev/null && json '(d["step"] or 0) >= 2' && break; sleep 0.1; i=$((i + 1)); done
"$CTL" watch "$RID" --interval 0.2 >"$TMP/watch.out" 2>"$TMP/watch.err" &
WATCH_PID=$!
sleep 1
if stop_nsad && start_nsad; then ok "nsad restarts on the same state dir"; else not_ok "nsad restarts on the same state dir" "$(tail -5 "$TMP/nsad.log")"; fi
i=0; while [ $i -lt 600 ]; do C status "$RID" --json >"$TMP/out" 2>/dev/null && json 'd["state"] == "running" and d["restarts"] >= 1' && break; sleep 0.1; i=$((i + 1)); done
json 'd["state"] == "running" and d["restarts"] >= 1' && ok "the restarted nsad resumed the run (restarts >= 1)" || not_ok "the restarted nsad resumed the run (restarts >= 1)" "$(head -c 400 "$TMP/out")"
# start --wait blocks while its run is queued and returns once it started
"$CTL" start "$TMP/short.yaml" --name waiter --wait >"$TMP/wait.out" 2>"$TMP/wait.err" &
WAIT_PID=$!
i=0; while [ $i -lt 600 ]; do C list --json >"$TMP/out" 2>/dev/null && json 'len(d["queue"]) == 1' && break; sleep 0.1; i=$((i + 1)); done
json 'len(d["queue"]) == 1' && kill -0 "$WAIT_PID" 2>/dev/null && ok "start --wait: the run is queued and nsactl still waits" ||
    not_ok "start --wait: the run is queued and nsactl still waits" "$(head -c 400 "$TMP/out")" "$(cat "$TMP/wait.out" "$TMP/wait.err")"
expect_rc "halt --wait of the resumed run exits 0" 0 timeout 60 "$CTL" halt "$RID" --wait
i=0; while kill -0 "$WAIT_PID" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 "$WAIT_PID" 2>/dev/null; then
    kill "$WAIT_PID"; not_ok "start --wait returns once the queued run started"
else
    wait "$WAIT_PID"; rc=$?
    [ $rc -eq 0 ] && grep -q "^queued run" "$TMP/wait.out" && grep -Eq "is (running|completed)$" "$TMP/wait.out" &&
        ok "start --wait returns once the queued run started" ||
        not_ok "start --wait returns once the queued run started" "exit $rc" "$(cat "$TMP/wait.out" "$TMP/wait.err")"
fi
i=0; while kill -0 "$WATCH_PID" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 "$WATCH_PID" 2>/dev/null; then
    kill "$WATCH_PID"; not_ok "watch ends after the halt"
else
    wait "$WATCH_PID"; rc=$?
    [ $rc -eq 0 ] && tail -1 "$TMP/watch.out" | grep -q halted && grep -q "lost nsad" "$TMP/watch.err" &&
        ok "watch kept following across the restart and exited 0 at halted" ||
        not_ok "watch kept following across the restart and exited 0 at halted" "exit $rc" "$(tail -2 "$TMP/watch.out")" "$(cat "$TMP/watch.err")"
fi

# ---- the daemon goes away ----------------------------------------------------------------
stop_nsad && ok "nsad stops on SIGTERM within 30 s" || not_ok "nsad stops on SIGTERM within 30 s"
expect_rc "after nsad stopped, list exits 3" 3 C list
expect_rc "after nsad stopped, TCP status exits 3" 3 C --url "$URL" --token-file "$STATE/token" status

echo "1..$n"
[ "$failed" -eq 0 ]
