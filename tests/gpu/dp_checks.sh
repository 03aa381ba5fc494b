#!/bin/bash
# dp_checks.sh - the data-parallel checks of the CUDA engine on the GPU
# machine (issue 40), one command each; logs under $OUT (or build/gpu-out).
#
#   tests/gpu/dp_checks.sh world1            one GPU: NCCL world 1 == the engine alone, bit for bit
#   tests/gpu/dp_checks.sh agree [N] [STEPS] N GPUs vs 1 GPU accumulating (default all GPUs, 200 steps)
#   tests/gpu/dp_checks.sh repeat [N]        two N-GPU runs are bit-identical
#   tests/gpu/dp_checks.sh resume [N]        kill -9 mid-run, resume: bit-identical to uninterrupted
#   tests/gpu/dp_checks.sh procs             2 processes of 1 GPU == 1 process of 2 GPUs, bit for bit
#   tests/gpu/dp_checks.sh faults [N]        a rank that stalls, a rank that exits, kill -9 of a
#                                            rank's process: the others fail by the deadline
#   tests/gpu/dp_checks.sh all               every check above (multi-GPU ones skip on 1 GPU)
# Each prints one "DP ... PASS|FAIL|SKIP" line per check. NCCL_NVLS_ENABLE=0
# (NVLink multicast off) unless already set. The text is build/data/fortunes.txt
# (scripts/make-corpus.sh; carry it to the GPU machine) or $TEXT.
set -u
cd "$(dirname "$0")/../.."
# The lent GPU machines are Hopper: the engine (libnsa.a, built by the
# top-level Makefile) for sm_90a alone, not also for Ampere, halves nvcc's
# time there. GENCODE set by the caller wins.
export GENCODE="${GENCODE:--gencode arch=compute_90a,code=sm_90a}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
OUT=${OUT:-build/gpu-out}
TEXT=${TEXT:-build/data/fortunes.txt}
BIN=build/gpu-tests/gpu_dp
mkdir -p "$OUT"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -ge 1 ] || { echo "DP SKIP: no GPU"; exit 0; }
make -C tests/gpu -j16 ../../build/gpu-tests/gpu_dp >"$OUT/dp-build.log" 2>&1 ||
    { grep -E "error" "$OUT/dp-build.log" | head -20; echo "DP BUILD FAIL"; exit 1; }
what=${1:-all}
N=${2:-$gpus}
failed=0
need2() { if [ "$gpus" -lt 2 ]; then echo "DP $1 SKIP: needs 2 GPUs, $gpus here"; return 1; fi; }
run() { # name, command...
    local name=$1; shift
    "$@" >"$OUT/dp-$name.log" 2>&1
    grep -E "^DP |^# rank" "$OUT/dp-$name.log" | tail -4
    grep -q "^DP .* PASS" "$OUT/dp-$name.log" || failed=$((failed + 1))
}

if [ "$what" = world1 ] || [ "$what" = all ]; then
    run world1 timeout 600 $BIN world1 10 "$TEXT"
fi
if [ "$what" = agree ] || [ "$what" = all ]; then
    need2 AGREE && run agree timeout 3000 $BIN agree "$N" "${3:-200}" "$TEXT"
fi
if [ "$what" = repeat ] || [ "$what" = all ]; then
    need2 REPEAT && run repeat timeout 1200 $BIN repeat "$N" 30 "$TEXT"
fi
if [ "$what" = resume ] || [ "$what" = all ]; then
    if need2 RESUME; then
        st="$OUT/dp-resume.state"
        rm -f "$st" "$st.tmp"
        timeout 1200 $BIN train "$N" 40 "$OUT/dp-full.state" 0 "$TEXT" >"$OUT/dp-full.log" 2>&1
        # the same run, killed with -9 after its second save (step 20), then resumed
        $BIN train "$N" 40 "$st" 10 "$TEXT" >"$OUT/dp-killed.log" 2>&1 &
        pid=$!
        for _ in $(seq 1 1200); do grep -q "^saved 20" "$OUT/dp-killed.log" && break; sleep 0.5; done
        kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
        timeout 1200 $BIN train "$N" 40 "$st" 10 "$TEXT" >"$OUT/dp-resumed.log" 2>&1
        from=$(sed -n 's/^resumed after step \([0-9]*\)/\1/p' "$OUT/dp-resumed.log")
        if [ -n "$from" ] && grep -q "^DP TRAIN DONE" "$OUT/dp-resumed.log"; then
            diff <(awk -v f="$from" '$1 == "loss" && $2 > f {print $2, $3}' "$OUT/dp-full.log") \
                 <(awk '$1 == "loss" {print $2, $3}' "$OUT/dp-resumed.log") >"$OUT/dp-resume.diff" &&
            [ "$(grep '^DP TRAIN' "$OUT/dp-full.log" | awk '{print $NF}')" = \
              "$(grep '^DP TRAIN' "$OUT/dp-resumed.log" | awk '{print $NF}')" ] &&
                echo "DP RESUME PASS gpus=$N killed after step $from: steps $((from + 1))-40 and the final weights bit-identical" ||
                { echo "DP RESUME FAIL (see $OUT/dp-resume.diff)"; failed=$((failed + 1)); }
        else
            echo "DP RESUME FAIL (no resume: see $OUT/dp-resumed.log)"; failed=$((failed + 1))
        fi
    fi
