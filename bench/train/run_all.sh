#!/bin/sh
# run_all.sh - `make bench-train` on the GPU machine: the engine's training
# step (bench_train) and the dense PyTorch baseline (dense_train.py: cuDNN
# and FlashAttention-2 through SDPA, torch.compile) at each shape in one run,
# the measured bf16 matrix rate and copy bandwidth, the table (report.py)
# and the per-kernel breakdown of one step (breakdown.py, Nsight Compute).
#
#   bench/train/run_all.sh
# Environment (all optional):
#   TRAIN_SHAPES     "S:B ..." (default "2048:64 16384:8 65536:2"); B 0 takes
#                    the largest batch that fits (bench_train only; the dense
#                    run then takes the NSA run's B)
#   TRAIN_MAX_BATCH  1 (default) also runs bench_train at the largest batch
#                    that fits at each S
#   TRAIN_DENSE      "cudnn flash" (default): the dense backends to run
#   TRAIN_BREAKDOWN  "S:B ..." (default: every shape of TRAIN_SHAPES): shapes broken
#                    down per kernel
#   TRAIN_STEPS      timed steps (default 10)
#   TRAIN_RECOMPUTE  "S:B ..." (default "2048:64"): also timed with layer and
#                    with selective activation recompute
#   TRAIN_LARGEST    1 (default): the longest S that trains at B = 1 without,
#                    with selective and with layer activation recompute
# Writes train.jsonl, report.md, breakdown.md and the logs to $OUT (the lent
# machine's return folder) or build/bench/train-results.
set -u
cd "$(dirname "$0")/../.." || exit 1
out="${OUT:-build/bench/train-results}"
mkdir -p "$out"
bin=build/bench/bench_train
shapes="${TRAIN_SHAPES:-2048:64 16384:8 65536:2}"
dense="${TRAIN_DENSE-cudnn flash}"
breakdown="${TRAIN_BREAKDOWN-$shapes}"
steps="${TRAIN_STEPS:-10}"
results="$out/train.jsonl"
: >"$results"
: >"$out/errors.log"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$out/env.txt" 2>&1
date -u +"%Y-%m-%d %H:%M UTC" >>"$out/env.txt"
python3 -c 'import torch; print("torch", torch.__version__)' >>"$out/env.txt" 2>&1
cat "$out/env.txt"

python3 bench/train/dense_train.py --ceiling >>"$results" 2>>"$out/errors.log"
for shape in $shapes; do
    S=${shape%%:*}; B=${shape##*:}
    line=$("$bin" --seq "$S" --batch "$B" --steps "$steps" 2>>"$out/errors.log")
    echo "$line" | tee -a "$results"
    if [ "${TRAIN_MAX_BATCH:-1}" = 1 ] && [ "$B" != 0 ]; then
        "$bin" --seq "$S" --batch 0 --steps "$steps" 2>>"$out/errors.log" | tee -a "$results"
    fi
    [ "$B" = 0 ] && B=$(echo "$line" | sed -n 's/.*"B": \([0-9]*\).*/\1/p')
    for backend in $dense; do
        python3 bench/train/dense_train.py --seq "$S" --batch "$B" --backend "$backend" \
            --steps "$steps" 2>>"$out/errors.log" | tee -a "$results"
    done
done
for shape in ${TRAIN_RECOMPUTE-2048:64}; do
    for flag in --recompute --selective-recompute; do
        "$bin" --seq "${shape%%:*}" --batch "${shape##*:}" --steps "$steps" $flag \
            2>>"$out/errors.log" | tee -a "$results"
    done
done
if [ "${TRAIN_LARGEST:-1}" = 1 ]; then
    for flag in "" --selective-recompute --recompute; do
        "$bin" --largest-seq $flag 2>>"$out/errors.log" | tee -a "$results"
    done
fi
python3 bench/train/report.py "$results" | tee "$out/report.md"

ceiling=$(sed -n 's/.*"bf16_tflops": \([0-9.]*\).*/\1/p' "$results" | head -1)
copy=$(sed -n 's/.*"copy_tbs": \([0-9.]*\).*/\1/p' "$results" | head -1)
: >"$out/breakdown.md"
for shape in $breakdown; do
    S=${shape%%:*}; B=${shape##*:}
    ms=$(grep "\"impl\": \"nsa\", \"S\": $S, \"B\": $B," "$results" | sed -n 's/.*"ms_step": \([0-9.]*\).*/\1/p' | head -1)
    if [ -z "$ms" ]; then
        echo "breakdown $S:$B: no bench_train line at that shape in this run" | tee -a "$out/breakdown.md"
        continue
    fi
    python3 bench/train/breakdown.py "$bin" --seq "$S" --batch "$B" --step-ms "$ms" \
        --tflops "$ceiling" --tbs "$copy" --csv-out "$out/ncu-$S-$B.csv" | tee -a "$out/breakdown.md"
done
if [ -s "$out/errors.log" ]; then
    echo "errors.log:"; tail -20 "$out/errors.log"
fi
