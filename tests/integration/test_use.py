#!/usr/bin/env python3
"""test_use.py - using what was trained, through the daemon and in the
foreground: a tiny CPU run trains under `nsad serve`, then
  - nsactl sample streams JSON lines (start, text pieces, done) over a
    chunked response; greedy output is reproducible and the same as
    `nsad sample` in the foreground; a stop string ends it;
  - nsactl eval reports the loss `nsad eval` computes in the foreground;
  - nsactl export downloads the export the daemon makes (the bytes `nsad
    export` writes in the foreground), made once and served again;
  - the training run wrote samples.jsonl and `samples` events;
  - a prompt of token ids (`prompt_ids`) to a byte model streams the ids of
    the text a text prompt gives;
  - a model trained on token shards of its own 100-token vocabulary opens
    for all of it: sampled as token ids through the daemon (`prompt_ids`:
    `ids` lines, the ids `nsad sample --prompt-ids` prints; nsactl sample
    --prompt-ids prints what the foreground prints) with each malformed
    `prompt_ids` refused naming what is wrong, an id outside the vocabulary
    ending the stream with an error and a text prompt refused naming its
    tokenizer, by both; evaluated on shards (the daemon's loss is the
    foreground's), exported with vocab 100;
  - refusals (unknown run, bad numbers, no prompt, a run without a
    checkpoint) are 4xx answers naming the field, and the daemon stays up;
  - a client that goes away mid-stream cancels its job (the next one runs);
  - SIGTERM during a stream ends it and nsad exits 0.
Prints TAP; exits non-zero on failure. Standard library only; every wait
bounded; the nsad it starts is killed on the way out.
"""
import json
import re
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from nsadtest import CORPUS, NSACTL, NSAD, check, corpus_slice, ensure_corpus, finish, wait_for