fi
if [ "$what" = procs ] || [ "$what" = all ]; then
    # the same job as 2 processes of one GPU each (NCCL across processes,
    # as two nodes' nsad run it) and as one process driving 2 GPUs
    if need2 PROCS; then
        idf="$OUT/dp-procs.id"; rm -f "$idf"
        CUDA_VISIBLE_DEVICES=0 timeout 900 $BIN proc 0 2 "$idf" 20 "$TEXT" >"$OUT/dp-procs0.log" 2>&1 &
        p0=$!
        CUDA_VISIBLE_DEVICES=1 timeout 900 $BIN proc 1 2 "$idf" 20 "$TEXT" >"$OUT/dp-procs1.log" 2>&1
        wait $p0
        timeout 900 $BIN train 2 20 "$OUT/dp-procs-none.state" 0 "$TEXT" >"$OUT/dp-procs-one.log" 2>&1
        if grep -q "^DP PROC rank 0 DONE" "$OUT/dp-procs0.log" &&
           diff <(awk '$1 == "loss" {print $2, $3}' "$OUT/dp-procs0.log") \
                <(awk '$1 == "loss" {print $2, $3}' "$OUT/dp-procs-one.log") >"$OUT/dp-procs.diff"; then
            echo "DP PROCS PASS: 2 processes x 1 GPU = 1 process x 2 GPUs, 20 steps bit for bit"
        else
            echo "DP PROCS FAIL (see $OUT/dp-procs.diff, dp-procs0.log)"; failed=$((failed + 1))
        fi
    fi
fi
if [ "$what" = faults ] || [ "$what" = all ]; then
    if need2 FAULTS; then
        run stall timeout 600 env DP_TIMEOUT=10 $BIN stall "$N" "$TEXT"
        run exit timeout 600 env DP_TIMEOUT=10 $BIN exit "$N" "$TEXT"
        # kill -9 of one rank's process (a node's nsad dying): rank 0 must fail by its deadline
        idf="$OUT/dp-proc.id"; rm -f "$idf"
        CUDA_VISIBLE_DEVICES=0 DP_TIMEOUT=15 $BIN proc 0 2 "$idf" 200 "$TEXT" >"$OUT/dp-proc0.log" 2>&1 &
        p0=$!
        CUDA_VISIBLE_DEVICES=1 DP_TIMEOUT=15 $BIN proc 1 2 "$idf" 200 "$TEXT" >"$OUT/dp-proc1.log" 2>&1 &
        p1=$!
        for _ in $(seq 1 1200); do grep -q "^rank 1 step 5 " "$OUT/dp-proc1.log" && break; sleep 0.5; done
        t0=$(date +%s)
        kill -9 $p1 2>/dev/null
        if timeout 300 tail --pid=$p0 -f /dev/null; then
            took=$(( $(date +%s) - t0 ))
            if grep -q "^DP PROC rank 0 FAILED" "$OUT/dp-proc0.log"; then
                echo "DP KILL9 PASS: rank 0 failed ${took} s after rank 1's process was killed (deadline 15 s): $(grep '^DP PROC rank 0' "$OUT/dp-proc0.log" | cut -c1-200)"
            else
                echo "DP KILL9 FAIL: rank 0 did not report the lost peer"; failed=$((failed + 1))
            fi
        else
            kill -9 $p0 2>/dev/null
            echo "DP KILL9 FAIL: rank 0 still running 300 s after its peer died (a hang)"; failed=$((failed + 1))
        fi
    fi
fi
echo "dp_checks: $failed failed"
[ "$failed" -eq 0 ]
