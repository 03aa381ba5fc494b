#!/bin/sh
# deps.sh - install the Debian packages nsad needs to build and test, if any
# is missing. Idempotent and quiet when everything is there. Needs root (or
# sudo) only when something must be installed.
set -eu

PACKAGES="
build-essential
pkg-config
python3
curl
libyaml-dev
libmicrohttpd-dev
libcjson-dev
libcmocka-dev
libcurl4-openssl-dev
fortunes
fortunes-min
systemd
"

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

echo "deps: installing:$missing"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "deps: need root to install:$missing" >&2; exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
# Refresh the package index only when it is missing or older than a day.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
    $SUDO apt-get update -qq
fi
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "deps: done"
