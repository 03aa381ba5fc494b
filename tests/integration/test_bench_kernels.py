#!/usr/bin/env python3
"""test_bench_kernels.py - bench/attn/kernels.py, the per-kernel breakdown of
make bench-attn, on synthetic Nsight Compute CSV (no GPU here): launches
counted per profiled ID, times and bytes in base and scaled units, kernel
names cut to function and template arguments, the program's own output
skipped; a fake ncu for the whole run (the options it is given); and the
errors - unknown unit, no kernel, no ncu, bad usage - each a clear exit.
Prints TAP and exits non-zero on failure.
"""
import os
import stat
import subprocess
import sys
import tempfile

from nsadtest import ROOT, check, finish, first_line

KERNELS = os.path.join(ROOT, "bench", "attn", "kernels.py")

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
        '"Metric Value"')


def line(kid, name, metric, unit, value):
    return (f'"{kid}","1","bench_nsa","h","{name}","1","7","(256, 1, 1)","(132, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


FUSED = "void selFusedBwdKernel<192, 128, true, 2>(FastCtx, FastBwdIo, FastRevIndex)"
DQ = "void fastDqKernel<192, 128, true, FastDqBranch<WinPolicy>>(FastCtx, FastBwdIo, FastDqMaps)"
CSV = [
    "==PROF== Connected to process 1 (bench_nsa)",
    '{"device": "TestGPU", "impl": "nsa"}',
    HEAD,
    line(0, FUSED, "dram__bytes_read.sum", "byte", "2,000,000,000"),
    line(0, FUSED, "dram__bytes_write.sum", "byte", "1000000000"),
    line(0, FUSED, "gpu__time_duration.sum", "ns", "3,000,000"),
    line(1, DQ, "dram__bytes_read.sum", "Mbyte", "500"),
    line(1, DQ, "dram__bytes_write.sum", "Gbyte", "0.25"),
    line(1, DQ, "gpu__time_duration.sum", "msecond", "4"),
    line(2, FUSED, "dram__bytes_read.sum", "byte", "0"),
    line(2, FUSED, "dram__bytes_write.sum", "byte", "0"),
    line(2, FUSED, "gpu__time_duration.sum", "us", "1000"),
    line(2, FUSED, "sm__cycles_elapsed.avg", "cycle", "5"),
    "==PROF== Disconnected from process 1",
]

def run(*args):
    p = subprocess.run([sys.executable, KERNELS, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "ncu.csv")
    with open(path, "w") as f:
        f.write("\n".join(CSV) + "\n")
    rc, out = run("--csv", path, "--title", "paper192, S = 65536")
    check("a saved CSV: exits 0", rc == 0, out)
    check("titled", "### paper192, S = 65536" in out, out)
    fused = first_line(out, "| selFusedBwdKernel<192, 128, true, 2> |")
    check("launches are distinct profiled IDs; ns and us summed; share of the sum",
          fused.startswith("| selFusedBwdKernel<192, 128, true, 2> | 2 | 4.00 | 50.0% | 2.00 | 1.00 | 0.75 |"),
          out)
    dq = first_line(out, "| fastDqKernel<192, 128, true, FastDqBranch<WinPolicy>> |")
    check("ms, Mbyte and Gbyte scaled; nested template arguments kept, parameters cut",
          dq.startswith("| fastDqKernel<192, 128, true, FastDqBranch<WinPolicy>> | 1 | 4.00 | 50.0% | 0.50 | 0.25 |"),
          out)
    check("the sum row", "| **sum** | 3 | **8.00** | | 2.50 | 1.25 | |" in out, out)
    kernel_rows = [l for l in out.splitlines()
                   if l.startswith("| ") and not l.startswith(("| kernel |", "| **sum**"))]
    check("other metrics and the program's lines are not kernels", len(kernel_rows) == 2, out)

    bad = os.path.join(tmp, "bad.csv")
    with open(bad, "w") as f:
        f.write("\n".join([HEAD, line(0, FUSED, "gpu__time_duration.sum", "fortnight", "1")]) + "\n")
    rc, out = run("--csv", bad)
    check("an unknown unit is an error naming it", rc == 1 and "'fortnight'" in out, out)

    empty = os.path.join(tmp, "empty.csv")
    with open(empty, "w") as f:
        f.write("==PROF== No kernels were profiled.\n")
    rc, out = run("--csv", empty)
    check("no kernel in the CSV: exit 1, said so", rc == 1 and "no kernel" in out, out)

    rc, out = run("/bin/true", "--ncu", os.path.join(tmp, "no-such-ncu"))
    check("no ncu: exit 1, said so", rc == 1 and "not found" in out, out)
    rc, out = run("--seq")
    check("an option without its value: exit 2", rc == 2 and "needs a value" in out, out)
    rc, out = run("--bogus", "1")
    check("an unknown option: exit 2, naming it", rc == 2 and "--bogus" in out, out)

    # a fake ncu: records its arguments, prints the CSV (for paper the one
    # with an unknown unit; for proto it fails)
    fake = os.path.join(tmp, "ncu")
    args_log = os.path.join(tmp, "args.log")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\n"
                f'echo "$@" >> "{args_log}"\n'
                'case "$*" in *"--shapes proto"*) echo "==ERROR== ERR_NVGPUCTRPERM" >&2; exit 3;; esac\n'
                f'case "$*" in *"--shapes paper "*) cat "{bad}"; exit 0;; esac\n'
                f'cat "{path}"\n')
    os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)
    rc, out = run("/path/bench_nsa", "--ncu", fake, "--shapes", "paper192,proto,paper", "--seq", "65536")
    with open(args_log) as f:
        calls = f.read().splitlines()
    check("one ncu run per shape and S", len(calls) == 3, calls)
    check("profiles only bench_nsa's window, base units, the device's clocks",
          all(w in calls[0] for w in ("--profile-from-start off", "--print-units base",
                                      "--clock-control none", "--csv",
                                      "/path/bench_nsa --reps 1 --shapes paper192 --seq 65536")),
          calls)
    check("the table of the run that worked", "### paper192, S = 65536" in out
          and "| **sum** | 3 | **8.00** |" in out, out)
    check("a failed run: its exit code and ncu's message, and exit 1",
          rc == 1 and "proto S=65536: ncu exited 3" in out and "ERR_NVGPUCTRPERM" in out, out)
    check("a unit it does not know: named, with that run's output",
          "paper S=65536: ncu exited 0 with 0 kernels: unknown time unit 'fortnight'" in out, out)

sys.exit(finish())
