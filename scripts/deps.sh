#!/bin/sh
# deps.sh - install the Debian packages nsad needs to build and test, if any
# is missing. Idempotent and quiet when everything is there. Needs root (or
# sudo) only when something must be installed.
set -eu

PACKAGES="
build-essential
pkg-config
python3
python3-numpy
curl
libyaml-dev
libmicrohttpd-dev
libcjson-dev
libcmocka-dev
libcurl4-openssl-dev
fortunes
fortunes-min
systemd
clang
libclang-rt-14-dev
"

# clang and its runtimes (libFuzzer, ASan, UBSan) build the fuzz harnesses
# (tests/fuzz): `make test` replays their seed corpus, `make fuzz` fuzzes.
# The browser test (tests/browser) drives Debian's Chromium with playwright-core
# from npm; the font gives its screenshots legible text.
PACKAGES="$PACKAGES chromium fonts-dejavu-core"

missing=""
# Node.js for the browser test: any node >= 18 will do (playwright-core 1.61
# needs 18; Debian 12's nodejs is 18.20). A node that is already there (e.g.
# a newer one from another source, which bundles npm) is kept as it is.
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

# Refreshes the package index only when it is missing or older than a day.
refresh_index() {
    if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
        $SUDO apt-get update -qq
    fi
}

if [ -n "$missing" ]; then
    echo "deps: installing:$missing"
    if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
        echo "deps: need root to install:$missing" >&2; exit 1
    fi
    refresh_index
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
    echo "deps: done"
fi

# promtool checks nsad's Prometheus exposition in the tests. It ships in
# Debian's prometheus package, whose install would also start a Prometheus
# server; so the package is only downloaded and promtool unpacked into build/.
top="$(cd "$(dirname "$0")/.." && pwd)"
tools="$top/build/tools"
if ! command -v promtool >/dev/null 2>&1 && [ ! -x "$tools/bin/promtool" ]; then
    echo "deps: unpacking promtool into build/tools"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    refresh_index
    chmod 755 "$tmp"  # apt fetches as the _apt user
    (cd "$tmp" && apt-get download -qq prometheus >/dev/null 2>&1)
    dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
    mkdir -p "$tools/bin"
    cp "$tmp/root/usr/bin/promtool" "$tools/bin/promtool"
fi
