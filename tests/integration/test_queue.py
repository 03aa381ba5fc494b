#!/usr/bin/env python3
"""test_queue.py - the run queue of nsad serve, end to end.

While a run holds the trainer, POST /api/v1/runs queues the new run (state
queued, queue_position) unless ?queue=false (409 busy); runs start in queue
order once the trainer is free; POST /runs/{id}/front moves a queued run
first; halt takes one out of the queue (halted), DELETE cancels it; a
resume while busy queues and resumes on its turn; the queue survives a
SIGTERM restart and a kill -9 (run.json keeps each queued run's place).

Orders are checked from the runs' own records (a run starts only after the
one before it ended), never from timing. Uses tests/integration/test_api.py's
helpers; Python 3 standard library only; prints TAP.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_api as T  # noqa: E402

check, wait_for, json_config = T.check, T.wait_for, T.json_config
ENDED = ("completed", "failed", "halted", "nan_halted")


def post_run(d, steps, name, query=""):
    return d.api("POST", f"/api/v1/runs?name={name}{query}", json_config(steps, train={"save_every": 5}),
                 content_type="application/json")


def queue_of(d):
    r = d.api("GET", "/api/v1/runs")
    return r.json.get("queue") if r.json else None


def run_scenario(workdir, web):
    d = T.Nsad(workdir, web)
    if not check("nsad starts", d.start(), ""):
        return d
    # the long run holds the trainer until it is halted
    r = post_run(d, 100000, "long")
    if not check("the first run starts at once (no queue)",
                 r.status == 201 and r.json["state"] in ("starting", "running") and r.json["queue_position"] is None,
                 r):
        return d
    long_id = r.json["id"]
    run = wait_for(lambda: (lambda x: x if x and x["last_checkpoint_step"] >= 5 else None)(d.run(long_id)), 60)
    check("the long run trains and checkpoints", bool(run), d.run(long_id))

    r = post_run(d, 8, "a")
    check("POST while busy: 201, state queued at position 1",
          r.status == 201 and r.json["state"] == "queued" and r.json["queue_position"] == 1
          and r.json["phase"] is None and r.json["started_at"] is None, r)
    a = r.json["id"] if r.json else "missing"
    r = post_run(d, 8, "b")
    check("a second POST: queued at position 2", r.status == 201 and r.json["queue_position"] == 2, r)
    b = r.json["id"] if r.json else "missing"
    r = post_run(d, 8, "c")
    c = r.json["id"] if r.json else "missing"
    r = post_run(d, 8, "nope", "&queue=false")
    check("?queue=false while busy: 409 busy, no run created",
          r.status == 409 and r.error_code() == "busy" and len(d.api("GET", "/api/v1/runs").json["runs"]) == 4, r)
    r = post_run(d, 8, "nope", "&queue=maybe")
    check("?queue=maybe: 400 invalid_argument naming the allowed values",
          r.status == 400 and r.error_code() == "invalid_argument" and "true, false" in r.json["error"]["message"], r)
    check("GET /runs: the queue in order", queue_of(d) == [a, b, c], queue_of(d))
    ev = d.api("GET", f"/api/v1/runs/{b}/events").json["events"]
    check("a queued run's event says its position",
          [e["type"] for e in ev] == ["queued"] and ev[0]["detail"].get("position") == 2, ev)

    r = d.api("POST", f"/api/v1/runs/{c}/front")
    check("POST front: 200, the run is first", r.status == 200 and r.json["queue_position"] == 1, r)
    check("the others moved back", queue_of(d) == [c, a, b], queue_of(d))
    r = d.api("POST", f"/api/v1/runs/{c}/front")
    check("front of the head: 200, nothing changes", r.status == 200 and queue_of(d) == [c, a, b], r)
    r = d.api("POST", f"/api/v1/runs/{long_id}/front")
    check("front of the active run: 409 invalid_state", r.status == 409 and r.error_code() == "invalid_state", r)
    r = d.api("POST", "/api/v1/runs/20000101-000000-dead/front")
    check("front of an unknown run: 404", r.status == 404, r)
    r = d.api("GET", f"/api/v1/runs/{c}/front")
    check("GET front: 405 with Allow: POST", r.status == 405 and r.headers.get("Allow") == "POST", r)

    # halt takes a queued run out (halted, files kept); resume queues it again
    r = d.api("POST", f"/api/v1/runs/{a}/halt")
    check("halt of a queued run: 202, halted, out of the queue",
          r.status == 202 and r.json["state"] == "halted" and queue_of(d) == [c, b], (r, queue_of(d)))
    r = d.api("POST", f"/api/v1/runs/{a}/resume?queue=false")
    check("resume ?queue=false while busy: 409 busy", r.status == 409 and r.error_code() == "busy", r)
    r = d.api("POST", f"/api/v1/runs/{a}/resume")
    check("resume while busy: 202, queued at the back",
          r.status == 202 and r.json["state"] == "queued" and queue_of(d) == [c, b, a], (r, queue_of(d)))
    # DELETE cancels: the run and its directory are gone
    r = post_run(d, 8, "gone")
    gone = r.json["id"] if r.json else "missing"
    r = d.api("DELETE", f"/api/v1/runs/{gone}")
    check("DELETE of a queued run: 200, cancelled, its directory gone",
          r.status == 200 and queue_of(d) == [c, b, a]
          and not os.path.exists(os.path.join(d.state_dir, "runs", gone)), (r, queue_of(d)))

    # the queue survives a SIGTERM restart...
    rc = d.stop(60)
    check("SIGTERM: nsad exits 0", rc == 0, rc)
    if not check("nsad restarts", d.start(), d.log_text()[-1500:]):
        return d
    check("after a restart: the same queue, the long run resumed",
          queue_of(d) == [c, b, a] and d.run(long_id)["state"] in ("starting", "running")
          and d.run(long_id)["restarts"] == 1, (queue_of(d), d.run(long_id)))
    # ... and a crash
    wait_for(lambda: (lambda x: x if x and x["state"] == "running" else None)(d.run(long_id)), 60)
    d.kill9()
    records = {}
    for rid in (a, b, c):
        with open(os.path.join(d.state_dir, "runs", rid, "run.json")) as f:
            records[rid] = T.json.load(f)
    check("on disk: each queued run's record says queued, with its place",
          all(records[x]["state"] == "queued" for x in (a, b, c))
          and records[c]["queue_order"] < records[b]["queue_order"] < records[a]["queue_order"]
          and records[a]["queue_resume"] is True and records[b]["queue_resume"] is False, records)
    if not check("nsad restarts after kill -9", d.start(), d.log_text()[-1500:]):
        return d
    check("after kill -9: the same queue", queue_of(d) == [c, b, a], queue_of(d))

    # free the trainer: the queue runs in order, one after the other
    r = d.api("POST", f"/api/v1/runs/{long_id}/halt")
    check("halt the long run", r.status == 202, r)
    runs = {x: d.wait_state(x, ENDED, 120) for x in (c, b, a)}
    check("every queued run ran to completion",
          all(runs[x] and runs[x]["state"] == "completed" for x in (c, b, a)), runs)
    if all(runs[x] for x in (c, b, a)):
        long_end = d.run(long_id)["ended_at"]
        check("they started in queue order, each after the one before ended",
              long_end <= runs[c]["started_at"] and runs[c]["ended_at"] <= runs[b]["started_at"]
              and runs[b]["ended_at"] <= runs[a]["started_at"],
              {x: (runs[x]["started_at"], runs[x]["ended_at"]) for x in (c, b, a)})
    ev = d.api("GET", f"/api/v1/runs/{a}/events").json["events"]
    deq = [e for e in ev if e["type"] == "dequeued"]
    # it never ran before its halt, so it had no checkpoint: the trainer's
    # resume starts it from step 0 (event start)
    check("the resume that waited in the queue was taken as a resume",
          deq and deq[0]["detail"].get("resume") is True, [e["type"] for e in ev])
    check("the queue is empty", queue_of(d) == [], queue_of(d))
    r = post_run(d, 4, "after")
    check("with the trainer free and no queue, a run starts at once",
          r.status == 201 and r.json["state"] in ("starting", "running"), r)
    if r.json:
        d.wait_state(r.json["id"], ENDED, 60)
    families = T.parse_prometheus(d.api("GET", "/metrics").body)
    samples = families.get("nsad_runs", {}).get("samples", {})
    check("/metrics counts runs by state, queued included",
          any(("state", "queued") in labels for labels in samples), samples)
    check("the daemon survived", d.alive(), d.log_text()[-2000:])
    return d


def scenarios(workdir, daemons):
    daemons.append(run_scenario(T.subdir(workdir, "q"), T.make_web_root(workdir)))


def main():
    return T.run_daemon_tests("nsad-queue-", scenarios)


if __name__ == "__main__":
    sys.exit(main())
