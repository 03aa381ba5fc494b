#!/usr/bin/env python3
"""ab.py - A/B timing of bench_nsa builds in one run on one device.

    bench/attn/ab.py [--rounds 2] [--reps 5] [--shapes proto,paper] [--seq 2048,65536]
                     [--phases bwd.sel.,fwd.sel] LABEL=BINARY[:ENV=VAL,...] ...

Runs every binary once per round, in turn (so drifting clocks and
neighbours hit every build alike), each as `BINARY --reps R --shapes ...
--seq ...` with the extra environment given after the colon, and prints per
(shape, S) the total fwd+bwd ms of each round and build, the median over
rounds and the ratio of each build's median to the first build's, then
the phases named (a name ending in '.' sums every phase it prefixes).
Peak memory and the finiteness flag are printed too: a build whose
outputs are not all finite is marked NONFINITE. Exits 1 when a run fails
or produces non-finite outputs."""
import json
import os
import statistics
import subprocess
import sys


def parse_args(argv):
    opts = {"rounds": 2, "reps": 5, "shapes": "proto,paper", "seq": "2048,65536", "phases": ""}
    builds = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and a[2:] in opts and i + 1 < len(argv):
            opts[a[2:]] = argv[i + 1]
            i += 2
            continue
        if "=" not in a or a.startswith("--"):
            sys.exit(f"ab.py: {a!r}: expected --option value or LABEL=BINARY[:ENV=VAL,...]")
        label, spec = a.split("=", 1)
        binary, _, envs = spec.partition(":")
        env = dict(os.environ)
        for kv in filter(None, envs.split(",")):
            k, _, v = kv.partition("=")
            env[k] = v
        builds.append((label, binary, env))
        i += 1
    if not builds:
        sys.exit("ab.py: no builds given; usage in the file comment")
    return opts, builds


def phase_sum(phases, pattern):
    if pattern.endswith("."):
        return sum(v for k, v in phases.items() if k.startswith(pattern))
    return phases.get(pattern, 0.0)


def main():
    opts, builds = parse_args(sys.argv[1:])
    runs = {}  # (label, shape, S) -> list of result dicts
    failed = False
    for r in range(int(opts["rounds"])):
        for label, binary, env in builds:
            cmd = [binary, "--reps", str(opts["reps"]), "--shapes", opts["shapes"], "--seq", opts["seq"]]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"{label} round {r}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
                failed = True
                continue
            for line in p.stdout.splitlines():
                if not line.startswith("{"):
                    continue
                j = json.loads(line)
                if "shape" not in j or "total_ms" not in j:
                    continue  # the device line, not a result
                runs.setdefault((label, j["shape"], j["S"]), []).append(j)
    keys = sorted({(k[1], k[2]) for k in runs})
    labels = [b[0] for b in builds]
    phases = [p for p in opts["phases"].split(",") if p]
    print("| shape | S | " + " | ".join(labels) + " | " + " | ".join(f"{l}/{labels[0]}" for l in labels[1:]) + " |")
    print("|---" * (2 + 2 * len(labels) - 1) + "|")
    for shape, S in keys:
        cells, meds = [], []
        for l in labels:
            rs = runs.get((l, shape, S), [])
            if not rs:
                cells.append("-")
                meds.append(None)
                continue
            totals = [x["total_ms"] for x in rs]
            med = statistics.median(totals)
            meds.append(med)
            flag = "" if all(x["finite"] for x in rs) else " NONFINITE"
            failed |= bool(flag)
            cells.append(f"{med:.2f} ({', '.join(f'{t:.2f}' for t in totals)}; {rs[0]['peak_mib']:.0f} MiB){flag}")
        ratios = [f"{m / meds[0]:.3f}" if m and meds[0] else "-" for m in meds[1:]]
        print(f"| {shape} | {S} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
        for ph in phases:
            vals = []
            for l in labels:
                rs = runs.get((l, shape, S), [])
                vals.append(f"{statistics.median(phase_sum(x['phases'], ph) for x in rs):.2f}" if rs else "-")
            print(f"|   {ph} | | " + " | ".join(vals) + " |" + " |" * (len(labels) - 1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
