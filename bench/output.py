"""The `output` scenario: jobs that stream their output, read live over SSE (issue 44).

    python -m bench.run --scenario output [--jobs 100] [--chunks-per-s 25] [--stream-s 10]
                        [--drain 5000]

* **Streaming.** One `brook api` and one `brook dispatcher` (fresh database,
  `BROOK_TASKS=bench.output_tasks`: `bench_emit`, shared, so the jobs run together in the
  one shared worker process). `--jobs` jobs (queue `stream`) each emit `--chunks-per-s`
  chunks a second for `--stream-s` seconds (`ctx.emit`, a short text chunk, on a fixed
  schedule). They are submitted due 3 s later, and one SSE reader per job
  (`GET /jobs/{id}/output`, one connection each, httpx in this process) is connected
  before they start; each reads its job's stream to its `end`.
  - emit → client latency: the reader's `time.time()` when the event is parsed, minus the
    chunk's `emitted_at` (the worker's `time.time()` at the `emit` call; same host);
  - output writes per second: transactions committed on the primary (`serverStatus`
    `transactions.totalCommitted`: each output batch is one) over the streaming time (first
    chunk emitted to last), against the most the batching allows (one per worker process
    per `BROOK_OUTPUT_WINDOW_MS`);
  - CPU per chunk: CPU seconds of the dispatcher's tree, the API, the three `mongod` and the
    readers (this process) from the readers' connection to their last `end`, over the chunks.
* **Drain while another queue streams** (`--drain`, 0 skips it). The same roles on a fresh
  database: `--drain` noop jobs (queue `default`) inserted due 2 s later, drained alone;
  then the same again while `--jobs` jobs of queue `stream` emit and are read as above
  (started first, cancelled once the drain is over). Drain rate: jobs/s from the first
  start to the last (the peer harness's definition of its drain mode); the target is the
  streaming run at ≥ 0.8x the quiet one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from bench.harness import (
    BenchError,
    RoleProcess,
    api_for,
    children,
    cpu_meter,
    free_port,
    role,
    role_env,
    wait_api,
    wait_dispatcher,
    wait_settled,
)
from bench.scale import pending_doc, primary_cost
from bench.scenarios import Context
from bench.stats import dist, ms
from brook import AsyncClient

TARGET_P50_MS = 50.0
TARGET_P99_MS = 150.0
TARGET_DRAIN_RATIO = 0.8
START_DELAY_S = 3.0  # the streaming jobs are due this long after their submit
WINDOW_MS = 25  # BROOK_OUTPUT_WINDOW_MS (its default): one write per process per window
SHARED_PROCESSES = 1  # BROOK_SHARED_PROCESSES (its default): where the streaming jobs run


class StreamLoad:
    """`jobs` streaming jobs and a reader for each, on an event loop of its own thread:
    `start()` submits them and returns once every reader is connected; `wait()` until every
    stream ended (or `stop()` cancels the jobs first, for a load of no set length)."""

    def __init__(self, uri: str, db: str, api: str, jobs: int, per_s: float, chunks: int) -> None:
        self.uri, self.db, self.api = uri, db, api
        self.jobs, self.per_s, self.chunks = jobs, per_s, chunks
        self.latencies_ms: list[float] = []
        self.emitted: list[float] = []  # each chunk's `emitted_at`
        self.read = 0
        self.ended: dict[str, int] = {}
        self.error: BaseException | None = None
        self._connected = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._main, name="stream-load", daemon=True)

    def start(self, timeout: float = 120) -> StreamLoad:
        self._thread.start()
        if not self._connected.wait(timeout) or self.error is not None:
            raise BenchError(f"the readers did not connect: {self.error!r}")
        return self

    def wait(self, timeout: float) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise BenchError(f"the streams did not end within {timeout:.0f} s")
        if self.error is not None:
            raise BenchError(f"a reader failed: {self.error!r}")

    def stop(self, timeout: float = 120) -> None:
        async def cancel() -> None:
            async with AsyncClient(self.uri, self.db) as client:
                await client.cancel_many(queue="stream")

        asyncio.run(cancel())
        self.wait(timeout)

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported by start() / wait()
            self.error = exc
            self._connected.set()

    async def _run(self) -> None:
        spec = {
            "task": "bench_emit",
            "payload": {"chunks": self.chunks, "per_s": self.per_s},
            "queue": "stream",
            "delay": START_DELAY_S,
        }
        async with AsyncClient(self.uri, self.db) as client:
            ids = [job.id for job in await client.submit_many([spec] * self.jobs)]
        limits = httpx.Limits(max_connections=self.jobs + 8, max_keepalive_connections=0)
        timeout = httpx.Timeout(30.0, read=300.0)
        connected = [0]
        async with httpx.AsyncClient(base_url=self.api, limits=limits, timeout=timeout) as http:
            await asyncio.gather(*(self._reader(http, job_id, connected) for job_id in ids))

    async def _reader(self, http: httpx.AsyncClient, job_id: str, connected: list[int]) -> None:
        async with aconnect_sse(http, "GET", f"/jobs/{job_id}/output") as source:
            source.response.raise_for_status()
            connected[0] += 1
            if connected[0] == self.jobs:
                self._connected.set()
            async for sse in source.aiter_sse():
                if sse.event == "output":
                    now = time.time()
                    chunk = json.loads(sse.data)
                    self.latencies_ms.append((now - float(chunk["emitted_at"])) * 1000.0)
                    self.emitted.append(float(chunk["emitted_at"]))
                    self.read += 1
                elif sse.event == "end":
                    status = str(json.loads(sse.data)["status"])
                    self.ended[status] = self.ended.get(status, 0) + 1
                    return


@contextlib.contextmanager
def _roles(ctx: Context, db: str, label: str) -> Iterator[tuple[str, RoleProcess, RoleProcess]]:
    port = free_port()
    env = role_env(ctx.deployment.uri, db, ctx.concurrency, port, ctx.log_level)
    env["BROOK_TASKS"] = "bench.output_tasks"
    api = api_for(port)
    with (
        role("api", env, ctx.log_dir / f"{label}-api.log") as api_proc,
        role(
            "dispatcher",
            {**env, "BROOK_METRICS_PORT": str(free_port())},
            ctx.log_dir / f"{label}-dispatcher.log",
        ) as disp,
    ):
        wait_api(api, api_proc)
        wait_dispatcher(api, [disp])
        yield api.base_url, api_proc, disp


def _committed(ctx: Context) -> int:
    status = ctx.client.admin.command("serverStatus")
    return int(status["transactions"]["totalCommitted"])


def streaming(ctx: Context, jobs: int, per_s: float, seconds: float) -> dict[str, Any]:
    db = ctx.new_db("output")
    chunks = int(per_s * seconds)
    with _roles(ctx, db, "output") as (api, api_proc, disp):
        load = StreamLoad(ctx.deployment.uri, db, api, jobs, per_s, chunks).start()
        groups = {
            "dispatcher": [disp.pid, *children(disp.pid)],
            "api": [api_proc.pid],
            "mongod": ctx.deployment.mongod_pids,
            "readers": [os.getpid()],
        }
        before, ops_before = _committed(ctx), primary_cost(ctx.client)
        with cpu_meter(groups) as cpu:
            load.wait(START_DELAY_S + seconds * 4 + 120)
        commits = _committed(ctx) - before
        ops = primary_cost(ctx.client)
        wait_settled(ctx.client, db, [disp], 120)
        stored = ctx.client[db]["brook_output"].count_documents({})
    span = max(load.emitted) - min(load.emitted) if load.emitted else 0.0
    cpu_s = sum(g["cpu_s"] for g in cpu["groups"].values())
    writes_per_s = commits / span if span else None
    most = SHARED_PROCESSES * 1000 / WINDOW_MS
    return {
        "jobs": jobs,
        "chunks_per_s_each": per_s,
        "stream_s": seconds,
        "chunks_expected": jobs * chunks,
        "chunks_read": load.read,
        "chunks_stored": stored,
        "ended": load.ended,
        "latency_ms": dist(load.latencies_ms),
        "streaming_s": round(span, 2),
        "output_commits": commits,
        "output_writes_per_s": round(writes_per_s, 1) if writes_per_s else None,
        "writes_allowed_per_s": most,
        "chunks_per_write": round(stored / commits, 1) if commits else None,
        # What the primary did per chunk read: documents inserted (the chunks) and updated
        # (the jobs' counts of their output: with an attempt's first batch, once a second,
        # and at its end), operations by kind.
        "primary_per_chunk": {
            k: round((ops[k] - ops_before.get(k, 0.0)) / max(load.read, 1), 3)
            for k in ("docs_inserted", "docs_updated", "op_insert", "op_update", "op_getmore")
            if k in ops
        },
        "cpu": cpu,
        "cpu_ms_per_chunk": round(cpu_s * 1000 / max(load.read, 1), 3),
        "cpu_ms_per_chunk_by_group": {
            k: round(g["cpu_s"] * 1000 / max(load.read, 1), 3) for k, g in cpu["groups"].items()
        },
        "logs": {"api": api_proc.log_events(), "dispatcher": disp.log_events()},
    }


def _drain_once(ctx: Context, db: str, n: int, label: str) -> dict[str, Any]:
    """`n` noop jobs due 2 s from now, inserted straight into the store; jobs/s from their
    first start to their last (the dispatcher is running)."""
    due = datetime.now(UTC) + timedelta(seconds=2)
    docs = [{**pending_doc(due), "bench": label} for _ in range(n)]
    jobs = ctx.client[db]["jobs"]
    jobs.insert_many(docs, ordered=False)
    deadline = time.monotonic() + max(300.0, n / 10)
    while jobs.find_one({"bench": label, "status": {"$in": ["pending", "running"]}}, {"_id": 1}):
        if time.monotonic() > deadline:
            raise BenchError(f"drain {label}: not done after {n / 10:.0f} s")
        time.sleep(0.1)
    starts = sorted(d["started_at"] for d in jobs.find({"bench": label}, {"started_at": 1}))
    span = ms(starts[-1], starts[0]) / 1000
    return {"jobs": n, "drain_per_s": round((len(starts) - 1) / span, 1) if span else None}


def drain_beside_streams(ctx: Context, n: int, jobs: int, per_s: float) -> dict[str, Any]:
    db = ctx.new_db("output_drain")
    out: dict[str, Any] = {"concurrency": ctx.concurrency, "streaming_jobs": jobs}
    with _roles(ctx, db, "output_drain") as (api, _api_proc, _disp):
        out["quiet"] = _drain_once(ctx, db, n, "quiet")
        # Streams of no set length (an hour's worth of chunks): cancelled once drained.
        load = StreamLoad(ctx.deployment.uri, db, api, jobs, per_s, int(per_s * 3600)).start()
        running = ctx.client[db]["jobs"]
        deadline = time.monotonic() + 120
        while running.count_documents({"queue": "stream", "status": "running"}) < jobs:
            if time.monotonic() > deadline:
                raise BenchError("the streaming jobs did not all start")
            time.sleep(0.1)
        time.sleep(2.0)  # streaming in full
        with cpu_meter({"machine": []}) as cpu:
            out["streaming"] = _drain_once(ctx, db, n, "streaming")
        out["streaming"]["machine_busy_share"] = cpu["machine_busy_share"]
        out["streaming"]["chunks_read_so_far"] = load.read
        out["streaming"]["latency_ms"] = dist(load.latencies_ms)
        load.stop()
        out["streams_ended"] = load.ended
    quiet, busy = out["quiet"]["drain_per_s"], out["streaming"]["drain_per_s"]
    out["ratio"] = round(busy / quiet, 2) if quiet and busy else None
    return out


def output(ctx: Context, jobs: int, per_s: float, seconds: float, drain: int) -> dict[str, Any]:
    ctx.log_dir.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"streaming": streaming(ctx, jobs, per_s, seconds)}
    if drain:
        res["drain"] = drain_beside_streams(ctx, drain, jobs, per_s)
    return res


def summary(res: dict[str, Any]) -> list[str]:
    s = res["streaming"]
    lat = s["latency_ms"]
    ok_lat = lat.get("p50", 1e9) <= TARGET_P50_MS and lat.get("p99", 1e9) <= TARGET_P99_MS
    writes = s["output_writes_per_s"] or 0.0
    lines = [
        f"output: {s['jobs']} jobs x {s['chunks_per_s_each']:g} chunks/s x {s['stream_s']:g} s, "
        f"one SSE reader each: {s['chunks_read']}/{s['chunks_expected']} chunks read, "
        f"{s['chunks_stored']} stored, ended {s['ended']}",
        f"  emit -> client latency ms: p50 {lat.get('p50')} p99 {lat.get('p99')} max "
        f"{lat.get('max')} (target p50 <= {TARGET_P50_MS:g}, p99 <= {TARGET_P99_MS:g}: "
        f"{'MET' if ok_lat else 'NOT MET'})",
        f"  output writes: {s['output_commits']} commits in {s['streaming_s']} s = {writes} /s, "
        f"{s['chunks_per_write']} chunks each (at most {s['writes_allowed_per_s']:g}/s: one per "
        f"worker process per {WINDOW_MS} ms window: "
        f"{'MET' if writes <= s['writes_allowed_per_s'] else 'NOT MET'})",
        f"  CPU per chunk: {s['cpu_ms_per_chunk']} ms ({s['cpu_ms_per_chunk_by_group']}); "
        f"machine busy {s['cpu']['machine_busy_share']:.0%}",
        f"  on the primary per chunk: {s.get('primary_per_chunk')}",
    ]
    if "drain" in res:
        d = res["drain"]
        ok = d["ratio"] is not None and d["ratio"] >= TARGET_DRAIN_RATIO
        lines.append(
            f"  drain of {d['quiet']['jobs']} noop jobs at concurrency {d['concurrency']}: "
            f"{d['quiet']['drain_per_s']}/s alone, {d['streaming']['drain_per_s']}/s while "
            f"{d['streaming_jobs']} jobs stream in another queue = {d['ratio']}x (target >= "
            f"{TARGET_DRAIN_RATIO}: {'MET' if ok else 'NOT MET'}); stream latency meanwhile "
            f"p50 {d['streaming']['latency_ms'].get('p50')} p99 "
            f"{d['streaming']['latency_ms'].get('p99')} ms"
        )
    return lines
