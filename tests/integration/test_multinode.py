#!/usr/bin/env python3
"""test_multinode.py - a multi-node data-parallel job of two nsad daemons on
loopback, on the CPU engine (ranks joined by the TCP transport).

Daemon A coordinates (POST /api/v1/runs?nodes=B), daemon B joins through its
API (POST /api/v1/join). Checks: both nodes train the job to the end and its
losses equal, bit for bit, a one-node job of the same two ranks; the run
objects show every rank and the member's coordinator; a halt on the member
stops both nodes at the same step and the coordinator resumes both; kill -9
of the member fails the coordinator's run at once (no hang), a member run is
never resumed alone, and resuming on the coordinator after the member's
nsad is back trains on to the same curve as an uninterrupted job; a job
started from a trained model's weights (init_from) trains on two nodes as on
one; a job that fails after its nodes are told leaves no listening socket
and fails its member; a busy node refuses to join, naming itself.

Python 3 standard library only; TAP output; every nsad it starts is killed
on the way out.
"""
import http.client
import json
import os
import sys
import time

from nsadtest import NsadProcess, check, free_port, run_daemon_tests, wait_for


def job(steps, ranks=1, **sections):
    """A tiny CPU job on synthetic data; `ranks` CPU ranks on each node."""
    cfg = {
        "model": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_groups": 1, "d_k": 16, "d_v": 16},
        "nsa": {"l": 8, "d": 4, "l_sel": 16, "n_sel": 4, "w": 32},
        "train": {"steps": steps, "seq_len": 64, "batch_size": 2, "log_every": 1, "eval_every": 0,
                  "save_every": 5, "warmup_steps": 2, "lr": 1e-3},
        "runtime": {"device": "cpu", "precision": "fp32", "threads": 1, "cpu_ranks": ranks},
        "data": {"source": "synthetic"},
        "watchdog": {"allreduce": 5},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return json.dumps(cfg)


class Nsad(NsadProcess):
    """One nsad serve on a loopback port, with the token every node shares."""

    def __init__(self, workdir, token):
        super().__init__(workdir)
        os.makedirs(self.state_dir, exist_ok=True)
        path = os.path.join(self.state_dir, "token")
        with open(path, "w") as f:
            f.write(token + "\n")
        os.chmod(path, 0o600)
        self.token = token
        self.port = free_port()

    def start(self):
        self.spawn(["--listen", f"127.0.0.1:{self.port}", "--state-dir", self.state_dir,
                    "--socket", os.path.join(self.workdir, "nsad.sock"), "--log-level", "info"])
        return wait_for(self._healthy, 20)

    def _healthy(self):
        if self.proc.poll() is not None:
            return False
        try:
            return self.request("GET", "/api/v1/health")[0] == 200
        except OSError:
            return False

    def address(self):
        return f"127.0.0.1:{self.port}"

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        try:
            headers = {"Authorization": f"Bearer {self.token}"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            text = r.read().decode()
            try:
                data = json.loads(text)
            except ValueError:
                data = None
            return r.status, data
        finally:
            conn.close()

    def run(self, run_id):
        status, data = self.request("GET", f"/api/v1/runs/{run_id}")
        return data if status == 200 else None

    def runs(self):
        return self.request("GET", "/api/v1/runs")[1]["runs"]

    def member_run(self, coordinator_id):
        for r in self.runs():
            if r.get("member_of") == coordinator_id:
                return r
        return None


def listening_sockets(pid):
    """The inodes of the TCP sockets process pid has open and listening."""
    mine = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A":  # TCP_LISTEN
                    listening.add(cols[9])
    return sorted(mine & listening)


def losses(run):
    """training.csv's step and loss columns, as written."""
    path = os.path.join(run["out_dir"], "training.csv")
    with open(path) as f:
        return [tuple(line.split(",")[:2]) for line in f.read().splitlines()[1:]]


def start(node, body, nodes=None):
    path = "/api/v1/runs" + (f"?nodes={nodes}" if nodes else "")
    return node.request("POST", path, body)


def scenarios(workdir, daemons):
    token = os.urandom(32).hex()
    a = Nsad(os.path.join(workdir, "a"), token)
    b = Nsad(os.path.join(workdir, "b"), token)
    daemons += [a, b]
    if not check("two nsad daemons start on loopback, one token", a.start() and b.start(),
                 a.log_text()[-2000:] + b.log_text()[-2000:]):
        return

    # ---- the job on two nodes equals the job on one node ----
    status, run = start(a, job(12), b.address())
    if not check("POST /api/v1/runs?nodes=B: 201", status == 201, (status, run)):
        return
    rid = run["id"]
    run = a.wait_state(rid, ("completed", "failed", "halted"), 120)
    member = b.member_run(rid)
    check("the coordinator's run completes", run and run["state"] == "completed", run)
    check("the member's run (named after the coordinator's, member_of it) completes",
          member and member["state"] == "completed" and member["name"] == rid, member)
    check("the coordinator shows every rank of the job",
          run and run["world"] == 2 and [r["rank"] for r in run["ranks"]] == [0, 1], run)
    status, one = start(a, job(12, ranks=2))
    one = a.wait_state(one["id"], ("completed", "failed"), 120) if status == 201 else None
    check("two nodes of one rank train as one node of two ranks, bit for bit",
          one and run and losses(one) == losses(run) and len(losses(run)) == 12,
          (losses(one) if one else None, losses(run) if run else None))
    check("the member logs the same curve", member and run and losses(member) == losses(run), "")

    # ---- a two-node job from a trained model's weights (train.init_from) ----
    if one:
        status, ft = a.request("POST", f"/api/v1/runs?nodes={b.address()}&init_from={one['id']}", job(4))
        ft = a.wait_state(ft["id"], ("completed", "failed"), 120) if status == 201 else None
        status, ref = a.request("POST", f"/api/v1/runs?init_from={one['id']}", job(4, ranks=2))
        ref = a.wait_state(ref["id"], ("completed", "failed"), 120) if status == 201 else None
        check("init_from on two nodes (the member receives the weights): the one-node curve, bit for bit",
              ft and ref and ft["state"] == "completed" and losses(ft) == losses(ref)
              and losses(ft)[0] != losses(one)[0], (losses(ft) if ft else None,
                                                     losses(ref) if ref else None))
        check("the member logs that the coordinator's checkpoint gave the weights",
              "init: the weights of the coordinator's" in b.log_text(), b.log_text()[-1500:])

    # ---- a halt on the member stops both; the coordinator resumes both ----
    status, run = start(a, job(100000), b.address())  # far longer than the test waits
    rid = run["id"]
    member = wait_for(lambda: (lambda m: m if m and m["step"] >= 3 else None)(b.member_run(rid)), 60)
    if member:
        b.request("POST", f"/api/v1/runs/{member['id']}/halt")
    run = a.wait_state(rid, ("halted", "completed", "failed"), 60)
    member = b.wait_state(member["id"], ("halted", "completed", "failed"), 60) if member else None
    check("a halt on the member halts both nodes at the same step",
          run and member and run["state"] == "halted" and member["state"] == "halted"
          and run["step"] == member["step"] and run["step"] < 100000, (run, member))
    status, data = b.request("POST", f"/api/v1/runs/{member['id']}/resume") if member else (0, None)
    check("resume on the member is refused: 409, naming the coordinator's run",
          status == 409 and rid in data["error"]["message"], (status, data))
    status, data = a.request("POST", f"/api/v1/runs/{rid}/resume")
    again = wait_for(lambda: (lambda m: m if m and m["state"] in ("running", "completed") else None)(
        next((r for r in b.runs() if r.get("member_of") == rid and r["state"] != "halted"), None)), 30)
    check("resume on the coordinator brings the member back in", status == 202 and again, (status, data))
    a.request("POST", f"/api/v1/runs/{rid}/halt")
    a.wait_state(rid, ("halted", "completed", "failed"), 60)
    wait_for(lambda: all(r["state"] not in ("starting", "running", "halting") for r in b.runs()), 60)

    # ---- kill -9 of the member: no hang, resumable to the same curve ----
    status, run = start(a, job(1000), b.address())
    rid = run["id"]
    wait_for(lambda: (lambda m: m if m and m["step"] >= 8 else None)(b.member_run(rid)), 60)
    t0 = time.monotonic()
    b.kill9()
    run = a.wait_state(rid, ("failed", "completed"), 30)
    took = time.monotonic() - t0
    check("kill -9 of the member's nsad: the coordinator's run fails naming rank 1, not hangs",
          run and run["state"] == "failed" and "rank 1" in (run["error"] or "") and took < 30,
          (took, run))
    check("the coordinator stays responsive", a.request("GET", "/api/v1/health")[0] == 200, "")
    b.start()
    member = wait_for(lambda: (lambda m: m if m and m["state"] == "failed" else None)(b.member_run(rid)), 20)
    check("the restarted member does not resume the job alone (its run failed, naming the coordinator's)",
          member and rid in (member["error"] or ""), member)
    a.request("POST", f"/api/v1/runs/{rid}/resume")
    run = a.wait_state(rid, ("completed", "failed"), 120)
    status, ref = start(a, job(1000, ranks=2))
    ref = a.wait_state(ref["id"], ("completed", "failed"), 120) if status == 201 else None
    check("resumed after the kill, the job ends on the uninterrupted curve, bit for bit",
          run and ref and run["state"] == "completed" and losses(run) == losses(ref),
          (run, losses(run) if run else None, losses(ref) if ref else None))

    # ---- a job that fails once the nodes are told: no socket is left ----
    before = listening_sockets(a.proc.pid)
    status, run = start(a, job(10, fault={"rank": 5, "nan_at_step": 3, "nan_kind": "loss"}), b.address())
    run = a.wait_state(run["id"], ("failed", "completed"), 60) if status == 201 else None
    check("a job that fails after the transport's id is made (fault.rank 5 of 2) names the field",
          run and run["state"] == "failed" and "fault.rank" in (run["error"] or ""), run)
    member = wait_for(lambda: (lambda m: m if m and m["state"] not in ("starting", "running") else None)(
        b.member_run(run["id"])) if run else None, 60)
    check("... its member fails too, not waits", member and member["state"] == "failed", member)
    check("... and the coordinator's TCP listening socket is closed",
          listening_sockets(a.proc.pid) == before, (before, listening_sockets(a.proc.pid)))

    # ---- a busy node refuses to join ----
    status, busy = start(b, job(100000))
    status, run = start(a, job(10), b.address())
    run = a.wait_state(run["id"], ("failed", "completed"), 30) if status == 201 else None
    check("a busy node refuses to join: the coordinator's run fails naming the node",
          run and run["state"] == "failed" and b.address() in (run["error"] or ""), run)
    if busy:
        b.request("POST", f"/api/v1/runs/{busy['id']}/halt")
        b.wait_state(busy["id"], ("halted", "completed", "failed"), 60)
    check("both daemons survived", a.proc.poll() is None and b.proc.poll() is None,
          a.log_text()[-2000:] + b.log_text()[-2000:])


def main():
    return run_daemon_tests("nsad-mn-", scenarios)


if __name__ == "__main__":
    sys.exit(main())
