"""The scenarios: open-loop latency, throughput over HTTP, throughput of a backlog, and a probe
of the raw MongoDB operations Brook is built from."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pymongo import AsyncMongoClient, MongoClient, ReturnDocument
from pymongo.write_concern import WriteConcern

from bench.harness import (
    Api,
    BenchError,
    Deployment,
    Doc,
    Profiler,
    RoleProcess,
    api_for,
    children,
    cpu_meter,
    free_port,
    role,
    role_env,
    server_counters,
    wait_api,
    wait_dispatcher,
    wait_first_claim,
    wait_settled,
)
from bench.stats import (
    JobTimes,
    anomalies,
    dist,
    gaps_ms,
    max_overlap,
    ms,
    per_second,
)
from brook import AsyncClient
from brook.common.domain.models import JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import JobStore, Lease

PROJECTION = {"status": 1, "attempts": 1, "created_at": 1, "started_at": 1, "finished_at": 1}
NOOP = {"task": "noop", "payload": {}}


@dataclass
class Context:
    """What every scenario shares: the deployment, the run's name, and its knobs."""

    deployment: Deployment
    stamp: str
    concurrency: int
    client: MongoClient[Doc]
    profiler: Profiler
    log_dir: Path
    log_level: str = "WARNING"
    databases: list[str] = field(default_factory=list)

    def new_db(self, scenario: str) -> str:
        name = f"bench_{self.stamp}_{scenario}"
        self.databases.append(name)
        return name

    @contextlib.contextmanager
    def window(self, label: str, roles: Roles) -> Iterator[dict[str, Any]]:
        """The measured part of a scenario: CPU accounting, and py-spy on each role if asked."""
        groups = {
            "dispatcher": [roles.dispatcher.pid],
            "workers": children(roles.dispatcher.pid),
            "api": [roles.api_proc.pid] if roles.api_proc else [],
            "mongod": self.deployment.mongod_pids,
            "bench_client": [os.getpid()],
        }
        before = server_counters(self.client)
        with contextlib.ExitStack() as stack:
            for proc in roles.procs:
                stack.enter_context(self.profiler.record(f"{label}-{proc.role}", proc.pid))
            report = stack.enter_context(cpu_meter(groups))
            try:
                yield report
            finally:
                after = server_counters(self.client)
                report["primary_counters"] = {k: after[k] - before.get(k, 0) for k in after}

    def jobs(self, db: str, exclude: str | None = None) -> list[JobTimes]:
        query: Doc = {"_id": {"$ne": exclude}} if exclude else {}
        docs = self.client[db]["jobs"].find(query, PROJECTION)
        return [JobTimes.from_doc(d) for d in docs]

    @contextlib.contextmanager
    def roles(self, db: str, label: str, *, api: bool) -> Iterator[Roles]:
        """Start the dispatcher (and the API, waiting until it is ready)."""
        port = free_port()
        env = role_env(self.deployment.uri, db, self.concurrency, port, self.log_level)
        with contextlib.ExitStack() as stack:
            disp = stack.enter_context(
                role("dispatcher", env, self.log_dir / f"{label}-dispatcher.log")
            )
            if not api:
                yield Roles(dispatcher=disp)
                return
            api_proc = stack.enter_context(role("api", env, self.log_dir / f"{label}-api.log"))
            client = api_for(port)
            wait_api(client, api_proc)
            yield Roles(dispatcher=disp, api_proc=api_proc, api=client)


@dataclass(frozen=True, kw_only=True)
class Roles:
    dispatcher: RoleProcess
    api_proc: RoleProcess | None = None
    api: Api | None = None

    @property
    def procs(self) -> list[RoleProcess]:
        return [p for p in (self.dispatcher, self.api_proc) if p is not None]

    def http(self) -> Api:
        if self.api is None:
            raise BenchError("this scenario started no API")
        return self.api

    def logs(self) -> dict[str, dict[str, int]]:
        return {p.role: p.log_events() for p in self.procs}


