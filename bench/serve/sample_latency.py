#!/usr/bin/env python3
"""sample_latency.py - what a client of POST /api/v1/sample waits for.

    bench/serve/sample_latency.py [--device cuda|cpu] [--nsad build/nsad] [--jobs N]

Trains a checkpoint of the production shape (the prototype's 125M model:
dim 768, 12 layers, 12 heads, 2 KV groups, d 64, NSA 32/16/64/16/512) for
two steps on synthetic data, starts `nsad serve --model-keep 120` on a
private Unix socket and state dir, and sends sample jobs back to back: N
with a 5-byte prompt and 64 tokens, then (on CUDA) N with a 16,000-byte
prompt and 16 tokens (the CUDA decoder's prompt pass; the CPU decoder
would take minutes to prefill it). Each job is timed on the client
from the request to its start line, its first text line and the stream's
end; the first job of each prompt loads the model, the next ones find it
kept (`reused` in the start line, proto/api.md). Prints a Markdown table.

nsad must be built (on the lent GPU machine with the Debian libraries
unpacked beside it: tests/gpu/serve_checks.sh shows how).
"""
import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

JOB = """model: {{dim: 768, n_layers: 12, n_heads: 12, n_kv_groups: 2, d_k: 64, d_v: 64}}
nsa: {{l: 32, d: 16, l_sel: 64, n_sel: 16, w: 512, phi: avg}}
train: {{steps: 2, seq_len: 256, batch_size: 1, lr: 1.0e-4, seed: 1, log_every: 1, eval_every: 0,
        save_every: 2, out_dir: {out}}}
runtime: {{device: {device}, precision: {precision}}}
data: {{source: synthetic}}
"""


def sample(sock, body):
    """One job: (start line, seconds to the start line, to the first text line, to the end)."""
    data = json.dumps(body).encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(300)
    s.connect(sock)
    t0 = time.monotonic()
    s.sendall(b"POST /api/v1/sample HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    buf, t_start, t_text = b"", None, None
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        now = time.monotonic() - t0
        if t_start is None and b'"event":"start"' in buf:
            t_start = now
        if t_text is None and b'"text"' in buf:
            t_text = now
    total = time.monotonic() - t0
    s.close()
    lines = [l for l in buf.decode("utf-8", "replace").split("\n") if l.startswith("{")]
    if not lines or json.loads(lines[-1]).get("event") != "done":
        sys.exit(f"sample_latency: a job did not finish: {buf[-300:]!r}")
    return json.loads(lines[0]), t_start, t_text, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--nsad", default=os.path.join(ROOT, "build", "nsad"))
    ap.add_argument("--jobs", type=int, default=3, help="jobs per prompt (the first loads the model)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="nsad-sample-latency-")
    proc = None
    try:
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(JOB.format(out=os.path.join(tmp, "out"), device=a.device,
                               precision="bf16" if a.device == "cuda" else "fp32"))
        r = subprocess.run([a.nsad, "train", job], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"sample_latency: nsad train failed: {r.stderr[-500:]}")
        sock = os.path.join(tmp, "nsad.sock")
        log = open(os.path.join(tmp, "nsad.log"), "w")
        proc = subprocess.Popen([a.nsad, "serve", "--listen", "none", "--socket", sock, "--state-dir",
                                 os.path.join(tmp, "state"), "--model-keep", "120"],
                                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit("sample_latency: nsad serve did not start: " + open(log.name).read()[-500:])
            time.sleep(0.05)
        rng = random.Random(3)
        long_prompt = "".join(rng.choice("abcdefghij klmnopqrstuvwxyz.") for _ in range(16000))
        cases = [("5 bytes", "Hello", 64)]
        if a.device == "cuda":
            cases.append(("16,000 bytes", long_prompt, 16))
        print("| prompt | max_tokens | job | reused | start line s | first text s | whole job s |")
        print("|---|---:|---:|---|---:|---:|---:|")
        for name, prompt, tokens in cases:
            for i in range(a.jobs):
                start, t_start, t_text, total = sample(sock, {"checkpoint": os.path.join(tmp, "out"),
                                                              "prompt": prompt, "max_tokens": tokens,
                                                              "device": a.device})
                print(f"| {name} | {tokens} | {i + 1} | {str(start.get('reused')).lower()} | "
                      f"{t_start:.3f} | {t_text:.3f} | {total:.3f} |")
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
