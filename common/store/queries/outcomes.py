"""Builders of an attempt's end: completed, failed, requeued, cancelled, released."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from brook.common.domain.status import JobStatus
from brook.common.store.fields import (
    NOW,
    P,
    R,
    after,
    attempt_budget,
    completed_fields,
    ended_status,
    expiry,
    history,
    lit,
    ran_times,
    shared_death_budget,
    shared_mark,
)
from brook.common.store.queries.base import (
    Write,
    expired_fence,
    running_fence,
    without_unknown_dependents,
)
from brook.common.store.queries.spawned import cancel_error_or
from brook.common.store.records import ExpiredLease, Lease, RunTimes


def completed(
    lease: Lease, owner: str, result: Any, retention_s: float, ran: RunTimes | None = None
) -> Write:
    """running → completed, fenced (and, unless the lease knows of dependents, on there
    being none)."""
    return Write(
        filter={**running_fence(lease, owner), **without_unknown_dependents(lease)},
        update=[{"$set": completed_fields(lease, result, retention_s, ran)}],
    )


def _by_id(ids: Sequence[str], values: Sequence[Any]) -> Any:
    """An expression worth `values[i]` in the document whose `_id` is `ids[i]` (the one
    value itself when all are the same)."""
    if all(v == values[0] for v in values[1:]):
        return values[0]
    branches = [{"case": {"$eq": ["$_id", i]}, "then": v} for i, v in zip(ids, values, strict=True)]
    return {"$switch": {"branches": branches}}


def completions_by_id(
    owner: str,
    items: Sequence[tuple[Lease, Any]],
    retention_s: float,
    times: Mapping[str, RunTimes],
) -> Write:
    """running → completed for many attempts in one `update_many`: each fenced as
    `completed` fences it, each job set to exactly what `completed` sets it to."""
    ids = [lease.job_id for lease, _ in items]
    sets = [
        completed_fields(lease, result, retention_s, times.get(lease.job_id))
        for lease, result in items
    ]
    query: dict[str, Any] = {"_id": {"$in": ids}, "owner": owner, "status": R}
    exprs: list[Any] = []
    attempts = [lease.attempt for lease, _ in items]
    if len(set(attempts)) == 1:
        query["attempts"] = attempts[0]
    else:
        exprs.append({"$eq": ["$attempts", _by_id(ids, attempts)]})
    knowing = [lease.job_id for lease, _ in items if lease.has_dependents]
    if not knowing:
        query["has_dependents"] = {"$ne": True}
    elif len(knowing) < len(items):
        exprs.append({"$or": [{"$ne": ["$has_dependents", True]}, {"$in": ["$_id", knowing]}]})
    if exprs:
        query["$expr"] = {"$and": exprs}
    fields = {key: _by_id(ids, [one[key] for one in sets]) for key in sets[0]}
    return Write(filter=query, update=[{"$set": fields}])


def completed_in_transaction(
    lease: Lease,
    owner: str,
    result: Any,
    retention_s: float,
    progress: Mapping[str, Any] | None,
) -> Write:
    """running → completed by a task's own transaction (`ctx.transaction()`): the same
    fields as the dispatcher's, its history entry marked, and the attempt's last progress
    (which the worker folds in rather than send it up its pipe to race the commit)."""
    fields = completed_fields(lease, result, retention_s)
    fields.update(
        history(
            {
                "status": JobStatus.COMPLETED.value,
                "at": NOW,
                "attempt": lease.attempt,
                "transaction": True,
                **shared_mark(lease),
            }
        )
    )
    fields["tx"] = "$$REMOVE"
    if progress is not None:
        fields["progress"] = {**{k: lit(v) for k, v in progress.items()}, "at": NOW}
    return Write(filter=running_fence(lease, owner), update=[{"$set": fields}])


def _attempt_ended(
    fence: dict[str, Any],
    error: Mapping[str, Any],
    retry_delay_s: float,
    retention_s: float,
    *,
    final: bool = False,
    ran: RunTimes | None = None,
    unstarted_free: bool = False,
    shared: bool = False,
) -> Write:
    """running → pending (after `retry_delay_s`, while attempts remain and not `final`),
    failed, or cancelled (if that was asked), with the attempt's error. `shared`: the
    attempt ran in a shared worker process, and if that process died (`WorkerCrashed`) the
    attempt does not use up the job's budget."""
    died = shared and error.get("type") == "WorkerCrashed"
    times = ran_times(ran) if ran is not None else {}
    ended: Any = times.get("finished_at", NOW)
    begun = {"started_at": times["started_at"]} if ran is not None else {}
    again = {"$eq": ["$status", P]}
    cancelled = {"$eq": ["$status", JobStatus.CANCELLED.value]}
    return Write(
        filter=fence,
        update=[
            *attempt_budget(unstarted_free),
            *(shared_death_budget() if died else []),
            {"$set": {"status": ended_status(final)}},
            {
                "$set": {
                    "error": {"$cond": [cancelled, cancel_error_or(dict(error)), lit(dict(error))]},
                    "run_at": {"$cond": [again, after(retry_delay_s * 1000), "$run_at"]},
                    **begun,
                    "finished_at": {"$cond": [again, None, ended]},
                    "expire_at": {"$cond": [again, "$$REMOVE", expiry(retention_s)]},
                    "updated_at": NOW,
                    "owner": None,
                    "lease_expires_at": None,
                    **history(
                        {
                            "status": "$status",
                            "at": NOW,
                            "attempt": "$attempts",
                            "error": {
                                "$cond": [
                                    cancelled,
                                    {"$ifNull": ["$cancel_error.type", lit(error.get("type"))]},
                                    lit(error.get("type")),
                                ]
                            },
                            # A step's exception: the history names the step.
                            **({"step": lit(error["step"])} if error.get("step") else {}),
                            **({"shared": True} if shared else {}),
                        }
                    ),
                }
            },
        ],
    )