@dataclass(frozen=True, kw_only=True)
class Sent:
    index: int
    lag_ms: float  # how late the request left against its open-loop schedule
    rtt_ms: float
    status: int
    job_id: str | None


async def _post(http: httpx.AsyncClient, index: int, scheduled: float) -> Sent:
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        resp = await http.post("/jobs", json=NOOP)
        status = resp.status_code
        job_id = resp.json().get("id") if status == 202 else None
    except httpx.HTTPError:
        status, job_id = 0, None
    return Sent(
        index=index,
        lag_ms=(start - scheduled) * 1000,
        rtt_ms=(loop.time() - start) * 1000,
        status=status,
        job_id=job_id,
    )


async def open_loop(api: Api, rate: float, duration: float) -> list[Sent]:
    """Submission i leaves at t0 + i/rate whatever earlier responses do (one persistent client)."""
    count = max(int(rate * duration), 1)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(
        base_url=api.base_url, headers=api.headers, timeout=30.0, limits=limits
    ) as http:
        loop = asyncio.get_running_loop()
        t0 = loop.time() + 0.1
        tasks: list[asyncio.Task[Sent]] = []
        for i in range(count):
            at = t0 + i / rate
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_post(http, i, at)))
        return list(await asyncio.gather(*tasks))


async def flood(api: Api, jobs: int, clients: int, per_client: int) -> tuple[list[Sent], float]:
    """`clients` connections x `per_client` requests in flight until `jobs` are submitted."""
    counter = itertools.count()
    sent: list[Sent] = []

    async def pump(http: httpx.AsyncClient) -> None:
        loop = asyncio.get_running_loop()
        while (i := next(counter)) < jobs:
            sent.append(await _post(http, i, loop.time()))

    https = [
        httpx.AsyncClient(base_url=api.base_url, headers=api.headers, timeout=30.0)
        for _ in range(clients)
    ]
    start = time.monotonic()
    try:
        await asyncio.gather(*(pump(h) for h in https for _ in range(per_client)))
    finally:
        for h in https:
            await h.aclose()
    return sent, time.monotonic() - start


def _sent_figures(sent: list[Sent]) -> dict[str, Any]:
    ok = [s for s in sent if s.status == 202]
    return {
        "requests": len(sent),
        "accepted_202": len(ok),
        "errors": {str(k): v for k, v in _count(s.status for s in sent if s.status != 202).items()},
        "rtt_ms": dist([s.rtt_ms for s in sent]),
    }


def _count(values: Any) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _job_figures(jobs: list[JobTimes], concurrency: int) -> dict[str, Any]:
    started = [j.started for j in jobs if j.started is not None]
    finished = [j.finished for j in jobs if j.finished is not None]
    return {
        "jobs": len(jobs),
        "anomalies": anomalies(jobs),
        "queue_wait_ms": dist([ms(j.started, j.created) for j in jobs if j.started]),
        "run_ms": dist([ms(j.finished, j.started) for j in jobs if j.started and j.finished]),
        "claim_gap_ms": dist(gaps_ms(started)),
        "max_running_at_once": max_overlap(jobs),
        "concurrency": concurrency,
        "completions_per_second": per_second(finished, min(started)) if started else [],
    }


# -- scenarios ---------------------------------------------------------------------------------


