"""Scenarios for throughput at scale: enqueue paths, worker start-up, drain cost, and a
backlog of up to a million pending jobs.

    enqueue   raw `insert_one` (w: majority; bare and with Brook's indexes) vs `Client.submit`
              and `AsyncClient.submit`, one after another; one HTTP
              connection; 32 HTTP connections; `POST /jobs/batch` (no dispatcher running)
    startup   `brook dispatcher` with 32 slots: process start → every worker ready
    e2e       noop jobs from one `AsyncClient` (one `submit` at a time, then `submit_many` of
              100 per call) while a dispatcher runs them: first submit → last task start
    drain     a pre-inserted backlog of noop jobs, drained at the default concurrency, with
              MongoDB's cost per job (operations, oplog getMores, change-stream getMores,
              mongod CPU-seconds per 1,000 jobs)
    backlog   with 0, 100k and 1M due jobs pending (inserted straight into the store), while
              a dispatcher drains them: a priority job's submit→start, the drain rate,
              `GET /metrics`, `GET /queues`, `GET /jobs?status=pending`, and the RSS of the
              API and the dispatcher
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import threading
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from bson import ObjectId
from pymongo import AsyncMongoClient, MongoClient

from bench.harness import (
    BenchError,
    Doc,
    RoleProcess,
    children,
    cpu_meter,
    free_port,
    role,
    role_env,
    wait_api,
    wait_settled,
)
from bench.scenarios import Context
from bench.stats import dist, ms
from brook import AsyncClient, Client, WaitTimeout
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import INDEXES, JobStore

NOOP_BODY = json.dumps({"task": "noop", "payload": {}})


# -- helpers ---------------------------------------------------------------------------------


def _ensure_indexes(uri: str, db: str) -> None:
    async def run() -> None:
        settings = Settings(mongo_uri=uri, db=db)
        client = make_client(settings, appname="brook-bench")
        try:
            await JobStore(database(client, settings)).ensure_indexes()
        finally:
            await client.close()

    asyncio.run(run())


def pending_doc(now: datetime, priority: int = 0) -> Doc:
    """A pending noop job as the store writes one (a small payload)."""
    return {
        "_id": str(ObjectId()),
        "task": "noop",
        "payload": {},
        "status": "pending",
        "queue": "default",
        "priority": priority,
        "attempts": 0,
        "max_attempts": 3,
        "attempt_budget": 3,
        "run_at": now,
        "created_at": now,
        "updated_at": now,
        "started_at": None,
        "finished_at": None,
        "result": None,
        "error": None,
        "timeout_s": None,
        "owner": None,
        "lease_expires_at": None,
        "cancel_requested": False,
        "history": [{"status": "pending", "at": now, "attempt": 0}],
        "progress": None,
    }


def preload(client: MongoClient[Doc], db: str, n: int, batch: int = 10_000) -> float:
    """`n` pending noop jobs with `insert_many` batches straight into the store; seconds."""
    start = time.monotonic()
    jobs = client[db]["jobs"]
    now = datetime.now(UTC)
    for first in range(0, n, batch):
        jobs.insert_many([pending_doc(now) for _ in range(min(batch, n - first))], ordered=False)
    return time.monotonic() - start


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def primary_cost(client: MongoClient[Doc]) -> dict[str, float]:
    """Cumulative primary counters: operations by kind and getMores by namespace (`top`)."""
    st = client.admin.command("serverStatus")
    out: dict[str, float] = {f"op_{k}": float(v) for k, v in st["opcounters"].items()}
    out["docs_updated"] = float(st["metrics"]["document"]["updated"])
    out["docs_inserted"] = float(st["metrics"]["document"]["inserted"])
    for ns, counts in client.admin.command("top")["totals"].items():
        if isinstance(counts, dict) and "getmore" in counts:
            key = "getmore_oplog" if ns == "local.oplog.rs" else "getmore_other"
            out[key] = out.get(key, 0.0) + counts["getmore"]["count"]
    return out


def per_job(before: dict[str, float], after: dict[str, float], jobs: int) -> dict[str, float]:
    return {k: round((after[k] - before.get(k, 0.0)) / max(jobs, 1), 3) for k in after}


def _http_one(port: int, n: int, headers: dict[str, str]) -> list[float]:
    """`n` POST /jobs one after another on one kept-alive connection; each round trip (ms)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    rtts: list[float] = []
    hdrs = {"content-type": "application/json", **headers}
    for _ in range(n):
        t = time.perf_counter()
        conn.request("POST", "/jobs", NOOP_BODY, hdrs)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 202:
            raise BenchError(f"POST /jobs -> {resp.status}")
        rtts.append((time.perf_counter() - t) * 1000)
    conn.close()
    return rtts