def attempt_failed(
    lease: Lease,
    owner: str,
    error: Mapping[str, Any],
    retry_delay_s: float,
    retention_s: float,
    *,
    final: bool = False,
    ran: RunTimes | None = None,
) -> Write:
    """running → pending / failed / cancelled: the holder ends a failed attempt."""
    return _attempt_ended(
        running_fence(lease, owner),
        error,
        retry_delay_s,
        retention_s,
        final=final,
        ran=ran,
        shared=lease.shared,
    )


def requeued_expired(lease: ExpiredLease, retry_delay_s: float, retention_s: float) -> Write:
    """running → pending / failed / cancelled: the watchdog ends an attempt whose lease is
    over. One whose task is not known to have started (no `started_at`) keeps its number,
    the fencing token, but does not use up one of the job's attempts."""
    return _attempt_ended(
        expired_fence(lease),
        {"type": "LeaseExpired", "message": f"lease of {lease.owner} expired"},
        retry_delay_s,
        retention_s,
        unstarted_free=True,
    )


def cancelled_running(
    lease: Lease, owner: str, retention_s: float, ran: RunTimes | None = None
) -> Write:
    """running → cancelled: the holder stopped the worker of a job whose cancel was
    requested (`ran`: when its task started and was stopped), or dropped it before its
    task started (no `ran`)."""
    message = "cancelled while running" if ran else "cancelled before its task started"
    return Write(
        filter=running_fence(lease, owner),
        update=[
            {
                "$set": {
                    "status": JobStatus.CANCELLED.value,
                    **(ran_times(ran) if ran else {"finished_at": NOW}),
                    "expire_at": expiry(retention_s),
                    "updated_at": NOW,
                    "owner": None,
                    "lease_expires_at": None,
                    "error": cancel_error_or({"type": "Cancelled", "message": message}),
                    **history(
                        {
                            "status": JobStatus.CANCELLED.value,
                            "at": NOW,
                            "attempt": lease.attempt,
                            **shared_mark(lease),
                        }
                    ),
                }
            }
        ],
    )


def released(lease: Lease, owner: str, retention_s: float) -> Write:
    """running → pending (or cancelled, if that was asked): a graceful shutdown hands the
    job back. The interrupted attempt is not counted, and the job keeps its `run_at`."""
    asked = {"$eq": ["$cancel_requested", True]}
    status = {"$cond": [asked, JobStatus.CANCELLED.value, P]}
    return Write(
        filter=running_fence(lease, owner),
        update=[
            {
                "$set": {
                    "status": status,
                    "attempts": {"$cond": [asked, "$attempts", {"$add": ["$attempts", -1]}]},
                    "finished_at": {"$cond": [asked, NOW, None]},
                    "expire_at": {"$cond": [asked, expiry(retention_s), "$$REMOVE"]},
                    "error": {"$cond": [asked, {"$ifNull": ["$cancel_error", "$error"]}, "$error"]},
                    "updated_at": NOW,
                    "owner": None,
                    "lease_expires_at": None,
                    **history(
                        {
                            "status": status,
                            "at": NOW,
                            "attempt": lease.attempt,
                            "reason": "released",
                            **shared_mark(lease),
                        }
                    ),
                }
            }
        ],
    )