def latency(ctx: Context, rate: float, duration: float) -> dict[str, Any]:
    db = ctx.new_db("latency")
    with ctx.roles(db, "latency", api=True) as roles:
        api = roles.http()
        warm = wait_dispatcher(api, roles.procs)
        with ctx.window("latency", roles) as cpu:
            sent = asyncio.run(open_loop(api, rate, duration))
            settle_s = wait_settled(ctx.client, db, roles.procs, timeout=120 + duration)
        jobs = ctx.jobs(db, exclude=warm)
    logs = roles.logs()
    to_start = [ms(j.started, j.created) for j in jobs if j.started]
    to_finish = [ms(j.finished, j.created) for j in jobs if j.finished]
    running = [ms(j.finished, j.started) for j in jobs if j.finished and j.started]
    return {
        "rate": rate,
        "duration_s": duration,
        "submit": _sent_figures(sent) | {"schedule_lag_ms": dist([s.lag_ms for s in sent])},
        "jobs": len(jobs),
        "anomalies": anomalies(jobs),
        "settle_after_last_submit_s": round(settle_s, 3),
        "submit_to_start_ms": dist(to_start),
        "submit_to_finish_ms": dist(to_finish),
        "start_to_finish_ms": dist(running),
        "raw": {
            "submit_to_start_ms": to_start,
            "submit_to_finish_ms": to_finish,
            "http_rtt_ms": [round(s.rtt_ms, 3) for s in sent],
        },
        "resources": cpu,
        "logs": logs,
    }


def throughput_http(ctx: Context, jobs: int, clients: int, per_client: int) -> dict[str, Any]:
    db = ctx.new_db("http")
    with ctx.roles(db, "throughput-http", api=True) as roles:
        api = roles.http()
        warm = wait_dispatcher(api, roles.procs)
        with ctx.window("throughput-http", roles) as cpu:
            sent, submit_s = asyncio.run(flood(api, jobs, clients, per_client))
            wait_settled(ctx.client, db, roles.procs, timeout=max(120.0, jobs / 20))
        found = ctx.jobs(db, exclude=warm)
    logs = roles.logs()
    first_created = min(j.created for j in found)
    first_started = min(j.started for j in found if j.started)
    last_finished = max(j.finished for j in found if j.finished)
    last_created = max(j.created for j in found)
    span = ms(last_finished, first_created) / 1000
    return {
        "jobs_requested": jobs,
        "in_flight": clients * per_client,
        "submit": _sent_figures(sent)
        | {"seconds": round(submit_s, 3), "jobs_per_s": round(len(sent) / submit_s, 1)},
        "end_to_end_s": round(span, 3),
        "end_to_end_jobs_per_s": round(len(found) / span, 1),
        "drain_jobs_per_s": round(len(found) / (ms(last_finished, first_started) / 1000), 1),
        "tail_after_last_submit_ms": round(ms(last_finished, last_created), 1),
        **_job_figures(found, ctx.concurrency),
        "resources": cpu,
        "logs": logs,
    }


# Batch submits are parked an hour ahead so the dispatcher does not run them while the
# submits are measured (its due timer is armed once, for the earliest).
PARKED = {"task": "noop", "payload": {"bench": "batch"}, "delay": 3600}


async def _post_batches(api: Api, jobs: int, size: int) -> tuple[float, list[float]]:
    """`jobs` specs through `POST /jobs/batch`, `size` per request, one request at a time."""
    rtts: list[float] = []
    async with httpx.AsyncClient(base_url=api.base_url, headers=api.headers, timeout=60) as http:
        start = time.monotonic()
        for first in range(0, jobs, size):
            body = {"jobs": [PARKED] * min(size, jobs - first)}
            sent = time.monotonic()
            resp = await http.post("/jobs/batch", json=body)
            rtts.append((time.monotonic() - sent) * 1000)
            if resp.status_code != 202:
                raise BenchError(f"batch submit: {resp.status_code} {resp.text[:300]}")
        return time.monotonic() - start, rtts


async def _client_batches(uri: str, db: str, jobs: int, size: int) -> tuple[float, list[float]]:
    """`jobs` specs through `AsyncClient.submit_many`, `size` per call, one call at a time."""
    calls: list[float] = []
    async with AsyncClient(uri, db) as client:
        await client.submit_many([PARKED])  # connect, indexes, task check: not measured
        start = time.monotonic()
        for first in range(0, jobs, size):
            sent = time.monotonic()
            await client.submit_many([PARKED] * min(size, jobs - first))
            calls.append((time.monotonic() - sent) * 1000)
        return time.monotonic() - start, calls


