#!/bin/sh
# test_gpu_sources.sh - the programs that only run on the GPU machine
# (tests/gpu/*.cu: the engine's checks, benchmark and training driver, the
# fast attention op's checks; bench/attn/bench_nsa.cu, bench/decode/bench_decode.cu)
# still compile here,
# so that a change to a header they share with the engine cannot break them
# unnoticed between GPU sessions. Each is compiled to an object by the rule
# its own Makefile uses, for sm_90a only (the kernels they link against are
# compiled by the engine build for every architecture); linking needs the
# whole engine rebuilt with nvcc and is left to the GPU machine.
# Prints TAP; a missing nvcc skips (the engine then builds without CUDA).
set -u
cd "$(dirname "$0")/../.." || exit 1
NVCC=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)

n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; sed 's/^/# /' "$2" | tail -20; }

TMP=$(mktemp -d /tmp/nsa-gpu-sources.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM HUP

programs=$(for f in tests/gpu/*.cu; do basename "$f" .cu; done)
if [ -z "$NVCC" ]; then
    for p in $programs; do skip "tests/gpu/$p.cu compiles" "no nvcc"; done
    skip "bench/attn/bench_nsa.cu compiles" "no nvcc"
    skip "bench/decode/bench_decode.cu compiles" "no nvcc"
    echo "1..$n"
    exit 0
fi
for p in $programs; do
    if make --no-print-directory -C tests/gpu NVCC="$NVCC" OUTDIR="$TMP/gpu" "$TMP/gpu/$p.o" \
        >"$TMP/$p.log" 2>&1 && [ -s "$TMP/gpu/$p.o" ]; then
        ok "tests/gpu/$p.cu compiles"
    else
        not_ok "tests/gpu/$p.cu compiles" "$TMP/$p.log"
    fi
done
# bench/Makefile links bench_nsa in one step; the same flags, compile only
if "$NVCC" -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
    -DNSA_HAVE_CUDA -Ikernels -Xcompiler -Wall,-Wextra,-Wno-unused-parameter \
    -c bench/attn/bench_nsa.cu -o "$TMP/bench_nsa.o" >"$TMP/bench_nsa.log" 2>&1; then
    ok "bench/attn/bench_nsa.cu compiles"
else
    not_ok "bench/attn/bench_nsa.cu compiles" "$TMP/bench_nsa.log"
fi
# bench/decode builds through tests/gpu/Makefile (bench-decode-build)
if make --no-print-directory -C tests/gpu NVCC="$NVCC" OUTDIR="$TMP/gpu" "$TMP/gpu/bench_decode.o" \
    >"$TMP/bench_decode.log" 2>&1 && [ -s "$TMP/gpu/bench_decode.o" ]; then
    ok "bench/decode/bench_decode.cu compiles"
else
    not_ok "bench/decode/bench_decode.cu compiles" "$TMP/bench_decode.log"
fi
echo "1..$n"
[ "$failed" -eq 0 ]
