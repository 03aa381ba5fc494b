#!/bin/sh
# make-corpus.sh - builds build/data/fortunes.txt, a plain-text English corpus
# (about 2.6 MB) from Debian's fortunes packages, for tests and `make run`.
#
# Each fortune becomes one document: its lines (blank lines inside it
# dropped, terminal overstrike sequences removed, trailing blanks trimmed),
# followed by one blank line, so that nsad's text loader (which splits .txt
# files into documents at blank lines) sees one document per fortune.
# Idempotent: the same packages give a byte-identical file, which is only
# rewritten when its content changes.
#   scripts/make-corpus.sh [OUTPUT]     (default build/data/fortunes.txt)
set -eu
cd "$(dirname "$0")/.."
src=/usr/share/games/fortunes
out="${1:-build/data/fortunes.txt}"

if [ ! -d "$src" ]; then
    echo "make-corpus: $src not found; install the fortunes packages (make deps)" >&2
    exit 1
fi
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT INT TERM

# the cookie files: not the .dat indexes, not the .u8 links to the same text
files=$(LC_ALL=C find "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort)
if [ -z "$files" ]; then
    echo "make-corpus: no fortune files in $src" >&2
    exit 1
fi

# shellcheck disable=SC2086
LC_ALL=C awk '
    function flush() { if (n > 0) { for (i = 1; i <= n; i++) print doc[i]; print ""; } n = 0 }
    FNR == 1 { flush() }
    {
        line = $0
        while (match(line, /.\010/)) line = substr(line, 1, RSTART - 1) substr(line, RSTART + 2)
        sub(/[ \t\r]+$/, "", line)
    }
    line == "%" { flush(); next }
    line == "" { next }
    { doc[++n] = line }
    END { flush() }
' $files >"$tmp"

if [ ! -s "$tmp" ]; then
    echo "make-corpus: the fortune files gave no text" >&2
    exit 1
fi
if [ -f "$out" ] && cmp -s "$tmp" "$out"; then
    rm -f "$tmp"
else
    mv "$tmp" "$out"
fi
trap - EXIT INT TERM
