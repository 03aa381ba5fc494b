#!/usr/bin/env python3
"""report.py DECODE_JSONL - the decode table from bench_decode and
dense_decode.py lines: per (batch, context) the NSA decoder and each dense
run with tokens/s, ms per step (mean and median), KV bytes read per token,
and NSA's speed-up (tokens/s ratio) and KV-byte ratio over each dense run,
and how fast the prompt filled the cache (prefill tok/s) where a run says.
Markdown on stdout; lines that are not JSON are skipped."""
import json
import sys


def main(path):
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    keys = sorted({(r["batch"], r["context"]) for r in rows})
    print("| batch | context | impl | tok/s | ms/step | p50 ms | KV MB/token | NSA speed-up | KV ratio "
          "| prefill tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b, c in keys:
        here = [r for r in rows if r["batch"] == b and r["context"] == c]
        nsa = next((r for r in here if r["impl"] == "nsa"), None)
        for r in sorted(here, key=lambda r: r["impl"] != "nsa"):
            up = kv = ""
            if nsa and r is not nsa:
                up = f"{nsa['tok_per_s'] / r['tok_per_s']:.2f}x"
                kv = f"{r['kv_bytes_per_token'] / nsa['kv_bytes_per_token']:.1f}x fewer"
            prefill = f"{r['prefill_tok_per_s']:.0f}" if "prefill_tok_per_s" in r else "-"
            print(f"| {b} | {c} | {r['impl']} | {r['tok_per_s']:.0f} | {r['ms_per_step']:.3f} | "
                  f"{r['ms_per_step_p50']:.3f} | {r['kv_bytes_per_token'] / 1e6:.2f} | {up} | {kv} "
                  f"| {prefill} |")


if __name__ == "__main__":
    main(sys.argv[1])
