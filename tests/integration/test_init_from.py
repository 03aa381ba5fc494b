#!/usr/bin/env python3
"""test_init_from.py - a run that starts from another run's weights
(train.init_from, `nsactl start --init-from`): fine-tuning and continued
training.

Under `nsad serve`: a tiny CPU run trains; a second job started with
--init-from its id gets train.init_from fixed to the absolute path of the
checkpoint that was the latest then, starts at step 0 with that model (its
step-0 held-out loss is, bit for bit, the first run's last: the same
weights on the same held-out batches) and logs what it loaded; a job that
also widens the window (nsa.w, which shapes no weight) is taken and the
change logged. Refusals, each an exit 78 naming what was wrong, creating
no run: an unknown run id, a path with no checkpoint, a model whose sizes
differ (model.dim), a run with no checkpoint yet. In the foreground, `nsad
train` with train.init_from in the file does the same.

Prints TAP; exits non-zero on failure. Standard library only; every wait
bounded; the nsad it starts is killed on the way out.
"""
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

from nsadtest import CORPUS, NSACTL, NSAD, check, corpus_slice, ensure_corpus, finish, wait_for

MODEL = "{dim: 32, n_layers: 2, n_heads: 4, n_kv_groups: 2, d_k: 8, d_v: 8}"


def job_text(steps, nsa="{l: 8, d: 4, l_sel: 16, n_sel: 4, w: 16}", model=MODEL, extra=""):
    return f"""model: {model}
nsa: {nsa}
train: {{steps: {steps}, seq_len: 64, batch_size: 2, lr: 3.0e-3, seed: 9, log_every: 4,
        eval_every: 4, eval_batches: 1, save_every: 4{extra}}}
runtime: {{device: cpu, precision: fp32, threads: 1}}
data: {{source: text, path: {CORPUS}, tokenizer: byte, val_fraction: 0.05}}
"""


def write_job(tmp, name, text):
    """tmp/name holding text; its path."""
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def run(args, timeout=60):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def val_rows(out_dir):
    with open(os.path.join(out_dir, "val.csv")) as f:
        return [(int(r["step"]), r["val_loss"]) for r in csv.DictReader(f)]


