"""`costs`: what MongoDB itself spends, in CPU of the three `mongod`, on the writes a job
needs, measured with raw PyMongo (no Brook process runs), so that the limits of any engine
on this host can be told apart from Brook's own.

    rounds        jobs arriving one at a time: per job, sequential majority writes shaped
                  like Brook's (1: the insert; 2: + the claim; 3: + the completion), with
                  and without Brook's indexes and change-stream pre-images
    insert_many   1,000 jobs a call, with and without Brook's indexes: the ceiling of any
                  batch submit on this host
    completions   64 running jobs completed in one write: one retryable statement per job
                  (`bulk_write`), or one `update_many` whose values are picked by `_id`
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from bson import ObjectId
from pymongo import UpdateOne
from pymongo.collection import Collection

from bench.harness import Doc, proc_cpu_s
from bench.scale import pending_doc
from bench.scenarios import Context
from brook.common.store.jobs import INDEXES

CLAIM = [{"$set": {"status": "running", "attempts": 1, "owner": "bench",
                   "lease_expires_at": "$$NOW", "claimed_at": "$$NOW"}}]
COMPLETE = [{"$set": {"status": "completed", "result": None, "finished_at": "$$NOW",
                      "owner": None, "lease_expires_at": None}}]


def _fresh(ctx: Context, db: str, *, indexes: bool, pre_images: bool = False) -> Collection[Doc]:
    database = ctx.client[db]
    database.drop_collection("jobs")
    database.create_collection("jobs", changeStreamPreAndPostImages={"enabled": pre_images})
    if indexes:
        database["jobs"].create_indexes(INDEXES)
    return database["jobs"]


def _mongod_ms(ctx: Context, n: int, work: Callable[[], None]) -> dict[str, float]:
    """mongod CPU-ms and wall ms per unit of `work` (`n` units)."""
    pids = ctx.deployment.mongod_pids
    cpu0, t0 = sum(proc_cpu_s(p) for p in pids), time.monotonic()
    work()
    cpu, wall = sum(proc_cpu_s(p) for p in pids) - cpu0, time.monotonic() - t0
    return {"mongod_cpu_ms": round(cpu / n * 1000, 2), "wall_ms": round(wall / n * 1000, 2)}


def _rounds(jobs: Collection[Doc], n: int, writes: int) -> Callable[[], None]:
    def work() -> None:
        now = datetime.now(UTC)
        for _ in range(n):
            doc = pending_doc(now)
            jobs.insert_one(doc)
            if writes >= 2:
                jobs.update_one({"_id": doc["_id"], "status": "pending"}, CLAIM)
            if writes >= 3:
                jobs.update_one({"_id": doc["_id"], "owner": "bench"}, COMPLETE)

    return work


def _insert_many(jobs: Collection[Doc], calls: int) -> Callable[[], None]:
    def work() -> None:
        now = datetime.now(UTC)
        for _ in range(calls):
            jobs.insert_many([pending_doc(now) for _ in range(1000)])

    return work


def _completions(jobs: Collection[Doc], n: int, one_write: bool) -> Callable[[], None]:
    now = datetime.now(UTC)
    ids = [str(ObjectId()) for _ in range(n)]
    for k in range(0, n, 1000):
        jobs.insert_many([{**pending_doc(now), "_id": i} for i in ids[k : k + 1000]])
    jobs.update_many({}, CLAIM)

    def work() -> None:
        for k in range(0, n, 64):
            chunk = ids[k : k + 64]
            if one_write:
                branches = [
                    {"case": {"$eq": ["$_id", i]}, "then": {"$literal": {"id": i}}} for i in chunk
                ]
                result = {"$switch": {"branches": branches}}
                update = [{"$set": {**COMPLETE[0]["$set"], "result": result}}]
                jobs.update_many({"_id": {"$in": chunk}, "owner": "bench", "attempts": 1}, update)
            else:
                jobs.bulk_write(
                    [
                        UpdateOne(
                            {"_id": i, "owner": "bench", "attempts": 1},
                            [{"$set": {**COMPLETE[0]["$set"], "result": {"$literal": {"id": i}}}}],
                        )
                        for i in chunk
                    ],
                    ordered=False,
                )

    return work


def costs(ctx: Context, n: int = 500) -> dict[str, Any]:
    """The three measurements of the module, each on a fresh collection."""
    db = ctx.new_db("costs")
    out: dict[str, Any] = {"n": n, "rounds": {}, "insert_many": {}, "completions": {}}
    for indexes, pre_images in ((False, False), (True, False), (True, True)):
        label = f"indexes={indexes} pre_images={pre_images}"
        for writes in (1, 2, 3):
            jobs = _fresh(ctx, db, indexes=indexes, pre_images=pre_images)
            out["rounds"][f"{label} writes={writes}"] = _mongod_ms(ctx, n, _rounds(jobs, n, writes))
    for indexes in (False, True):
        jobs = _fresh(ctx, db, indexes=indexes)
        out["insert_many"][f"indexes={indexes} (per 1,000 jobs)"] = _mongod_ms(
            ctx, 20, _insert_many(jobs, 20)
        )
    for one_write in (False, True):
        jobs = _fresh(ctx, db, indexes=True)
        label = "update_many by _id" if one_write else "bulk_write, a statement each"
        out["completions"][f"{label} (per 1,000 jobs)"] = {
            k: round(v * 1000, 1)
            for k, v in _mongod_ms(ctx, 3200, _completions(jobs, 3200, one_write)).items()
        }
    return out
