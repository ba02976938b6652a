"""`failover`: a burst of jobs over many HTTP connections with the primary SIGKILLed midway,
then checked from outside.

Each job is a `bench_effect` (one side-effect row per attempt that ran). Every connection
submits its share one `POST /jobs` at a time, each with an idempotency key of its own, and
sends it again after any error or non-2xx answer (as a careful client would): a job whose
insert was applied but not acknowledged is then the same job, not a second one. When half
are acknowledged, the primary member is killed with SIGKILL (the embedded set only). After
every acknowledged job is finished and the roles stopped, it reports: jobs missing, jobs
by status and by attempts, side effects per job (a job run twice has two), `job.completed`
log lines per job, and the HTTP answers the clients got.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from pymongo import MongoClient

from bench.harness import (
    BenchError,
    Doc,
    api_for,
    embedded_set,
    free_port,
    role,
    role_env,
    wait_api,
    wait_dispatcher,
)
from bench.scenarios import Context

TERMINAL = ["completed", "failed", "cancelled"]


class Burst:
    """`n` jobs over `conns` connections, each retried until acknowledged."""

    def __init__(self, base_url: str, headers: dict[str, str], n: int, conns: int) -> None:
        self.base_url, self.headers, self.n, self.conns = base_url, headers, n, conns
        self.acked: dict[int, str] = {}
        self.answers: Counter[str] = Counter()
        self._lock = threading.Lock()

    def run(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._one, args=(k,)) for k in range(self.conns)]
        for t in threads:
            t.start()
        return threads

    def _one(self, k: int) -> None:
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=30) as http:
            for i in range(k, self.n, self.conns):
                spec = {"task": "bench_effect", "payload": {"n": i}, "idempotency_key": f"b-{i}"}
                while (job_id := self._submit(http, spec)) is None:
                    time.sleep(0.2)
                with self._lock:
                    self.acked[i] = job_id

    def _submit(self, http: httpx.Client, spec: dict[str, Any]) -> str | None:
        try:
            resp = http.post("/jobs", json=spec)
        except httpx.HTTPError as exc:
            with self._lock:
                self.answers[type(exc).__name__] += 1
            return None
        with self._lock:
            self.answers[str(resp.status_code)] += 1
        return str(resp.json()["id"]) if resp.status_code in (200, 202) else None


def primary_pid(client: MongoClient[Doc], pids: list[int]) -> tuple[str, int]:
    primary = str(client.admin.command("hello")["primary"])
    port = primary.rsplit(":", 1)[1]
    for pid in pids:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--port" in args and args[args.index(b"--port") + 1].decode() == port:
            return primary, pid
    raise BenchError(f"no mongod of this run listens on {primary}")


def _wait_finished(client: MongoClient[Doc], db: str, timeout: float) -> float:
    jobs = client[db]["jobs"]
    start = time.monotonic()
    while jobs.count_documents({"status": {"$nin": TERMINAL}}):
        if time.monotonic() - start > timeout:
            raise BenchError(f"jobs still unfinished after {timeout:.0f} s")
        time.sleep(1.0)
    return time.monotonic() - start


def _check(client: MongoClient[Doc], db: str, burst: Burst, log: Path) -> dict[str, Any]:
    docs = {d["_id"]: d for d in client[db]["jobs"].find({"task": "bench_effect"})}
    effects = Counter(e["job_id"] for e in client[db]["effects"].find({}, {"job_id": 1}))
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    logged = Counter(e.get("job_id") for e in lines if e.get("event") == "job.completed")
    missing = [i for i, job_id in burst.acked.items() if job_id not in docs]
    return {
        "acknowledged": len(burst.acked),
        "jobs": len(docs),
        "missing": len(missing),
        "by_status": dict(Counter(d["status"] for d in docs.values())),
        "by_attempts": dict(Counter(d["attempts"] for d in docs.values())),
        "effects_per_job": dict(Counter(effects[j] for j in docs)),
        "completed_log_lines_per_job": dict(Counter(logged[j] for j in docs)),
        "answers": dict(burst.answers),
    }


def failover(ctx: Context, n: int = 50_000, conns: int = 32) -> dict[str, Any]:
    """The burst, the primary SIGKILLed at half, the history checked (see the module)."""
    if not ctx.deployment.mongod_pids:
        raise BenchError("failover kills a member: it needs the embedded set (no BROOK_MONGO_URI)")
    db = ctx.new_db("failover")
    port = free_port()
    env = role_env(ctx.deployment.uri, db, ctx.concurrency, port, "INFO")
    env["BROOK_TASKS"] = "bench.tasks"
    api = api_for(port)
    out: dict[str, Any] = {"n": n, "connections": conns}
    dispatcher_log = ctx.log_dir / "failover-dispatcher.log"
    with role("api", env, ctx.log_dir / "failover-api.log") as api_proc:
        wait_api(api, api_proc)
        with role("dispatcher", env, dispatcher_log) as disp:
            wait_dispatcher(api, [disp])
            burst = Burst(api.base_url, api.headers, n, conns)
            start = time.monotonic()
            threads = burst.run()
            while len(burst.acked) < n // 2 and any(t.is_alive() for t in threads):
                time.sleep(0.05)
            primary, pid = primary_pid(ctx.client, ctx.deployment.mongod_pids)
            out["killed"] = {"member": primary, "after_s": round(time.monotonic() - start, 1),
                             "acknowledged_before": len(burst.acked)}
            os.kill(pid, signal.SIGKILL)
            for t in threads:
                t.join()
            out["submitted_s"] = round(time.monotonic() - start, 1)
            out["finished_s"] = round(_wait_finished(ctx.client, db, 900) + out["submitted_s"], 1)
            disp.check_alive()
    out.update(_check(ctx.client, db, burst, dispatcher_log))
    _restart_killed_member()
    return out


def _restart_killed_member() -> None:
    """The embedded set back to three members (`up` restarts the one that is down)."""
    embedded_set().up()


def problems(res: dict[str, Any]) -> list[str]:
    """What the checks found wrong (empty: nothing lost, nothing run or completed twice)."""
    found = []
    if res["missing"]:
        found.append(f"{res['missing']} acknowledged jobs missing")
    if set(res["by_status"]) != {"completed"}:
        found.append(f"jobs by status {res['by_status']}")
    if set(res["effects_per_job"]) != {1}:
        found.append(f"side effects per job {res['effects_per_job']}")
    if set(res["completed_log_lines_per_job"]) != {1}:
        found.append(f"job.completed lines per job {res['completed_log_lines_per_job']}")
    if res["jobs"] != res["n"]:
        found.append(f"{res['jobs']} jobs for {res['n']} keys")
    return found
