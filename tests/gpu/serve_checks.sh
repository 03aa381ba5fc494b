#!/bin/bash
# serve_checks.sh [DEBS_DIR] - on the GPU machine: builds nsad with the CUDA
# engine (sm_90a unless GENCODE says otherwise) and runs serve_checks.py
# (runs side by side through nsad serve on real GPUs). The lent machines lack
# libyaml, libmicrohttpd, cJSON and libcurl's headers: given DEBS_DIR, the
# Debian 12 .deb files there (libyaml-dev, libyaml-0-2, libmicrohttpd-dev,
# libmicrohttpd12, libcjson-dev, libcjson1, libcurl4-openssl-dev, libcurl4)
# are unpacked into /tmp/nsad-deps and nsad is built and run against them.
# Prints TAP and "N passed, N failed"; exits 1 on a failure.
set -u
cd "$(dirname "$0")/../.." || exit 1
export NCCL_NVLS_ENABLE=0
export GENCODE="${GENCODE:--gencode arch=compute_90a,code=sm_90a}"
cc="cc"
if [ $# -ge 1 ]; then
    deps=/tmp/nsad-deps
    lib=$deps/usr/lib/x86_64-linux-gnu
    mkdir -p "$deps"
    for d in "$1"/*.deb; do dpkg -x "$d" "$deps" || exit 1; done
    # the machine's own libcurl (Ubuntu's) when it has one: the Debian one
    # would need Debian's libssl
    if [ -e /usr/lib/x86_64-linux-gnu/libcurl.so.4 ]; then
        rm -f "$lib"/libcurl.so.4*
        ln -sf /usr/lib/x86_64-linux-gnu/libcurl.so.4 "$lib/libcurl.so"
    fi
    cc="cc -I$deps/usr/include -L$lib"
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if ! make -j"$(nproc)" CC="$cc" build/nsad >/tmp/nsad-build.log 2>&1; then
    grep -E "error" /tmp/nsad-build.log | head -20
    echo "not ok 1 - build/nsad builds"
    echo "1..1"
    echo "0 passed, 1 failed"
    exit 1
fi
exec python3 tests/gpu/serve_checks.py
