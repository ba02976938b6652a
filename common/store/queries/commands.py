"""Builders of a caller's operations on one job and on many (`brook.common.domain.bulk`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brook.common.domain.bulk import BulkAction, JobFilter
from brook.common.domain.status import RETRYABLE, JobStatus
from brook.common.store.fields import (
    NOW,
    P,
    R,
    W,
    expiry,
    history,
    lit,
    retried_fields,
)
from brook.common.store.queries.base import (
    Write,
)


def cancelled(job_id: str, retention_s: float) -> Write:
    """waiting / pending → cancelled at once."""
    return Write(
        filter={"_id": job_id, "status": {"$in": [W, P]}},
        update=[
            {
                "$set": {
                    "status": JobStatus.CANCELLED.value,
                    "finished_at": NOW,
                    "expire_at": expiry(retention_s),
                    "updated_at": NOW,
                    **history(
                        {
                            "status": JobStatus.CANCELLED.value,
                            "at": NOW,
                            "attempt": "$attempts",
                        }
                    ),
                }
            }
        ],
    )


def cancel_requested(job_id: str) -> Write:
    """A running job is asked to stop: its holder stops it (`cancelled_running`)."""
    return Write(
        filter={"_id": job_id, "status": R},
        update=[{"$set": {"cancel_requested": True, "updated_at": NOW}}],
    )


def retried(job_id: str, waiting_on: Sequence[str] = ()) -> Write:
    """failed / cancelled → pending, due now (or waiting for the parents in `waiting_on`),
    with as many attempts again as it was submitted with."""
    return Write(
        filter={"_id": job_id, "status": {"$in": sorted(s.value for s in RETRYABLE)}},
        update=[{"$set": retried_fields(waiting_on)}],
    )


# -- a caller's operations on many jobs (`brook.common.domain.bulk`) ------------------------------


def bulk_match(f: JobFilter, action: BulkAction) -> dict[str, Any]:
    """The jobs a bulk `action` with filter `f` changes: those the filter names, in the
    statuses the action acts on (and, for a cancel, running ones not yet asked to stop).
    User values go in as equality values, never as operators."""
    query: dict[str, Any] = {"status": {"$in": f.statuses_for(action)}}
    for field, value in (
        ("task", f.task),
        ("queue", f.queue),
        ("key", f.key),
        ("error.type", f.error_type),
    ):
        if value is not None:
            query[field] = {"$eq": value}
    if f.key is not None:
        # Says what the partial index `by_key` holds: without it, the planner cannot tell
        # the query fits that index and scans all of it.
        query["key"]["$type"] = "string"
    for field, since, until in (
        ("created_at", f.created_since, f.created_until),
        ("finished_at", f.finished_since, f.finished_until),
    ):
        bounds = {op: at for op, at in (("$gte", since), ("$lt", until)) if at is not None}
        if bounds:
            query[field] = bounds
    if action == "cancel":
        query["cancel_requested"] = {"$ne": True}
    return query


def bulk_index(f: JobFilter, action: BulkAction) -> str | None:
    """The index a bulk filter reads, named so the plan never depends on the cache: a
    retry by error type or finish time reads `failures` (failed and cancelled jobs only), a
    filter by key `by_key`; otherwise the planner picks among the listing indexes."""
    if action == "retry" and (f.error_type or f.finished_since or f.finished_until):
        return "failures"
    if f.key is not None:
        return "by_key"
    return None


def retried_many(ids: Sequence[str], tag: str) -> Write:
    """`retried` for many jobs without parents (a job with parents is retried on its own,
    to wait for them), each marked with the operation's `tag` (`bulk_op`) to read back."""
    return Write(
        filter={
            "_id": {"$in": list(ids)},
            "status": {"$in": sorted(s.value for s in RETRYABLE)},
            "depends_on.0": {"$exists": False},
        },
        update=[{"$set": {**retried_fields(()), "bulk_op": lit(tag)}}],
    )


def cancelled_many(ids: Sequence[str], retention_s: float, tag: str) -> Write:
    """`cancelled` for many jobs (waiting / pending → cancelled), marked with `tag`."""
    one = cancelled("", retention_s)
    assert isinstance(one.update, list)
    return Write(
        filter={"_id": {"$in": list(ids)}, "status": {"$in": [W, P]}},
        update=[{"$set": {**one.update[0]["$set"], "bulk_op": lit(tag)}}],
    )


def cancel_requested_many(ids: Sequence[str], tag: str) -> Write:
    """`cancel_requested` for many running jobs, marked with `tag`."""
    return Write(
        filter={"_id": {"$in": list(ids)}, "status": R, "cancel_requested": {"$ne": True}},
        update=[{"$set": {"cancel_requested": True, "updated_at": NOW, "bulk_op": lit(tag)}}],
    )
