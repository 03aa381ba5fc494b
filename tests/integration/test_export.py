#!/usr/bin/env python3
"""test_export.py - `nsad export` end to end: a tiny CPU run writes a
checkpoint, the export is read back with a standard-library safetensors
parser (and with Python's own `safetensors` package where it is installed:
it is no Debian package) and every tensor's name, dtype, shape and values
are checked against the checkpoint (f32: bit-identical; bf16: the
checkpoint's values rounded to nearest even, bit for bit); config.json
against the checkpoint's model config; the model card's figures; and the
refusals (an existing export, a bad --dtype, a directory without a
checkpoint), each leaving nothing behind.

Prints TAP and exits non-zero on failure. Standard library only.
"""
import array
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

from nsadtest import CORPUS, NSAD, check, ensure_corpus, finish, skip


def read_safetensors(path):
    """(tensors {name: (dtype, shape, raw bytes)}, metadata) by the format:
    8-byte little-endian header length, JSON header, contiguous data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    assert (8 + n) % 8 == 0, "data must start at a multiple of 8"
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    out, end = {}, 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        a, b = t["data_offsets"]
        assert a == end, f"{name}: data not contiguous ({a} after {end})"
        end = b
        out[name] = (t["dtype"], t["shape"], data[a:b])
    assert end == len(data), "data ends where the last tensor ends"
    return out, meta


def bf16_bits(f32_bytes):
    """bfloat16 bits of little-endian f32 values, round to nearest even."""
    u = array.array("I")
    u.frombytes(f32_bytes)
    out = array.array("H")
    for x in u:
        if (x & 0x7FFFFFFF) > 0x7F800000:
            out.append((x >> 16) | 0x40)
        else:
            out.append(((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF)
    return out.tobytes()


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def run(args, **kw):
    return subprocess.run([NSAD] + args, capture_output=True, text=True, timeout=120, **kw)


def main():
    ensure_corpus()
    tmp = tempfile.mkdtemp(prefix="nsad-test-export-")
    try:
        out = os.path.join(tmp, "run")
        cfg = os.path.join(tmp, "job.yaml")
        with open(cfg, "w") as f:
            f.write(f"""model: {{dim: 32, n_layers: 2, n_heads: 4, n_kv_groups: 2, d_k: 8, d_v: 8, vocab_size: 256}}
nsa: {{l: 8, d: 4, l_sel: 16, n_sel: 4, w: 32, phi: mlp}}
train: {{steps: 6, seq_len: 64, batch_size: 2, lr: 3.0e-3, seed: 5, log_every: 2, eval_every: 3,
        eval_batches: 1, save_every: 6, out_dir: {out}}}
