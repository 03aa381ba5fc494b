#!/usr/bin/env python3
"""report.py - the table of `make bench-train` from the JSON lines of one run.

    bench/train/report.py RESULTS.jsonl

RESULTS.jsonl holds bench_train's lines (impl "nsa", "nsa-recompute",
"nsa-selective", "nsa-largest"), dense_train.py's ("dense-cudnn", "dense-flash") and one
"ceiling" line. Prints, per sequence
length and batch, each implementation's tokens/s, MFU (tokens/s x its model
FLOPs per token over the measured bf16 matrix rate), step time and peak
memory, and NSA's tokens/s over each dense backend's at the same S (the
dense line with the largest batch at that S when batches differ).
"""
import json
import sys


def main(argv):
    if len(argv) != 1:
        sys.stderr.write("usage: report.py RESULTS.jsonl\n")
        return 2
    rows, largest, ceiling = [], [], None
    with open(argv[0]) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r.get("impl") == "ceiling":
                ceiling = r
            elif r.get("impl") == "nsa-largest":
                largest.append(r)
            else:
                rows.append(r)
    if ceiling is None:
        print("report.py: no ceiling line; MFU needs the measured bf16 matrix rate")
        return 1
    peak = ceiling["bf16_tflops"] * 1e12
    print(f"Device: {ceiling.get('device', '?')}; bf16 matrix rate {ceiling['bf16_tflops']} TFLOP/s, "
          f"copy {ceiling['copy_tbs']} TB/s (measured in this run)\n")
    print("| S | B | impl | tok/s | MFU | ms/step | peak GB | NSA / this |")
    print("|---|---|---|---|---|---|---|---|")
    for S in sorted({r["S"] for r in rows}):
        at = [r for r in rows if r["S"] == S]
        nsa = [r for r in at if r["impl"] == "nsa" and "error" not in r]
        best_nsa = max((r["tok_s"] for r in nsa), default=None)
        for r in sorted(at, key=lambda r: (r["impl"] != "nsa", r["impl"], r.get("B", 0))):
            if "error" in r:
                print(f"| {S} | {r.get('B', '')} | {r['impl']} | failed: {r['error'][:60]} | | | | |")
                continue
            mfu = r["tok_s"] * r["flops_per_token"] / peak
            ratio = ""
            if r["impl"].startswith("dense") and best_nsa:
                ratio = f"{best_nsa / r['tok_s']:.2f}x"
            print(f"| {S} | {r['B']} | {r['impl']} | {r['tok_s']:,.0f} | {100 * mfu:.1f}% | "
                  f"{r['ms_step']:.1f} | {r['peak_gb']:.1f} | {ratio} |")
    if largest:
        print("\nLongest sequence that trains at B = 1:\n")
        print("| activation recompute | S | ms/step | tok/s | peak GB |")
        print("|---|---|---|---|---|")
        names = {0: "none", 1: "layer", 2: "selective"}
        for r in sorted(largest, key=lambda r: r["recompute"]):
            print(f"| {names.get(r['recompute'], r['recompute'])} | {r['S']:,} | {r['ms_step']:.0f} | "
                  f"{r['tok_s']:,.0f} | {r['peak_gb']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