def main():
    ensure_corpus()
    tmp = tempfile.mkdtemp(prefix="nsad-test-init-")
    sock = os.path.join(tmp, "nsad.sock")
    log_path = os.path.join(tmp, "nsad.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([NSAD, "serve", "--listen", "none", "--socket", sock, "--state-dir",
                             os.path.join(tmp, "state")], stdout=log, stderr=subprocess.STDOUT,
                            cwd=tmp)
    ctl = [NSACTL, "--socket", sock]
    ok = False
    try:
        if not check("nsad serve starts", wait_for(lambda: os.path.exists(sock), 20),
                     open(log_path).read()):
            return
        status = lambda rid: json.loads(run(ctl + ["--json", "status", rid]).stdout)
        ended = lambda rid: wait_for(lambda: status(rid)["state"] in ("completed", "failed"), 60, 0.1)

        base_yaml = write_job(tmp, "base.yaml", job_text(8))
        r = run(ctl + ["--json", "start", base_yaml])
        base = json.loads(r.stdout)["id"] if r.returncode == 0 else None
        if not check("the first run starts", base is not None, r.stderr):
            return
        check("the first run completes", ended(base) and status(base)["state"] == "completed")
        base_out = status(base)["out_dir"]
        base_ck = os.path.realpath(os.path.join(base_out, "checkpoints", "step_00000008"))

        # fine-tuning through nsactl: the run id resolved to its checkpoint
        ft_yaml = write_job(tmp, "ft.yaml", job_text(4))
        r = run(ctl + ["--json", "start", ft_yaml, "--init-from", base, "--wait"])
        ft = json.loads(r.stdout)["id"] if r.returncode == 0 else None
        if not check("nsactl start --init-from RUN_ID: the run starts", ft is not None, r.stderr):
            return
        check("it completes", ended(ft) and status(ft)["state"] == "completed", status(ft))
        ft_out = status(ft)["out_dir"]
        with open(os.path.join(os.path.dirname(ft_out), "config.yaml")) as f:
            stored = f.read()
        check("the run object and nsactl status name the checkpoint it started from",
              status(ft).get("init_from") == base_ck
              and f"init from   {base_ck}" in run(ctl + ["status", ft]).stdout,
              (status(ft).get("init_from"), run(ctl + ["status", ft]).stdout))
        check("its stored config holds train.init_from fixed to the checkpoint's absolute path",
              f"init_from: \"{base_ck}\"" in stored or f"init_from: {base_ck}" in stored,
              [l for l in stored.splitlines() if "init_from" in l])
        base_val, ft_val = val_rows(base_out), val_rows(ft_out)
        check("its step-0 held-out loss is the first run's last, bit for bit (the same weights)",
              ft_val and base_val and ft_val[0] == (0, base_val[-1][1]), (base_val, ft_val))
        logs = run(ctl + ["logs", ft]).stdout
        check("its log names the checkpoint it started from",
              f"init: the weights of {base_ck} (step 8 of its run" in logs, logs[-1500:])
        ev = json.loads(run(ctl + ["--json", "events", ft]).stdout)["events"]
        start = next((e for e in ev if e["type"] == "start"), None)
        check("its start event carries init_from",
              start and start["detail"].get("init_from") == base_ck, start)

        # a path, and a change that shapes no weight
        wide = write_job(tmp, "wide.yaml",
                         job_text(4, nsa="{l: 8, d: 4, l_sel: 16, n_sel: 4, w: 32}"))
        r = run(ctl + ["--json", "start", wide, "--init-from", base_out, "--wait"])
        wide_id = json.loads(r.stdout)["id"] if r.returncode == 0 else None
        check("--init-from a run's out_dir path, with nsa.w widened: taken",
              wide_id is not None and ended(wide_id) and status(wide_id)["state"] == "completed",
              r.stderr)
        if wide_id:
            logs = run(ctl + ["logs", wide_id]).stdout
            check("the widened window is logged", "shapes no weight: nsa.w 16 -> 32" in logs,
                  logs[-1500:])

        # fine-tuning with a held-out file of its own (data.val_path)
        held = corpus_slice(os.path.join(tmp, "held.txt"), 50000, 3000)
        tuned_yaml = write_job(tmp, "tuned.yaml",
                               job_text(4).replace("val_fraction: 0.05", f"val_path: {held}"))
        r = run(ctl + ["--json", "start", tuned_yaml, "--init-from", base, "--wait"])
        tuned = json.loads(r.stdout)["id"] if r.returncode == 0 else None
        fe = run([NSAD, "eval", base_ck, "--data", held, "--seq-len", "64", "--batch", "2",
                  "--max-tokens", "128", "--json", "--device", "cpu"])
        ok_tuned = tuned and ended(tuned) and status(tuned)["state"] == "completed" and fe.returncode == 0
        first = val_rows(status(tuned)["out_dir"])[0] if ok_tuned else None
        check("data.val_path: validation reads that file (step 0 = nsad eval of the start weights "
              "on its first batch)", ok_tuned and first[0] == 0
              and abs(float(first[1]) - json.loads(fe.stdout)["loss"]) < 1e-9,
              (r.stderr, first, fe.stdout, fe.stderr))
        missing_val = write_job(tmp, "missing-val.yaml",
                                job_text(4).replace("val_fraction: 0.05", "val_path: no/such.txt"))
        r = run(ctl + ["start", missing_val])
        check("a data.val_path that does not exist: refused (78) naming it",
              r.returncode == 78 and "data.val_path" in r.stderr, (r.returncode, r.stderr))

        # refusals: exit 78, the field named, no run created
        before = len(json.loads(run(ctl + ["--json", "list"]).stdout)["runs"])
        r = run(ctl + ["start", ft_yaml, "--init-from", "0123456789ab"])
        check("an unknown run id: refused (78) naming init_from",
              r.returncode == 78 and "init_from" in r.stderr, (r.returncode, r.stderr))
        r = run(ctl + ["start", ft_yaml, "--init-from", tmp + "/"])
        check("a path without a checkpoint: refused (78) naming it",
              r.returncode == 78 and "init_from" in r.stderr and "neither" in r.stderr,
              (r.returncode, r.stderr))
        wider = write_job(tmp, "wider.yaml", job_text(4, model=MODEL.replace("dim: 32", "dim: 48")))
        r = run(ctl + ["start", wider, "--init-from", base])
        check("a model whose sizes differ: refused (78) naming model.dim and both values",
              r.returncode == 78 and "model.dim = 32; this job's is 48" in r.stderr,
              (r.returncode, r.stderr))
        other_tok = write_job(tmp, "other-tokenizer.yaml",
                              job_text(4).replace(f"source: text, path: {CORPUS}, tokenizer: byte",
                                                  "source: synthetic, tokenizer: gpt2"))
        r = run(ctl + ["start", other_tok, "--init-from", base])
        check("a checkpoint of another tokenizer: refused (78) naming both",
              r.returncode == 78 and "'byte'; this job's is 'gpt2'" in r.stderr,
              (r.returncode, r.stderr))
        in_file = write_job(tmp, "in-file.yaml", job_text(4, extra=", init_from: nothing/here"))
        r = run(ctl + ["start", in_file])
        check("train.init_from in the file is checked the same way (relative to nsad's directory)",
              r.returncode == 78 and "train.init_from: \"nothing/here\" (relative to nsad's working "
              "directory" in r.stderr, (r.returncode, r.stderr))
        check("no run was created by the refusals",
              len(json.loads(run(ctl + ["--json", "list"]).stdout)["runs"]) == before)
        long_yaml = write_job(tmp, "long.yaml",
                              job_text(1000000).replace("save_every: 4", "save_every: 1000000"))
        r = run(ctl + ["--json", "start", long_yaml])
        busy = json.loads(r.stdout)["id"] if r.returncode == 0 else None
        r = run(ctl + ["start", ft_yaml, "--init-from", busy or "x"])
        check("a run that has written no checkpoint yet: refused (78) saying so",
              busy and r.returncode == 78 and "no checkpoint yet" in r.stderr, (r.returncode, r.stderr))
        if busy:
            run(ctl + ["halt", busy])
            wait_for(lambda: status(busy)["state"] in ("halted", "completed", "failed"), 60, 0.1)

        # the foreground: nsad train with init_from in the file
        fg_out = os.path.join(tmp, "fg")
        fg = write_job(tmp, "fg.yaml", job_text(4, extra=f", init_from: {base_ck}, out_dir: {fg_out}"))
        r = run([NSAD, "train", fg])
        check("nsad train with train.init_from: starts from those weights",
              r.returncode == 0 and val_rows(fg_out)[0] == (0, base_val[-1][1]),
              r.stderr[-1500:])
        ok = True
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
    sys.exit(finish())
