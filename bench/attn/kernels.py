#!/usr/bin/env python3
"""kernels.py - the per-kernel time breakdown of the NSA op (issue 7).

    bench/attn/kernels.py BENCH_NSA [--shapes paper,paper192,proto] [--seq 65536] [--ncu ncu]
    bench/attn/kernels.py --csv FILE [--title TITLE]

The first form runs BENCH_NSA once per shape and sequence length under
Nsight Compute and prints, per kernel of one forward + backward, its
launches, time, share of the sum and DRAM bytes, as a markdown table. The
second summarises a CSV saved from such a run (ncu --csv ... > FILE).

bench_nsa runs one forward + backward between cudaProfilerStart and
cudaProfilerStop after its timed runs; ncu (--profile-from-start off)
sees only those kernels. It runs them one at a time at the device's own
clocks (--clock-control none), so the sum is the kernels' time without
their overlap on the op's two streams or the gaps between launches - not
the op's wall time, which is bench_nsa's total_ms.

Exits 1 where ncu is missing, fails, or profiles no kernel (its output is
printed), 2 on bad usage.
"""
import csv
import os
import shutil
import subprocess
import sys
from collections import OrderedDict

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")
# ncu 2025.3 prints "ns" and "byte" with --print-units base; its scaled
# units (and older versions' names) are taken too
TIME_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9,
           "nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}
BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}


def short_name(name):
    """'void k<1, f<2>>(A, B)' -> 'k<1, f<2>>': the function and its
    template arguments, without the return type and parameter list."""
    if name.startswith("void "):
        name = name[5:]
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            return name[:i].strip()
    return name.strip()


def parse(lines):
    """Per kernel (in order of first launch): launches, ns, read and write
    bytes. Lines that are not ncu's quoted CSV (the program's own output,
    ==PROF== notes) are skipped. Raises ValueError on a unit it does not
    know or a CSV without the columns it needs."""
    rows = list(csv.reader(l for l in lines if l.startswith('"')))
    if not rows:
        return OrderedDict()
    head = rows[0]
    try:
        ci, cn, cm, cu, cv = (head.index(k) for k in
                              ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
    except ValueError:
        raise ValueError("not an ncu --csv table: header " + ",".join(head[:8]))
    kernels = OrderedDict()
    seen = set()
    for r in rows[1:]:
        if len(r) <= max(ci, cn, cm, cu, cv) or r[cm] not in METRICS:
            continue
        name = short_name(r[cn])
        k = kernels.setdefault(name, {"launches": 0, "ns": 0.0, "read": 0.0, "write": 0.0})
        if (r[ci], name) not in seen:
            seen.add((r[ci], name))
            k["launches"] += 1
        value = float(r[cv].replace(",", ""))
        unit = r[cu]
        if r[cm] == "gpu__time_duration.sum":
            if unit not in TIME_NS:
                raise ValueError(f"unknown time unit {unit!r}")
            k["ns"] += value * TIME_NS[unit]
        else:
            if unit not in BYTES:
                raise ValueError(f"unknown byte unit {unit!r}")
            k["read" if r[cm] == "dram__bytes_read.sum" else "write"] += value * BYTES[unit]
    return kernels


def table(title, kernels):
    total_ns = sum(k["ns"] for k in kernels.values())
    out = [f"### {title}", "",
           "| kernel | launches | ms | share | DRAM read GB | DRAM write GB | TB/s |",
           "|---|---|---|---|---|---|---|"]
    for name, k in sorted(kernels.items(), key=lambda kv: -kv[1]["ns"]):
        tbs = (k["read"] + k["write"]) / k["ns"] / 1e3 if k["ns"] > 0 else 0.0
        share = 100.0 * k["ns"] / total_ns if total_ns > 0 else 0.0
        out.append(f"| {name} | {k['launches']} | {k['ns'] / 1e6:.2f} | {share:.1f}% | "
                   f"{k['read'] / 1e9:.2f} | {k['write'] / 1e9:.2f} | {tbs:.2f} |")
    out.append(f"| **sum** | {sum(k['launches'] for k in kernels.values())} | "
               f"**{total_ns / 1e6:.2f}** | | {sum(k['read'] for k in kernels.values()) / 1e9:.2f} | "
               f"{sum(k['write'] for k in kernels.values()) / 1e9:.2f} | |")
    out.append("")
    return "\n".join(out)


def usage(msg):
    sys.stderr.write(f"kernels.py: {msg}\nusage: see the comment at the top of {__file__}\n")
    sys.exit(2)


def main(argv):
    opts = {"--shapes": "paper,paper192,proto", "--seq": "65536", "--ncu": "ncu", "--csv": None,
            "--title": None}
    binary = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in opts:
            if i + 1 >= len(argv):
                usage(f"{a} needs a value")
            opts[a] = argv[i + 1]
            i += 2
        elif a.startswith("-"):
            usage(f"unknown option {a}; allowed: {', '.join(opts)}")
        elif binary is None:
            binary = a
            i += 1
        else:
            usage(f"one bench_nsa binary, not also {a!r}")
    if opts["--csv"]:
        try:
            with open(opts["--csv"]) as f:
                kernels = parse(f.read().splitlines())
        except (OSError, ValueError) as e:
            print(f"kernels.py: {opts['--csv']}: {e}")
            return 1
        if not kernels:
            print(f"kernels.py: {opts['--csv']}: no kernel in it")
            return 1
        print(table(opts["--title"] or os.path.basename(opts["--csv"]), kernels))
        return 0
    if binary is None:
        usage("give a bench_nsa binary or --csv FILE")
    ncu = shutil.which(opts["--ncu"])
    if ncu is None:
        print(f"kernels.py: {opts['--ncu']} (Nsight Compute) not found; no per-kernel breakdown")
        return 1
    status = 0
    print("Per-kernel breakdown of one forward + backward (Nsight Compute, kernels one at a\n"
          "time at the device's clocks: the sum leaves out the overlap of the op's two\n"
          "streams and the gaps between launches, so it is not the op's wall time).\n")
    for shape in filter(None, opts["--shapes"].split(",")):
        for seq in filter(None, opts["--seq"].split(",")):
            cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--csv",
                   "--print-units", "base", "--metrics", ",".join(METRICS),
                   binary, "--reps", "1", "--shapes", shape, "--seq", seq]
            p = subprocess.run(cmd, capture_output=True, text=True)
            problem = None
            try:
                kernels = parse(p.stdout.splitlines())
            except ValueError as e:
                kernels, problem = OrderedDict(), str(e)
            if p.returncode != 0 or not kernels:
                print(f"kernels.py: {shape} S={seq}: ncu exited {p.returncode} with "
                      f"{len(kernels)} kernels{': ' + problem if problem else ''}; its output's end:")
                print("\n".join((p.stdout + p.stderr).strip().splitlines()[-12:]))
                status = 1
                continue
            print(table(f"{shape}, S = {seq}", kernels))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
