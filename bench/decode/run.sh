#!/bin/sh
# run.sh - `make bench-decode` on the GPU machine: NSA decode (bench_decode)
# against a dense-attention KV-cache decode of the same model in PyTorch
# (dense_decode.py: eager and CUDA-graph), batch 1 and 16, context 2k, 16k
# and 64k; prints the table (report.py) with tokens/s, per-token latency,
# KV bytes read per token and the speed-up over each dense run.
#   bench/decode/run.sh [CONTEXTS] [BATCHES]     e.g. run.sh "2048 65536" "1"
# Logs and decode.jsonl land in $OUT (the lent machine's return folder) or
# build/bench/decode.
set -u
cd "$(dirname "$0")/../.." || exit 1
# The lent GPU machines are Hopper: the engine (libnsa.a, built by the
# top-level Makefile) for sm_90a alone, not also for Ampere, halves nvcc's
# time there. GENCODE set by the caller wins.
export GENCODE="${GENCODE:--gencode arch=compute_90a,code=sm_90a}"
out="${OUT:-build/bench/decode}"
mkdir -p "$out"
contexts="${1:-2048 16384 65536}"
batches="${2:-1 16}"
bin=build/gpu-tests/bench_decode
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/env.txt" 2>&1
date -u +"%Y-%m-%d %H:%M UTC" >>"$out/env.txt"
cat "$out/env.txt"
if ! make --no-print-directory -C tests/gpu -j"$(nproc)" bench-decode-build >"$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    exit 1
fi
: >"$out/decode.jsonl"
status=0
for b in $batches; do
    for c in $contexts; do
        for run in "$bin $c $b" "python3 bench/decode/dense_decode.py $c $b --mode graph" \
                   "python3 bench/decode/dense_decode.py $c $b --mode eager"; do
            if ! timeout 600 $run >>"$out/decode.jsonl" 2>>"$out/errors.log"; then
                echo "failed: $run (see $out/errors.log)"
                status=1
            fi
        done
    done
done
python3 bench/decode/report.py "$out/decode.jsonl" | tee "$out/report.md"
exit $status