def http(sock, method, path, body=None, read_lines=None):
    """One HTTP/1.1 request over the Unix socket. Returns (status, headers,
    body bytes); read_lines=N returns after N body lines (leaving the
    connection to be closed by the caller: the socket is returned too)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(sock)
    data = json.dumps(body).encode() if body is not None else b""
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    if read_lines is not None:
        while rest.count(b"\n") < read_lines + 1:   # chunk size lines count too
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        return status, headers, rest, s
    while True:
        if headers.get("transfer-encoding") == "chunked" and rest.endswith(b"0\r\n\r\n"):
            break
        if "content-length" in headers and len(rest) >= int(headers["content-length"]):
            break
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    s.close()
    if headers.get("transfer-encoding") == "chunked":
        out, pos = b"", 0
        while True:
            eol = rest.index(b"\r\n", pos)
            n = int(rest[pos:eol], 16)
            if n == 0:
                break
            out += rest[eol + 2:eol + 2 + n]
            pos = eol + 2 + n + 2
        rest = out
    return status, headers, rest


def run(cmd, timeout=120):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def clean_utf8(data):
    """proto/api.md's rule for streamed text: a byte that does not start a
    whole, valid UTF-8 sequence (or a NUL) becomes U+FFFD."""
    out, i = [], 0
    while i < len(data):
        for n in (1, 2, 3, 4):
            try:
                ch = data[i:i + n].decode("utf-8")
            except UnicodeDecodeError:
                continue
            if len(ch) == 1 and ch != "\0":
                out.append(ch)
                i += n
                break
        else:
            out.append("\ufffd")
            i += 1
    return "".join(out)


def write_shard(path, tokens):
    """An llm.c token shard: the 256-int32 header (magic, version, count), uint16 tokens."""
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def start_and_wait(ctl, job, seconds=60):
    """Starts job through nsactl and waits for it to end: (run id, whether it
    ended in time, its last status), or (None, False, nsactl's stderr) when
    it did not start."""
    r = run(ctl + ["--json", "start", job])
    if r.returncode != 0:
        return None, False, r.stderr
    rid = json.loads(r.stdout)["id"]
    done = wait_for(lambda: json.loads(run(ctl + ["--json", "status", rid]).stdout)["state"]
                    in ("completed", "failed"), seconds, 0.2)
    return rid, done, json.loads(run(ctl + ["--json", "status", rid]).stdout)


def small_vocab(ctl, sock, tmp, held):
    """A run on token shards of a 100-token vocabulary (data.tokenizer
    char100, which nsad does not run): its checkpoint is sampled as ids,
    evaluated on shards and exported, by the daemon and in the foreground;
    text is refused naming why."""
    shards = os.path.join(tmp, "shards")
    os.makedirs(shards)
    train, val = os.path.join(shards, "tok_train_000.bin"), os.path.join(shards, "tok_val_000.bin")
    write_shard(train, [(i * 7 + i // 5) % 100 for i in range(20000)])
    write_shard(val, [(i * 7 + i // 5 + 3) % 100 for i in range(3000)])
    job = os.path.join(tmp, "job100.yaml")
    with open(job, "w") as f:
        f.write(f"""model: {{dim: 32, n_layers: 2, n_heads: 4, n_kv_groups: 2, d_k: 8, d_v: 8, vocab_size: 100}}
nsa: {{l: 8, d: 4, l_sel: 16, n_sel: 4, w: 16}}
train: {{steps: 6, seq_len: 64, batch_size: 2, lr: 3.0e-3, seed: 9, log_every: 3, eval_every: 3,
        eval_batches: 1, save_every: 6}}
runtime: {{device: cpu, precision: fp32, threads: 1}}
data: {{source: shards, path: {train}, val_path: {val}, tokenizer: char100}}
""")
    rid, done, status = start_and_wait(ctl, job)
    if not check("vocab 100: a run on 100-token shards starts", rid is not None, status):
        return
    if not check("vocab 100: the run completes", done and status["state"] == "completed", status):
        return
    out = status["out_dir"]

    st, _, body = http(sock, "POST", "/api/v1/sample", {"run": rid, "prompt": "Hello", "max_tokens": 5})
    lines = [json.loads(l) for l in body.decode().splitlines() if l]
    msg = lines[-1].get("message", "") if lines else ""
    check("vocab 100: POST /api/v1/sample with a text prompt ends in an error naming the run's "
          "tokenizer, prompt_ids and --prompt-ids", st == 200 and lines[-1].get("event") == "error"
          and "'char100'" in msg and "prompt_ids" in msg and "--prompt-ids" in msg, lines)
    fs = run([NSAD, "sample", out, "--prompt-ids", "1,2, 3", "--max-tokens", "12", "--temperature", "0",
              "--device", "cpu"])
    ids = fs.stdout.split()
    check("vocab 100: nsad sample --prompt-ids prints one line of ids: the prompt's, then 12 new ones "
          "below 100", fs.returncode == 0 and fs.stdout.count("\n") == 1 and ids[:3] == ["1", "2", "3"]
          and len(ids) == 15 and all(0 <= int(i) < 100 for i in ids) and "12 tokens, max_tokens" in fs.stderr,
          (fs.returncode, fs.stdout, fs.stderr))
    again = run([NSAD, "sample", out, "--prompt-ids", "1 2 3", "--max-tokens", "12", "--temperature", "0",
                 "--device", "cpu"])
    check("... greedy is reproducible", again.returncode == 0 and again.stdout == fs.stdout, again.stdout)
    fn = run([NSAD, "sample", out, "--prompt-ids", "1,2,3", "--max-tokens", "4", "--n", "2", "--device", "cpu"])
    check("... --n 2: each continuation's ids under its header", fn.returncode == 0
          and re.fullmatch(r"--- sample 0 \(4 tokens, max_tokens\) ---\n1 2 3( \d+){4}\n"
                           r"--- sample 1 \(4 tokens, max_tokens\) ---\n1 2 3( \d+){4}\n", fn.stdout),
          (fn.stdout, fn.stderr))

    # the daemon's sample route by token ids
    def sample(body):
        st, _, raw = http(sock, "POST", "/api/v1/sample", dict({"run": rid}, **body))
        return st, raw, [json.loads(l) for l in raw.decode().splitlines() if l] if st == 200 else []

    st, _, lines = sample({"prompt_ids": [1, 2, 3], "max_tokens": 12, "temperature": 0})
    new_ids = [l["ids"] for l in lines[1:-1]]
    check("vocab 100: POST /api/v1/sample with prompt_ids: start (its prompt_ids), a line of one new id "
          "per token, done (12 tokens, max_tokens, the text's summary)", st == 200 and len(lines) == 14
          and lines[0].get("event") == "start" and lines[0].get("prompt_ids") == [1, 2, 3]
          and "prompt" not in lines[0] and lines[0].get("samples") == 1
          and all(list(l) == ["ids"] and len(l["ids"]) == 1 and 0 <= l["ids"][0] < 100 for l in lines[1:-1])
          and lines[-1].get("event") == "done" and lines[-1].get("tokens") == 12
          and lines[-1].get("stop") == "max_tokens"
          and lines[-1].get("samples") == [{"tokens": 12, "stop": "max_tokens"}]
          and {"seconds", "prefill_seconds", "tokens_per_s"} <= set(lines[-1]), lines)
    check("... the ids nsad sample --prompt-ids gives in the foreground",
          ["1", "2", "3"] + [str(i[0]) for i in new_ids] == ids, (new_ids, fs.stdout))
    st, _, lines = sample({"prompt_ids": [1, 200], "max_tokens": 5})
    msg = lines[-1].get("message", "") if lines else ""
    check("vocab 100: an id outside the vocabulary ends the stream with an error naming its index, the id "
          "and the vocabulary", st == 200 and len(lines) == 1 and lines[0].get("event") == "error"
          and "prompt_ids[1]: id 200 is not in the model's vocabulary of 100 ids; allowed: 0 to 99" in msg,
          lines)
    st, _, lines = sample({"prompt_ids": [1, 2, 3], "max_tokens": 12, "temperature": 0})
    check("... which left the model kept: the same request again reuses it, with the same ids",
          st == 200 and lines and lines[0].get("reused") is True
          and [l["ids"] for l in lines[1:-1]] == new_ids, lines[:2])
    st, _, lines = sample({"prompt_ids": [1, 2, 3], "n": 2, "max_tokens": 4})
    per = [[l["ids"][0] for l in lines if l.get("sample") == i and "ids" in l] for i in range(2)]
    check("vocab 100: n = 2: every ids line names its continuation, done has each one's count",
          st == 200 and lines[0].get("samples") == 2 and lines[-1].get("event") == "done"
          and all(l.get("sample") in (0, 1) and len(l["ids"]) == 1 for l in lines[1:-1])
          and [len(p) for p in per] == [4, 4] and lines[-1].get("tokens") == 8 and "stop" not in lines[-1]
          and fn.stdout == "".join(f"--- sample {i} (4 tokens, max_tokens) ---\n1 2 3"
                                   + "".join(f" {x}" for x in per[i]) + "\n" for i in range(2)),
          (lines[:3], fn.stdout))
    for body, want in [
            ({"prompt_ids": "1,2,3"}, "prompt_ids: not an array; allowed: an array of 1 to 65536 token ids"),
            ({"prompt_ids": []}, "prompt_ids: empty"),
            ({"prompt_ids": [1, 2.5]}, "prompt_ids[1]: 2.5 is not a whole number"),
            ({"prompt_ids": [1, "2"]}, 'prompt_ids[1]: \\"2\\" is not a number'),
            ({"prompt_ids": [-3]}, "prompt_ids[0]: -3 is out of range; allowed: a whole number from 0 to "
                                   "16777215"),
            ({"prompt_ids": [0] * 65537}, "prompt_ids: 65537 ids, longer than a prompt may be; allowed: "
                                          "an array of 1 to 65536"),
            ({"prompt_ids": [1], "stop": ["a"]}, "stop: stop strings with prompt_ids; allowed: none"),
            ({"prompt_ids": [1], "prompt": "Hello"}, "prompt and prompt_ids: give one of the two, not both"),
            ({"max_tokens": 3}, "prompt (text) or prompt_ids (an array of token ids) is required")]:
        st, raw, _ = sample(body)
        check(f"vocab 100: {json.dumps(body)[:60]}: 400 naming it", st == 400
              and b'"invalid_argument"' in raw and want.encode() in raw, raw[:300])

    # nsactl sample --prompt-ids
    r = run(ctl + ["sample", rid, "--prompt-ids", "1,2, 3", "--max-tokens", "12", "--temperature", "0"])
    check("vocab 100: nsactl sample --prompt-ids prints what nsad sample --prompt-ids prints, the summary "
          "on stderr", r.returncode == 0 and r.stdout == fs.stdout
          and re.fullmatch(r"\[12 tokens, max_tokens, [\d.]+ tokens/s, model kept\]\n", r.stderr),
          (r.returncode, r.stdout, fs.stdout, r.stderr))
    r = run(ctl + ["sample", rid, "--prompt-ids", "1,2,3", "--max-tokens", "4", "--n", "2"])
    check("... --n 2: each continuation's ids under its header, as nsad sample prints them",
          r.returncode == 0 and r.stdout == fn.stdout and "[2 samples, 8 tokens" in r.stderr,
          (r.stdout, fn.stdout, r.stderr))
    r = run(ctl + ["--json", "sample", rid, "--prompt-ids", "1 2 3", "--max-tokens", "3", "--temperature", "0"])
    js = [json.loads(l) for l in r.stdout.splitlines()]
    check("... --json: the daemon's lines (start, ids, done)", r.returncode == 0 and len(js) == 5
          and js[0].get("prompt_ids") == [1, 2, 3] and [l["ids"] for l in js[1:4]] == new_ids[:3]
          and js[4].get("event") == "done", r.stdout)
    r = run(ctl + ["sample", rid, "--prompt-ids", "1,100", "--max-tokens", "3"])
    check("vocab 100: nsactl sample --prompt-ids 1,100: exit 1 naming the id and the vocabulary",
          r.returncode == 1 and r.stdout == "" and "id 100 is not in the model's vocabulary of 100" in r.stderr,
          (r.stdout, r.stderr))
    r = run(ctl + ["sample", rid, "--prompt-ids", "1,x"])
    check("... --prompt-ids 1,x: exit 2 naming 'x'", r.returncode == 2 and "'x' is not a token id" in r.stderr,
          r.stderr)
    r = run(ctl + ["sample", rid, "--prompt-ids", "1,-2"])
    check("... --prompt-ids 1,-2: exit 2 naming '-2'", r.returncode == 2 and "'-2' is not a token id" in r.stderr,
          r.stderr)
    r = run(ctl + ["sample", rid, "--prompt-ids", "1,16777216"])
    check("... an id above any vocabulary: the daemon's 400, exit 2 naming it", r.returncode == 2
          and "prompt_ids[1]: 16777216 is out of range" in r.stderr, r.stderr)
    r = run(ctl + ["sample", rid, "--prompt-ids", " , "])
    check("... no ids: exit 2", r.returncode == 2 and "no ids" in r.stderr, r.stderr)
    r = run(ctl + ["sample", rid, "--prompt", "Hello", "--prompt-ids", "1"])
    check("... --prompt and --prompt-ids: exit 2", r.returncode == 2 and "not both" in r.stderr, r.stderr)
    r = run(ctl + ["sample", rid, "--prompt-ids", "1", "--stop", "a"])
    check("... --stop with --prompt-ids: exit 2", r.returncode == 2 and "stop strings need text" in r.stderr,
          r.stderr)
    r = run(ctl + ["sample", rid])
    check("... neither: exit 2 naming both", r.returncode == 2 and "--prompt TEXT or --prompt-ids" in r.stderr,
          r.stderr)
    r = run(ctl + ["sample", rid, "--prompt", "Hello"])
    check("vocab 100: nsactl sample --prompt TEXT: exit 1 naming the tokenizer and --prompt-ids",
          r.returncode == 1 and r.stdout == "" and "'char100'" in r.stderr and "--prompt-ids" in r.stderr,
          r.stderr)

    ft = run([NSAD, "sample", out, "--prompt", "Hello"])
    check("vocab 100: nsad sample --prompt TEXT: exit 1 naming the tokenizer and --prompt-ids",
          ft.returncode == 1 and ft.stdout == "" and "'char100'" in ft.stderr and "--prompt-ids" in ft.stderr,
          ft.stderr)
    fb = run([NSAD, "sample", out, "--prompt-ids", "1,100"])
    check("vocab 100: an id outside the vocabulary: exit 1 naming it", fb.returncode == 1 and fb.stdout == ""
          and "id 100" in fb.stderr and "vocabulary of 100" in fb.stderr, fb.stderr)
    fu = run([NSAD, "sample", out, "--prompt-ids", "1,x"])
    check("vocab 100: --prompt-ids 1,x: a usage error naming 'x'", fu.returncode == 2 and "'x'" in fu.stderr,
          fu.stderr)

    fe = run([NSAD, "eval", out, "--data", val, "--json", "--device", "cpu"])
    de = run(ctl + ["--json", "eval", rid, "--data", val])
    result = [json.loads(l) for l in de.stdout.splitlines() if '"result"' in l]
    ok = fe.returncode == 0 and de.returncode == 0 and result
    if ok:
        a, b = json.loads(fe.stdout), result[0]
        ok = a["tokens"] == b["tokens"] > 0 and abs(a["loss"] - b["loss"]) <= 1e-9 * a["loss"] \
            and a["bits_per_byte"] is None and b["bits_per_byte"] is None
    check("vocab 100: eval on its shards, the daemon's loss the foreground's, no bits per byte", ok,
          (fe.stdout, fe.stderr, de.stdout, de.stderr))
    fx = run([NSAD, "eval", out, "--data", held])
    check("vocab 100: eval on text: exit 1 naming why", fx.returncode == 1 and "is text" in fx.stderr
          and "'char100'" in fx.stderr, fx.stderr)

    dl = os.path.join(tmp, "dl100")
    r = run(ctl + ["export", rid, "--out", dl])
    c = json.load(open(os.path.join(dl, "config.json"))) if r.returncode == 0 else {}
    shapes = {t["name"]: t["shape"] for t in c.get("tensors", [])}
    check("vocab 100: the export's config.json: vocab_size 100, the run's tokenizer, tok_emb and "
          "lm_head of 100 rows", c.get("vocab_size") == 100
          and c.get("tokenizer") == {"type": "char100", "vocab_size": 100}
          and shapes.get("tok_emb") == [100, 32] and shapes.get("lm_head") == [100, 32], (r.stderr, c))
    fg = os.path.join(tmp, "fg100")
    r = run([NSAD, "export", out, "--out", fg, "--dtype", "bf16"])
    check("... byte for byte what nsad export writes", r.returncode == 0 and all(
        open(os.path.join(dl, f), "rb").read() == open(os.path.join(fg, f), "rb").read()
        for f in ("config.json", "model.safetensors", "README.md")), r.stderr)
    card = open(os.path.join(fg, "README.md")).read() if r.returncode == 0 else ""
    check("... its card: vocab 100 (char100 tokenizer), a val loss and no bits per byte",
          "| vocab | 100 (char100 tokenizer) |" in card and "none: token shards" in card, card[:800])


def main():
    ensure_corpus()
    tmp = tempfile.mkdtemp(prefix="nsad-test-use-")
    sock = os.path.join(tmp, "nsad.sock")
    log = open(os.path.join(tmp, "nsad.log"), "w")
    keep_s = 10   # --model-keep: the checks that reuse a model run well within it
    proc = subprocess.Popen([NSAD, "serve", "--listen", "none", "--socket", sock, "--state-dir",
                             os.path.join(tmp, "state"), "--model-keep", str(keep_s)],
                            stdout=log, stderr=subprocess.STDOUT)
    ctl = [NSACTL, "--socket", sock]
    try:
        if not check("nsad serve starts", wait_for(lambda: os.path.exists(sock), 20),
                     open(os.path.join(tmp, "nsad.log")).read()):
            return
        held = corpus_slice(os.path.join(tmp, "held.txt"), 100000, 20000)
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(f"""model: {{dim: 32, n_layers: 2, n_heads: 4, n_kv_groups: 2, d_k: 8, d_v: 8}}
nsa: {{l: 8, d: 4, l_sel: 16, n_sel: 4, w: 16}}
train: {{steps: 12, seq_len: 64, batch_size: 2, lr: 3.0e-3, seed: 9, log_every: 4, eval_every: 6,
        eval_batches: 1, save_every: 12}}
runtime: {{device: cpu, precision: fp32, threads: 1}}
data: {{source: text, path: {CORPUS}, tokenizer: byte, val_fraction: 0.05}}
""")
        run_id, done, status = start_and_wait(ctl, job)
        if not check("a run starts", run_id is not None, status):
            return
        check("the run completes", done)
        out_dir = status["out_dir"]

        # samples written during training
        with open(os.path.join(out_dir, "samples.jsonl")) as f:
            rows = [json.loads(l) for l in f]
        check("samples.jsonl: one line per evaluation (steps 0, 6, 12), three prompts each",
              [r["step"] for r in rows] == [0, 6, 12] and all(len(r["samples"]) == 3 for r in rows)
              and all(len(s["text"].encode()) >= 96 for r in rows for s in r["samples"]), rows[:1])
        ev = json.loads(run(ctl + ["--json", "events", run_id]).stdout)["events"]
        se = [e for e in ev if e["type"] == "samples"]
        check("samples events carry the samples", len(se) == 3 and se[-1]["detail"]["samples"][0]["prompt"]
              == rows[-1]["samples"][0]["prompt"], [e["type"] for e in ev])

        # sample: streamed JSON lines
        st, hd, body = http(sock, "POST", "/api/v1/sample",
                            {"run": run_id, "prompt": "Hello", "max_tokens": 30, "temperature": 0})
        lines = [json.loads(l) for l in body.decode().splitlines() if l]
        check("POST /api/v1/sample: 200, chunked, application/x-ndjson",
              st == 200 and hd.get("transfer-encoding") == "chunked"
              and hd.get("content-type", "").startswith("application/x-ndjson"), (st, hd))
        check("the lines: start, text pieces, done", lines and lines[0].get("event") == "start"
              and lines[-1].get("event") == "done" and lines[-1]["tokens"] == 30
              and lines[-1]["stop"] == "max_tokens" and all("text" in l for l in lines[1:-1]), lines[:3])
        streamed = "".join(l.get("text", "") for l in lines[1:-1])
        check("the first sample job loads the model (start: reused false)",
              lines and lines[0].get("reused") is False, lines[:1])
        st, _, body = http(sock, "POST", "/api/v1/sample",
                           {"run": run_id, "prompt": "Hello", "max_tokens": 30, "temperature": 0})
        again = [json.loads(l) for l in body.decode().splitlines() if l]
        check("the next one reuses it (reused true) and gives the same greedy text",
              st == 200 and again and again[0].get("reused") is True
              and "".join(l.get("text", "") for l in again[1:-1]) == streamed, again[:1])
        r1 = run(ctl + ["sample", run_id, "--prompt", "Hello", "--max-tokens", "30", "--temperature", "0"])
        r2 = run(ctl + ["sample", run_id, "--prompt", "Hello", "--max-tokens", "30", "--temperature", "0"])
        check("nsactl sample: greedy is reproducible", r1.returncode == 0 and r1.stdout == r2.stdout
              and r1.stdout.startswith("Hello"), r1.stderr)
        check("... its summary says the daemon had the model kept", r2.stderr.rstrip().endswith(", model kept]"),
              r2.stderr)
        fg = subprocess.run([NSAD, "sample", out_dir, "--prompt", "Hello", "--max-tokens", "30",
                             "--temperature", "0", "--device", "cpu"], capture_output=True, timeout=60)
        check("the daemon's text is the foreground's (nsad sample, raw bytes there)", fg.returncode == 0
              and clean_utf8(fg.stdout) == r1.stdout.rstrip("\n") and r1.stdout.rstrip("\n") == "Hello" + streamed,
              (fg.stdout, r1.stdout))
        st, _, body = http(sock, "POST", "/api/v1/sample", {"run": run_id, "prompt_ids": list(b"Hello"),
                                                            "max_tokens": 30, "temperature": 0})
        byid = [json.loads(l) for l in body.decode().splitlines() if l]
        check("a byte model takes prompt_ids: start has them (no prompt), ids lines of one id each, "
              "the ids the text's bytes (nsad sample's raw bytes), done as for text",
              st == 200 and byid and byid[0].get("prompt_ids") == list(b"Hello") and "prompt" not in byid[0]
              and all(list(l) == ["ids"] and len(l["ids"]) == 1 for l in byid[1:-1])
              and [l["ids"][0] for l in byid[1:-1]] == list(fg.stdout[len("Hello"):])
              and byid[-1].get("event") == "done" and byid[-1].get("tokens") == 30
              and byid[-1].get("stop") == "max_tokens", (byid[:3], byid[-1:], fg.stdout[:40]))
        r3 = run(ctl + ["sample", run_id, "--prompt", "Hello", "--max-tokens", "200", "--seed", "4"])
        gen = r3.stdout[len("Hello"):]
        at = next(i for i in range(len(gen) - 1) if gen[i:i + 2].isascii() and gen[i:i + 2].isprintable())
        stop = gen[at:at + 2]   # two printable ASCII bytes: the same in the raw bytes
        r4 = run(ctl + ["sample", run_id, "--prompt", "Hello", "--max-tokens", "200", "--seed", "4",
                        "--stop", stop])
        check("a stop string ends the text at its first occurrence", r4.returncode == 0
              and r4.stdout.rstrip("\n") == "Hello" + r3.stdout[len("Hello"):].split(stop)[0] + stop
              and "stop," in r4.stderr, (stop, r3.stdout[:40], r4.stdout[:40], r4.stderr))

        # several continuations of one prompt: one prefill, a stream each
        st, _, body = http(sock, "POST", "/api/v1/sample",
                           {"run": run_id, "prompt": "Hello", "n": 3, "max_tokens": 200, "seed": 4})
        lines = [json.loads(l) for l in body.decode().splitlines() if l]
        texts = ["".join(l["text"] for l in lines if l.get("sample") == i and "text" in l) for i in range(3)]
        done = lines[-1] if lines else {}
        check("n = 3: start says 3, every text line names its sample, done has each one's count",
              st == 200 and lines[0].get("samples") == 3 and done.get("event") == "done"
              and all(l.get("sample") in (0, 1, 2) for l in lines[1:-1])
              and [e["tokens"] for e in done.get("samples", [])] == [200, 200, 200] and done["tokens"] == 600,
              (st, lines[:2], done))
        check("... sample 0 is the single sample of that seed, the others differ",
              # (run() reads text with universal newlines: \r and \r\n come out as \n)
              "Hello" + re.sub(r"\r\n?", "\n", texts[0]) == r3.stdout.rstrip("\n")
              and texts[1] != texts[0] and texts[2] != texts[1],
              (texts[0][:40], r3.stdout[:40]))
        r5 = run(ctl + ["sample", run_id, "--prompt", "Hello", "--n", "2", "--max-tokens", "20"])
        check("nsactl sample --n 2: each continuation under its own header",
              r5.returncode == 0 and "--- sample 0 (20 tokens, max_tokens) ---\nHello" in r5.stdout
              and "--- sample 1 (20 tokens, max_tokens) ---\nHello" in r5.stdout
              and "[2 samples, 40 tokens" in r5.stderr, (r5.stdout[:200], r5.stderr))
        fg2 = subprocess.run([NSAD, "sample", out_dir, "--prompt", "Hello", "--n", "2", "--max-tokens", "20",
                              "--device", "cpu"], capture_output=True, timeout=60)
        parts = fg2.stdout.split(b"--- sample ")
        check("nsad sample --n 2 (foreground): two continuations under headers, 40 tokens in all",
              fg2.returncode == 0 and len(parts) == 3 and parts[1].startswith(b"0 (20 tokens, max_tokens) ---\nHello")
              and parts[2].startswith(b"1 (20 tokens, max_tokens) ---\nHello") and parts[1][2:] != parts[2][2:]
              and b"40 tokens" in fg2.stderr, (fg2.stdout[:120], fg2.stderr))
        bad = subprocess.run([NSAD, "sample", out_dir, "--prompt", "Hello", "--n", "2.5"],
                             capture_output=True, timeout=60)
        check("nsad sample --n 2.5: refused (exit 2), naming the flag and what is allowed",
              bad.returncode == 2 and bad.stdout == b""
              and b"--n '2.5' is not allowed; allowed: an integer from 1 to" in bad.stderr, bad.stderr)
        check("n = 3 after jobs of one slot builds a decoder (reused false)", lines[0].get("reused") is False,
              lines[:1])
        st, _, body = http(sock, "POST", "/api/v1/sample",
                           {"run": run_id, "prompt": "Hello", "n": 2, "max_tokens": 200, "seed": 4})
        two = [json.loads(l) for l in body.decode().splitlines() if l]
        two_text = "".join(l["text"] for l in two if l.get("sample") == 1 and "text" in l)
        check("n = 2 then reuses the three-slot decoder, with the same continuation 1",
              st == 200 and two and two[0].get("reused") is True and two_text == texts[1],
              (two[:1], two_text[:40], texts[1][:40]))
        latest = os.path.join(out_dir, "checkpoints",
                              open(os.path.join(out_dir, "checkpoints", "latest")).read().strip(),
                              "model.safetensors")
        os.utime(latest, ns=(os.stat(latest).st_atime_ns, os.stat(latest).st_mtime_ns + 1000))
        st, _, body = http(sock, "POST", "/api/v1/sample", {"run": run_id, "prompt": "Hello", "max_tokens": 5})
        changed = [json.loads(l) for l in body.decode().splitlines() if l]
        check("a checkpoint file that changed is loaded again (reused false, logged)",
              st == 200 and changed and changed[0].get("reused") is False
              and "its model.safetensors changed" in open(os.path.join(tmp, "nsad.log")).read(),
              changed[:1])
        # streamed as generated: each text line leaves when it is written, not at the HTTP
        # thread's next periodic wake-up (that batched a job's lines into a few reads)
        body = json.dumps({"run": run_id, "prompt": "Hello", "max_tokens": 3000}).encode()
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(sock)
        c.sendall(b"POST /api/v1/sample HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        reads, got = 0, b""
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            reads += 1
            got += chunk
        c.close()
        check("a 3000-token sample reaches the client in many reads as it is generated",
              b'"event":"done"' in got and reads >= 30, (reads, got[-80:]))
        last_sample = time.monotonic()
        st, _, body = http(sock, "POST", "/api/v1/sample", {"run": run_id, "prompt": "x", "n": 17})
        check("n = 17: 400 naming n", st == 400 and b"n: out of range" in body, body)
        r = run(ctl + ["sample", run_id, "--prompt", "x", "--n", "0"])
        check("nsactl sample --n 0: exit 2 naming it", r.returncode == 2 and "--n" in r.stderr, r.stderr)

        # eval
        fe = run([NSAD, "eval", out_dir, "--data", held, "--json", "--device", "cpu"])
        de = run(ctl + ["--json", "eval", run_id, "--data", held])
        result = [json.loads(l) for l in de.stdout.splitlines() if '"result"' in l]
        ok = fe.returncode == 0 and de.returncode == 0 and result
        if ok:
            a, b = json.loads(fe.stdout), result[0]
            ok = a["tokens"] == b["tokens"] and abs(a["loss"] - b["loss"]) <= 1e-9 * a["loss"] \
                and abs(a["bits_per_byte"] - b["bits_per_byte"]) <= 1e-9 * a["bits_per_byte"]
        check("nsactl eval reports what nsad eval computes", ok, (fe.stdout, fe.stderr, de.stdout, de.stderr))
        check("nsactl eval --json streams progress lines before the result",
              '"progress"' in de.stdout.split('"result"')[0], de.stdout[:300])

        # export: made in the state dir, downloaded, the same bytes as nsad export
        dl = os.path.join(tmp, "dl")
        r = run(ctl + ["export", run_id, "--out", dl])
        files = ["README.md", "config.json", "model.safetensors"]
        check("nsactl export RUN --out DIR: the three files", r.returncode == 0
              and sorted(os.listdir(dl)) == files, (r.returncode, r.stderr, os.listdir(dl) if
                                                     os.path.isdir(dl) else None))
        fg_dir = os.path.join(tmp, "fg-export")
        fx = run([NSAD, "export", out_dir, "--out", fg_dir, "--dtype", "bf16"])
        same = fx.returncode == 0 and all(
            open(os.path.join(dl, f), "rb").read() == open(os.path.join(fg_dir, f), "rb").read()
            for f in files)
        check("... byte for byte what nsad export writes in the foreground", same, fx.stderr)
        st, _, body = http(sock, "POST", "/api/v1/export", {"run": run_id})
        lines = [json.loads(l) for l in body.decode().splitlines() if l.startswith("{")]
        done = lines[-1] if lines else {}
        check("POST /api/v1/export again: done, reused, the files and their sizes",
              st == 200 and done.get("event") == "done" and done.get("reused") is True
              and [f["name"] for f in done.get("files", [])] == ["model.safetensors", "config.json",
                                                                  "README.md"]
              and done["files"][0]["bytes"] == os.path.getsize(os.path.join(dl, "model.safetensors")),
              lines)
        name = done.get("name", "")
        st, hd, body = http(sock, "GET", f"/api/v1/exports/{name}/config.json")
        check("GET /api/v1/exports/NAME/config.json: the file, as JSON",
              st == 200 and hd.get("content-type") == "application/json"
              and body == open(os.path.join(dl, "config.json"), "rb").read(), (st, hd))
        st, _, body = http(sock, "GET", f"/api/v1/exports/{name}/run.json")
        check("a file that is not one of the three: 404", st == 404, body)
        st, _, body = http(sock, "GET", f"/api/v1/exports/..%2F..%2Fruns/config.json")
        check("a path out of the exports: refused (400 bad_path)", st == 400 and b"bad_path" in body, body)
        st, _, body = http(sock, "GET", f"/api/v1/exports/step_1-bf16-00000000/config.json")
        check("an export that is not there: 404", st == 404, body)
        r = run(ctl + ["export", run_id, "--out", dl])
        check("nsactl export into a directory holding them: exit 2, nothing overwritten",
              r.returncode == 2 and "exists" in r.stderr and sorted(os.listdir(dl)) == files, r.stderr)
        r = run(ctl + ["export", run_id, "--out", os.path.join(tmp, "dl3"), "--dtype", "f16"])
        check("--dtype f16: exit 2 naming what is allowed", r.returncode == 2 and "bf16 or f32" in r.stderr,
              r.stderr)
        st, _, body = http(sock, "POST", "/api/v1/export", {"run": run_id, "dtype": "f16"})
        check("dtype f16 in the body: 400 naming it", st == 400 and b"dtype" in body, body)

        released = wait_for(lambda: "no sample job for the keep time" in open(os.path.join(tmp, "nsad.log")).read(),
                            keep_s + 30, 0.5)
        check(f"the kept model is released after --model-keep {keep_s} s without a sample job",
              released and time.monotonic() - last_sample >= keep_s - 1,
              open(os.path.join(tmp, "nsad.log")).read()[-600:])

        small_vocab(ctl, sock, tmp, held)

        # refusals
        r = run(ctl + ["sample", "no-such-run", "--prompt", "x"])
        check("an unknown run: exit 4", r.returncode == 4 and "no run" in r.stderr, r.stderr)
        r = run(ctl + ["sample", run_id, "--prompt", "x", "--temperature", "-1"])
        check("a bad temperature: exit 2 naming it", r.returncode == 2 and "temperature" in r.stderr, r.stderr)
        st, _, body = http(sock, "POST", "/api/v1/sample", {"run": run_id})
        check("no prompt: 400 naming it", st == 400 and b"prompt" in body, body)
        st, _, body = http(sock, "POST", "/api/v1/sample", {"run": run_id, "prompt": "x", "tokens": 3})
        check("an unknown field: 400 naming it", st == 400 and b"tokens" in body, body)
        st, _, body = http(sock, "POST", "/api/v1/eval", {"checkpoint": tmp, "data": held})
        check("a directory without a checkpoint: 404", st == 404, body)
        st, _, body = http(sock, "GET", "/api/v1/sample")
        check("GET /api/v1/sample: 405", st == 405, body)

        # a client that leaves mid-stream cancels its job
        st, _, first, s = http(sock, "POST", "/api/v1/eval",
                               {"run": run_id, "data": CORPUS, "seq_len": 32, "batch": 1}, read_lines=1)
        s.close()
        r = run(ctl + ["sample", run_id, "--prompt", "Hi", "--max-tokens", "5"], timeout=60)
        check("after a client left mid-eval, the next job runs", st == 200 and r.returncode == 0, r.stderr)
        logtext = open(os.path.join(tmp, "nsad.log")).read()
        check("... and the left job was cancelled, not run to its end",
              "(cancelled: its reader left)" in logtext, logtext[-500:])

        # SIGTERM while a stream is open
        st, _, first, s = http(sock, "POST", "/api/v1/eval",
                               {"run": run_id, "data": CORPUS, "seq_len": 32, "batch": 1}, read_lines=1)
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            rc = None
        rest = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                rest += chunk
        except OSError:
            pass
        s.close()
        check("SIGTERM during a stream: nsad exits 0 and the stream ends", st == 200 and rc == 0,
              (rc, open(os.path.join(tmp, "nsad.log")).read()[-800:]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
    sys.exit(finish())
