#!/usr/bin/env python3
"""serve_checks.py - nsad serve on the GPU machine: runs side by side.

With the real engine on real GPUs (tests/unit/test_scheduler.c checks the
scheduler with a made-up node and a stand-in trainer), this checks:
  - one trainer per GPU and one for the CPU engine (GET /health);
  - a CUDA run on the last GPU and a CPU run train at once (both running,
    active_runs holds both, nsad_trainer_busy 2, the CUDA run names its
    GPU and reports MFU); the CPU run completes beside the CUDA one;
  - a second CUDA run claiming that GPU waits in the queue while the first
    trains, and starts and completes once the first is halted;
  - a sample of the halted CUDA run (its halt checkpoint) says which GPU it
    ran on; the next one reuses the kept model (same text), and a run that
    claims that GPU releases it;
  - with two or more GPUs: runs on GPU 0 and GPU 1 train at once.
Orders are read from the runs' own states, never from timing.

Needs build/nsad built with CUDA (on the lent machine: the Debian libraries
unpacked beside it, see tests/gpu/serve_checks.sh). Prints TAP and
"N passed, N failed"; exits 1 on a failure. NCCL_NVLS_ENABLE=0 is set for
the daemon.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import nsadtest  # noqa: E402
import test_api as T  # noqa: E402

check, diag, wait_for = nsadtest.check, nsadtest.diag, nsadtest.wait_for
ENDED = ("completed", "failed", "halted", "nan_halted")


def job(device, steps, gpus=None):
    """A small job on synthetic data: a few seconds of training on either
    engine, long enough for the checks to see it running."""
    cfg = {
        "model": {"dim": 128, "n_layers": 2, "n_heads": 4, "n_kv_groups": 2, "d_k": 32, "d_v": 32},
        "nsa": {"l": 16, "d": 8, "l_sel": 32, "n_sel": 8, "w": 64},
        "train": {"steps": steps, "seq_len": 256, "batch_size": 4, "log_every": 1, "eval_every": 0,
                  "save_every": steps, "warmup_steps": 2, "lr": 1e-3},
        "runtime": {"device": device, "precision": "bf16" if device == "cuda" else "fp32"},
        "data": {"source": "synthetic"},
    }
    if gpus is not None:
        cfg["runtime"]["gpus"] = gpus
    return json.dumps(cfg)


def submit(d, body, name):
    r = d.api("POST", f"/api/v1/runs?name={name}", body, content_type="application/json")
    return r.json["id"] if r.status == 201 else None, r


def state(d, run_id):
    r = d.api("GET", f"/api/v1/runs/{run_id}")
    return r.json if r.status == 200 else {}


def halt(d, run_id):
    d.api("POST", f"/api/v1/runs/{run_id}/halt", "{}", content_type="application/json")


def scenario(d, n_gpus):
    last = n_gpus - 1
    # a CUDA run (long: it is halted below) and a CPU run side by side
    gpu_run, r = submit(d, job("cuda", 1000000, [last]), "gpu-side")
    check("a CUDA run on the last GPU is accepted", gpu_run is not None, r)
    cpu_run, r = submit(d, job("cpu", 40), "cpu-side")
    check("a CPU run beside it is accepted", cpu_run is not None, r)
    if not (gpu_run and cpu_run):
        return
    both = wait_for(lambda: state(d, gpu_run).get("state") == "running" and
                    state(d, cpu_run).get("state") == "running", 120)
    check("both train at once", both, [state(d, gpu_run).get("state"), state(d, cpu_run).get("state")])
    runs = d.api("GET", "/api/v1/runs").json or {}
    check("active_runs holds both", sorted(runs.get("active_runs", [])) == sorted([gpu_run, cpu_run]), runs.get("active_runs"))
    check("the CUDA run names its GPU", state(d, gpu_run).get("gpus") == [last], state(d, gpu_run).get("gpus"))
    # MFU on a GPU nsad knows the peak of (H100, H200): a fraction beside tok/s
    has_mfu = wait_for(lambda: isinstance(state(d, gpu_run).get("mfu"), (int, float)), 60)
    mfu = state(d, gpu_run).get("mfu")
    check("the CUDA run reports MFU in (0, 1) beside tok/s", has_mfu and 0 < mfu < 1 and
          state(d, gpu_run).get("toks_per_s", 0) > 0,
          {k: state(d, gpu_run).get(k) for k in ("mfu", "toks_per_s", "flops_per_token", "peak_flops")})
    metrics = d.request("GET", "/metrics").body
    check("/metrics counts two busy trainers", "nsad_trainer_busy 2\n" in metrics,
          [l for l in metrics.splitlines() if l.startswith("nsad_trainer")])

    # a second run on the same GPU waits for the first
    waiting, r = submit(d, job("cuda", 20, [last]), "gpu-waits")
    check("a run claiming the held GPU is queued", waiting and state(d, waiting).get("state") == "queued", r)
    done = wait_for(lambda: state(d, cpu_run).get("state") in ENDED, 600)
    check("the CPU run completes beside the CUDA run", done and state(d, cpu_run).get("state") == "completed" and
          state(d, gpu_run).get("state") == "running", [state(d, gpu_run), state(d, cpu_run)])
    halt(d, gpu_run)
    check("the CUDA run halts", wait_for(lambda: state(d, gpu_run).get("state") in ENDED, 300) and
          state(d, gpu_run).get("state") == "halted", state(d, gpu_run))
    if waiting:
        w = wait_for(lambda: state(d, waiting).get("state") in ENDED, 300)
        check("the queued run started when the GPU came free and completed",
              w and state(d, waiting).get("state") == "completed", state(d, waiting))

    # a sample on the GPU says where it ran
    r = d.api("POST", "/api/v1/sample", json.dumps({"run": gpu_run, "prompt": "The", "max_tokens": 8}),
              content_type="application/json")
    start = {}
    for line in r.body.splitlines():
        if '"event":"start"' in line.replace(" ", ""):
            start = json.loads(line)
    check("a sample runs on a GPU and names it", r.status == 200 and start.get("device") == "cuda" and
          isinstance(start.get("gpu"), int), r.body[:300])
    r2 = d.api("POST", "/api/v1/sample", json.dumps({"run": gpu_run, "prompt": "The", "max_tokens": 8}),
               content_type="application/json")
    again = [json.loads(l) for l in r2.body.splitlines() if '"event":"start"' in l.replace(" ", "")]
    check("the next sample reuses the kept model and gives the same text",
          r2.status == 200 and again and again[0].get("reused") is True and
          [l for l in r2.body.splitlines() if '"text"' in l] == [l for l in r.body.splitlines() if '"text"' in l],
          r2.body[:300])
    # a run claiming that GPU makes the worker release the kept model at once
    g = start.get("gpu")
    claimer, _ = submit(d, job("cuda", 20, [g]), "claims-the-sample-gpu") if isinstance(g, int) else (None, None)
    released = claimer and wait_for(
        lambda: "released: a run claimed its GPU" in open(d.log_path, errors="replace").read(), 60)
    check("a run on the sample's GPU releases the kept model", released,
          open(d.log_path, errors="replace").read()[-600:])
    if claimer:
        wait_for(lambda: state(d, claimer).get("state") in ENDED, 300)

    if n_gpus < 2:
        check("runs on GPU 0 and GPU 1 train at once # SKIP one GPU here", True)
        return
    a, _ = submit(d, job("cuda", 1000000, [0]), "gpu0")
    b, _ = submit(d, job("cuda", 1000000, [1]), "gpu1")
    both = a and b and wait_for(lambda: state(d, a).get("state") == "running" and
                                state(d, b).get("state") == "running", 120)
    check("runs on GPU 0 and GPU 1 train at once", both, [state(d, a), state(d, b)])
    for x in (a, b):
        if x:
            halt(d, x)
    check("both halt", wait_for(lambda: all(state(d, x).get("state") in ENDED for x in (a, b) if x), 120))


def scenarios(workdir, daemons):
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    d = T.Nsad(nsadtest.subdir(workdir, "serve"), T.make_web_root(workdir))
    daemons.append(d)
    if not check("nsad starts", d.start(60), d.log_text()[-1500:]):
        return
    version = d.api("GET", "/api/v1/version").json or {}
    health = d.api("GET", "/api/v1/health").json or {}
    diag(f"device probe: {version.get('device_probe')}")
    # one trainer per GPU and one for the CPU engine
    n_gpus = int(health.get("trainers", 1)) - 1
    if check("nsad found a GPU and runs a trainer for it and one for the CPU",
             "cuda" in version.get("devices", []) and n_gpus >= 1, [version, health]):
        scenario(d, n_gpus)
    d.stop(60)


def main():
    rc = nsadtest.run_daemon_tests("nsad-serve-gpu-", scenarios)
    print(f"{nsadtest._count - nsadtest.failed()} passed, {nsadtest.failed()} failed")
    return rc


if __name__ == "__main__":
    sys.exit(main())
