"""Brook's queries on the jobs collection: every state change as a named, pure builder.

Each transition is one function returning a `Write`: the filter that fences it (the status
it expects and, for a running attempt, its owner and attempt number, from `running_fence`)
and the update it applies. Nothing here touches MongoDB: the jobs store runs these, and a
unit test reads them without a database (`tests/unit/test_queries.py`), checking each
against the allowed transitions in `common.domain.status`. Times come from the server's
clock (`$$NOW`); user data goes in as `$literal`, never read as an expression.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING, UpdateOne

from common.domain.bulk import BulkAction, JobFilter
from common.domain.models import Doc, JobSpec
from common.domain.status import RETRYABLE, TERMINAL, JobStatus
from common.store.fields import (
    NOW,
    C,
    P,
    R,
    W,
    after,
    attempt_budget,
    claimed_fields,
    completed_fields,
    ended_status,
    expiry,
    history,
    lit,
    new_job,
    ran_times,
    retried_fields,
    within_lease,
)
from common.store.records import EndedParent, ExpiredLease, Lease, RunTimes

# MongoDB merges at most this many index scans to give a sort (internalQueryMaxScansToExplode);
# a routed claim over more tasks than this uses the general claim order instead.
MAX_MERGED_SCANS = 200

ENDED = sorted(s.value for s in TERMINAL)

CLAIM_SORT: list[tuple[str, int]] = [
    ("priority", DESCENDING),
    ("run_at", ASCENDING),
    ("_id", ASCENDING),
]


# The `run_at` of a job waiting for a signal without a timeout: never due by the clock.
FOREVER = datetime(9999, 12, 31, tzinfo=UTC)

# An update: a pipeline (a list of stages) or an update document.
Update = list[dict[str, Any]] | dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Write:
    """One conditional write: the filter that fences it and the update it applies (an
    update pipeline, or an update document). No match: the caller lost a race."""

    filter: dict[str, Any]
    update: Update


# Due pending jobs, by the server's clock; with CLAIM_SORT this is an IXSCAN on claim_order.
CLAIM_FILTER: dict[str, Any] = {"status": P, "$expr": {"$lte": ["$run_at", NOW]}}


def claim_filter(
    tasks: Collection[str] | None,
    queue: str | None,
    exclude: Collection[str] = (),
    among: Collection[str] | None = None,
) -> dict[str, Any]:
    """Due pending jobs of these tasks (None: any) in this queue (None: any queue, or any
    of `among`, but none of `exclude`: the queues with limits, claimed through their
    slots instead)."""
    query = dict(CLAIM_FILTER)
    if tasks is not None:
        query["task"] = {"$in": sorted(tasks)}
    if queue is not None:
        query["queue"] = queue
    elif among is not None:
        query["queue"] = {"$in": sorted(set(among) - set(exclude))}
    elif exclude:
        query["queue"] = {"$nin": sorted(exclude)}  # an index key of every claim index
    return query


def claim_index(
    tasks: Collection[str] | None, queue: str | None, among: Collection[str] | None = None
) -> str:
    """The index a claim reads, named (a hint) so the plan never depends on the cache.
    A claim `among` several queues reads one scan per (queue, task) of `claim_by_queue`,
    merged: the jobs of other queues (a backlog waiting in a limited queue) cost nothing."""
    if tasks is None or len(tasks) > MAX_MERGED_SCANS:
        return "claim_order"
    if queue is None and among is not None:
        fits = len(tasks) * max(len(among), 1) <= MAX_MERGED_SCANS
        return "claim_by_queue" if fits else "claim_order"
    return "claim_by_queue" if queue is not None else "claim_by_task"


# -- fences --------------------------------------------------------------------------------


def running_fence(lease: Lease, owner: str) -> dict[str, Any]:
    """The filter of every write of a running attempt: its job, attempt, owner, `running`."""
    return {"_id": lease.job_id, "attempts": lease.attempt, "owner": owner, "status": R}


def expired_fence(lease: ExpiredLease) -> dict[str, Any]:
    """`running_fence` of an attempt whose lease is over by the server's clock (the watchdog's
    writes: the holder it names may have renewed since it was read)."""
    return {
        **running_fence(Lease(job_id=lease.job_id, attempt=lease.attempt), lease.owner),
        "$expr": {"$lt": ["$lease_expires_at", NOW]},
    }


def not_in_transaction(attempt: int) -> dict[str, Any]:
    """A filter clause: this attempt has no transaction of its own open on the job."""
    return {"tx.attempt": {"$ne": attempt}}


def _without_unknown_dependents(lease: Lease) -> dict[str, Any]:
    """A filter clause: a completion whose lease did not know of dependents completes only
    a job that has none (a child attached after the claim must be settled by it)."""
    return {} if lease.has_dependents else {"has_dependents": {"$ne": True}}


# -- submit ----------------------------------------------------------------------------------


def submitted(job_id: str, spec: JobSpec) -> Write:
    """A new job, as an upsert on a fresh `_id` (it always inserts): the server stamps its
    times (`$$NOW`) without a read of its clock."""
    return Write(filter={"_id": job_id}, update=[{"$set": new_job(spec)}])


def new_job_upsert(job_id: str, spec: JobSpec) -> UpdateOne:
    """`submitted` as a bulk request: usable inside a transaction too."""
    write = submitted(job_id, spec)
    return UpdateOne(write.filter, write.update, upsert=True)


def debounced(job_id: str, spec: JobSpec) -> Write:
    """Join the pending job of `spec.debounce_key`, or start it (an upsert under the fresh
    `job_id`; the unique index `debounce_pending` keeps one pending job per key, so racing
    submitters, in any API process, all end in the same job): the latest payload, due once
    no submit joined for `debounce_s`, never later than its `debounce_until` (the first
    submit plus the longest wait). A job already claimed is not pending: the next submit
    starts a new one."""
    if spec.debounce_key is None or spec.debounce_s is None:
        raise ValueError("not a debounced spec")
    fresh = {"$eq": [{"$type": "$created_at"}, "missing"]}
    first = {k: {"$cond": [fresh, v, f"${k}"]} for k, v in new_job(spec).items()}
    first["_id"] = {"$ifNull": ["$_id", lit(job_id)]}
    return Write(
        filter={"debounce_key": spec.debounce_key, "status": P},
        update=[
            {"$set": first},
            {
                "$set": {
                    "payload": lit(spec.payload),
                    "run_at": {"$min": [after(spec.debounce_s * 1000), "$debounce_until"]},
                    "debounced": {"$add": [{"$ifNull": ["$debounced", 0]}, 1]},
                    "updated_at": NOW,
                }
            },
        ],
    )


def key_released(job_id: str, key: str | None) -> Write:
    """Free a key whose unique window is over (by the server's clock): the old job keeps it
    as `released_key`."""
    return Write(
        filter={"_id": job_id, "idempotency_key": key, "$expr": {"$lte": ["$unique_until", NOW]}},
        update=[
            {"$set": {"released_key": lit(key), "updated_at": NOW}},
            {"$unset": "idempotency_key"},
        ],
    )


# -- claims ----------------------------------------------------------------------------------


def claimed(
    owner: str,
    lease_seconds: float,
    *,
    tasks: Collection[str] | None = None,
    queue: str | None = None,
    exclude: Collection[str] = (),
    among: Collection[str] | None = None,
) -> Write:
    """pending → running: the best due pending job (sort `CLAIM_SORT`, hint `claim_index`),
    leased to `owner`; `attempts` + 1 is the new fencing token."""
    return Write(
        filter=claim_filter(tasks, queue, exclude, among),
        update=[{"$set": claimed_fields(owner, lease_seconds)}],
    )


def claimed_as_read(candidates: Sequence[Doc], owner: str, lease_seconds: float, tag: str) -> Write:
    """pending → running for a batch: each candidate at the attempt number it was read with
    (one claimed and handed back meanwhile is not taken), still due, tagged with `tag`."""
    as_read = [{"_id": d["_id"], "attempts": d.get("attempts", 0)} for d in candidates]
    return Write(
        filter={"$or": as_read, **CLAIM_FILTER},
        update=[{"$set": {**claimed_fields(owner, lease_seconds), "claim_tag": tag}}],
    )


def claimed_tagged(
    ids: Sequence[str], owner: str, lease_seconds: float, tag: str, before: datetime
) -> Write:
    """pending → running in a limited queue: these jobs if still due and pending, tagged
    with the claim's `tag` (its slots carry it too), only while the server's clock is before
    `before` (the slots' `claim_by`)."""
    due = {"$lte": ["$run_at", NOW]}
    in_time = {"$lt": [NOW, lit(before)]}
    return Write(
        filter={"_id": {"$in": list(ids)}, "status": P, "$expr": {"$and": [due, in_time]}},
        update=[{"$set": {**claimed_fields(owner, lease_seconds), "claim_tag": lit(tag)}}],
    )


# -- a running attempt: lease, progress, start ----------------------------------------------


def lease_renewed(owner: str, leases: Sequence[Lease], lease_seconds: float) -> Write:
    """Every lease `owner` still holds, extended; not one whose attempt has its own
    transaction open (it renewed its lease for it, and must not be written meanwhile)."""
    held = {"owner": owner, "status": R, "$or": held_leases(leases)}
    return Write(
        filter={
            **held,
            "$or": [
                {"_id": lease.job_id, "attempts": a, **not_in_transaction(a)}
                for lease in leases
                for a in [lease.attempt]
            ],
        },
        update=[{"$set": {"lease_expires_at": after(lease_seconds * 1000)}}],
    )


def held_leases(leases: Sequence[Lease]) -> list[dict[str, Any]]:
    """`$or` clauses naming each of these attempts (its job at its attempt number)."""
    return [{"_id": lease.job_id, "attempts": lease.attempt} for lease in leases]


def progress_reported(lease: Lease, owner: str, fraction: float, message: str | None) -> Write:
    """An attempt's latest progress, fenced; not while its own transaction is open (it
    writes the last report with its completion, `completed_in_transaction`)."""
    return Write(
        filter={**running_fence(lease, owner), **not_in_transaction(lease.attempt)},
        update=[
            {
                "$set": {
                    "progress": {
                        "fraction": lit(fraction),
                        "message": lit(message),
                        "at": NOW,
                        "attempt": lease.attempt,
                    }
                }
            }
        ],
    )


def started(lease: Lease, owner: str, started_at: datetime) -> Write:
    """When an attempt's task started, kept within its lease; fenced, once, and never into
    its own open transaction (a write conflict there would abort the task's work)."""
    return Write(
        filter={
            **running_fence(lease, owner),
            "started_at": None,
            **not_in_transaction(lease.attempt),
        },
        update=[{"$set": {"started_at": within_lease(started_at)}}],
    )


def transaction_opened(
    lease: Lease, owner: str, session_id: Mapping[str, Any], lease_seconds: float
) -> Write:
    """A running attempt is about to open its own transaction (`ctx.transaction()`); its
    worker writes this, fenced, just before. From here until the transaction ends, nothing
    else writes the job (heartbeats and progress pass it by, `not_in_transaction`): a write
    to it after the transaction's snapshot would make the completion write inside it a write
    conflict, aborting the attempt's work. So the lease is renewed once, now, for the whole
    transaction; and the session is recorded, so that whoever requeues an abandoned attempt
    ends that transaction first."""
    tx = {"attempt": lease.attempt, "session": lit(dict(session_id)), "at": NOW}
    # A short task's start is otherwise written with its outcome, which its transaction
    # writes: its task has started by now, so now is the closest this write can tell.
    begun = {"$ifNull": ["$started_at", NOW]}
    return Write(
        filter=running_fence(lease, owner),
        update=[
            {
                "$set": {
                    "tx": tx,
                    "lease_expires_at": after(lease_seconds * 1000),
                    "started_at": begun,
                }
            }
        ],
    )


def transaction_closed(lease: Lease, owner: str, lease_seconds: float) -> Write:
    """The attempt's transaction ended without its completion (it was aborted) and the task
    goes on: its lease is renewed by heartbeats again."""
    return Write(
        filter=running_fence(lease, owner),
        update=[{"$set": {"lease_expires_at": after(lease_seconds * 1000)}}, {"$unset": "tx"}],
    )


# -- durable steps, sleeps and signal waits -------------------------------------------------


def step_entry(
    lease: Lease, name: str, result: Any, size: int, duration_ms: float
) -> dict[str, Any]:
    """A step as the job keeps it (`steps`, in the order they were recorded)."""
    return {
        "name": lit(name),
        "result": lit(result),
        "at": NOW,
        "duration_ms": round(float(duration_ms), 3),
        "size": int(size),
        "attempt": lease.attempt,
    }


def step_recorded(
    lease: Lease, owner: str, name: str, result: Any, size: int, duration_ms: float
) -> Write:
    """A running attempt's step, checkpointed: fenced like a completion (attempt, owner,
    running), never into the attempt's own open transaction, and once per name (a later
    attempt replays it instead of recording it again)."""
    entry = step_entry(lease, name, result, size, duration_ms)
    return Write(
        filter={
            **running_fence(lease, owner),
            **not_in_transaction(lease.attempt),
            "steps.name": {"$ne": name},
        },
        update=[{"$set": steps_grown(entry)}],
    )


def step_recorded_in_transaction(
    lease: Lease, owner: str, name: str, result: Any, size: int, duration_ms: float
) -> Write:
    """A transactional step's checkpoint, written inside the step's transaction (with the
    writes its function made there), fenced by attempt and owner: the two commit together
    or not at all."""
    entry = step_entry(lease, name, result, size, duration_ms)
    return Write(
        filter={**running_fence(lease, owner), "steps.name": {"$ne": name}},
        update=[{"$set": steps_grown(entry)}],
    )


def steps_grown(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "steps": {"$concatArrays": [{"$ifNull": ["$steps", []]}, [entry]]},
        "steps_bytes": {"$add": [{"$ifNull": ["$steps_bytes", 0]}, entry["size"]]},
    }


def suspended(
    lease: Lease,
    owner: str,
    until: datetime | None,
    waiting: Mapping[str, Any],
    retention_s: float,
) -> Write:
    """running → pending until `until` (None: no end; a signal wakes it): the attempt
    slept or waits for a signal, and ends without a worker. Not an attempt and not a
    failure: `max_attempts` grows by one (the attempt number goes on, as the fencing
    token). A cancel asked meanwhile wins: cancelled."""
    asked = {"$eq": ["$cancel_requested", True]}
    status = {"$cond": [asked, C, P]}
    due = lit(until) if until is not None else lit(FOREVER)
    cancel_error = {"type": "Cancelled", "message": "cancelled while running"}
    return Write(
        filter=running_fence(lease, owner),
        update=[
            {
                "$set": {
                    "status": status,
                    "run_at": {"$cond": [asked, "$run_at", due]},
                    "max_attempts": {
                        "$cond": [asked, "$max_attempts", {"$add": ["$max_attempts", 1]}]
                    },
                    "waiting_for": {**{k: lit(v) for k, v in waiting.items()}, "since": NOW},
                    "finished_at": {"$cond": [asked, NOW, None]},
                    "expire_at": {"$cond": [asked, expiry(retention_s), "$$REMOVE"]},
                    "error": {"$cond": [asked, lit(cancel_error), "$error"]},
                    "updated_at": NOW,
                    "owner": None,
                    "lease_expires_at": None,
                    **history(
                        {
                            "status": status,
                            "at": NOW,
                            "attempt": lease.attempt,
                            "reason": lit(waiting.get("kind")),
                            "until": due,
                        }
                    ),
                }
            }
        ],
    )


def signal_waiters(key: str) -> dict[str, Any]:
    """The pending jobs waiting for a signal on `key`."""
    return {"status": P, "waiting_for.kind": "signal", "waiting_for.key": key}


def woken_by_signal(key: str, job_id: str | None = None) -> Write:
    """pending (waiting for a signal on `key`) → pending, due now: a signal came. The
    dispatchers hear of it on their change stream (`woken_at`), not by polling."""
    query = signal_waiters(key)
    if job_id is not None:
        query["_id"] = job_id
    return Write(
        filter=query,
        update=[
            {
                "$set": {
                    "run_at": NOW,
                    "woken_at": NOW,
                    "waiting_for": {"$mergeObjects": ["$waiting_for", {"woken_at": NOW}]},
                    "updated_at": NOW,
                }
            }
        ],
    )


# -- outcomes --------------------------------------------------------------------------------


def completed(
    lease: Lease, owner: str, result: Any, retention_s: float, ran: RunTimes | None = None
) -> Write:
    """running → completed, fenced (and, unless the lease knows of dependents, on there
    being none)."""
    return Write(
        filter={**running_fence(lease, owner), **_without_unknown_dependents(lease)},
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
) -> Write:
    """running → pending (after `retry_delay_s`, while attempts remain and not `final`),
    failed, or cancelled (if that was asked), with the attempt's error."""
    times = ran_times(ran) if ran is not None else {}
    ended: Any = times.get("finished_at", NOW)
    begun = {"started_at": times["started_at"]} if ran is not None else {}
    again = {"$eq": ["$status", P]}
    return Write(
        filter=fence,
        update=[
            *attempt_budget(unstarted_free),
            {"$set": {"status": ended_status(final)}},
            {
                "$set": {
                    "error": lit(dict(error)),
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
                            "error": lit(error.get("type")),
                            # A step's exception: the history names the step.
                            **({"step": lit(error["step"])} if error.get("step") else {}),
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
        running_fence(lease, owner), error, retry_delay_s, retention_s, final=final, ran=ran
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
                    "error": lit({"type": "Cancelled", "message": message}),
                    **history(
                        {"status": JobStatus.CANCELLED.value, "at": NOW, "attempt": lease.attempt}
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
                    "updated_at": NOW,
                    "owner": None,
                    "lease_expires_at": None,
                    **history(
                        {
                            "status": status,
                            "at": NOW,
                            "attempt": lease.attempt,
                            "reason": "released",
                        }
                    ),
                }
            }
        ],
    )


# -- a caller's operations on one job --------------------------------------------------------


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


# -- a caller's operations on many jobs (`common.domain.bulk`) ------------------------------


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


# -- workflows -------------------------------------------------------------------------------


def dependents_attached(parent_ids: Collection[str], token: str) -> Write:
    """These jobs become parents with dependents not settled yet (`unsettled`, a fresh
    token); one that ended already loses its `expire_at` until they are."""
    return Write(
        filter={"_id": {"$in": list(parent_ids)}},
        update={
            "$set": {"has_dependents": True, "unsettled": token},
            "$unset": {"expire_at": ""},
        },
    )


def parents_adopted(adopted: Mapping[str, str]) -> Write:
    """The waiting children of never-inserted jobs (`adopted`: their id → the id of the job
    holding their idempotency key) point at the jobs that hold the keys instead."""
    new, old = lit(list(adopted)), lit(list(adopted.values()))

    def swap(field: str) -> dict[str, Any]:
        at = {"$indexOfArray": [new, "$$p"]}
        one = {"$cond": [{"$lt": [at, 0]}, "$$p", {"$arrayElemAt": [old, at]}]}
        return {"$map": {"input": f"${field}", "as": "p", "in": one}}

    return Write(
        filter={"parents_left": {"$in": list(adopted)}, "status": W},
        update=[{"$set": {"depends_on": swap("depends_on"), "parents_left": swap("parents_left")}}],
    )


def settled(
    children: Sequence[str], ended: Sequence[EndedParent], tag: str, retention_s: float
) -> Write:
    """waiting → pending / cancelled / (still) waiting: these waiting children of these
    ended parents forget them; no parent left → pending (due at the latest of its `run_at`
    and now); a parent that did not complete → cancelled with `DependencyFailed`, unless
    `run_on_parent_failure`. A child whose status changes is tagged with `tag` and gets one
    history entry."""
    ids = [p.job_id for p in ended]
    return Write(
        filter={"_id": {"$in": list(children)}, "parents_left": {"$in": ids}, "status": W},
        update=_settled_pipeline(ended, tag, retention_s),
    )


def marked_settled(parent: EndedParent, retention_s: float) -> Write:
    """A finished parent's `unsettled` token cleared, unless a child attached since it was
    read (a new token), and its retention started from now."""
    return Write(
        filter={"_id": parent.job_id, "unsettled": parent.token, "status": {"$in": ENDED}},
        update=[{"$unset": "unsettled"}, {"$set": {"expire_at": expiry(retention_s)}}],
    )


def _settled_pipeline(
    ended: Sequence[EndedParent], tag: str, retention_s: float
) -> list[dict[str, Any]]:
    failed = [p for p in ended if not p.completed]
    failed_ids = lit([p.job_id for p in failed])
    hit = {"$setIntersection": ["$parents_left", failed_ids]}
    first = {"$arrayElemAt": [hit, 0]}
    messages = lit([p.failure() for p in failed])
    message = {"$arrayElemAt": [messages, {"$indexOfArray": [failed_ids, first]}]}
    runs_anyway = {"$eq": ["$run_on_parent_failure", True]}
    left = {"$setDifference": ["$parents_left", lit([p.job_id for p in ended])]}
    cancel = {"$and": [{"$not": [runs_anyway]}, {"$gt": [{"$size": hit}, 0]}]}
    status = {
        "$switch": {
            "branches": [
                {"case": cancel, "then": C},
                {"case": {"$eq": [{"$size": left}, 0]}, "then": P},
            ],
            "default": W,
        }
    }
    is_cancelled = {"$eq": ["$status", C]}
    is_released = {"$eq": ["$status", P]}
    changed = {"$ne": ["$status", W]}
    entry = {
        "status": "$status",
        "at": NOW,
        "attempt": "$attempts",
        "error": {"$cond": [is_cancelled, "DependencyFailed", "$$REMOVE"]},
    }
    error = {"type": "DependencyFailed", "message": message}
    outcome = {"tag": tag, "status": "$status", "attempt": "$attempts"}
    return [
        {"$set": {"error": {"$cond": [cancel, error, "$error"]}, "status": status}},
        {
            "$set": {
                "parents_left": left,
                "finished_at": {"$cond": [is_cancelled, NOW, "$finished_at"]},
                "expire_at": {"$cond": [is_cancelled, expiry(retention_s), "$$REMOVE"]},
                "run_at": {"$cond": [is_released, {"$max": ["$run_at", NOW]}, "$run_at"]},
                "updated_at": NOW,
                # What this settle made of it, read back by its tag: the child may be
                # claimed (or further) by the time it is read.
                "settled": {"$cond": [changed, outcome, "$settled"]},
                **{k: {"$cond": [changed, v, f"${k}"]} for k, v in history(entry).items()},
            }
        },
    ]
