#!/bin/bash
# dp_multinode.sh - the multi-node path on one 2-GPU host (issue 40): two
# nsad daemons, one GPU each (CUDA_VISIBLE_DEVICES), joined through the API
# over loopback (nsactl start --nodes), train the production config, and
# their losses must equal, bit for bit, one nsad driving both GPUs (two
# ranks: every sum is a + b, whatever the transport's path). Needs build/nsad
# and build/nsactl built with the CUDA engine and NCCL on this machine
# (`make all`: the daemon's libraries - libyaml, libmicrohttpd, cJSON,
# libcurl - must be installed or unpacked where the Makefile finds them).
#
#   tests/gpu/dp_multinode.sh [STEPS]      prints "DP NODES PASS|FAIL|SKIP ..."
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
OUT=${OUT:-build/gpu-out}
TEXT=${TEXT:-$PWD/build/data/fortunes.txt}
STEPS=${1:-50}
mkdir -p "$OUT"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -ge 2 ] || { echo "DP NODES SKIP: needs 2 GPUs, $gpus here"; exit 0; }
for b in build/nsad build/nsactl; do
    [ -x "$b" ] || { echo "DP NODES SKIP: $b is not built (make all, with the daemon's libraries)"; exit 0; }
done
build/nsad serve --help >/dev/null 2>&1 || { echo "DP NODES SKIP: build/nsad does not run here"; exit 0; }

work=$(mktemp -d /tmp/nsad-nodes.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; }
trap cleanup EXIT
token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
daemon() { # name, CUDA_VISIBLE_DEVICES
    mkdir -p "$work/$1"
    printf '%s\n' "$token" >"$work/$1/token"; chmod 600 "$work/$1/token"
    local p; p=$(port)
    CUDA_VISIBLE_DEVICES=$2 build/nsad serve --listen "127.0.0.1:$p" --state-dir "$work/$1" \
        --socket "$work/$1/sock" >"$OUT/dp-nodes-$1.log" 2>&1 &
    pids+=($!)
    echo "$p"
}
pa=$(daemon a 0)
pb=$(daemon b 1)
pc=$(daemon c 0,1)
sleep 3

# the production model (configs/prototype-125m.yaml's shape) on real text
job() { # gpus
    cat <<EOF
model: {dim: 768, n_layers: 12, n_heads: 12, n_kv_groups: 2, d_k: 64, d_v: 64}
nsa: {l: 32, d: 16, l_sel: 64, n_sel: 16, w: 512, phi: avg}
train: {steps: $STEPS, seq_len: 2048, batch_size: 4, lr: 6.0e-4, seed: 1337, log_every: 1,
        warmup_steps: 20, eval_every: 0, save_every: 0}
runtime: {device: cuda, precision: bf16, gpus: $1}
data: {source: text, path: "$TEXT", tokenizer: byte}
watchdog: {allreduce: 120}
EOF
}
job 1 >"$work/one-gpu.yaml"
job 2 >"$work/two-gpus.yaml"
ctl() { build/nsactl --socket "$work/$1/sock" "${@:2}"; }
id_nodes=$(ctl a start "$work/one-gpu.yaml" --nodes "127.0.0.1:$pb" --json |
           python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
id_one=$(ctl c start "$work/two-gpus.yaml" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
state() { ctl "$1" status "$2" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'; }
for _ in $(seq 1 1800); do
    sa=$(state a "$id_nodes"); sc=$(state c "$id_one")
    case "$sa$sc" in *starting*|*running*|*halting*) sleep 1 ;; *) break ;; esac
done
csv_a="$work/a/runs/$id_nodes/out/training.csv"
csv_c="$work/c/runs/$id_one/out/training.csv"
if [ "$sa" = completed ] && [ "$sc" = completed ] &&
   diff <(cut -d, -f1,2 "$csv_a") <(cut -d, -f1,2 "$csv_c") >"$OUT/dp-nodes.diff"; then
    echo "DP NODES PASS: 2 nsad x 1 GPU joined over loopback = 1 nsad x 2 GPUs, $STEPS steps bit for bit"
    ctl a status "$id_nodes" | grep -A3 ranks
    exit 0
fi
echo "DP NODES FAIL: nodes run $sa, one-daemon run $sc (see $OUT/dp-nodes.diff and dp-nodes-*.log)"
exit 1
