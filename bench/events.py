"""Live events under load: how fast a change reaches many SSE clients of one API process,
and what the change-stream post-images that make each event exact cost the dispatcher."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import httpx

from bench.harness import Api, BenchError
from bench.scenarios import Context
from bench.stats import dist
from brook.common.domain.models import JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import JobStore


async def _client(
    http: httpx.AsyncClient, seen: dict[str, float], connected: list[int]
) -> None:
    """One SSE client: when each job's `pending` and `completed` events arrived."""
    async with http.stream("GET", "/events") as resp:
        if resp.status_code != 200:
            raise BenchError(f"/events answered {resp.status_code}")
        connected.append(1)
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                job = json.loads(line[6:])
                if job["status"] in ("pending", "completed"):
                    seen.setdefault(f"{job['id']}:{job['status']}", time.perf_counter())


async def _submit_at(store: JobStore, rate: float, duration: float) -> dict[str, float]:
    """Submit noop jobs at `rate` per second for `duration`; when each was acknowledged."""
    acked: dict[str, float] = {}
    start = time.monotonic()
    while time.monotonic() - start < duration:
        job = (await store.submit(JobSpec(task="noop", payload={}))).job
        acked[job.id] = time.perf_counter()
        await asyncio.sleep(max(start + len(acked) / rate - time.monotonic(), 0))
    return acked


async def _fanout(
    api: Api, settings: Settings, clients: int, rate: float, duration: float
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=0)
    timeout = httpx.Timeout(30, read=None)
    mongo = make_client(settings, appname="brook-bench")
    seen: list[dict[str, float]] = [{} for _ in range(clients)]
    connected: list[int] = []
    async with httpx.AsyncClient(
        base_url=api.base_url, headers=api.headers, limits=limits, timeout=timeout
    ) as http:
        tasks = [asyncio.create_task(_client(http, seen[i], connected)) for i in range(clients)]
        deadline = time.monotonic() + 30
        while len(connected) < clients:
            if time.monotonic() > deadline:
                raise BenchError(f"only {len(connected)} of {clients} SSE clients connected")
            await asyncio.sleep(0.05)
        acked = await _submit_at(JobStore(database(mongo, settings)), rate, duration)
        await asyncio.sleep(3)  # the last events arrive
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await task
    await mongo.close()
    delays: dict[str, list[float]] = {"pending": [], "completed": []}
    for arrivals in seen:
        for job_id, ack in acked.items():
            for status, values in delays.items():
                if (at := arrivals.get(f"{job_id}:{status}")) is not None:
                    values.append((at - ack) * 1000)
    expected = 2 * len(acked) * clients
    return {
        "clients": clients,
        "jobs": len(acked),
        "events_expected": expected,
        "events_missing": expected - sum(len(v) for v in delays.values()),
        "insert_ack_to_pending_event_ms": dist(delays["pending"]),
        "insert_ack_to_completed_event_ms": dist(delays["completed"]),
    }


def events_fanout(ctx: Context, clients: int, rate: float, duration: float) -> dict[str, Any]:
    """`clients` SSE clients on one API process while jobs are submitted at `rate` per second
    (straight to the store, so HTTP submits do not share the API's CPU): the delay from a
    submit's acknowledgement to its `pending` event, and to its `completed` event, at every
    client; and the API's CPU."""
    db = ctx.new_db("events")
    settings = Settings(mongo_uri=ctx.deployment.uri, db=db)
    with (
        ctx.roles(db, "events-fanout", api=True) as roles,
        ctx.window("events-fanout", roles) as cpu,
    ):
        figures = asyncio.run(_fanout(roles.http(), settings, clients, rate, duration))
    return {
        **figures,
        "rate": rate,
        "duration_s": duration,
        "resources": cpu,
        "logs": roles.logs(),
    }


def enable_post_images(uri: str, db: str) -> None:
    """What the API does at start: post-images on the jobs collection (a pre-image is written
    with every job update)."""

    async def enable() -> None:
        settings = Settings(mongo_uri=uri, db=db)
        client = make_client(settings, appname="brook-bench")
        try:
            await JobStore(database(client, settings)).enable_post_images()
        finally:
            await client.close()

    asyncio.run(enable())
