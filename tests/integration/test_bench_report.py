#!/usr/bin/env python3
"""test_bench_report.py - bench/attn/report.py, the merge of the NSA and dense
attention benchmarks (make bench-attn), on synthetic JSON lines: the speed-up
columns, the per-branch and per-phase tables, the issue-7 targets table, and
that a line that is not JSON or a missing dense file loses nothing else.
Prints TAP and exits non-zero on failure.
"""
import json
import os
import subprocess
import sys
import tempfile

from nsadtest import ROOT, check, finish, first_line

REPORT = os.path.join(ROOT, "bench", "attn", "report.py")

NSA = [
    {"device": "TestGPU", "impl": "nsa"},
    {"impl": "nsa", "shape": "paper", "S": 65536, "B": 1, "fwd_ms": 40.0, "bwd_ms": 60.0,
     "total_ms": 100.0, "peak_mib": 1000.0, "tflops": 123.0, "finite": True,
     "branches": {k: {"gflop": 1.0, "ms": 2.5, "tflops": 7.0} for k in ("cmp", "score", "sel", "win")},
     "phases": {"fwd.cmp": 1.25, "bwd.cmp.dq": 2.5}},
    {"impl": "nsa", "shape": "proto", "S": 65536, "B": 1, "fwd_ms": 4.0, "bwd_ms": 6.0,
     "total_ms": 10.0, "peak_mib": 100.0, "tflops": 50.0, "finite": True},
    {"impl": "nsa", "shape": "paper192", "S": 65536, "B": 1, "fwd_ms": 50.0, "bwd_ms": 70.0,
     "total_ms": 120.0, "peak_mib": 1100.0, "tflops": 130.0, "finite": True},
]
DENSE = [
    {"impl": "fa2", "shape": "paper", "S": 65536, "B": 1, "total_ms": 950.0, "peak_mib": 2000.0},
    {"impl": "cudnn", "shape": "paper", "S": 65536, "B": 1, "total_ms": 400.0, "peak_mib": 1500.0},
    {"impl": "fa2", "shape": "proto", "S": 65536, "B": 1, "total_ms": 50.0, "peak_mib": 200.0},
    {"impl": "fa2", "shape": "paper192", "S": 65536, "B": 1, "total_ms": 1200.0, "peak_mib": 2500.0,
     "v_padded": True},
    {"impl": "cudnn", "shape": "paper192", "S": 65536, "B": 1, "total_ms": 540.0, "peak_mib": 1800.0,
     "v_padded": False},
]

def write(path, rows, junk=False):
    with open(path, "w") as f:
        if junk:
            f.write("warming up...\n{not json\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")


def run(*paths):
    p = subprocess.run([sys.executable, REPORT, *paths], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


with tempfile.TemporaryDirectory() as tmp:
    nsa, dense = os.path.join(tmp, "nsa.jsonl"), os.path.join(tmp, "dense.jsonl")
    write(nsa, NSA, junk=True)
    write(dense, DENSE)
    rc, out = run(nsa, dense)
    check("report exits 0", rc == 0, out)
    check("names the device", "device: TestGPU" in out, out)
    paper = first_line(out, "| paper | 65536 | 1 |")
    check("speed-ups over FA2 and cuDNN are dense / NSA totals",
          "| 9.50x | 4.00x |" in paper, paper)
    check("peak memory of each implementation", "| 1000 | 2000 | 1500 |" in paper, paper)
    proto = first_line(out, "| proto | 65536 | 1 |")
    check("a missing dense backend reads '-', not '-x'", "| 5.00x | - |" in proto, proto)
    check("per-branch table", "| paper | 65536 | 2.50 | 7 | 2.50 | 7 |" in out, out)
    check("per-phase table", "| paper | 65536 | 1.250 | 2.500 |" in out, out)
    check("targets: paper vs FA2 (9.50x >= 9x) met",
          "| paper | 65536 | fa2 | 9.00x | 9.50x | yes |" in out, out)
    check("targets: paper vs cuDNN (4.00x < 5x) not met",
          "| paper | 65536 | cudnn | 5.00x | 4.00x | no |" in out, out)
    check("targets: proto vs FA2 (5.00x < 6x) not met",
          "| proto | 65536 | fa2 | 6.00x | 5.00x | no |" in out, out)
    check("targets: paper192 vs FA2 says V was padded (10.00x >= 9x) met",
          "| paper192 | 65536 | fa2 (V zero-padded to d_k) | 9.00x | 10.00x | yes |" in out, out)
    check("targets: paper192 vs cuDNN, native, (4.50x < 5x) not met",
          "| paper192 | 65536 | cudnn | 5.00x | 4.50x | no |" in out, out)
    check("the padded backend is named under the table",
          "V zero-padded to d_k (the backend refuses d_k != d_v): fa2 at paper192." in out, out)
    check("no target row without its measurement", "| paper | 2048 |" not in out, out)

    rc, out = run(nsa, os.path.join(tmp, "absent.jsonl"))
    check("a missing dense file still reports NSA", rc == 0 and "| 100.00 | - | - |" in out, out)
    check("... and prints no targets table", "Against issue 7" not in out, out)

sys.exit(finish())
