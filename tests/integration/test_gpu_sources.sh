#!/bin/sh
# test_gpu_sources.sh - the programs that only run on the GPU machine
# (tests/gpu/*.cu: the engine's checks, benchmark and training driver, the
# decoder's and the fast attention op's checks, the data-parallel driver;
# bench/attn/bench_nsa.cu, bench/train/bench_train.cu,
# bench/decode/bench_decode.cu) still compile
# and link here, so that a change to a header or an engine function they
# use cannot break them unnoticed between GPU sessions. They link the engine
# this build made (build/libnsa.a, every kernels/cuda/*.cu compiled once,
# by the top-level Makefile): their Makefiles compile no engine source of
# their own, which is checked too. `make test` builds them in its parallel
# build; here they are brought up to date (a no-op then) and must exist.
# Prints TAP; a missing nvcc skips (the engine then builds without CUDA).
set -u
cd "$(dirname "$0")/../.." || exit 1
NVCC=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)

. tests/integration/tap.sh
# not_ok with a log file: its last 20 lines as the detail
not_ok_log() { not_ok "$1"; tail -20 "$2" | sed 's/^/# /'; }

TMP=$(mktemp -d /tmp/nsa-gpu-sources.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM HUP

gpu_programs="gpu_tests gpu_bench gpu_train test_decode gpu_dp bench_decode"  # tests/gpu/Makefile
bench_programs="bench_nsa bench_train test_fast_attn test_sel_index test_wgmma" # bench/Makefile
# This build's engine: with CUDA only when nvcc built it (`make NVCC= test`
# builds without, and then the GPU programs have nothing to link).
why=""
[ -n "$NVCC" ] || why="no nvcc"
[ -z "$why" ] && ! ar t build/libnsa.a 2>/dev/null | grep -qx 'cuda_engine.o' &&
    why="build/libnsa.a has no CUDA engine (built with NVCC= or not built)"
if [ -n "$why" ]; then
    for p in $gpu_programs; do skip "tests/gpu: $p compiles and links" "$why"; done
    for p in $bench_programs; do skip "bench: $p compiles and links" "$why"; done
    skip "tests/gpu and bench compile no engine source of their own" "$why"
    echo "1..$n"
    exit 0
fi

# the engine is compiled once: the programs' Makefiles, from scratch, only
# compile the programs themselves and link build/libnsa.a
{
    make --no-print-directory -n -C tests/gpu NVCC="$NVCC" OUTDIR="$TMP/gpu" all
    make --no-print-directory -n -C bench NVCC="$NVCC" OUTDIR="$TMP/bench" build
} >"$TMP/plan.log" 2>&1
if grep -Eq -- '-c [^ ]*kernels/' "$TMP/plan.log" || ! grep -q 'libnsa.a' "$TMP/plan.log"; then
    grep -E -- '-c [^ ]*kernels/' "$TMP/plan.log" >"$TMP/engine.log"
    [ -s "$TMP/engine.log" ] || cp "$TMP/plan.log" "$TMP/engine.log"
    not_ok_log "tests/gpu and bench compile no engine source of their own (they link build/libnsa.a)" "$TMP/engine.log"
else
    ok "tests/gpu and bench compile no engine source of their own (they link build/libnsa.a)"
fi

make --no-print-directory -C tests/gpu NVCC="$NVCC" all >"$TMP/gpu.log" 2>&1
for p in $gpu_programs; do
    if [ -x "build/gpu-tests/$p" ]; then
        ok "tests/gpu: $p compiles and links against build/libnsa.a"
    else
        not_ok_log "tests/gpu: $p compiles and links against build/libnsa.a" "$TMP/gpu.log"
    fi
done
make --no-print-directory -C bench NVCC="$NVCC" build >"$TMP/bench.log" 2>&1
for p in $bench_programs; do
    if [ -x "build/bench/$p" ]; then
        ok "bench: $p compiles and links"
    else
        not_ok_log "bench: $p compiles and links" "$TMP/bench.log"
    fi
done
echo "1..$n"
[ "$failed" -eq 0 ]
