"""The `fairness` scenario: a tenant with one job behind another tenant's backlog.

    python -m bench.run --scenario fairness [--jobs 10000] [--concurrency N]

One dispatcher at `--concurrency` (default: the CPU count), jobs of the demo task `noop`:

1. **Idle**: 30 jobs submitted one at a time, each after the previous one started: the
   submit→start times (`started_at - created_at`, the server's stamps), their p50.
   Once in a queue claimed fairly across keys (`fair: true`, every job with a key) and
   once in a plain queue with no keys (the path every job without keys takes).
2. **Backlog**: tenant A submits `--jobs` jobs (key `a`); once the dispatcher is working
   through them, tenant B submits one job (key `b`), and again once it started, 7 times in
   all (once in the plain queue, where the first waits for all of A): B's submit→start,
   each split into submit→claim and claim→start, their median against twice the idle p50
   of the same queue. Fair queue, and for comparison a plain queue where both tenants'
   jobs carry no key (B waits its turn in submit order).
3. **Drain**: the `--jobs` backlog's jobs/s, with keys (100 keys, fair queue) and without
   (plain queue): what the turns cost a single busy queue.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from bench.harness import BenchError
from bench.limits import _dispatchers, wait_settled_queue
from bench.scenarios import PROJECTION, Context
from bench.stats import JobTimes
from brook.common.domain.models import JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import JobStore
from brook.common.store.queues import QueueStore

IDLE_SAMPLES = 30
B_SAMPLES = 7
T = TypeVar("T")


def _store_call(ctx: Context, db: str, fn: Callable[[JobStore], Awaitable[T]]) -> T:
    async def go() -> T:
        settings = Settings(mongo_uri=ctx.deployment.uri, db=db)
        client = make_client(settings, appname="brook-bench")
        try:
            return await fn(JobStore(database(client, settings)))
        finally:
            await client.close()

    return asyncio.run(go())


def _spec(queue: str, key: str | None) -> JobSpec:
    return JobSpec(task="noop", payload={}, queue=queue, key=key)


async def _wait_started(store: JobStore, job_id: str, timeout: float = 120) -> float:
    """Seconds from the job's `created_at` to its `started_at` (the server's stamps)."""
    deadline = time.monotonic() + timeout
    while True:
        doc = await store.jobs.find_one({"_id": job_id}, {"created_at": 1, "started_at": 1})
        if doc is not None and doc.get("started_at") is not None:
            return float((doc["started_at"] - doc["created_at"]).total_seconds())
        if time.monotonic() > deadline:
            raise BenchError(f"job {job_id} did not start in {timeout:.0f} s")
        await asyncio.sleep(0.002)


async def _completed(store: JobStore, queue: str, n: int) -> None:
    """Until `n` jobs of `queue` completed (a poll of the bench, not of Brook)."""
    done = 0
    while done < n:
        await asyncio.sleep(0.01)
        done = await store.jobs.count_documents({"queue": queue, "status": "completed"})


async def _one_by_one(store: JobStore, queue: str, key: str | None, n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        job = (await store.submit(_spec(queue, key))).job
        out.append(await _wait_started(store, job.id))
    return out


async def _fill(store: JobStore, queue: str, keys: list[str | None], n: int) -> None:
    specs = [_spec(queue, keys[i % len(keys)]) for i in range(n)]
    for start in range(0, n, 1000):
        await store.submit_many(specs[start : start + 1000])


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered) * 1000, 1),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 1),
        "max": round(ordered[-1] * 1000, 1),
    }


def _tenants(ctx: Context, label: str, jobs: int, *, fair: bool) -> dict[str, Any]:
    """Idle submit→start, then B's one job behind A's backlog, in one queue."""
    db = ctx.new_db(label)
    queue = "shared"
    a_key, b_key = ("a", "b") if fair else (None, None)

    async def prepare(store: JobStore) -> None:
        await store.ensure_indexes()
        if fair:
            await QueueStore(store.db).set_limits(queue, {"fair": True})

    _store_call(ctx, db, prepare)
    with _dispatchers(ctx, db, label, 1) as procs:
        idle = _store_call(ctx, db, lambda s: _one_by_one(s, queue, b_key, IDLE_SAMPLES))

        async def backlog(store: JobStore) -> dict[str, Any]:
            await _fill(store, queue, [a_key], jobs)
            # The dispatcher is working through A's backlog when B submits.
            await _completed(store, queue, IDLE_SAMPLES + min(200, jobs // 10))
            waits, parts = [], []
            # In a plain queue the first B waits behind all of A: no backlog is left after it.
            for _ in range(B_SAMPLES if fair else 1):
                b = (await store.submit(_spec(queue, b_key))).job
                waits.append(await _wait_started(store, b.id, timeout=600))
                doc = await store.jobs.find_one({"_id": b.id}) or {}
                claimed = (doc["claimed_at"] - doc["created_at"]).total_seconds()
                started = (doc["started_at"] - doc["claimed_at"]).total_seconds()
                parts.append((round(claimed * 1000, 1), round(started * 1000, 1)))
            left = await store.jobs.count_documents(
                {"queue": queue, "status": "pending", "key": a_key}
            )
            return {
                "b_submit_to_start_ms": round(statistics.median(waits) * 1000, 1),
                "b_samples_ms": [round(w * 1000, 1) for w in waits],
                "b_submit_to_claim_and_claim_to_start_ms": parts,
                "a_pending_at_b_start": left,
            }

        behind = _store_call(ctx, db, backlog)
        wait_settled_queue(ctx, db, queue, procs, timeout=max(300.0, jobs / 5))
    idle_ms = _ms(idle)
    return {
        "fair": fair,
        "idle_submit_to_start_ms": idle_ms,
        "a_backlog": jobs,
        **behind,
        "b_within_2x_idle_p50": behind["b_submit_to_start_ms"] <= 2 * idle_ms["p50"],
    }


def _drain(ctx: Context, label: str, jobs: int, *, keys: int) -> dict[str, Any]:
    db = ctx.new_db(label)
    queue = "shared"

    async def prepare(store: JobStore) -> None:
        await store.ensure_indexes()
        if keys:
            await QueueStore(store.db).set_limits(queue, {"fair": True})
        await _fill(store, queue, [f"k{i}" for i in range(keys)] if keys else [None], jobs)

    _store_call(ctx, db, prepare)
    with _dispatchers(ctx, db, label, 1) as procs:
        wait_settled_queue(ctx, db, queue, procs, timeout=max(300.0, jobs / 5))
    found = [JobTimes.from_doc(d) for d in ctx.client[db]["jobs"].find({}, PROJECTION)]
    starts = [j.started for j in found if j.started is not None]
    last = max(j.finished for j in found if j.finished is not None)
    seconds = (last - min(starts)).total_seconds()
    return {"jobs": len(found), "keys": keys, "jobs_per_s": round(len(found) / seconds, 1)}


def fairness(ctx: Context, jobs: int) -> dict[str, Any]:
    return {
        "concurrency": ctx.concurrency,
        "fair_queue": _tenants(ctx, "fairkeys", jobs, fair=True),
        "plain_queue_no_keys": _tenants(ctx, "plainnokeys", jobs, fair=False),
        "drain_fair_100_keys": _drain(ctx, "drainkeys", jobs, keys=100),
        "drain_plain_no_keys": _drain(ctx, "drainplain", jobs, keys=0),
    }


def summary(res: dict[str, Any]) -> list[str]:
    lines = [f"fairness: one dispatcher, concurrency {res['concurrency']}, noop jobs"]
    for label in ("fair_queue", "plain_queue_no_keys"):
        r = res[label]
        idle = r["idle_submit_to_start_ms"]
        lines.append(
            f"  {label:<20} idle submit→start p50 {idle['p50']} ms (p90 {idle['p90']}); "
            f"B behind A's {r['a_backlog']}: median {r['b_submit_to_start_ms']} ms "
            f"of {r.get('b_samples_ms')} "
            f"({r['a_pending_at_b_start']} of A's jobs still pending; within 2x idle p50: "
            f"{r['b_within_2x_idle_p50']})"
        )
    for label in ("drain_fair_100_keys", "drain_plain_no_keys"):
        d = res[label]
        lines.append(f"  {label:<20} {d['jobs']} jobs, {d['jobs_per_s']} jobs/s")
    return lines


# -- bulk operations: the plans of their filters ---------------------------------------------


def _plan_summary(explain: dict[str, Any]) -> dict[str, Any]:
    stats = explain["executionStats"]
    stage = explain["queryPlanner"]["winningPlan"]
    indexes: list[str] = []
    while stage:
        if "indexName" in stage:
            indexes.append(stage["indexName"])
        stage = stage.get("inputStage") or (stage.get("inputStages") or [None])[0]
    return {
        "index": indexes[0] if indexes else "COLLSCAN",
        "returned": stats["nReturned"],
        "keys_examined": stats["totalKeysExamined"],
        "docs_examined": stats["totalDocsExamined"],
    }


def bulk_plans(ctx: Context, jobs: int) -> dict[str, Any]:
    """The plans of the bulk filters on `jobs` finished jobs (a tenth failed with one of
    ten error types, a tenth of those cancelled), a fifth with a key, plus as many pending."""
    from datetime import UTC, datetime, timedelta

    from brook import JobFilter, JobStatus
    from brook.common.store.queries import bulk_index, bulk_match

    db = ctx.new_db("bulkplans")
    now = datetime.now(UTC)

    async def fill(store: JobStore) -> None:
        await store.ensure_indexes()
        docs = []
        for i in range(2 * jobs):
            failed = i % 10 == 0 and i < jobs
            created = now - timedelta(seconds=jobs - i)
            status = "pending" if i >= jobs else ("failed" if failed else "completed")
            if failed and i % 100 == 0:
                status = "cancelled"
            docs.append(
                {
                    "_id": f"{i:024x}",
                    "task": f"t{i % 5}",
                    "queue": "default",
                    "status": status,
                    "priority": 0,
                    "run_at": now,
                    "created_at": created,
                    "finished_at": None if status == "pending" else created,
                    "error": {"type": f"E{i % 7}", "message": "x"} if failed else None,
                    **({"key": f"k{i % 50}"} if i % 5 == 0 else {}),
                }
            )
        for start in range(0, len(docs), 5000):
            await store.jobs.insert_many(docs[start : start + 5000])

    _store_call(ctx, db, fill)
    since = now - timedelta(seconds=jobs // 2)
    cases = {
        "retry error_type=E3 finished_since": (
            "retry",
            JobFilter(error_type="E3", finished_since=since),
        ),
        "retry status=failed task=t1": (
            "retry",
            JobFilter(status=JobStatus.FAILED, task="t1"),
        ),
        "cancel key=k10": ("cancel", JobFilter(key="k10")),
        "cancel status=pending queue=default": (
            "cancel",
            JobFilter(status=JobStatus.PENDING, queue="default"),
        ),
    }

    async def explain(store: JobStore) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, (action, f) in cases.items():
            cursor = store.jobs.find(bulk_match(f, action))  # type: ignore[arg-type]
            hint = bulk_index(f, action)  # type: ignore[arg-type]
            plan = await (cursor.hint(hint) if hint else cursor).explain()
            out[label] = _plan_summary(plan)
        return out

    return {"jobs": 2 * jobs, "plans": _store_call(ctx, db, explain)}


# -- key limits at scale: the drain rate with many keys in a big backlog ----------------------


def _drain_for(ctx: Context, label: str, jobs: int, keys: int, seconds: float) -> dict[str, Any]:
    """One dispatcher on a backlog of `jobs` noop jobs (over `keys` keys with
    `key_concurrency` 2, or none): jobs finished per second over `seconds`, once it runs."""
    db = ctx.new_db(label)
    queue = "shared"

    async def prepare(store: JobStore) -> None:
        await store.ensure_indexes()
        if keys:
            await QueueStore(store.db).set_limits(queue, {"key_concurrency": 2})
        await _fill(store, queue, [f"k{i}" for i in range(keys)] if keys else [None], jobs)

    _store_call(ctx, db, prepare)
    coll = ctx.client[db]["jobs"]
    with _dispatchers(ctx, db, label, 1) as procs:
        deadline = time.monotonic() + 300
        while not coll.find_one({"status": "completed"}, {"_id": 1}):
            procs[0].check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{label}: nothing completed in 300 s")
            time.sleep(0.2)
        start = coll.count_documents({"status": "completed"})
        t0 = time.monotonic()
        time.sleep(seconds)
        done = coll.count_documents({"status": "completed"}) - start
        elapsed = time.monotonic() - t0
    # The next phase finds the set as this one did: not holding this one's backlog too.
    ctx.client.drop_database(db)
    ctx.databases.remove(db)
    return {
        "pending_at_start": jobs,
        "keys": keys,
        "key_concurrency": 2 if keys else None,
        "seconds": round(elapsed, 1),
        "jobs_per_s": round(done / elapsed, 1),
    }


def keyscale(
    ctx: Context, jobs: int, keys: int = 10_000, seconds: float = 30.0, rounds: int = 2
) -> dict[str, Any]:
    """Plain and keyed drains, alternated `rounds` times on one set: a drain's rate moves
    with the set's state (just started, just filled) more than with the build, and one
    plain-then-keyed pair put all of that on one side of the ratio. Each phase drops its
    database at the end, so every phase starts on a set holding only its own backlog."""
    plains: list[dict[str, Any]] = []
    keyeds: list[dict[str, Any]] = []
    for r in range(rounds):
        plains.append(_drain_for(ctx, f"scaleplain{r}", jobs, 0, seconds))
        keyeds.append(_drain_for(ctx, f"scalekeys{r}", jobs, keys, seconds))
    plain = {**plains[-1], "jobs_per_s": _mean_rate(plains), "rounds": _rates(plains)}
    keyed = {**keyeds[-1], "jobs_per_s": _mean_rate(keyeds), "rounds": _rates(keyeds)}
    return {
        "no_keys": plain,
        "key_concurrency": keyed,
        "ratio": round(keyed["jobs_per_s"] / max(plain["jobs_per_s"], 1e-9), 2),
        "ratio_per_round": [
            round(k["jobs_per_s"] / max(p["jobs_per_s"], 1e-9), 2)
            for p, k in zip(plains, keyeds, strict=True)
        ],
    }


def _rates(runs: list[dict[str, Any]]) -> list[float]:
    return [float(r["jobs_per_s"]) for r in runs]


def _mean_rate(runs: list[dict[str, Any]]) -> float:
    return round(sum(_rates(runs)) / len(runs), 1)


def summaries(results: dict[str, Any]) -> list[str]:
    """The lines of the fairness and keyscale scenarios that ran."""
    lines = summary(results["fairness"]) if "fairness" in results else []
    return lines + (keyscale_summary(results["keyscale"]) if "keyscale" in results else [])


def keyscale_summary(res: dict[str, Any]) -> list[str]:
    plain, keyed = res["no_keys"], res["key_concurrency"]
    return [
        f"keyscale: {plain['pending_at_start']} pending noop jobs, one dispatcher, "
        f"{plain['seconds']:.0f} s each",
        f"  no keys                               {plain['jobs_per_s']} jobs/s"
        f" (rounds: {plain.get('rounds', [])})",
        f"  {keyed['keys']} keys, key_concurrency {keyed['key_concurrency']}"
        f"          {keyed['jobs_per_s']} jobs/s ({res['ratio']:.2f}x;"
        f" rounds: {keyed.get('rounds', [])}, ratios {res.get('ratio_per_round', [])})",
    ]
