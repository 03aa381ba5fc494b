#!/bin/sh
# run_all.sh - issue 7 in one command on the GPU machine: build the fast NSA
# attention, check it against the CPU reference, time it against dense
# PyTorch attention (FA2, cuDNN), print the merged table, then the time of
# each kernel (Nsight Compute).
#   bench/attn/run_all.sh [all|test|bench|nsa]
# Writes env.txt (device, SASS summary), build.log, test.log, nsa.jsonl,
# dense.jsonl, errors.log, report.md and kernels.md (per kernel, by ncu) to
# $OUT (the lent machine's return folder) or build/bench/results.
# BENCH_ARGS / DENSE_ARGS pass options through (e.g. BENCH_ARGS="--reps 5
# --seq 2048,65536").
set -u
cd "$(dirname "$0")/../.." || exit 1
# The lent GPU machines are Hopper: the engine (libnsa.a, built by the
# top-level Makefile) for sm_90a alone, not also for Ampere, halves nvcc's
# time there. GENCODE set by the caller wins.
export GENCODE="${GENCODE:--gencode arch=compute_90a,code=sm_90a}"
out="${OUT:-build/bench/results}"
mkdir -p "$out"
mode="${1:-all}"
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$out/env.txt" 2>&1
if ! make --no-print-directory -C bench -j"$(nproc)" build >"$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    exit 1
fi
# which tensor-core instructions the fast kernels use (HMMA = mma.sync, HGMMA = wgmma)
if command -v cuobjdump >/dev/null 2>&1; then
    for o in build/obj/kernels/cuda/fast_*.o; do
        printf '%s: ' "$(basename "$o")"
        cuobjdump -sass "$o" | grep -oE '(HGMMA|HMMA|LDSM|LDGSTS)[.A-Z0-9]*' | sort | uniq -c | tr -s ' \n' ' '
        echo
    done >>"$out/env.txt"
fi
cat "$out/env.txt"
: >"$out/errors.log"
if [ "$mode" = all ] || [ "$mode" = test ]; then
    # the wgmma building blocks first (a layout error shows there plainly)
    build/bench/test_wgmma >"$out/test_wgmma.log" 2>&1 || status=1
    echo "test_wgmma: $(tail -1 "$out/test_wgmma.log")"
    build/bench/test_sel_index >"$out/test_sel_index.log" 2>&1 || status=1
    echo "test_sel_index: $(tail -1 "$out/test_sel_index.log")"
    # one process per case and design (the fp32 CPU reference is the slow
    # part): auto picks the selected kernels by shape, union / warp / block /
    # dense force one at every shape (dense where it applies); each runs on
    # the device's default tensor-core path (wgmma on sm_90), auto once
    # more on mma.sync, and block once more with the selected dK/dV and dQ
    # as two passes (unfused), and auto and block once more with the
    # compressed dK/dV in 3 parts (the model picks per shape otherwise), and
    # block once more in chunks of 256 tokens (many chunks at every S, so
    # that the combines' drain refills its two buffers). These are the
    # plan's options (NsaAttnCudaOptions in kernels/nsa.h), given to
    # test_fast_attn as flags; a design reads sel[/mma[/fused[/parts[/chunk]]]].
    # A run that outlasts 900 s (the longest case takes about 140 s alone)
    # counts as a failure: a pass that hangs must not stall the command.
    # At most one process per CPU at a time: each holds a CUDA context,
    # and a hundred at once ran the GPU out of memory (a case then bails
    # out at its first cudaMalloc - a false failure).
    n=$(build/bench/test_fast_attn --count)
    tmp=$(mktemp -d)
    designs="auto union warp block dense auto/sync block/auto/0 auto/auto/1/3 block/auto/1/3 block/auto/1/auto/256"
    for design in $designs; do
        i=0
        while [ "$i" -lt "$n" ]; do
            echo "$design $i"
            i=$((i + 1))
        done
    done | xargs -P "$(nproc)" -L 1 sh -c '
        IFS=/ read -r sel mma fused parts chunk <<DESIGN
$0
DESIGN
        flags="--sel $sel --mma ${mma:-auto} --cmp-parts $( [ "${parts:-auto}" = auto ] && echo 0 || echo "$parts") --sel-chunk-tokens $( [ "${chunk:-auto}" = auto ] && echo 0 || echo "$chunk")"
        [ "${fused:-1}" = 1 ] || flags="$flags --unfused"
        # shellcheck disable=SC2086
        timeout 900 build/bench/test_fast_attn "$1" $flags \
            >"'"$tmp"'/${sel}_${mma:-auto}_${fused:-1}_${parts:-auto}_${chunk:-auto}.$1.log" 2>&1
        [ $? -ne 124 ] || echo "Bail out! case $1 ran past 900 s (a hung pass?)" \
            >>"'"$tmp"'/${sel}_${mma:-auto}_${fused:-1}_${parts:-auto}_${chunk:-auto}.$1.log"'
    for design in $designs; do
        IFS=/ read -r sel mma fused parts chunk <<DESIGN
$design
DESIGN
        tag="${sel}_${mma:-auto}_${fused:-1}_${parts:-auto}_${chunk:-auto}"
        echo "# sel $sel, mma ${mma:-auto}, fused ${fused:-1}, cmp parts ${parts:-auto}, sel chunk tokens ${chunk:-auto}" >>"$out/test.log"
        i=0
        while [ "$i" -lt "$n" ]; do
            cat "$tmp/$tag.$i.log" >>"$out/test.log"
            i=$((i + 1))
        done
        echo "test[$sel, ${mma:-auto}, fused ${fused:-1}, parts ${parts:-auto}, chunk ${chunk:-auto}]: $(cat "$tmp/$tag".*.log | grep -c '^ok') ok, $(cat "$tmp/$tag".*.log | grep -cE '^(not ok|Bail)') not ok"
    done
    rm -rf "$tmp"
    grep -E '^(not ok|Bail)' "$out/test.log"
    bad=$(grep -cE '^(not ok|Bail)' "$out/test.log")
    echo "test: $(grep -c '^ok' "$out/test.log") ok, $bad not ok"
    [ "$bad" -eq 0 ] || status=1
fi
if [ "$mode" = all ] || [ "$mode" = bench ] || [ "$mode" = nsa ]; then
    # shellcheck disable=SC2086
    build/bench/bench_nsa ${BENCH_ARGS:-} >"$out/nsa.jsonl" 2>>"$out/errors.log" || status=1
    if [ "$mode" != nsa ]; then
        # shellcheck disable=SC2086
        PYTHONUNBUFFERED=1 python3 bench/attn/dense_sdpa.py ${DENSE_ARGS:-} >"$out/dense.jsonl" 2>>"$out/errors.log" || status=1
    fi
    tail -5 "$out/errors.log"
    python3 bench/attn/report.py "$out/nsa.jsonl" "$out/dense.jsonl" >"$out/report.md" 2>&1 || status=1
    cat "$out/report.md"
    # per kernel of one forward + backward at the longest S (Nsight
    # Compute; KERNEL_SHAPES / KERNEL_SEQ choose others)
    if command -v ncu >/dev/null 2>&1; then
        python3 bench/attn/kernels.py build/bench/bench_nsa --shapes "${KERNEL_SHAPES:-paper,paper192,proto}" \
            --seq "${KERNEL_SEQ:-65536}" >"$out/kernels.md" 2>&1 || status=1
        cat "$out/kernels.md"
    else
        echo "per-kernel breakdown: skipped - ncu (Nsight Compute) is not on PATH"
    fi
fi
exit $status