runtime: {{device: cpu, precision: fp32, threads: 1}}
data: {{source: text, path: {CORPUS}, tokenizer: byte, val_fraction: 0.05}}
""")
        r = run(["train", cfg])
        if not check("a tiny run trains and saves a checkpoint", r.returncode == 0, r.stderr):
            return
        ck = os.path.join(out, "checkpoints", "step_00000006")
        ck_t, ck_meta = read_safetensors(os.path.join(ck, "model.safetensors"))
        model_cfg = json.loads(ck_meta["model_config"])

        for dtype in ("f32", "bf16"):
            dst = os.path.join(tmp, "export-" + dtype)
            r = run(["export", out if dtype == "f32" else ck, "--out", dst, "--dtype", dtype])
            if not check(f"{dtype}: nsad export exits 0", r.returncode == 0, r.stderr):
                continue
            check(f"{dtype}: the three files", sorted(os.listdir(dst)) == ["README.md", "config.json",
                                                                            "model.safetensors"],
                  os.listdir(dst))
            ex_t, ex_meta = read_safetensors(os.path.join(dst, "model.safetensors"))
            check(f"{dtype}: the checkpoint's tensor names, no more, no fewer", set(ex_t) == set(ck_t),
                  sorted(set(ex_t) ^ set(ck_t)))
            want_dtype = "F32" if dtype == "f32" else "BF16"
            bad = []
            for name, (cdt, cshape, cdata) in ck_t.items():
                if name not in ex_t:
                    continue
                edt, eshape, edata = ex_t[name]
                want = cdata if dtype == "f32" else bf16_bits(cdata)
                if edt != want_dtype or eshape != cshape or len(edata) != numel(cshape) * (4 if dtype == "f32" else 2) \
                        or edata != want:
                    bad.append(name)
            check(f"{dtype}: every tensor's dtype, shape and values match the checkpoint", not bad, bad[:5])
            check(f"{dtype}: metadata format and step", ex_meta.get("nsad_format") == "nsad-export-1"
                  and ex_meta.get("step") == "6" and ex_meta.get("format") == "pt", ex_meta)
            with open(os.path.join(dst, "config.json")) as f:
                c = json.load(f)
            m, nsa = model_cfg["model"], model_cfg["nsa"]
            same = (c["dim"] == m["dim"] and c["n_layers"] == m["n_layers"] and c["n_heads"] == m["n_heads"]
                    and c["n_kv_groups"] == m["n_kv_groups"] and c["d_k"] == m["d_k"] and c["d_v"] == m["d_v"]
                    and c["vocab_size"] == m["vocab_size"] and c["nsa"]["cmp_len"] == nsa["l"]
                    and c["nsa"]["cmp_stride"] == nsa["d"] and c["nsa"]["sel_len"] == nsa["l_sel"]
                    and c["nsa"]["n_sel"] == nsa["n_sel"] and c["nsa"]["window"] == nsa["w"]
                    and c["nsa"]["phi"] == "mlp" and c["mlp_hidden"] == 4 * m["dim"])
            check(f"{dtype}: config.json has every size of the model config", same, json.dumps(c)[:400])
            check(f"{dtype}: config.json: RoPE convention, tokenizer, dtype",
                  c["rope"]["pairing"] == "split_halves" and c["rope"]["base"] == 10000
                  and c["tokenizer"]["type"] == "byte" and c["tokenizer"]["vocab_size"] == 256
                  and c["dtype"] == ("float32" if dtype == "f32" else "bfloat16"), c.get("rope"))
            check(f"{dtype}: config.json's tensor table is the file's",
                  {t["name"]: t["shape"] for t in c["tensors"]} == {k: v[1] for k, v in ex_t.items()})
            with open(os.path.join(dst, "README.md")) as f:
                card = f.read()
            with open(os.path.join(out, "val.csv")) as f:
                last = f.read().strip().splitlines()[-1].split(",")
            check(f"{dtype}: the model card has steps, tokens, val bits/byte and the config",
                  "| optimizer steps | 6 |" in card and "| tokens seen | 768 |" in card
                  and f"{float(last[2]):.4f}" in card and "l_sel: 16" in card, card[:600])
            try:
                from safetensors import safe_open  # present on some machines, not a Debian package
            except ImportError:
                skip(f"{dtype}: Python safetensors loads the export", "not installed")
                continue
            if dtype == "f32":
                with safe_open(os.path.join(dst, "model.safetensors"), framework="numpy") as f:
                    ok = all(list(f.get_tensor(k).shape) == ex_t[k][1] for k in f.keys())
                check(f"{dtype}: Python safetensors loads the export", ok)

        # refusals: nothing is overwritten or created
        dst = os.path.join(tmp, "export-f32")
        before = {n: os.path.getmtime(os.path.join(dst, n)) for n in os.listdir(dst)}
        r = run(["export", ck, "--out", dst])
        check("an existing export is refused (exit 1) and left alone",
              r.returncode == 1 and "exists" in r.stderr
              and before == {n: os.path.getmtime(os.path.join(dst, n)) for n in os.listdir(dst)}, r.stderr)
        r = run(["export", ck, "--out", os.path.join(tmp, "x"), "--dtype", "f16"])
        check("--dtype f16 is a usage error naming the allowed values",
              r.returncode == 2 and "bf16 or f32" in r.stderr and not os.path.exists(os.path.join(tmp, "x")),
              r.stderr)
        r = run(["export", tmp, "--out", os.path.join(tmp, "y")])
        check("a directory without a checkpoint is refused", r.returncode == 1 and r.stderr.strip() != ""
              and not os.path.exists(os.path.join(tmp, "y")), r.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
    sys.exit(finish())
