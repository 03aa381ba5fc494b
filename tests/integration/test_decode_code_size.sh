#!/bin/sh
# test_decode_code_size.sh - every function of the CUDA decoder
# (kernels/cuda/decode/*.cu) compiles to at most CODE_BUDGET bytes of sm_90a
# machine code.
#
# Why a size: a decode step is a chain of ~125 short launches, and each CTA
# runs its kernel's code about once, fetched anew at every launch, so a
# kernel's length is time on every step. Loops unrolled for the largest
# supported shape (16 heads of 256 dims) had made the selected + window
# kernel ~145 KB, and ncu found its warps waiting for instructions more than
# for anything else; 6b73b04 brought it to ~38 KB. This catches the next
# such loop on a machine without a GPU. The budget has headroom over the
# largest function today (~44 KB) for other nvcc versions.
# Prints TAP; a missing nvcc or readelf skips.
set -u
cd "$(dirname "$0")/../.." || exit 1
CODE_BUDGET=65536
NVCC=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)

. tests/integration/tap.sh

sources=$(ls kernels/cuda/decode/*.cu)
why=""
[ -n "$NVCC" ] || why="no nvcc"
command -v readelf >/dev/null 2>&1 || why="${why:+$why, }no readelf"
if [ -n "$why" ]; then
    for f in $sources; do skip "$f: every function at most $CODE_BUDGET bytes of sm_90a code" "$why"; done
    echo "1..$n"
    exit 0
fi

TMP=$(mktemp -d /tmp/nsa-code-size.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM HUP

demangle() { if command -v c++filt >/dev/null 2>&1; then c++filt "$1"; else echo "$1"; fi; }

for f in $sources; do
    name="$f: every function at most $CODE_BUDGET bytes of sm_90a code"
    cubin="$TMP/$(basename "$f" .cu).cubin"
    if ! "$NVCC" -O3 -std=c++17 -arch=sm_90a -Ikernels --expt-relaxed-constexpr -DNSA_HAVE_CUDA \
        -cubin "$f" -o "$cubin" >"$TMP/nvcc.log" 2>&1; then
        not_ok "$name" "nvcc failed:" "$(tail -5 "$TMP/nvcc.log")"
        continue
    fi
    # section headers: [Nr] Name Type Address Off Size ...; .text.<function>
    readelf -SW "$cubin" 2>/dev/null |
        sed -n 's/.*\] *\.text\.\([^ ]*\) *PROGBITS *[0-9a-f]* *[0-9a-f]* *\([0-9a-f]*\).*/\2 \1/p' \
        >"$TMP/sizes"
    if [ ! -s "$TMP/sizes" ]; then
        # host code only (decode.cu drives the kernels): nothing to measure
        if grep -q '__global__\|__device__' "$f"; then
            not_ok "$name" "no .text sections read from $cubin, though $f has device code"
        else
            ok "$name (host code only)"
        fi
        continue
    fi
    over=""
    largest=0
    largest_fn=""
    while read -r hex fn; do
        bytes=$((0x$hex))
        [ "$bytes" -gt "$largest" ] && largest=$bytes && largest_fn=$fn
        [ "$bytes" -gt "$CODE_BUDGET" ] && over="$over $(demangle "$fn") ($bytes bytes);"
    done <"$TMP/sizes"
    if [ -n "$over" ]; then
        not_ok "$name" "over the budget:$over"
    else
        ok "$name (largest: $(demangle "$largest_fn"), $largest bytes)"
    fi
done
echo "1..$n"
[ "$failed" -eq 0 ]