def _http_many(port: int, n: int, connections: int, headers: dict[str, str]) -> float:
    """`n` POST /jobs over `connections` kept-alive connections, one request in flight on
    each (threads: the stdlib client is lighter than an async one); seconds."""
    per = [n // connections + (1 if i < n % connections else 0) for i in range(connections)]
    errors: list[BaseException] = []

    def pump(count: int) -> None:
        try:
            _http_one(port, count, headers)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=pump, args=(c,)) for c in per]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise BenchError(f"POST /jobs over {connections} connections: {errors[0]!r}")
    return time.monotonic() - start


async def _post_batches(base: str, headers: dict[str, str], n: int, size: int, conns: int) -> float:
    spec = {"task": "noop", "payload": {}}
    body = json.dumps({"jobs": [spec] * size})
    hdrs = {"content-type": "application/json", **headers}
    calls = n // size // conns

    async def pump(http: httpx.AsyncClient) -> None:
        for _ in range(calls):
            resp = await http.post("/jobs/batch", content=body, headers=hdrs)
            if resp.status_code != 202:
                raise BenchError(f"POST /jobs/batch -> {resp.status_code}")

    clients = [httpx.AsyncClient(base_url=base, timeout=120) for _ in range(conns)]
    try:
        start = time.monotonic()
        await asyncio.gather(*(pump(h) for h in clients))
        return time.monotonic() - start
    finally:
        for h in clients:
            await h.aclose()


def _blocking_submits(uri: str, db: str, n: int) -> float:
    """`Client.submit` (the blocking client) one after another."""
    with Client(uri, db) as client:
        client.submit("noop")  # connect, indexes, task check: not measured
        start = time.monotonic()
        for _ in range(n):
            client.submit("noop")
        return time.monotonic() - start


async def _client_submits(uri: str, db: str, n: int) -> float:
    async with AsyncClient(uri, db) as client:
        await client.submit("noop")  # connect, indexes, task check: not measured
        start = time.monotonic()
        for _ in range(n):
            await client.submit("noop")
        return time.monotonic() - start


async def _raw_async_inserts(uri: str, db: str, n: int) -> float:
    """The same raw `insert_one` through PyMongo's async API, which Brook's clients use."""
    client: AsyncMongoClient[Doc] = AsyncMongoClient(uri, w="majority")
    try:
        coll = client[db]["raw_async_inserts"]
        await coll.insert_one({"warm": True})
        now = datetime.now(UTC)
        start = time.monotonic()
        for _ in range(n):
            await coll.insert_one(pending_doc(now))
        return time.monotonic() - start
    finally:
        await client.close()


def _raw_inserts(client: MongoClient[Doc], db: str, n: int, *, indexed: bool = False) -> float:
    """Raw `insert_one` of a job-shaped document, one after another, into a collection with
    only `_id` (the strictest reference) or, `indexed`, with every index of Brook's jobs
    collection (what any job store's insert pays here)."""
    coll = client[db]["raw_indexed_inserts" if indexed else "raw_inserts"]
    if indexed:
        coll.create_indexes(INDEXES)
    coll.insert_one({"warm": True})
    now = datetime.now(UTC)
    start = time.monotonic()
    for _ in range(n):
        coll.insert_one(pending_doc(now))
    return time.monotonic() - start


# -- enqueue ---------------------------------------------------------------------------------