def batch_submit(ctx: Context, jobs: int, size: int = 1000) -> dict[str, Any]:
    """Submit throughput of the batch paths, `size` specs per call: over HTTP
    (`POST /jobs/batch`) and from Python (`AsyncClient.submit_many`, straight to MongoDB)."""
    db = ctx.new_db("batch")
    with ctx.roles(db, "batch", api=True) as roles:
        api = roles.http()
        wait_dispatcher(api, roles.procs)
        with ctx.window("batch", roles) as cpu:
            http_s, rtts = asyncio.run(_post_batches(api, jobs, size))
            py_s, calls = asyncio.run(_client_batches(ctx.deployment.uri, db, jobs, size))
        stored = ctx.client[db]["jobs"].count_documents({"payload.bench": "batch"})
    if stored != 2 * jobs + 1:
        raise BenchError(f"batch submit stored {stored} jobs, expected {2 * jobs + 1}")
    return {
        "jobs": jobs,
        "batch_size": size,
        "http": {"seconds": round(http_s, 3), "jobs_per_s": round(jobs / http_s, 1)}
        | {"request_ms": dist(rtts)},
        "python": {"seconds": round(py_s, 3), "jobs_per_s": round(jobs / py_s, 1)}
        | {"call_ms": dist(calls)},
        "resources": cpu,
        "logs": roles.logs(),
    }


async def _preload(settings: Settings, jobs: int, in_flight: int) -> float:
    client = make_client(settings, appname="brook-bench")
    try:
        return await _submit_many(JobStore(database(client, settings)), jobs, in_flight)
    finally:
        await client.close()


async def _submit_many(store: JobStore, jobs: int, in_flight: int) -> float:
    """`jobs` noop jobs through `JobStore.submit` (the API's own write), `in_flight` at once."""
    await store.ensure_indexes()
    counter = itertools.count()
    spec = JobSpec(task="noop", payload={})

    async def pump() -> None:
        while next(counter) < jobs:
            await store.submit(spec)

    start = time.monotonic()
    await asyncio.gather(*(pump() for _ in range(in_flight)))
    return time.monotonic() - start


async def _store_ceiling(settings: Settings, jobs: int) -> dict[str, Any]:
    """What the store alone sustains on a backlog, no processes or IPC: (a) claims one at a
    time, as the dispatcher's claimer issues them; (b) 8 loops of claim then complete."""
    client = make_client(settings, appname="brook-bench")
    store = JobStore(database(client, settings))
    out: dict[str, Any] = {"backlog": jobs}
    try:
        await _submit_many(store, jobs * 3, 32)
        start = time.monotonic()
        for _ in range(jobs):
            await store.claim("bench-serial", 60)
        out["serial_claims_per_s"] = round(jobs / (time.monotonic() - start), 1)

        async def loop() -> int:
            done = 0
            while (job := (await store.claim("bench-8", 60)).job) is not None:
                lease = Lease(job_id=job.id, attempt=job.attempts)
                await store.complete_many("bench-8", [(lease, None)])
                done += 1
            return done

        start = time.monotonic()
        finished = sum(await asyncio.gather(*(loop() for _ in range(8))))
        out["claim_complete_x8_jobs_per_s"] = round(finished / (time.monotonic() - start), 1)
    finally:
        await client.close()
    return out


