"""The `limits` scenario: what cluster-wide queue limits cost, and what they let through.

    python -m bench.run --scenario limits [--jobs 2000] [--concurrency 8] [--limit 4]

1. **Claim cost for unlimited queues** (the store alone, one claim at a time, no process):
   claims/s of jobs in an unlimited queue (a) with no limits anywhere (the claim as it
   was), (b) with a paused limited queue holding a backlog ahead of them in claim order,
   as a dispatcher claims now (naming the queues without limits), (c) the same backlog
   with the naive filter (`queue: {$nin: limited}`), for comparison; index keys examined
   per claim from `explain`.
2. **Drains** (real dispatcher processes): a backlog of `noop` jobs in an unlimited queue,
   one dispatcher, with and without a paused limited backlog elsewhere; the same jobs in
   a queue with `concurrency = --limit`, drained by one and by three dispatchers (jobs/s,
   most running at once from the server's stamps, operations on `brook_queues` per job).
3. **Rate**: `--jobs / 4` jobs at 50 per second, two dispatchers: the starts/s achieved
   and the most starts in any one-second window.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from bench.harness import BenchError, RoleProcess, free_port, role, role_env
from bench.scenarios import PROJECTION, Context
from bench.stats import JobTimes, max_overlap
from brook.common.domain.models import JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import BestDue, JobStore
from brook.common.store.queries import CLAIM_SORT, claim_filter, claim_index
from brook.common.store.queues import QueueStore

BACKLOG = 5000  # jobs waiting in a limited queue, ahead of the unlimited ones
TASKS = frozenset({"noop", "echo", "sleep", "fail", "crash", "cpu"})  # the demo tasks


async def _fill(store: JobStore, queue: str, n: int, priority: int = 0) -> None:
    spec = JobSpec(task="noop", payload={}, queue=queue, priority=priority)
    for start in range(0, n, 1000):
        await store.submit_many([spec] * min(1000, n - start))


async def _keys_per_claim(store: JobStore, **scope: Any) -> int:
    stats = await store.db.command(
        "explain",
        {
            "find": "jobs",
            "filter": claim_filter(TASKS, None, **scope),
            "sort": dict(CLAIM_SORT),
            "hint": claim_index(TASKS, None, scope.get("among")),
            "limit": 1,
        },
        verbosity="executionStats",
    )
    return int(stats["executionStats"]["totalKeysExamined"])


async def _claims_per_s(store: JobStore, n: int, **scope: Any) -> dict[str, Any]:
    keys = await _keys_per_claim(store, **scope)
    start = time.monotonic()
    for _ in range(n):
        if (await store.claim("bench", 600, BestDue(tasks=TASKS, **scope))).job is None:
            raise BenchError("the claim-cost backlog ran out")
    seconds = time.monotonic() - start
    return {
        "claims_per_s": round(n / seconds, 1),
        "ms_per_claim": round(seconds / n * 1000, 2),
        "keys_examined": keys,
    }


async def _claim_cost(uri: str, db: str, n: int) -> dict[str, Any]:
    settings = Settings(mongo_uri=uri, db=db)
    client = make_client(settings, appname="brook-bench")
    store = JobStore(database(client, settings))
    out: dict[str, Any] = {"claims": n, "limited_backlog": BACKLOG}
    try:
        await store.ensure_indexes()
        await _fill(store, "default", 3 * n)
        out["no_limits"] = await _claims_per_s(store, n)
        await QueueStore(store.db).set_limits("held", {"paused": True})
        await _fill(store, "held", BACKLOG, priority=5)  # all ahead in claim order
        among = await store.pending_queues() - {"held"}
        out["limited_backlog_named_queues"] = await _claims_per_s(
            store, n, exclude={"held"}, among=among
        )
        out["limited_backlog_nin"] = await _claims_per_s(store, n, exclude={"held"})
    finally:
        await client.drop_database(db)
        await client.close()
    return out


@contextlib.contextmanager
def _dispatchers(ctx: Context, db: str, label: str, n: int) -> Iterator[list[RoleProcess]]:
    env = role_env(ctx.deployment.uri, db, ctx.concurrency, free_port(), ctx.log_level)
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(role("dispatcher", env, ctx.log_dir / f"{label}-{i}.log"))
            for i in range(n)
        ]


def _queue_ops(ctx: Context, db: str) -> int:
    top = ctx.client.admin.command("top")["totals"].get(f"{db}.brook_queues", {})
    return int(top.get("total", {}).get("count", 0)) - int(top.get("getmore", {}).get("count", 0))


def _drain(
    ctx: Context,
    label: str,
    jobs: int,
    dispatchers: int,
    limits: dict[str, Any] | None,
    *,
    held: bool = False,
) -> dict[str, Any]:
    db = ctx.new_db(label)
    queue = "limited" if limits else "default"

    async def prepare() -> None:
        settings = Settings(mongo_uri=ctx.deployment.uri, db=db)
        client = make_client(settings, appname="brook-bench")
        store = JobStore(database(client, settings))
        try:
            await store.ensure_indexes()
            if limits:
                await QueueStore(store.db).set_limits(queue, limits)
            if held:
                await QueueStore(store.db).set_limits("held", {"paused": True})
                await _fill(store, "held", BACKLOG, priority=5)
            await _fill(store, queue, jobs)
        finally:
            await client.close()

    asyncio.run(prepare())
    before = _queue_ops(ctx, db)
    with _dispatchers(ctx, db, label, dispatchers) as procs:
        wait_settled_queue(ctx, db, queue, procs, timeout=max(300.0, jobs / 5))
    found = [
        JobTimes.from_doc(d) for d in ctx.client[db]["jobs"].find({"queue": queue}, PROJECTION)
    ]
    starts = [j.started for j in found if j.started is not None]
    last = max(j.finished for j in found if j.finished is not None)
    seconds = (last - min(starts)).total_seconds()
    return {
        "jobs": len(found),
        "dispatchers": dispatchers,
        "limits": limits,
        "limited_backlog_elsewhere": BACKLOG if held else 0,
        "seconds": round(seconds, 3),
        "jobs_per_s": round(len(found) / seconds, 1),
        "max_running_at_once": max_overlap(found),  # noop jobs: one attempt each
        "queue_ops_per_job": round((_queue_ops(ctx, db) - before) / len(found), 2),
        "starts": starts,
    }


def wait_settled_queue(
    ctx: Context, db: str, queue: str, procs: list[RoleProcess], timeout: float
) -> None:
    jobs = ctx.client[db]["jobs"]
    deadline = time.monotonic() + timeout
    while jobs.find_one({"queue": queue, "status": {"$in": ["pending", "running"]}}, {"_id": 1}):
        for proc in procs:
            proc.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"{queue} not drained in {db} after {timeout:.0f}s")
        time.sleep(0.1)


def limits(ctx: Context, jobs: int, limit: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "claim_cost": asyncio.run(
            _claim_cost(ctx.deployment.uri, ctx.new_db("claimcost"), min(jobs, 1000))
        )
    }
    runs = [
        ("unlimited", 1, None, False),
        ("unlimited_with_limited_backlog", 1, None, True),
        (f"concurrency_{limit}_one_dispatcher", 1, {"concurrency": limit}, False),
        (f"concurrency_{limit}_three_dispatchers", 3, {"concurrency": limit}, False),
    ]
    drains: dict[str, Any] = {}
    for label, n, lim, held in runs:
        result = _drain(ctx, label.replace("_", "")[:20], jobs, n, lim, held=held)
        result.pop("starts")
        drains[label] = result
    out["drains"] = drains
    rate = _drain(ctx, "rate", max(jobs // 4, 100), 2, {"rate": {"limit": 50, "per_seconds": 1}})
    starts = rate.pop("starts")
    rate["starts_per_s"] = round(len(starts) / max(rate["seconds"], 1e-9), 1)
    rate["max_starts_in_any_1s"] = max_starts_in_window(starts, 1.0)
    out["rate"] = rate
    return out


def max_starts_in_window(starts: list[Any], seconds: float) -> int:
    """The most starts in any window `[t, t + seconds)`."""
    ordered = sorted(starts)
    peak = j = 0
    for i, start in enumerate(ordered):
        j = max(j, i)
        while j < len(ordered) and (ordered[j] - start).total_seconds() < seconds:
            j += 1
        peak = max(peak, j - i)
    return peak


def summary(res: dict[str, Any]) -> list[str]:
    cost = res["claim_cost"]
    lines = [
        f"limits: claim cost for an unlimited queue, {cost['claims']} claims one at a time "
        f"(a limited backlog of {cost['limited_backlog']} jobs ahead in claim order)",
    ]
    for key, text in (
        ("no_limits", "no limits anywhere (the claim as before)"),
        ("limited_backlog_named_queues", "limited backlog, claims name the other queues"),
        ("limited_backlog_nin", "limited backlog, naive $nin filter (not used)"),
    ):
        c = cost[key]
        lines.append(
            f"  {text:<48} {c['claims_per_s']:>7.0f} claims/s  {c['ms_per_claim']:>6.2f} ms  "
            f"{c['keys_examined']} keys"
        )
    for label, d in res["drains"].items():
        lines.append(
            f"  drain {label:<36} {d['jobs_per_s']:>6.0f} jobs/s  max running "
            f"{d['max_running_at_once']}  brook_queues ops/job {d['queue_ops_per_job']}"
        )
    r = res["rate"]
    lines.append(
        f"  rate 50/1s, {r['jobs']} jobs, 2 dispatchers: {r['starts_per_s']:.1f} starts/s, "
        f"most in any 1 s window {r['max_starts_in_any_1s']}"
    )
    return lines
