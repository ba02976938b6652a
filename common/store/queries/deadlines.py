"""Builders of a job's end by one of its bounds (`brook.common.domain.deadlines`): a job not
started by its `start_by` → `cancelled` (`StartByPassed`); one unfinished at its `deadline`
→ `failed` (`DeadlineExceeded`), never retried.

A bound is the job's own (`start_by`, `deadline`) or its task's default counted from its
submit (`created_at`), which the dispatchers know from the task's declaration: `defaults`.
Whether it passed is the server's clock's to say (`$$NOW`); the end writes the bound it
ended by onto the job, so a default shows there too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from brook.common.domain.deadlines import (
    DEADLINE_EXCEEDED,
    START_BY_PASSED,
    Bound,
    Defaults,
)
from brook.common.domain.status import JobStatus
from brook.common.store.fields import NOW, P, W, expiry, history, lit, shared_mark
from brook.common.store.queries.base import Write, running_fence
from brook.common.store.queries.outcomes import attempt_failed
from brook.common.store.records import Lease, RunTimes

# Which bound: the job's field, and the task option that gives its default.
START_BY = ("start_by", "start_within_s")
DEADLINE = ("deadline", "deadline_s")
# No attempt of the job has started its task (`start_by` covers the first start only).
NEVER_STARTED: dict[str, Any] = {"started_at": None, "first_started_at": None}


def bound_of(bound: tuple[str, str], defaults: Defaults) -> Any:
    """An expression worth the job's bound: its own, else its task's default from its
    submit, else null."""
    field, option = bound
    by_task = sorted(
        (task, seconds)
        for task, own in defaults.items()
        if (seconds := getattr(own, option)) is not None
    )
    if not by_task:
        return f"${field}"
    branches = [
        {"case": {"$eq": ["$task", lit(task)]}, "then": {"$add": ["$created_at", int(s * 1000)]}}
        for task, s in by_task
    ]
    return {"$ifNull": [f"${field}", {"$switch": {"branches": branches, "default": None}}]}


def has_passed(at: Any) -> dict[str, Any]:
    """`at` is a time, and not after now on the server's clock (null is no bound)."""
    return {"$and": [{"$ne": [at, None]}, {"$lte": [at, NOW]}]}


def _when(at: Any) -> dict[str, Any]:
    return {"$dateToString": {"date": at, "format": "%Y-%m-%dT%H:%M:%S.%LZ"}}


def _ended(
    status: JobStatus,
    field: str,
    at: Any,
    error: str,
    text: str,
    retention_s: float,
    *,
    attempt: Any = "$attempts",
    mark: dict[str, Any] | None = None,
) -> dict[str, Any]:
    entry = {"status": status.value, "at": NOW, "attempt": attempt, "error": error, **(mark or {})}
    return {
        "status": status.value,
        field: at,
        "finished_at": NOW,
        "expire_at": expiry(retention_s),
        "updated_at": NOW,
        "error": {"type": error, "message": {"$concat": [text, _when(at)]}},
        **history(entry),
    }


def start_by_passed(job_id: str, defaults: Defaults, retention_s: float) -> Write:
    """waiting / pending → cancelled (`StartByPassed`): a job that never started, whose
    `start_by` passed."""
    at = bound_of(START_BY, defaults)
    return Write(
        filter={"_id": job_id, "status": {"$in": [W, P]}, **NEVER_STARTED, "$expr": has_passed(at)},
        update=[
            {
                "$set": _ended(
                    JobStatus.CANCELLED,
                    "start_by",
                    at,
                    START_BY_PASSED,
                    "not started by its start_by, ",
                    retention_s,
                )
            }
        ],
    )


def deadline_exceeded(job_id: str, defaults: Defaults, retention_s: float) -> Write:
    """waiting / pending → failed (`DeadlineExceeded`), never retried: its `deadline` passed
    while it waited for its parents, its due time, a retry, a wake-up or a signal."""
    at = bound_of(DEADLINE, defaults)
    return Write(
        filter={"_id": job_id, "status": {"$in": [W, P]}, "$expr": has_passed(at)},
        update=[
            {
                "$set": _ended(
                    JobStatus.FAILED,
                    "deadline",
                    at,
                    DEADLINE_EXCEEDED,
                    "its deadline passed, ",
                    retention_s,
                )
            }
        ],
    )


def held_start_by_passed(lease: Lease, owner: str, at: datetime, retention_s: float) -> Write:
    """running → cancelled (`StartByPassed`): the holder drops a job claimed but not
    started (at its claim, or claimed ahead) whose `start_by` (`at`) passed."""
    fields = _ended(
        JobStatus.CANCELLED,
        "start_by",
        {"$ifNull": ["$start_by", lit(at)]},
        START_BY_PASSED,
        "not started by its start_by, ",
        retention_s,
        attempt=lease.attempt,
        mark=shared_mark(lease),
    )
    fields.update(owner=None, lease_expires_at=None)
    return Write(filter=running_fence(lease, owner), update=[{"$set": fields}])


def held_deadline_exceeded(
    lease: Lease, owner: str, at: datetime, retention_s: float, ran: RunTimes | None = None
) -> Write:
    """running → failed (`DeadlineExceeded`), never retried: the holder stopped an attempt
    (or dropped a job not started) whose `deadline` (`at`) passed."""
    error = {"type": DEADLINE_EXCEEDED, "message": f"its deadline passed, {_iso(at)}"}
    write = attempt_failed(lease, owner, error, 0.0, retention_s, final=True, ran=ran)
    assert isinstance(write.update, list)
    stamp = {"$set": {"deadline": {"$ifNull": ["$deadline", lit(at)]}}}
    return Write(filter=write.filter, update=[*write.update, stamp])


def _iso(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- where the timer looks: the waiting and pending jobs by their bounds ----------------------

ACTIVE_UNCLAIMED = {"$in": [W, P]}


@dataclass(frozen=True, kw_only=True)
class BoundRead:
    """One look for waiting and pending jobs by one kind of bound: their own (`start_by`,
    `deadline`, read on its index), or a task's default (by `created_at`, `offset_s` before
    the bound). `filter` finds those whose bound passed by `now`; without `now`, all, in
    `sort`'s order, the earliest first."""

    bound: Bound
    filter: dict[str, Any]
    sort: str
    index: str
    offset_s: float = 0.0


def bound_reads(defaults: Defaults, now: datetime | None = None) -> list[BoundRead]:
    """Every look the timer makes: deadlines first (a job past both ends by its deadline)."""
    reads: list[BoundRead] = []
    kinds: tuple[tuple[Bound, tuple[str, str]], ...] = (
        ("deadline_exceeded", DEADLINE),
        ("start_by_passed", START_BY),
    )
    for bound, (field, option) in kinds:
        unstarted = NEVER_STARTED if field == "start_by" else {}
        own: dict[str, Any] = {"$type": "date"}
        if now is not None:
            own["$lte"] = now
        reads.append(
            BoundRead(
                bound=bound,
                filter={"status": ACTIVE_UNCLAIMED, field: own, **unstarted},
                sort=field,
                index=field,
            )
        )
        for task, d in sorted(defaults.items()):
            seconds = getattr(d, option)
            if seconds is None:
                continue
            made: dict[str, Any] = {"$type": "date"}
            if now is not None:
                made["$lte"] = now - timedelta(seconds=seconds)
            query = {"status": ACTIVE_UNCLAIMED, "task": task, field: None, **unstarted}
            reads.append(
                BoundRead(
                    bound=bound,
                    filter={**query, "created_at": made},
                    sort="created_at",
                    index="bound_by_age",
                    offset_s=seconds,
                )
            )
    return reads
