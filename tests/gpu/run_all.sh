#!/bin/bash
# run_all.sh - on the GPU machine: build tests/gpu, run every check, the
# timings and (optionally) the training run; logs under $OUT (or
# build/gpu-out); prints a short table at the end.
#
#   tests/gpu/run_all.sh [tests] [bench] [long] [train STEPS B|auto SECONDS] [budget SECONDS]
# With no argument: tests and bench. The stages always run in this order:
# tests, bench (S = 2048: bf16 B 1 and 2, fp16 and f32 B 1), long (bf16
# S = 8192 and 32768), train. `train 1000 1 500` trains the production
# config at B=1, S=2048 for at most 500 s of this call, resuming from and
# saving to build/gpu-train.state (kept on a warm machine between calls;
# delete it to start over); `auto` picks B from the S=2048 bench so that the
# steps fit in SECONDS. `budget N` caps the whole call at N seconds: the
# training gets what the earlier stages left (minus a margin), so a single
# bounded device call still ends with its logs written.
set -u
cd "$(dirname "$0")/../.."
# The lent GPU machines are Hopper: the engine (libnsa.a, built by the
# top-level Makefile) for sm_90a alone, not also for Ampere, halves nvcc's
# time there. GENCODE set by the caller wins.
export GENCODE="${GENCODE:--gencode arch=compute_90a,code=sm_90a}"
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
BIN=build/gpu-tests
want_tests=0; want_bench=0; want_long=0; train_steps=0; train_b=4; train_secs=100000; budget=0
[ $# -eq 0 ] && { want_tests=1; want_bench=1; }
while [ $# -gt 0 ]; do
    case "$1" in
        tests) want_tests=1 ;;
        bench) want_bench=1 ;;
        train) train_steps=$2; train_b=$3; train_secs=$4; shift 3 ;;
        long) want_long=1 ;;
        budget) budget=$2; shift ;;
        *) echo "unknown stage $1"; exit 2 ;;
    esac
    shift
done
t_start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t_start) )); }
summary=()
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
date -u +"%Y-%m-%d %H:%M UTC" >>"$OUT/device.txt"
t0=$(date +%s)
if ! make -C tests/gpu -j16 all >"$OUT/build.log" 2>&1; then
    grep -E "error|Error" "$OUT/build.log" | head -30
    echo "BUILD FAILED"; exit 1
fi
summary+=("build: ok ($(( $(date +%s) - t0 )) s)")
echo "build: $(( $(date +%s) - t0 )) s"
if [ $want_tests -eq 1 ]; then
    t0=$(date +%s)
    timeout 150 $BIN/gpu_tests >"$OUT/tests.log" 2>&1
    rc=$?
    grep -E "^not ok|FATAL" "$OUT/tests.log" | head -20
    sed -n '/^#    test/,$p' "$OUT/tests.log" | tail -60
    summary+=("tests: $(tail -1 "$OUT/tests.log") (rc $rc, $(( $(date +%s) - t0 )) s)")
    echo "tests: $(tail -1 "$OUT/tests.log") (rc $rc, $(( $(date +%s) - t0 )) s)"
fi
bench() {   # S B steps precision limit
    timeout "$5" $BIN/gpu_bench "$1" "$2" "$3" "$4" >>"$OUT/bench.log" 2>&1 ||
        echo "bench $1 $2 $3 $4 failed (rc $?)" >>"$OUT/bench.log"
    grep -E "^BENCH S=$1 B=$2 prec=$4 |^bench $1 $2 $3 $4 failed" "$OUT/bench.log" | tail -1
}
if [ $want_bench -eq 1 ]; then
    : >"$OUT/bench.log"
    bench 2048 1 6 bf16 90
    bench 2048 2 4 bf16 90
    bench 2048 1 4 fp16 60
    bench 2048 1 3 f32 60
    grep -E "^# plan|^# attention" "$OUT/bench.log" | head -2
    summary+=("bench: $(grep -c '^BENCH' "$OUT/bench.log") configs timed")
fi
if [ $want_long -eq 1 ]; then
    bench 8192 1 3 bf16 90
    bench 32768 1 2 bf16 120
fi
if [ "$train_steps" -gt 0 ]; then
    if [ "$budget" -gt 0 ]; then
        avail=$(( $(left) - 20 ))
        [ "$avail" -lt "$train_secs" ] && train_secs=$avail
        echo "train: $train_secs s of the budget left"
    fi
    if [ "$train_b" = auto ]; then
        ms=$(grep '^BENCH S=2048 B=1 prec=bf16 ' "$OUT/bench.log" | sed 's/.*ms_step=\([0-9.]*\).*/\1/')
        train_b=$(python3 -c "print(max(1, min(16, int(0.8 * $train_secs * 1000 / ($train_steps * ${ms:-1000})))))")
        echo "train: S=2048 step ${ms} ms at B=1 -> B=$train_b"
    fi
    $BIN/gpu_train build/data/fortunes.txt "$train_steps" "$train_b" 2048 "$train_secs" \
        build/gpu-train.state >"$OUT/train.log" 2>&1
    grep -E "^step +(1|25|100|250|500|750|1000) |^val|^TRAIN|^#" "$OUT/train.log"
    summary+=("train: $(tail -1 "$OUT/train.log")")
fi
echo
echo "==== summary ($(head -1 "$OUT/device.txt"))"
for s in "${summary[@]}"; do echo "  $s"; done