def throughput_backlog(
    ctx: Context, jobs: int, in_flight: int, *, prepare: Callable[[str, str], None] | None = None
) -> dict[str, Any]:
    """A backlog of `jobs` drained by one dispatcher; `prepare(uri, db)` runs first (say,
    turning on the post-images an API turns on)."""
    db = ctx.new_db("backlog" if prepare is None else "backlog_prepared")
    settings = Settings(mongo_uri=ctx.deployment.uri, db=db)
    if prepare is not None:
        prepare(ctx.deployment.uri, db)
    preload_s = asyncio.run(_preload(settings, jobs, in_flight))
    with ctx.roles(db, "throughput-backlog", api=False) as roles:
        # Measure from the first claim on: worker start-up is not part of the drain.
        wait_first_claim(ctx.client, db, roles.procs)
        with ctx.window("throughput-backlog", roles) as cpu:
            wait_settled(ctx.client, db, roles.procs, timeout=max(180.0, jobs / 20))
        found = ctx.jobs(db)
    logs = roles.logs()
    first_started = min(j.started for j in found if j.started)
    last_finished = max(j.finished for j in found if j.finished)
    span = ms(last_finished, first_started) / 1000
    return {
        "jobs_requested": jobs,
        "preload": {
            "seconds": round(preload_s, 3),
            "jobs_per_s": round(jobs / preload_s, 1),
            "in_flight": in_flight,
        },
        "first_claim_to_last_finish_s": round(span, 3),
        "jobs_per_s": round(len(found) / span, 1),
        **_job_figures(found, ctx.concurrency),
        "resources": cpu,
        "logs": logs,
    }


# -- probe: the raw operations ------------------------------------------------------------------


def _timed(fn: Any, n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t) * 1000)
    return out


async def _stream_delivery(uri: str, db: str, n: int, gap_s: float) -> dict[str, Any]:
    """Insert (w: majority) every `gap_s`; time from each insert's send to its change event."""
    client: AsyncMongoClient[Doc] = AsyncMongoClient(uri, w="majority")
    coll = client[db]["probe_stream"]
    sent: dict[int, float] = {}
    acked: dict[int, float] = {}
    seen: dict[int, float] = {}
    try:
        stream = await coll.watch([{"$match": {"operationType": "insert"}}], max_await_time_ms=1000)
        async with stream:

            async def follow() -> None:
                while len(seen) < n:
                    change = await stream.next()
                    seen[change["fullDocument"]["i"]] = time.perf_counter()

            follower = asyncio.create_task(follow())
            for i in range(n):
                sent[i] = time.perf_counter()
                await coll.insert_one({"i": i})
                acked[i] = time.perf_counter()
                await asyncio.sleep(gap_s)
            await asyncio.wait_for(follower, 30)
    finally:
        await client.close()
    return {
        "insert_ack_ms": dist([(acked[i] - sent[i]) * 1000 for i in range(n)]),
        "insert_to_event_ms": dist([(seen[i] - sent[i]) * 1000 for i in range(n)]),
    }


def probe(ctx: Context, n: int = 200, ceiling_jobs: int = 1000) -> dict[str, Any]:
    """Sequential round trips from this host: what one majority write, one w:1 write, one
    claim-shaped findOneAndUpdate and one change-stream notification cost here; then the
    store's own ceiling for claims (see `_store_ceiling`)."""
    db = ctx.new_db("probe")
    maj = ctx.client[db]["probe"]
    w1 = ctx.client.get_database(db, write_concern=WriteConcern(w=1))["probe_w1"]
    maj.insert_one({"_id": "claim", "n": 0})
    fam = _timed(
        lambda i: maj.find_one_and_update(
            {"_id": "claim"},
            [{"$set": {"n": {"$add": ["$n", 1]}, "at": "$$NOW"}}],
            return_document=ReturnDocument.AFTER,
        ),
        n,
    )
    figures = {
        "n": n,
        "insert_majority_ms": dist(_timed(lambda i: maj.insert_one({"i": i}), n)),
        "insert_w1_ms": dist(_timed(lambda i: w1.insert_one({"i": i}), n)),
        "find_one_and_update_majority_ms": dist(fam),
        "read_by_id_ms": dist(_timed(lambda i: maj.find_one({"_id": "claim"}), n)),
    }
    figures |= asyncio.run(_stream_delivery(ctx.deployment.uri, db, 100, 0.02))
    settings = Settings(mongo_uri=ctx.deployment.uri, db=db)
    figures["store_ceiling"] = asyncio.run(_store_ceiling(settings, ceiling_jobs))
    return figures