def enqueue(ctx: Context, n: int = 2000) -> dict[str, Any]:
    """Submit throughput of each path, back to back on the same host (no dispatcher)."""
    db = ctx.new_db("enqueue")
    uri = ctx.deployment.uri
    _ensure_indexes(uri, db)
    out: dict[str, Any] = {"n": n, "loadavg_before": os.getloadavg()}
    raw_s = _raw_inserts(ctx.client, db, n)
    raw_indexed_s = _raw_inserts(ctx.client, db, n, indexed=True)
    raw_async_s = asyncio.run(_raw_async_inserts(uri, db, n))
    blocking_s = _blocking_submits(uri, db, n)
    client_s = asyncio.run(_client_submits(uri, db, n))
    out["raw_insert_one_per_s"] = round(n / raw_s, 1)
    out["raw_insert_one_indexed_per_s"] = round(n / raw_indexed_s, 1)
    out["raw_async_insert_one_per_s"] = round(n / raw_async_s, 1)
    # Issue 12's figure: `Client.submit` (blocking) against a raw (blocking) insert_one.
    out["client_submit_per_s"] = round(n / blocking_s, 1)
    out["client_vs_raw"] = round(raw_s / blocking_s, 3)
    out["client_vs_raw_indexed"] = round(raw_indexed_s / blocking_s, 3)
    out["async_client_submit_per_s"] = round(n / client_s, 1)
    out["async_client_vs_raw_async"] = round(raw_async_s / client_s, 3)
    port = free_port()
    env = role_env(uri, db, ctx.concurrency, port, ctx.log_level)
    headers: dict[str, str] = {}
    with role("api", env, ctx.log_dir / "enqueue-api.log") as api:
        wait_api(_api(port), api)
        _http_one(port, 50, headers)  # warm
        with ctx.profiler.record("enqueue-api-one", api.pid):
            start = time.monotonic()
            rtts = _http_one(port, n, headers)
            one_s = time.monotonic() - start
        out["http_one_connection_per_s"] = round(n / one_s, 1)
        out["http_one_connection_rtt_ms"] = dist(rtts)
        with cpu_meter({"api": [api.pid], "mongod": ctx.deployment.mongod_pids}) as cpu:
            many_s = _http_many(port, 4 * n, 32, headers)
        out["http_32_connections_per_s"] = round(4 * n / many_s, 1)
        out["http_32_connections_cpu"] = cpu
        base = f"http://127.0.0.1:{port}"
        for conns in (1, 4):
            jobs = 20_000
            batch_s = asyncio.run(_post_batches(base, headers, jobs, 1000, conns))
            out[f"batch_1000_x{conns}_per_s"] = round(jobs / batch_s, 1)
        out["api_rss_mb"] = rss_mb(api.pid)
    out["loadavg_after"] = os.getloadavg()
    return out


def _api(port: int) -> Any:
    from bench.harness import api_for

    return api_for(port)


# -- startup ---------------------------------------------------------------------------------


def startup(ctx: Context, slots: int = 32, runs: int = 3) -> dict[str, Any]:
    """`brook dispatcher` with `slots` slots: from exec to `dispatcher.ready` (every worker
    ready and the backlog swept) and to the last `worker.started`."""
    db = ctx.new_db("startup")
    out: dict[str, Any] = {"slots": slots, "runs": []}
    for i in range(runs):
        env = role_env(ctx.deployment.uri, db, slots, free_port(), "INFO")
        t0 = time.time()
        with role("dispatcher", env, ctx.log_dir / f"startup-{i}.log") as disp:
            ready = _wait_event(disp, "dispatcher.ready", 120)
            workers = [e for e in disp_events(disp) if e.get("event") == "worker.started"]
            run = {
                "ready_s": round(_ts(ready) - t0, 3),
                "workers_started": len(workers),
                "last_worker_s": round(max(_ts(e) for e in workers) - t0, 3) if workers else None,
                "first_worker_s": round(min(_ts(e) for e in workers) - t0, 3) if workers else None,
                "loadavg": os.getloadavg()[0],
            }
        out["runs"].append(run)
    out["ready_s"] = dist([r["ready_s"] for r in out["runs"]])
    return out


