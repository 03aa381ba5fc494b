#!/usr/bin/env python3
"""breakdown.py - where one training step of the CUDA engine spends its time:
each kernel family's time and share next to its floor.

    bench/train/breakdown.py BENCH_TRAIN --seq S --batch B --step-ms MS
                             --tflops T --tbs W [--ncu ncu] [--csv-out FILE]
    bench/train/breakdown.py --csv FILE --seq S --batch B --step-ms MS --tflops T --tbs W

The first form runs `BENCH_TRAIN --seq S --batch B --steps 1 --warmup 2
--profile` under Nsight Compute (--profile-from-start off, so only the
profiled step's kernels, one at a time at the device's clocks) and sums
gpu__time_duration and DRAM bytes per kernel; the second reads such a CSV.

Families: GEMM (cuBLASLt), attention (the fast NSA op and the reference
kernels), cross-entropy, optimizer (grad norm, AdamW), element-wise (RMSNorm,
RoPE, activations, embedding, conversions, memsets). Floors: the GEMMs' and
the attention's model FLOPs (nsaModelFlopsPerToken's matmul and attention
terms, from bench_train's JSON line) at T TFLOP/s, the other families' DRAM
bytes at W TB/s. "host and gaps" is the step's wall
time (MS, from an unprofiled run) minus the kernels' sum: launch gaps, host
work and what the streams overlapped (negative where overlap wins).
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "attn"))
from kernels import METRICS, parse  # noqa: E402

FAMILIES = ("GEMM", "attention", "cross-entropy", "optimizer", "element-wise")


def family(name):
    n = name.lower()
    if any(k in n for k in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitk")):
        return "GEMM"
    if n.startswith("fast") or "attn" in n or "nsa" in n or "sel" in n or "cmp" in n \
            or "win" in n or "pool" in n:
        return "attention"
    if "crossentropy" in n or "cross_entropy" in n:
        return "cross-entropy"
    if "adam" in n or "gradnorm" in n or "norm_partial" in n or "optim" in n:
        return "optimizer"
    return "element-wise"


def report(kernels, args, flops):
    fam = {f: {"ns": 0.0, "bytes": 0.0, "launches": 0} for f in FAMILIES}
    for name, k in kernels.items():
        f = fam[family(name)]
        f["ns"] += k["ns"]
        f["bytes"] += k["read"] + k["write"]
        f["launches"] += k["launches"]
    tokens = args["--seq"] * args["--batch"]
    total_ms = sum(f["ns"] for f in fam.values()) / 1e6
    floor = {}
    if flops:
        floor["GEMM"] = flops["matmul_flops_per_token"] * tokens / (args["--tflops"] * 1e12) * 1e3
        floor["attention"] = flops["attention_flops_per_token"] * tokens / (args["--tflops"] * 1e12) * 1e3
    out = [f"### One training step, S = {args['--seq']}, B = {args['--batch']} "
           f"(Nsight Compute; floors at {args['--tflops']:.0f} TFLOP/s and {args['--tbs']:.2f} TB/s)",
           "",
           "| family | launches | ms | share of step | floor ms | floor from | DRAM GB |",
           "|---|---|---|---|---|---|---|"]
    step = args["--step-ms"]
    for name in FAMILIES:
        f = fam[name]
        ms = f["ns"] / 1e6
        if name in floor:
            fl, why = floor[name], "FLOPs"
        else:
            fl, why = f["bytes"] / (args["--tbs"] * 1e12) * 1e3, "DRAM bytes"
        out.append(f"| {name} | {f['launches']} | {ms:.2f} | {100 * ms / step:.1f}% | {fl:.2f} | "
                   f"{why} | {f['bytes'] / 1e9:.2f} |")
    gap = step - total_ms
    out.append(f"| host and gaps | | {gap:.2f} | {100 * gap / step:.1f}% | 0 | | |")
    out.append(f"| **step (wall)** | {sum(f['launches'] for f in fam.values())} | **{step:.2f}** | 100% | "
               f"{sum(floor.values()):.2f}+ | | |")
    out += ["", "Largest kernels:", "", "| kernel | family | launches | ms | share of step |",
            "|---|---|---|---|---|"]
    for name, k in sorted(kernels.items(), key=lambda kv: -kv[1]["ns"])[:15]:
        out.append(f"| {name[:90]} | {family(name)} | {k['launches']} | {k['ns'] / 1e6:.3f} | "
                   f"{100 * k['ns'] / 1e6 / step:.1f}% |")
    return "\n".join(out) + "\n"


def main(argv):
    args = {"--seq": None, "--batch": None, "--step-ms": None, "--tflops": None, "--tbs": None,
            "--ncu": "ncu", "--csv": None, "--csv-out": None}
    binary = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in args and i + 1 < len(argv):
            args[a] = argv[i + 1]
            i += 2
        elif a.startswith("-"):
            sys.stderr.write(f"breakdown.py: unknown option {a}; allowed: {', '.join(args)}\n")
            return 2
        else:
            binary = a
            i += 1
    for k in ("--seq", "--batch", "--step-ms", "--tflops", "--tbs"):
        if args[k] is None:
            sys.stderr.write(f"breakdown.py: {k} is required\n")
            return 2
    for k in ("--seq", "--batch"):
        args[k] = int(args[k])
    for k in ("--step-ms", "--tflops", "--tbs"):
        args[k] = float(args[k])
    text, flops = "", None
    if args["--csv"]:
        with open(args["--csv"]) as f:
            text = f.read()
    else:
        ncu = shutil.which(args["--ncu"])
        if binary is None or ncu is None:
            print("breakdown.py: needs a bench_train binary and ncu (Nsight Compute); no breakdown")
            return 1
        cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--csv",
               "--print-units", "base", "--metrics", ",".join(METRICS), binary,
               "--seq", str(args["--seq"]), "--batch", str(args["--batch"]), "--steps", "1",
               "--warmup", "2", "--profile"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        text = p.stdout
        if p.returncode != 0:
            print(f"breakdown.py: ncu exited {p.returncode}:")
            print("\n".join((p.stdout + p.stderr).strip().splitlines()[-12:]))
            return 1
        if args["--csv-out"]:
            with open(args["--csv-out"], "w") as f:
                f.write(text)
    for line in text.splitlines():
        if line.startswith("{") and '"impl": "nsa"' in line:
            flops = json.loads(line)
    kernels = parse(text.splitlines())
    if not kernels:
        print("breakdown.py: no kernel in the profile")
        return 1
    print(report(kernels, args, flops))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