def disp_events(proc: RoleProcess) -> list[dict[str, Any]]:
    events = []
    for line in proc.log_path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def _wait_event(proc: RoleProcess, event: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.check_alive()
        for e in disp_events(proc):
            if e.get("event") == event:
                return e
        time.sleep(0.02)
    raise BenchError(f"no {event} after {timeout:.0f}s:\n{proc.tail()}")


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


# -- drain and its cost ----------------------------------------------------------------------


def drain(ctx: Context, n: int = 5000) -> dict[str, Any]:
    """A backlog of `n` noop jobs drained by one dispatcher at `ctx.concurrency`: jobs/s
    from the first start to the last, and what it cost MongoDB per job."""
    db = ctx.new_db("drain")
    _ensure_indexes(ctx.deployment.uri, db)
    preload(ctx.client, db, n)
    env = role_env(ctx.deployment.uri, db, ctx.concurrency, free_port(), ctx.log_level)
    with role("dispatcher", env, ctx.log_dir / "drain-dispatcher.log") as disp:
        _wait_first(ctx.client, db, disp)
        before = primary_cost(ctx.client)
        groups = {"mongod": ctx.deployment.mongod_pids, "dispatcher": [disp.pid]}
        groups["workers"] = children(disp.pid)
        with cpu_meter(groups) as cpu:
            wait_settled(ctx.client, db, [disp], timeout=max(300.0, n / 20))
        after = primary_cost(ctx.client)
    docs = list(ctx.client[db]["jobs"].find({}, {"started_at": 1, "finished_at": 1}))
    starts = sorted(d["started_at"] for d in docs)
    span = ms(starts[-1], starts[0]) / 1000
    mongod_s = cpu["groups"]["mongod"]["cpu_s"]
    return {
        "jobs": n,
        "concurrency": ctx.concurrency,
        "drain_per_s": round((len(starts) - 1) / span, 1),
        "mongod_cpu_s_per_1000_jobs": round(mongod_s / n * 1000, 2),
        "per_job": per_job(before, after, n),
        "resources": cpu,
        "loadavg": os.getloadavg(),
    }


# -- end to end from Python -------------------------------------------------------------------

MANY_SIZE = 100  # jobs per `submit_many` call in `e2e`


def e2e(ctx: Context, n: int = 5000) -> dict[str, Any]:
    """`n` noop jobs submitted from one Python client while one dispatcher (at
    `ctx.concurrency`) runs them, as the peer harness's throughput mode does over HTTP:
    jobs/s = n / (last task start - first submit). Once one `AsyncClient.submit` after
    another, once `AsyncClient.submit_many` of `MANY_SIZE` jobs per call, one call at a time."""
    out: dict[str, Any] = {"jobs": n, "concurrency": ctx.concurrency, "many_size": MANY_SIZE}
    for variant, size in (("one_at_a_time", 1), ("submit_many", MANY_SIZE)):
        db = ctx.new_db(f"e2e{size}")
        _ensure_indexes(ctx.deployment.uri, db)
        env = role_env(ctx.deployment.uri, db, ctx.concurrency, free_port(), ctx.log_level)
        with role("dispatcher", env, ctx.log_dir / f"e2e{size}-dispatcher.log") as disp:
            t0, submit_s = asyncio.run(_submit_while_running(ctx, db, n, size, disp))
            wait_settled(ctx.client, db, [disp], timeout=max(300.0, n / 20))
        jobs = ctx.client[db]["jobs"]
        starts = [d["started_at"] for d in jobs.find({"task": "noop"}, {"started_at": 1})]
        if len(starts) != n + 1:  # the warm-up job too
            raise BenchError(f"e2e {variant}: {len(starts)} jobs stored, {n + 1} submitted")
        span = max(s.replace(tzinfo=UTC).timestamp() for s in starts) - t0
        out[variant] = {
            "jobs_per_s": round(n / span, 1),
            "submit_per_s": round(n / submit_s, 1),
            "loadavg": os.getloadavg()[0],
        }
    return out


async def _submit_while_running(
    ctx: Context, db: str, n: int, size: int, disp: RoleProcess
) -> tuple[float, float]:
    """Submit `n` jobs, `size` per call (1: `submit`); the wall time of the first call, and
    the seconds all calls took. A warm-up job runs first: the dispatcher is ready."""
    async with AsyncClient(ctx.deployment.uri, db) as client:
        warm = await client.submit("noop")
        try:
            await client.wait(warm.id, timeout=120)
        except WaitTimeout:
            disp.check_alive()
            raise BenchError("the warm-up job did not complete in 120 s") from None
        t0 = time.time()
        start = time.monotonic()
        if size == 1:
            for _ in range(n):
                await client.submit("noop")
        else:
            for first in range(0, n, size):
                await client.submit_many([{"task": "noop"}] * min(size, n - first))
        return t0, time.monotonic() - start


def _wait_first(client: MongoClient[Doc], db: str, proc: RoleProcess) -> None:
    jobs = client[db]["jobs"]
    deadline = time.monotonic() + 120
    while jobs.find_one({"status": {"$ne": "pending"}}, {"_id": 1}) is None:
        proc.check_alive()
        if time.monotonic() > deadline:
            raise BenchError("no job claimed after 120 s")
        time.sleep(0.005)


# -- a backlog of up to a million ------------------------------------------------------------


def backlog(ctx: Context, sizes: tuple[int, ...] = (0, 100_000, 1_000_000)) -> dict[str, Any]:
    """For each size: that many due noop jobs inserted straight into the store, then an API
    and a dispatcher (at `ctx.concurrency`), which drains them while the figures of goal 5
    are taken. With no backlog, the drain rate is that of 5,000 jobs inserted afterwards."""
    out: dict[str, Any] = {}
    for size in sizes:
        db = ctx.new_db(f"backlog{size}")
        _ensure_indexes(ctx.deployment.uri, db)
        preload_s = preload(ctx.client, db, size)
        rate = round(size / max(preload_s, 1e-9))
        res = {"preload_s": round(preload_s, 1), "preload_per_s": rate}
        out[str(size)] = res | _measure_backlog(ctx, db, size)
        print(f"[bench] backlog {size}: {json.dumps(out[str(size)])}", flush=True)
        ctx.client.drop_database(db)
        ctx.databases.remove(db)
    return out


def _measure_backlog(ctx: Context, db: str, size: int) -> dict[str, Any]:
    port = free_port()
    env = role_env(ctx.deployment.uri, db, ctx.concurrency, port, ctx.log_level)
    with (
        role("api", env, ctx.log_dir / f"backlog{size}-api.log") as api,
        role("dispatcher", env, ctx.log_dir / f"backlog{size}-dispatcher.log") as disp,
    ):
        wait_api(_api(port), api)
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base, [api, disp])
        res: dict[str, Any] = {"pending": size}
        res["endpoints_ms"] = _endpoint_latencies(base)
        res["priority_submit_to_start_ms"] = _priority_latency(ctx, db, base)
        res["drain_per_s"] = _drain_rate(ctx, db, size, [api, disp])
        res["rss_mb"] = {"api": rss_mb(api.pid), "dispatcher": rss_mb(disp.pid)}
        res["loadavg"] = os.getloadavg()
    return res


def _wait_ready(base: str, procs: list[RoleProcess], timeout: float = 300.0) -> None:
    """The dispatcher runs jobs: a top-priority noop (ahead of any backlog) completed."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=base, timeout=30) as http:
        job_id = http.post("/jobs", json={"task": "noop", "priority": 1000}).json()["id"]
        while http.get(f"/jobs/{job_id}").json()["status"] != "completed":
            for proc in procs:
                proc.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"the warm-up job did not complete in {timeout:.0f} s")
            time.sleep(0.05)


def _endpoint_latencies(base: str, n: int = 50) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with httpx.Client(base_url=base, timeout=60) as http:
        for path in ("/metrics", "/queues", "/jobs?status=pending"):
            http.get(path)  # warm (and start any cache)
            rtts = []
            for _ in range(n):
                t = time.perf_counter()
                resp = http.get(path)
                rtts.append((time.perf_counter() - t) * 1000)
                if resp.status_code != 200:
                    raise BenchError(f"GET {path} -> {resp.status_code}")
                time.sleep(0.05)
            out[path] = dist(rtts)
    return out


def _priority_latency(ctx: Context, db: str, base: str, n: int = 50) -> dict[str, Any]:
    """`n` priority-10 jobs, one every 50 ms, while the backlog drains: submit (the
    server's stamp) → start, and its two parts: submit → claim (`claimed_at`) and claim →
    start."""
    ids = []
    with httpx.Client(base_url=base, timeout=30) as http:
        for _ in range(n):
            resp = http.post("/jobs", json={"task": "noop", "payload": {}, "priority": 10})
            ids.append(resp.json()["id"])
            time.sleep(0.05)
    jobs = ctx.client[db]["jobs"]
    deadline = time.monotonic() + 60
    while jobs.count_documents({"_id": {"$in": ids}, "status": "completed"}) < n:
        if time.monotonic() > deadline:
            raise BenchError("priority jobs not completed in 60 s")
        time.sleep(0.1)
    stamps = {"created_at": 1, "claimed_at": 1, "started_at": 1}
    docs = list(jobs.find({"_id": {"$in": ids}}, stamps))
    return dist([ms(d["started_at"], d["created_at"]) for d in docs]) | {
        "submit_to_claim": dist([ms(d["claimed_at"], d["created_at"]) for d in docs]),
        "claim_to_start": dist([ms(d["started_at"], d["claimed_at"]) for d in docs]),
    }


def _drain_rate(ctx: Context, db: str, size: int, procs: list[RoleProcess]) -> float:
    """Jobs started per second: over a 15 s window of the draining backlog, or, with no
    backlog, for 5,000 jobs inserted now (first start → last start)."""
    jobs = ctx.client[db]["jobs"]
    if size:
        done0 = jobs.count_documents({"status": "completed"})
        t0 = time.monotonic()
        time.sleep(15)
        done1 = jobs.count_documents({"status": "completed"})
        return round((done1 - done0) / (time.monotonic() - t0), 1)
    now = datetime.now(UTC)
    docs = [pending_doc(now) for _ in range(5000)]
    jobs.insert_many(docs)
    ids = [d["_id"] for d in docs]
    wait_settled(ctx.client, db, procs, timeout=300)
    starts = sorted(d["started_at"] for d in jobs.find({"_id": {"$in": ids}}, {"started_at": 1}))
    return round((len(starts) - 1) / (ms(starts[-1], starts[0]) / 1000), 1)
