"""`JobStore`: the only code that touches the jobs collection.

Every method is one named operation. Every status change is one conditional write whose
filter names the expected status (and, for a running job, its owner and attempt); the
database decides, and a write that matches nothing means the caller lost a race.
Times that matter for leases and due dates come from the server clock (`$$NOW`).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from bson import ObjectId, Timestamp
from pymongo import ASCENDING, DESCENDING, CursorType, IndexModel, ReturnDocument, UpdateOne
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.cursor import AsyncCursor
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import (
    BulkWriteError,
    CollectionInvalid,
    DocumentTooLarge,
    DuplicateKeyError,
    OperationFailure,
    WriteConcernError,
    WriteError,
)
from pymongo.read_concern import ReadConcern

from common.domain.errors import JobConflict, JobNotFound, LeaseLost
from common.domain.models import DEFAULT_QUEUE, Doc, Job, JobSpec, whole_ms
from common.domain.status import RETRYABLE, TERMINAL, JobStatus
from common.domain.workflows import external_parents, parent_ids
from common.runtime.settings import WEEK_S

JOBS = "jobs"
STATE = "brook_state"
DISPATCHERS = "brook_dispatchers"
HISTORY_CAP = 50
KEY_TRIES = 5  # a key freed and taken again by a peer, over and over: give up, say so

# MongoDB merges at most this many index scans to give a sort (internalQueryMaxScansToExplode);
# a routed claim over more tasks than this uses the general claim order instead.
MAX_MERGED_SCANS = 200
# How often `server_clock` measures the server clock's offset from this process's.
CLOCK_REFRESH_S = 10.0
# A dispatcher is live while it was seen within this many of its lease lengths.
LIVE_LEASES = 3
# What is left of a dispatcher that vanished without retiring is deleted after a day.
PRESENCE_TTL_S = 86400

P, R = JobStatus.PENDING.value, JobStatus.RUNNING.value
W = JobStatus.WAITING.value
C = JobStatus.CANCELLED.value
ENDED = sorted(s.value for s in TERMINAL)
# How many waiting children one settling write handles (a larger fan-out takes more).
SETTLE_PAGE = 1000

CLAIM_SORT: list[tuple[str, int]] = [
    ("priority", DESCENDING),
    ("run_at", ASCENDING),
    ("_id", ASCENDING),
]
_PENDING = {"status": P}

INDEXES = [
    # The queue indexes are partial: they hold only pending (or running) jobs, so they stay
    # small however many finished jobs the collection keeps, and a finished job costs them
    # nothing. Claims read them in claim order (best priority, then earliest due), so a
    # claim is an index scan that stops at the first match and never sorts in memory.
    # The general claim order; queue and task ride in the key so that a routed claim that
    # cannot use the two below (too many tasks to merge) filters on index keys alone.
    IndexModel(
        [("status", ASCENDING), *CLAIM_SORT, ("queue", ASCENDING), ("task", ASCENDING)],
        name="claim_order",
        partialFilterExpression=_PENDING,
    ),
    # A dispatcher serving every queue: one scan per task it runs, merged in claim order;
    # jobs of tasks it does not run (however many) cost it nothing.
    IndexModel(
        [("status", ASCENDING), ("task", ASCENDING), *CLAIM_SORT, ("queue", ASCENDING)],
        name="claim_by_task",
        partialFilterExpression=_PENDING,
    ),
    # A dispatcher claiming for one of its queues: one scan per task, in that queue only.
    IndexModel(
        [("status", ASCENDING), ("queue", ASCENDING), ("task", ASCENDING), *CLAIM_SORT],
        name="claim_by_queue",
        partialFilterExpression=_PENDING,
    ),
    # Next due time among the tasks a dispatcher runs (the dispatcher's timer).
    IndexModel(
        [("status", ASCENDING), ("task", ASCENDING), ("run_at", ASCENDING), ("queue", ASCENDING)],
        name="due",
        partialFilterExpression=_PENDING,
    ),
    # Watchdog: running jobs whose lease expired.
    IndexModel(
        [("status", ASCENDING), ("lease_expires_at", ASCENDING)],
        name="lease_expiry",
        partialFilterExpression={"status": R},
    ),
    # Workflows: the waiting children of a parent (the partial index holds only waiting
    # jobs, so it costs the rest nothing) ...
    IndexModel(
        [("parents_left", ASCENDING)],
        name="waiting_on",
        partialFilterExpression={"status": W},
    ),
    # ... and the parents whose children are not settled yet (the sweep's backstop).
    IndexModel(
        [("status", ASCENDING)],
        name="dependents_unsettled",
        partialFilterExpression={"unsettled": {"$exists": True}},
    ),
    # Listing, newest first, by status, task or queue.
    IndexModel([("status", ASCENDING), ("_id", DESCENDING)], name="list_status"),
    IndexModel([("task", ASCENDING), ("_id", DESCENDING)], name="list_task"),
    IndexModel([("queue", ASCENDING), ("_id", DESCENDING)], name="list_queue"),
    # An idempotency key is reserved while its job exists (or until its unique window ends).
    IndexModel(
        [("idempotency_key", ASCENDING)],
        name="idempotency_key_unique",
        unique=True,
        partialFilterExpression={"idempotency_key": {"$type": "string"}},
    ),
    # Retention: a finished job gets `expire_at` (its finish + its retention) at its terminal
    # write, and MongoDB's TTL monitor deletes it then. Active jobs have no `expire_at`.
    IndexModel(
        [("expire_at", ASCENDING)],
        name="retention",
        expireAfterSeconds=0,
        partialFilterExpression={"expire_at": {"$exists": True}},
    ),
]

PRESENCE_INDEXES = [
    IndexModel([("seen_at", ASCENDING)], name="forget", expireAfterSeconds=PRESENCE_TTL_S),
]

NOW = "$$NOW"

# Change-stream events after which a stream is over.
INVALIDATING = ("invalidate", "drop", "dropDatabase", "rename")

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


def _lit(value: Any) -> dict[str, Any]:
    """User data inside an update pipeline must never be read as an expression or field path."""
    return {"$literal": value}


def _after(ms: float) -> dict[str, Any]:
    return {"$add": [NOW, int(ms)]}


def _history(entry: dict[str, Any]) -> dict[str, Any]:
    """`history` plus `entry`, capped at HISTORY_CAP entries: the first (the submit) and the
    latest ones are kept, and `history_truncated` counts the entries dropped between."""
    grown = {"$concatArrays": [{"$ifNull": ["$history", []]}, [entry]]}
    over = {"$max": [0, {"$subtract": [{"$size": "$$grown"}, HISTORY_CAP]}]}
    capped = {
        "$cond": [
            {"$gt": [{"$size": "$$grown"}, HISTORY_CAP]},
            {
                "$concatArrays": [
                    {"$slice": ["$$grown", 1]},
                    {"$slice": ["$$grown", -(HISTORY_CAP - 1)]},
                ]
            },
            "$$grown",
        ]
    }
    return {
        "history": {"$let": {"vars": {"grown": grown}, "in": capped}},
        "history_truncated": {
            "$let": {
                "vars": {"grown": grown},
                "in": {"$add": [{"$ifNull": ["$history_truncated", 0]}, over]},
            }
        },
    }


def _expiry(default_retention_s: float) -> dict[str, Any]:
    """When a job finishing now is to be deleted: its own `retention_s`, else the default.
    Never while it is a parent whose dependents are not settled yet (`unsettled`): they
    are to read its result. Settling them sets its `expire_at` (`mark_settled`)."""
    seconds = {"$ifNull": ["$retention_s", default_retention_s]}
    at = {"$add": [NOW, {"$toLong": {"$multiply": [seconds, 1000]}}]}
    return {"$cond": [{"$eq": [{"$type": "$unsettled"}, "missing"]}, at, "$$REMOVE"]}


def _new_job(
    spec: JobSpec, now: datetime | None = None, parents: Sequence[str] = ()
) -> dict[str, Any]:
    """A new job's fields: pending, or waiting for `parents` (job ids). Without `now`: `$set`
    expressions for an update pipeline, the server stamping the times (`$$NOW`) and user
    data wrapped in `$literal`. With `now` (the server's time, read just before): the same
    fields as a document to insert as it is."""

    def lit(value: Any) -> Any:
        return _lit(value) if now is None else value

    def at(ms: float = 0) -> Any:
        if now is None:
            return _after(ms) if ms else NOW
        return now + timedelta(milliseconds=int(ms))

    run_at: Any = at()
    if spec.run_at is not None:
        run_at = lit(whole_ms(spec.run_at))
    elif spec.delay_s is not None:
        run_at = at(spec.delay_s * 1000)
    status = W if parents else P
    fields: dict[str, Any] = {
        "task": lit(spec.task),
        "payload": lit(spec.payload),
        "status": status,
        "queue": lit(spec.queue),
        "priority": spec.priority,
        "attempts": 0,
        "max_attempts": spec.max_attempts,
        "attempt_budget": spec.max_attempts,  # what a `retry` grants again
        "run_at": run_at,
        "created_at": at(),
        "updated_at": at(),
        "started_at": None,
        "finished_at": None,
        "result": None,
        "error": None,
        "timeout_s": spec.timeout_s,
        "owner": None,
        "lease_expires_at": None,
        "cancel_requested": False,
        "history": [{"status": status, "at": at(), "attempt": 0}],
        "progress": None,
    }
    fields.update(_workflow_fields(spec, parents, lit))
    if spec.idempotency_key is not None:
        fields["idempotency_key"] = lit(spec.idempotency_key)
    if spec.unique_for_s is not None:
        fields["unique_until"] = at(spec.unique_for_s * 1000)
    if spec.retention_s is not None:
        fields["retention_s"] = spec.retention_s
    if spec.schedule is not None:
        fields["schedule"] = lit(spec.schedule)
    return fields


def _workflow_fields(
    spec: JobSpec, parents: Sequence[str], lit: Callable[[Any], Any]
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if parents:
        fields["depends_on"] = lit(list(parents))
        fields["parents_left"] = lit(list(parents))
    if spec.run_on_parent_failure:
        fields["run_on_parent_failure"] = True
    if spec.ref is not None:
        fields["ref"] = lit(spec.ref)
    return fields


def _claimed(owner: str, lease_seconds: float) -> dict[str, Any]:
    """A lease, not a start: a claimed job may wait in its dispatcher's prefetch buffer, so
    `started_at` stays null until its task really starts (see `RunTimes`)."""
    attempt = {"$add": ["$attempts", 1]}
    return {
        "status": R,
        "owner": _lit(owner),
        "attempts": attempt,
        "claimed_at": NOW,
        "started_at": None,
        "updated_at": NOW,
        "lease_expires_at": _after(lease_seconds * 1000),
        **_history({"status": R, "at": NOW, "attempt": attempt, "owner": _lit(owner)}),
        "progress": None,  # a new attempt starts from nothing
    }


def _as_claimed(doc: Doc, owner: str) -> Job:
    """A pending job as `_claimed` left it (the fields a dispatcher reads of its claim)."""
    return Job.from_doc(
        {
            **doc,
            "status": R,
            "owner": owner,
            "attempts": int(doc.get("attempts", 0)) + 1,
            "claimed_at": None,  # the server's; not read back
            "started_at": None,
            "progress": None,
        }
    )


def _attempt_budget(unstarted_free: bool) -> list[dict[str, Any]]:
    """With `unstarted_free`, an attempt whose task is not known to have started does not
    use up one of the job's attempts: `max_attempts` grows by one."""
    if not unstarted_free:
        return []
    unstarted = {"$eq": [{"$ifNull": ["$started_at", None]}, None]}
    grown = {"$cond": [unstarted, {"$add": ["$max_attempts", 1]}, "$max_attempts"]}
    return [{"$set": {"max_attempts": grown}}]


def _ended_status(final: bool) -> dict[str, Any]:
    """A failed attempt's job: cancelled if that was asked, else pending while attempts
    remain (and not `final`), else failed."""
    cancelled = {"$eq": ["$cancel_requested", True]}
    retry = {"$and": [{"$not": [final]}, {"$lt": ["$attempts", "$max_attempts"]}]}
    return {
        "$switch": {
            "branches": [
                {"case": cancelled, "then": JobStatus.CANCELLED.value},
                {"case": retry, "then": P},
            ],
            "default": JobStatus.FAILED.value,
        }
    }


def _within_lease(at: datetime) -> dict[str, Any]:
    """`at` (a dispatcher's reading of the server clock) kept between the attempt's claim
    and now, on the server's clock."""
    return {"$min": [{"$max": [_lit(at), "$claimed_at"]}, NOW]}


def _ran(ran: RunTimes | None) -> dict[str, Any]:
    """`started_at` / `finished_at` of an attempt that ran: the task's own start and end as
    its dispatcher measured them; without them, the time of this write."""
    if ran is None:
        return {"started_at": {"$ifNull": ["$started_at", NOW]}, "finished_at": NOW}
    # Within the attempt's lease, on the server's clock: never before its claim, never after
    # this write (a dispatcher's reading of the server clock errs by a round trip). So a
    # queue's jobs never show more runs at once than the slots they held.
    finished = {"$min": [_lit(ran.finished_at), NOW]}
    started = {"$min": [{"$max": [_lit(ran.started_at), "$claimed_at"]}, finished]}
    return {"started_at": started, "finished_at": finished}


def _completed(
    lease: Lease, result: Any, retention_s: float, ran: RunTimes | None = None
) -> dict[str, Any]:
    return {
        "status": JobStatus.COMPLETED.value,
        "result": _lit(result),
        "error": None,
        **_ran(ran),
        "expire_at": _expiry(retention_s),
        "updated_at": NOW,
        "owner": None,
        "lease_expires_at": None,
        **_history({"status": JobStatus.COMPLETED.value, "at": NOW, "attempt": lease.attempt}),
    }


def _retried(waiting_on: Sequence[str]) -> dict[str, Any]:
    """A finished job back to pending (or waiting for the parents in `waiting_on`), with as
    many attempts again as it was submitted with. `attempts` keeps counting: it is the
    fencing token, and must never be reused."""
    status = W if waiting_on else P
    return {
        "status": status,
        "parents_left": _lit(list(waiting_on)) if waiting_on else "$$REMOVE",
        "max_attempts": {
            "$add": ["$attempts", {"$ifNull": ["$attempt_budget", "$max_attempts"]}]
        },
        "run_at": NOW,
        "finished_at": None,
        "expire_at": "$$REMOVE",
        "updated_at": NOW,
        "owner": None,
        "lease_expires_at": None,
        "cancel_requested": False,
        **_history({"status": status, "at": NOW, "attempt": "$attempts", "reason": "retry"}),
    }


def _session_of(doc: Doc, attempt: int) -> dict[str, Any] | None:
    """The session of the transaction this attempt opened (`transaction_opened`), if any."""
    tx = doc.get("tx")
    if not isinstance(tx, dict) or tx.get("attempt") != attempt:
        return None
    session = tx.get("session")
    return session if isinstance(session, dict) else None


def transaction_opened(
    lease: Lease, session_id: Mapping[str, Any], lease_seconds: float
) -> list[dict[str, Any]]:
    """A running attempt is about to open its own transaction (`ctx.transaction()`); its
    worker writes this, fenced, just before. From here until the transaction ends, nothing
    else writes the job (heartbeats and progress pass it by, `not_in_transaction`): a write
    to it after the transaction's snapshot would make the completion write inside it a write
    conflict, aborting the attempt's work. So the lease is renewed once, now, for the whole
    transaction; and the session is recorded, so that whoever requeues an abandoned attempt
    ends that transaction first."""
    tx = {"attempt": lease.attempt, "session": _lit(dict(session_id)), "at": NOW}
    # A short task's start is otherwise written with its outcome, which its transaction
    # writes: its task has started by now, so now is the closest this write can tell.
    started = {"$ifNull": ["$started_at", NOW]}
    return [
        {
            "$set": {
                "tx": tx,
                "lease_expires_at": _after(lease_seconds * 1000),
                "started_at": started,
            }
        }
    ]


def transaction_closed(lease_seconds: float) -> list[dict[str, Any]]:
    """The attempt's transaction ended without its completion (it was aborted) and the task
    goes on: its lease is renewed by heartbeats again."""
    return [{"$set": {"lease_expires_at": _after(lease_seconds * 1000)}}, {"$unset": "tx"}]


def not_in_transaction(attempt: int) -> dict[str, Any]:
    """A filter clause: this attempt has no transaction of its own open on the job."""
    return {"tx.attempt": {"$ne": attempt}}


def key_window_over(job_id: str, key: str | None) -> dict[str, Any]:
    """The job holding `key` whose unique window is over (by the server's clock)."""
    return {"_id": job_id, "idempotency_key": key, "$expr": {"$lte": ["$unique_until", NOW]}}


def release_key(key: str | None) -> list[dict[str, Any]]:
    """Free a key whose window is over: the old job keeps it as `released_key`."""
    return [
        {"$set": {"released_key": _lit(key), "updated_at": NOW}},
        {"$unset": "idempotency_key"},
    ]


def new_job_upsert(job_id: str, spec: JobSpec) -> UpdateOne:
    """Insert a pending job as an upsert on a fresh `_id`, so that the server stamps its
    times (`$$NOW`) without a read of its clock: usable inside a transaction too."""
    return UpdateOne({"_id": job_id}, [{"$set": _new_job(spec)}], upsert=True)


def running_fence(lease: Lease, owner: str) -> dict[str, Any]:
    """The filter of every write of a running attempt: its job, attempt, owner, `running`."""
    return {"_id": lease.job_id, "attempts": lease.attempt, "owner": owner, "status": R}


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
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The filter and update of one `update_many` completing these running attempts: each
    fenced as `running_fence` (and, unless its lease knows of dependents, on having none),
    each job set to exactly what `_completed` sets it to."""
    ids = [lease.job_id for lease, _ in items]
    sets = [
        _completed(lease, result, retention_s, times.get(lease.job_id)) for lease, result in items
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
    return query, [{"$set": fields}]


def completed_in_transaction(
    lease: Lease, result: Any, retention_s: float, progress: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """The completion write a task's own transaction makes (`ctx.transaction()`): the same
    fields as the dispatcher's, its history entry marked, and the attempt's last progress
    (which the worker folds in rather than send it up its pipe to race the commit)."""
    fields = _completed(lease, result, retention_s)
    fields.update(
        _history(
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
        fields["progress"] = {**{k: _lit(v) for k, v in progress.items()}, "at": NOW}
    return [{"$set": fields}]


@dataclass(frozen=True, kw_only=True)
class EndedParent:
    """A parent that ended: finished with `status`, or deleted (`status` None). `token`:
    its `unsettled` token when read."""

    job_id: str
    status: JobStatus | None
    token: str | None

    @property
    def completed(self) -> bool:
        return self.status == JobStatus.COMPLETED

    def failure(self) -> str:
        """What its dependents' `DependencyFailed` error says."""
        if self.status is None:
            return f"parent {self.job_id} no longer exists"
        return f"parent {self.job_id} {self.status.value}"


@dataclass(frozen=True, kw_only=True)
class Settled:
    """A waiting child whose status a settle changed (to `pending` or `cancelled`), as that
    settle left it (`settled` in its document)."""

    job_id: str
    task: str
    attempt: int
    status: JobStatus
    has_dependents: bool
    error: dict[str, Any] | None

    @classmethod
    def from_doc(cls, doc: Doc) -> Settled:
        return cls(
            job_id=doc["_id"],
            task=doc["task"],
            attempt=int(doc["settled"]["attempt"]),
            status=JobStatus(doc["settled"]["status"]),
            has_dependents=bool(doc.get("has_dependents", False)),
            error=doc.get("error"),
        )


def _settled(ended: Sequence[EndedParent], tag: str, retention_s: float) -> list[dict[str, Any]]:
    """The pipeline that settles a waiting child of these ended parents: forget them; no
    parent left → pending (due at the latest of its `run_at` and now); a parent that did
    not complete → cancelled with `DependencyFailed`, unless `run_on_parent_failure`.
    A child whose status changes is tagged with `tag` and gets one history entry."""
    failed = [p for p in ended if not p.completed]
    failed_ids = _lit([p.job_id for p in failed])
    hit = {"$setIntersection": ["$parents_left", failed_ids]}
    first = {"$arrayElemAt": [hit, 0]}
    messages = _lit([p.failure() for p in failed])
    message = {"$arrayElemAt": [messages, {"$indexOfArray": [failed_ids, first]}]}
    runs_anyway = {"$eq": ["$run_on_parent_failure", True]}
    left = {"$setDifference": ["$parents_left", _lit([p.job_id for p in ended])]}
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
    cancelled = {"$eq": ["$status", C]}
    released = {"$eq": ["$status", P]}
    changed = {"$ne": ["$status", W]}
    entry = {
        "status": "$status",
        "at": NOW,
        "attempt": "$attempts",
        "error": {"$cond": [cancelled, "DependencyFailed", "$$REMOVE"]},
    }
    error = {"type": "DependencyFailed", "message": message}
    outcome = {"tag": tag, "status": "$status", "attempt": "$attempts"}
    return [
        {"$set": {"error": {"$cond": [cancel, error, "$error"]}, "status": status}},
        {
            "$set": {
                "parents_left": left,
                "finished_at": {"$cond": [cancelled, NOW, "$finished_at"]},
                "expire_at": {"$cond": [cancelled, _expiry(retention_s), "$$REMOVE"]},
                "run_at": {"$cond": [released, {"$max": ["$run_at", NOW]}, "$run_at"]},
                "updated_at": NOW,
                # What this settle made of it, read back by its tag: the child may be
                # claimed (or further) by the time it is read.
                "settled": {"$cond": [changed, outcome, "$settled"]},
                **{k: {"$cond": [changed, v, f"${k}"]} for k, v in _history(entry).items()},
            }
        },
    ]


@dataclass(frozen=True, kw_only=True)
class Submitted:
    job: Job
    created: bool


@dataclass(frozen=True, kw_only=True)
class Lease:
    """What a dispatcher holds: the job and the attempt number that fences its writes.
    `has_dependents`: the job had dependents when it was claimed (its completion then
    settles them; see `complete_many`)."""

    job_id: str
    attempt: int
    has_dependents: bool = False


@dataclass(frozen=True, kw_only=True)
class Completions:
    """What `complete_many` did: the jobs it completed, those MongoDB refused (with the
    reason), and which completed jobs have dependents to settle."""

    done: set[str]
    refused: dict[str, str]
    parents: set[str]


@dataclass(frozen=True, kw_only=True)
class RunTimes:
    """When an attempt's task really started and ended, on the server's clock as its
    dispatcher reads it (its own clock plus a measured offset): a claimed job may wait in
    the prefetch buffer, and its outcome may be written a little after the task ended."""

    started_at: datetime
    finished_at: datetime


@dataclass(frozen=True, kw_only=True)
class ExpiredLease:
    """A running job whose lease is over by the server's clock (the watchdog's find)."""

    job_id: str
    attempt: int
    task: str
    owner: str
    # The server session of a transaction this attempt opened (`ctx.transaction()`): the
    # watchdog ends it before requeueing the job.
    tx_session: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class LiveDispatcher:
    """A live dispatcher as it published itself: the tasks it runs and the queues it serves
    (None: every queue)."""

    owner: str
    name: str
    tasks: frozenset[str]
    queues: dict[str, int] | None
    seen_at: datetime

    @classmethod
    def from_doc(cls, d: Doc) -> LiveDispatcher:
        return cls(
            owner=str(d["_id"]),
            name=str(d.get("name", "")),
            tasks=frozenset(d.get("tasks") or ()),
            queues=d.get("queues"),
            seen_at=d["seen_at"],
        )


def live_query() -> dict[str, Any]:
    """Dispatchers seen within LIVE_LEASES of their lease length, by the server's clock."""
    window = {"$multiply": ["$lease_seconds", LIVE_LEASES * 1000]}
    return {"$expr": {"$gte": [{"$add": ["$seen_at", window]}, NOW]}}



def buffered(stream: AsyncChangeStream[Doc]) -> int | None:
    """How many changes `stream` already holds from its last batch: the next `try_next`
    returns one of them without asking the server. PyMongo keeps them in its cursor; read
    defensively (None if that ever moves: unknown)."""
    data = getattr(getattr(stream, "_cursor", None), "_data", None)
    return len(data) if data is not None else None


class JobStore:
    def __init__(self, db: AsyncDatabase[Doc], *, retention_s: float = WEEK_S) -> None:
        self.db = db
        self.jobs: AsyncCollection[Doc] = db[JOBS]
        self.state: AsyncCollection[Doc] = db[STATE]
        self.dispatchers: AsyncCollection[Doc] = db[DISPATCHERS]
        # How long a finished job without its own `retention_s` is kept (the TTL's input).
        self.retention_s = retention_s
        self._clock_offset = 0.0  # server clock - time.monotonic(), seconds (see server_clock)
        self._clock_read_at = -math.inf

    async def ensure_indexes(self) -> None:
        """Idempotent: an index that exists with the same spec is a no-op; one that exists
        under the same name with another spec (an older Brook) is rebuilt."""
        for collection, models in ((self.jobs, INDEXES), (self.dispatchers, PRESENCE_INDEXES)):
            try:
                await collection.create_indexes(models)
            except OperationFailure as exc:
                if exc.code not in (85, 86):  # IndexOptionsConflict, IndexKeySpecsConflict
                    raise
                for model in models:
                    await self._rebuild_index(collection, model)

    async def _rebuild_index(self, collection: AsyncCollection[Doc], model: IndexModel) -> None:
        # Several processes (API, dispatchers) may do this at once: a peer may drop or
        # recreate the index between our steps, so tolerate both and try again.
        for _ in range(5):
            try:
                await collection.create_indexes([model])
                return
            except OperationFailure as exc:
                if exc.code not in (85, 86):
                    raise
            try:
                await collection.drop_index(model.document["name"])
            except OperationFailure as exc:
                if exc.code != 27:  # IndexNotFound: a peer dropped it first
                    raise
        await collection.create_indexes([model])

    # -- submit / read ---------------------------------------------------------------------

    async def submit(self, spec: JobSpec) -> Submitted:
        """Insert a pending job, majority-acknowledged; a known idempotency key returns its job."""
        if spec.depends_on:
            return (await self.submit_many([spec]))[0]
        for _ in range(KEY_TRIES):
            try:
                # An upsert on a fresh _id always inserts, and lets the server stamp the times.
                doc = await self.jobs.find_one_and_update(
                    {"_id": str(ObjectId())},
                    [{"$set": _new_job(spec)}],
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
            except DuplicateKeyError:
                holder = await self._key_holder(spec)
                if holder is not None:
                    return Submitted(job=holder, created=False)
                continue  # the key was freed meanwhile: insert again
            assert doc is not None
            return Submitted(job=Job.from_doc(doc), created=True)
        raise JobConflict(f"idempotency key {spec.idempotency_key!r} keeps changing hands")

    async def submit_many(self, specs: Sequence[JobSpec]) -> list[Submitted]:
        """`submit` for many jobs in one write (one `insert_many`, one majority wait), in
        order. A job whose idempotency key exists (or repeats within the batch) returns the
        job holding it; only a key whose unique window ended meanwhile costs more round
        trips."""
        # One reading of the server's clock stamps the whole batch: an insert cannot evaluate
        # `$$NOW`, and an upsert per job costs the server several times more.
        now = await self.server_clock()
        if any(spec.depends_on for spec in specs):
            return await self._submit_workflow(specs, now)
        docs = [{"_id": str(ObjectId()), **_new_job(spec, now)} for spec in specs]
        return await self._insert_submitted(specs, docs)

    async def _insert_submitted(
        self, specs: Sequence[JobSpec], docs: Sequence[Doc]
    ) -> list[Submitted]:
        duplicates = await self._insert_new(docs)
        out: list[Submitted] = []
        for i, spec in enumerate(specs):
            if i not in duplicates:
                out.append(Submitted(job=Job.from_doc(docs[i]), created=True))
                continue
            holder = await self._key_holder(spec)
            if holder is None:  # the key was freed meanwhile: this spec goes in on its own
                holder_spec = replace(spec, depends_on=tuple(docs[i].get("depends_on", ())))
                out.append(await self.submit(holder_spec))
            else:
                out.append(Submitted(job=holder, created=False))
        return out

    async def _submit_workflow(self, specs: Sequence[JobSpec], now: datetime) -> list[Submitted]:
        """Specs with parents: each child goes in `waiting` for its parents (ids, or refs
        resolved to the ids of this batch's jobs), and every parent is marked as having
        unsettled dependents. Parents named by id are marked before the insert (a submitter
        dying after the insert leaves them marked, so the sweep finds the children) and
        again after it (a settle that ran in between, and cleared the mark, missed them).
        The caller then re-checks the parents (`workflows`' `recheck`): one that ended
        before the second mark may have settled its dependents without these."""
        ids = [str(ObjectId()) for _ in specs]
        parents = parent_ids(specs, ids)
        external = external_parents(specs)
        if external:
            await self.attach_dependents(external)
        docs = [{"_id": ids[i], **_new_job(spec, now, parents[i])} for i, spec in enumerate(specs)]
        named = {p for ps in parents for p in ps}
        token = secrets.token_hex(8)
        for doc in docs:
            if doc["_id"] in named:
                doc["has_dependents"] = True
                doc["unsettled"] = token
        out = await self._insert_submitted(specs, docs)
        # A parent of this batch that was deduplicated (its idempotency key names an
        # existing job) is that job: its children here are told so.
        adopted = {ids[i]: s.job.id for i, s in enumerate(out) if s.job.id != ids[i]}
        adopted = {new: old for new, old in adopted.items() if new in named}
        if adopted:
            out = await self._adopt_parents(adopted, out)
        if external or adopted:
            await self.attach_dependents([*external, *adopted.values()])
        return out

    async def _adopt_parents(
        self, adopted: Mapping[str, str], out: Sequence[Submitted]
    ) -> list[Submitted]:
        """Point the waiting children of never-inserted jobs (`adopted`: their id → the id
        of the job holding their idempotency key) at the jobs that hold the keys."""
        new, old = _lit(list(adopted)), _lit(list(adopted.values()))

        def swap(field: str) -> dict[str, Any]:
            at = {"$indexOfArray": [new, "$$p"]}
            one = {"$cond": [{"$lt": [at, 0]}, "$$p", {"$arrayElemAt": [old, at]}]}
            return {"$map": {"input": f"${field}", "as": "p", "in": one}}

        await self.jobs.update_many(
            {"parents_left": {"$in": list(adopted)}, "status": W},
            [{"$set": {"depends_on": swap("depends_on"), "parents_left": swap("parents_left")}}],
        )
        fresh = {
            d["_id"]: Job.from_doc(d)
            for d in await self.jobs.find({"_id": {"$in": [s.job.id for s in out]}}).to_list()
        }
        return [
            Submitted(job=fresh.get(s.job.id, s.job), created=s.created) if s.created else s
            for s in out
        ]

    async def _insert_new(self, docs: Sequence[Doc]) -> set[int]:
        """Insert these new jobs (one unordered `insert_many`); return the indexes refused
        for an idempotency key that is already taken."""
        try:
            await self.jobs.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(err.get("code") != 11000 for err in errors):
                raise
            return {int(err["index"]) for err in errors}
        return set()

    async def _key_holder(self, spec: JobSpec) -> Job | None:
        """The job holding `spec`'s idempotency key, or None if the key is free again: its
        job is gone (retention), or its unique window is over, in which case the key is
        released from that job here, by one conditional write on the server's clock (the
        old job keeps existing, under `released_key`)."""
        key = spec.idempotency_key
        for _ in range(KEY_TRIES):
            doc = await self.jobs.find_one({"idempotency_key": key})
            if doc is None or doc.get("unique_until") is None:
                return Job.from_doc(doc) if doc is not None else None
            released = await self.jobs.update_one(
                key_window_over(doc["_id"], key), release_key(key)
            )
            if released.modified_count:
                return None
            # Not released: its window is still open, or a peer released the key (and
            # maybe took it) meanwhile. Whoever holds it now is the answer.
            holder = await self.jobs.find_one({"idempotency_key": key})
            if holder is None or holder["_id"] == doc["_id"]:
                return Job.from_doc(holder) if holder is not None else None
        raise JobConflict(f"idempotency key {key!r} keeps changing hands")

    async def get(self, job_id: str) -> Job:
        doc = await self.jobs.find_one({"_id": job_id})
        if doc is None:
            raise JobNotFound(job_id)
        return Job.from_doc(doc)

    async def get_many(self, job_ids: Collection[str]) -> dict[str, Job]:
        """The jobs of these ids that exist, by id."""
        docs = await self.jobs.find({"_id": {"$in": list(job_ids)}}).to_list()
        return {d["_id"]: Job.from_doc(d) for d in docs}

    async def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        task: str | None = None,
        queue: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> tuple[list[Job], str | None]:
        """Newest first; `after` is the `next` cursor of the previous page."""
        query: dict[str, Any] = {}
        if status is not None:
            query["status"] = status.value
        if task is not None:
            query["task"] = task
        if queue is not None:
            query["queue"] = queue
        if after is not None:
            query["_id"] = {"$lt": after}
        cursor = self.jobs.find(query).sort("_id", DESCENDING).limit(limit + 1)
        filters = [name for name in ("status", "task", "queue") if name in query]
        if len(filters) == 1:
            # Named, so the plan never depends on the cache: with a million pending jobs,
            # weighing the claim indexes (which hold them all) against this one, on every
            # replanning, is what would make the first page slow.
            cursor = cursor.hint(f"list_{filters[0]}")
        docs = await cursor.to_list()
        jobs = [Job.from_doc(d) for d in docs[:limit]]
        nxt = jobs[-1].id if len(docs) > limit else None
        return jobs, nxt

    async def count_by_status(self) -> dict[str, int]:
        """Jobs per status, in one aggregation."""
        counts = {s.value: 0 for s in JobStatus}
        async for row in await self.jobs.aggregate(
            [{"$group": {"_id": "$status", "n": {"$sum": 1}}}]
        ):
            counts[str(row["_id"])] = int(row["n"])
        return counts

    async def count_by_queue(self) -> dict[str, dict[str, int]]:
        """Jobs per queue and status, in one aggregation; queues in name order."""
        rows = await (
            await self.jobs.aggregate(
                [
                    {
                        "$group": {
                            "_id": {
                                "queue": {"$ifNull": ["$queue", DEFAULT_QUEUE]},
                                "status": "$status",
                            },
                            "n": {"$sum": 1},
                        }
                    }
                ]
            )
        ).to_list()
        counts: dict[str, dict[str, int]] = {}
        for row in rows:
            queue = str(row["_id"]["queue"])
            counts.setdefault(queue, {s.value: 0 for s in JobStatus})
            counts[queue][str(row["_id"]["status"])] = int(row["n"])
        return dict(sorted(counts.items()))

    # -- dispatcher operations -------------------------------------------------------------

    async def claim(
        self,
        owner: str,
        lease_seconds: float,
        *,
        tasks: Collection[str] | None = None,
        queue: str | None = None,
        exclude: Collection[str] = (),
        among: Collection[str] | None = None,
    ) -> Job | None:
        """Lease the best due pending job (of these tasks, in this queue) to `owner`;
        `attempts` + 1 is the new fencing token."""
        doc = await self.jobs.find_one_and_update(
            claim_filter(tasks, queue, exclude, among),
            [{"$set": _claimed(owner, lease_seconds)}],
            sort=CLAIM_SORT,
            hint=claim_index(tasks, queue, among),
            return_document=ReturnDocument.AFTER,
        )
        return Job.from_doc(doc) if doc is not None else None

    async def claim_many(
        self,
        owner: str,
        lease_seconds: float,
        limit: int,
        *,
        tasks: Collection[str] | None = None,
        queue: str | None = None,
        exclude: Collection[str] = (),
        among: Collection[str] | None = None,
    ) -> tuple[list[Job], bool]:
        """Lease up to `limit` of the best due pending jobs with one write; also say whether
        fewer than `limit` were due (the queue ran dry, as opposed to losing races).

        Concurrent `findOneAndUpdate`s all race for the same first job (write conflicts the
        server retries); this picks the candidates, claims those still pending in a single
        `update_many` tagged with a fresh token, and reads back exactly what it won. Another
        dispatcher may win some of them; it never claims one twice.
        """
        candidates = await self.jobs.find(
            claim_filter(tasks, queue, exclude, among),
            sort=CLAIM_SORT,
            limit=limit,
            hint=claim_index(tasks, queue, among),
        ).to_list()
        if not candidates:
            return [], True
        ids = [d["_id"] for d in candidates]
        tag = secrets.token_hex(8)
        # Each candidate at the attempt number it was read with: one claimed and handed
        # back meanwhile is not taken here, so a full match means every job is as read.
        as_read = [{"_id": d["_id"], "attempts": d.get("attempts", 0)} for d in candidates]
        res = await self.jobs.update_many(
            {"$or": as_read, **CLAIM_FILTER},
            [{"$set": {**_claimed(owner, lease_seconds), "claim_tag": tag}}],
        )
        dry = len(candidates) < limit
        if res.modified_count == len(ids):
            # Won them all (the usual case): every candidate was pending when the update
            # matched it, so its claim took attempt + 1; no read-back needed.
            return [_as_claimed(d, owner) for d in candidates], dry
        won = await self.jobs.find(
            {"_id": {"$in": ids}, "claim_tag": tag, "owner": owner, "status": R}
        ).to_list()
        won.sort(key=lambda d: (-d["priority"], d["run_at"], d["_id"]))
        return [Job.from_doc(d) for d in won], dry

    async def next_due(
        self,
        *,
        tasks: Collection[str] | None = None,
        queues: Collection[str] | None = None,
        exclude: Collection[str] = (),
        after: datetime | None = None,
    ) -> datetime | None:
        """The earliest `run_at` among pending jobs of these tasks and queues (the
        dispatcher's timer; None: any), but not in `exclude` (queues that cannot start a
        job now: paused, or waiting for a slot or their rate window) and, with `after`, not
        before it (so a backlog already due in those queues is not even scanned)."""
        query: dict[str, Any] = {"status": P}
        if tasks is not None:
            query["task"] = {"$in": sorted(tasks)}
        if queues is not None:
            query["queue"] = {"$in": sorted(set(queues) - set(exclude))}
        elif exclude:
            query["queue"] = {"$nin": sorted(exclude)}
        if after is not None:
            query["run_at"] = {"$gt": after}
        doc = await self.jobs.find_one(
            query, projection={"run_at": 1}, sort=[("run_at", ASCENDING)]
        )
        return doc["run_at"] if doc is not None else None

    async def server_now(self) -> datetime:
        hello = await self.db.client.admin.command("hello")
        now: datetime = hello["localTime"]
        # A wrapped application client may not decode datetimes as aware ones.
        return now if now.tzinfo is not None else now.replace(tzinfo=UTC)

    async def server_clock(self) -> datetime:
        """The server's time now, read from this process's monotonic clock and an offset
        measured with one `hello` at most every CLOCK_REFRESH_S (not one per batch), so a
        step of the local wall clock changes nothing. It errs early, never late: the server
        read its clock at some moment of the round trip, so the offset taken is the
        smallest that reading allows, and a job stamped with it is due when it lands."""
        if time.monotonic() - self._clock_read_at > CLOCK_REFRESH_S:
            server = (await self.server_now()).replace(tzinfo=UTC)
            self._clock_read_at = time.monotonic()
            self._clock_offset = server.timestamp() - self._clock_read_at
        return whole_ms(datetime.fromtimestamp(time.monotonic() + self._clock_offset, UTC))

    async def renew(self, owner: str, leases: Sequence[Lease], lease_seconds: float) -> set[str]:
        """Extend every lease `owner` still holds in one write; return the job ids it lost."""
        if not leases:
            return set()
        ids = [{"_id": lease.job_id, "attempts": lease.attempt} for lease in leases]
        held = {"owner": owner, "status": R, "$or": ids}
        # An attempt with its own transaction open renewed its lease for it, and must not
        # be written meanwhile (`transaction_opened`): it is held, not renewed.
        renewable = {
            **held,
            "$or": [
                {"_id": lease.job_id, "attempts": a, **not_in_transaction(a)}
                for lease in leases
                for a in [lease.attempt]
            ],
        }
        res = await self.jobs.update_many(
            renewable, [{"$set": {"lease_expires_at": _after(lease_seconds * 1000)}}]
        )
        if res.matched_count == len(leases):
            return set()
        # Not lost either: a job its attempt completed itself, in its own transaction, an
        # instant before its worker says so.
        done = {"status": JobStatus.COMPLETED.value, "$or": ids}
        still = await self.jobs.find({"$or": [held, done]}, projection={"_id": 1}).to_list()
        kept = {d["_id"] for d in still}
        return {lease.job_id for lease in leases} - kept

    async def complete_many(
        self,
        owner: str,
        items: Sequence[tuple[Lease, Any]],
        *,
        ran: Mapping[str, RunTimes] | None = None,
    ) -> Completions:
        """Fenced completions in one round trip (one `bulk_write`, one majority wait);
        `ran` gives the attempts' real start and end times by job id.

        Says which jobs this call (or an earlier try of it, cut off by a failover)
        completed, which ones MongoDB refused with the reason (e.g. a document too large),
        and which completed jobs have dependents to settle. A job in neither of the first
        two had lost its lease: another attempt or owner holds it.
        """
        # One causally consistent session: after a write-concern error (the write applied on
        # the primary but its majority wait failed) the read-back waits until the write is
        # majority-committed (or gone), instead of reading the old state and calling the
        # job lost when it is in fact completed.
        async with self.db.client.start_session(causal_consistency=True) as session:
            times = ran or {}
            refused = await self._write_completions(owner, items, times, session)
            if refused is None:
                done = {lease.job_id for lease, _ in items}
                parents = {lease.job_id for lease, _ in items if lease.has_dependents}
                return Completions(done=done, refused={}, parents=parents)
            docs = await self._completion_states(items, session)
            # A completion that did not know of dependents is fenced on there being none: a
            # child attached after the claim (its submitter saw this job still running) made
            # it match nothing. Complete those again, knowing; the caller settles the children.
            late = [
                (replace(lease, has_dependents=True), result)
                for lease, result in items
                if (d := docs.get(lease.job_id)) is not None
                and not lease.has_dependents
                and d.get("has_dependents") is True
                and (d["status"], d["attempts"], d.get("owner")) == (R, lease.attempt, owner)
            ]
            if late:
                refused.update(await self._write_completions(owner, late, times, session) or {})
                docs = await self._completion_states(items, session)
        # Which ones are ours? A completed job with our attempt number can only be ours:
        # every claim takes a new attempt number.
        wanted = {lease.job_id: lease.attempt for lease, _ in items}
        done = {
            job_id
            for job_id, d in docs.items()
            if d["status"] == JobStatus.COMPLETED.value and d["attempts"] == wanted[job_id]
        }
        return Completions(
            done=done,
            refused={k: v for k, v in refused.items() if k not in done},
            parents={job_id for job_id in done if docs[job_id].get("has_dependents") is True},
        )

    async def _write_completions(
        self,
        owner: str,
        items: Sequence[tuple[Lease, Any]],
        times: Mapping[str, RunTimes],
        session: AsyncClientSession,
    ) -> dict[str, str] | None:
        """Fenced completions in one write: None if every one matched, else the ids MongoDB
        refused, with the reason (an empty dict: some matched nothing, or the write's
        majority wait failed; the caller reads their states back).

        Several go in one `update_many` whose values are picked per job by `_id`: about
        half the server's work of as many single-document updates (a retryable write per
        document). One MongoDB refuses (too large, say) stops that write part-way: they are
        then written one statement each (those done already match nothing), to learn which."""
        if len(items) > 1:
            try:
                res = await self.jobs.update_many(
                    *completions_by_id(owner, items, self.retention_s, times), session=session
                )
                return None if res.matched_count == len(items) else {}
            except WriteConcernError:
                return {}
            except (WriteError, DocumentTooLarge):
                pass
        return await self._write_each_completion(owner, items, times, session)

    async def _write_each_completion(
        self,
        owner: str,
        items: Sequence[tuple[Lease, Any]],
        times: Mapping[str, RunTimes],
        session: AsyncClientSession,
    ) -> dict[str, str] | None:
        """One `bulk_write` of fenced completions, one statement each."""
        ops = [
            UpdateOne(
                {
                    **running_fence(lease, owner),
                    **({} if lease.has_dependents else {"has_dependents": {"$ne": True}}),
                },
                [{"$set": _completed(lease, result, self.retention_s, times.get(lease.job_id))}],
            )
            for lease, result in items
        ]
        refused: dict[str, str] = {}
        try:
            res = await self.jobs.bulk_write(ops, ordered=False, session=session)
            if res.matched_count == len(ops):
                return None
        except BulkWriteError as exc:
            for err in exc.details.get("writeErrors", []):
                refused[items[err["index"]][0].job_id] = str(err.get("errmsg", ""))[:2000]
        return refused

    async def _completion_states(
        self, items: Sequence[tuple[Lease, Any]], session: AsyncClientSession
    ) -> dict[str, Doc]:
        docs = await self.jobs.find(
            {"_id": {"$in": [lease.job_id for lease, _ in items]}},
            projection={"status": 1, "attempts": 1, "owner": 1, "has_dependents": 1},
            session=session,
        ).to_list()
        return {d["_id"]: d for d in docs}

    async def fail_attempt(
        self,
        lease: Lease,
        owner: str,
        error: Mapping[str, Any],
        retry_delay_s: float,
        *,
        final: bool = False,
        ran: RunTimes | None = None,
    ) -> Job:
        """End a failed attempt: back to pending after `retry_delay_s` while attempts remain,
        else `failed`; a job whose cancel was requested becomes `cancelled`. `ran`: when its
        task really started and ended."""
        return await self._end_attempt(
            {"_id": lease.job_id, "attempts": lease.attempt, "owner": owner, "status": R},
            error,
            retry_delay_s,
            final=final,
            ran=ran,
        )

    async def completed_by(self, lease: Lease) -> bool:
        """Whether this attempt completed the job itself (in its own transaction): every claim
        takes a new attempt number, so a job completed at this number was completed by it."""
        doc = await self.jobs.find_one(
            {"_id": lease.job_id, "attempts": lease.attempt, "status": JobStatus.COMPLETED.value},
            projection={"_id": 1},
        )
        return doc is not None

    async def kill_sessions(self, session_ids: Sequence[Mapping[str, Any]]) -> None:
        """End these server sessions, aborting any transaction they left open (a worker that
        died or was killed mid-transaction): its locks go at once, not at the server's
        `transactionLifetimeLimitSeconds`, and nothing it wrote can commit afterwards."""
        if session_ids:
            await self.db.client.admin.command("killSessions", list(session_ids))

    async def cancel_running(self, lease: Lease, owner: str, *, ran: RunTimes | None = None) -> Job:
        """The holder stopped the worker of a job whose cancel was requested (`ran`: when its
        task started and was stopped), or dropped it before its task started (no `ran`)."""
        message = "cancelled while running" if ran else "cancelled before its task started"
        return await self._fenced(
            lease,
            owner,
            {
                "status": JobStatus.CANCELLED.value,
                **(_ran(ran) if ran else {"finished_at": NOW}),
                "expire_at": _expiry(self.retention_s),
                "updated_at": NOW,
                "owner": None,
                "lease_expires_at": None,
                "error": _lit({"type": "Cancelled", "message": message}),
                **_history(
                    {"status": JobStatus.CANCELLED.value, "at": NOW, "attempt": lease.attempt}
                ),
            },
        )

    async def release(self, lease: Lease, owner: str) -> Job:
        """Graceful shutdown: hand a running job back at once. The interrupted attempt is not
        the job's fault, so it is not counted; the worker was stopped before this write (or
        the job was only claimed ahead). It keeps its `run_at`: it was due when claimed, so
        it is due now, in its place in the claim order (and a scheduled job keeps its tick)."""
        cancelled = {"$eq": ["$cancel_requested", True]}
        status = {"$cond": [cancelled, JobStatus.CANCELLED.value, P]}
        return await self._fenced(
            lease,
            owner,
            {
                "status": status,
                "attempts": {"$cond": [cancelled, "$attempts", {"$add": ["$attempts", -1]}]},
                "finished_at": {"$cond": [cancelled, NOW, None]},
                "expire_at": {"$cond": [cancelled, _expiry(self.retention_s), "$$REMOVE"]},
                "updated_at": NOW,
                "owner": None,
                "lease_expires_at": None,
                **_history(
                    {"status": status, "at": NOW, "attempt": lease.attempt, "reason": "released"}
                ),
            },
        )

    async def expired(self, limit: int = 100) -> list[ExpiredLease]:
        """Running jobs whose lease is over by the server's clock."""
        docs = await self.jobs.find(
            {"status": R, "$expr": {"$lt": ["$lease_expires_at", NOW]}},
            projection={"_id": 1, "attempts": 1, "owner": 1, "task": 1, "tx": 1},
            limit=limit,
        ).to_list()
        return [
            ExpiredLease(
                job_id=str(d["_id"]),
                attempt=d["attempts"],
                task=d["task"],
                owner=d["owner"],
                tx_session=_session_of(d, d["attempts"]),
            )
            for d in docs
        ]

    async def requeue_expired(self, lease: ExpiredLease, retry_delay_s: float) -> Job:
        """Watchdog: the holder of this lease died or froze; count the attempt and retry or
        fail. An attempt whose task is not known to have started (no `started_at`: it was
        claimed ahead, or started under MARK_AFTER_S before) keeps its number, the fencing
        token, but does not use up the job's attempts: `max_attempts` grows by one."""
        return await self._end_attempt(
            {
                "_id": lease.job_id,
                "attempts": lease.attempt,
                "owner": lease.owner,
                "status": R,
                "$expr": {"$lt": ["$lease_expires_at", NOW]},
            },
            {"type": "LeaseExpired", "message": f"lease of {lease.owner} expired"},
            retry_delay_s,
            unstarted_free=True,
        )

    async def cancel_requested(self, owner: str, job_ids: Sequence[str]) -> list[str]:
        """Which of these jobs `owner` holds have a cancel request (a missed event's backup)."""
        if not job_ids:
            return []
        docs = await self.jobs.find(
            {"_id": {"$in": list(job_ids)}, "owner": owner, "cancel_requested": True},
            projection={"_id": 1},
        ).to_list()
        return [str(d["_id"]) for d in docs]

    # -- a caller's operations on one job --------------------------------------------------

    async def cancel(self, job_id: str) -> Job:
        """Waiting or pending → cancelled at once; running → `cancel_requested` (its holder
        stops it). A cancelled parent's dependents are the caller's to settle."""
        for _ in range(5):
            doc = await self.jobs.find_one_and_update(
                {"_id": job_id, "status": {"$in": [W, P]}},
                [
                    {
                        "$set": {
                            "status": JobStatus.CANCELLED.value,
                            "finished_at": NOW,
                            "expire_at": _expiry(self.retention_s),
                            "updated_at": NOW,
                            **_history(
                                {
                                    "status": JobStatus.CANCELLED.value,
                                    "at": NOW,
                                    "attempt": "$attempts",
                                }
                            ),
                        }
                    }
                ],
                return_document=ReturnDocument.AFTER,
            )
            if doc is not None:
                return Job.from_doc(doc)
            doc = await self.jobs.find_one_and_update(
                {"_id": job_id, "status": R},
                [{"$set": {"cancel_requested": True, "updated_at": NOW}}],
                return_document=ReturnDocument.AFTER,
            )
            if doc is not None:
                return Job.from_doc(doc)
            await self._must_be_active(job_id)
        raise JobConflict(f"job {job_id} kept changing state; try again")  # pragma: no cover

    async def _must_be_active(self, job_id: str) -> None:
        current = await self.jobs.find_one({"_id": job_id}, projection={"status": 1})
        if current is None:
            raise JobNotFound(job_id)
        if JobStatus(current["status"]) in TERMINAL:
            raise JobConflict(f"job {job_id} is already {current['status']}")

    async def retry(self, job_id: str, waiting_on: Sequence[str] = ()) -> Job:
        """A failed or cancelled job back to `pending`, due now, with its attempt budget
        renewed and its history kept; any other state is a conflict. With `waiting_on`
        (parents that have not completed) it goes back to `waiting` for them instead."""
        doc = await self.jobs.find_one_and_update(
            {"_id": job_id, "status": {"$in": sorted(s.value for s in RETRYABLE)}},
            [{"$set": _retried(waiting_on)}],
            return_document=ReturnDocument.AFTER,
        )
        if doc is not None:
            return Job.from_doc(doc)
        current = await self.jobs.find_one({"_id": job_id}, projection={"status": 1})
        if current is None:
            raise JobNotFound(job_id)
        raise JobConflict(
            f"job {job_id} is {current['status']}; only failed or cancelled jobs can be retried"
        )

    async def job_changes(self, job_id: str, *, max_await_ms: int) -> AsyncChangeStream[Doc]:
        """A change stream of one job's status changes and of its deletion (open it with
        `async with`). It carries only wake-ups: the job is read again after each."""
        changed = "updateDescription.updatedFields.status"
        return await self.jobs.watch(
            [
                {
                    "$match": {
                        "documentKey._id": job_id,
                        "$or": [
                            {"operationType": "update", changed: {"$exists": True}},
                            {"operationType": {"$in": ["replace", "delete", *INVALIDATING]}},
                        ],
                    }
                },
                {"$project": {"operationType": 1, "documentKey": 1}},
            ],
            max_await_time_ms=max_await_ms,
        )

    # -- change stream -------------------------------------------------------------------------

    async def changes(
        self,
        pipeline: Sequence[Mapping[str, Any]],
        *,
        resume_after: Mapping[str, Any] | None,
        max_await_ms: int,
        full_document: str | None = None,
    ) -> AsyncChangeStream[Doc]:
        """A change stream on the jobs collection (open it with `async with`)."""
        return await self.jobs.watch(
            list(pipeline),
            resume_after=resume_after,
            max_await_time_ms=max_await_ms,
            full_document=full_document,
        )

    async def new_pending(self, tasks: Collection[str], *, max_await_ms: int) -> AsyncCursor[Doc]:
        """A tailable cursor on the primary's oplog, from its end: each pending job of
        `tasks` inserted from now on, as the primary writes it, a replication round before
        a change stream shows it (a stream shows only majority-committed changes). Each
        entry is `{"ts", "o": {"_id", "task", "queue", "run_at", "priority"}}`. A hint, not a
        fact: such an insert may still be rolled back by a failover."""
        oplog = self.db.client.get_database(
            "local", codec_options=self.db.codec_options, read_concern=ReadConcern("local")
        )["oplog.rs"]
        newest = await oplog.find({}, {"ts": 1}).sort("$natural", -1).limit(1).to_list()
        query: dict[str, Any] = {
            "ns": f"{self.db.name}.{JOBS}",
            "op": "i",
            "o.status": P,
            "o.task": {"$in": sorted(tasks)},
        }
        if newest:
            query["ts"] = {"$gt": newest[0]["ts"]}
        fields = {"ts": 1, **{f"o.{k}": 1 for k in ("_id", "task", "queue", "run_at", "priority")}}
        cursor = oplog.find(query, fields, cursor_type=CursorType.TAILABLE_AWAIT)
        return cursor.max_await_time_ms(max_await_ms)

    # -- resume tokens -----------------------------------------------------------------------

    async def load_token(self, name: str, version: str) -> Mapping[str, Any] | None:
        doc = await self.state.find_one({"_id": f"stream:{name}"})
        if doc is None or doc.get("version") != version:
            return None
        token: Mapping[str, Any] | None = doc.get("token")
        return token

    async def save_token(self, name: str, version: str, token: Mapping[str, Any]) -> None:
        await self.state.update_one(
            {"_id": f"stream:{name}"},
            {"$set": {"token": token, "version": version}, "$currentDate": {"saved_at": True}},
            upsert=True,
        )

    async def drop_token(self, name: str) -> None:
        await self.state.delete_one({"_id": f"stream:{name}"})

    # -- dispatcher presence -------------------------------------------------------------------

    async def announce(
        self,
        owner: str,
        *,
        name: str,
        tasks: Collection[str],
        queues: Mapping[str, int] | None,
        lease_seconds: float,
    ) -> None:
        """Publish (or refresh) what this dispatcher runs: clients and the API check task
        names against the live dispatchers' tasks."""
        await self.dispatchers.update_one(
            {"_id": owner},
            [
                {
                    "$set": {
                        "name": _lit(name),
                        "tasks": _lit(sorted(tasks)),
                        "queues": _lit(dict(queues) if queues is not None else None),
                        "lease_seconds": lease_seconds,
                        "started_at": {"$ifNull": ["$started_at", NOW]},
                        "seen_at": NOW,
                    }
                }
            ],
            upsert=True,
        )

    async def seen(self, owner: str) -> bool:
        """The dispatcher is alive (its heartbeat); False if its document is gone."""
        res = await self.dispatchers.update_one({"_id": owner}, [{"$set": {"seen_at": NOW}}])
        return res.matched_count == 1

    async def retire(self, owner: str) -> None:
        await self.dispatchers.delete_one({"_id": owner})

    async def live_dispatchers(self) -> list[LiveDispatcher]:
        """Dispatchers seen within LIVE_LEASES of their lease length, by the server's clock."""
        docs = await self.dispatchers.find(live_query()).to_list()
        return [LiveDispatcher.from_doc(d) for d in docs]

    # -- internals -----------------------------------------------------------------------------

    async def _fenced(self, lease: Lease, owner: str, fields: dict[str, Any]) -> Job:
        doc = await self.jobs.find_one_and_update(
            {"_id": lease.job_id, "attempts": lease.attempt, "owner": owner, "status": R},
            [{"$set": fields}],
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            raise LeaseLost(
                f"job {lease.job_id} attempt {lease.attempt} is no longer held by {owner}"
            )
        return Job.from_doc(doc)

    async def ended_by_holder(self, lease: Lease) -> Job | None:
        """A fenced write that ends an attempt found it no longer held: the job, if that
        attempt was ended by its holder after all (an earlier try of the same write
        applied, and its reply was lost to a failover); None if the watchdog ended it, or
        nothing did. Only the holder and the watchdog end an attempt, and the watchdog's
        history entry says `LeaseExpired`."""
        doc = await self.jobs.find_one({"_id": lease.job_id})
        if doc is None:
            return None
        mine = [h for h in doc.get("history") or [] if h.get("attempt") == lease.attempt]
        if not mine or mine[-1].get("status") == R or mine[-1].get("error") == "LeaseExpired":
            return None
        return Job.from_doc(doc)

    async def _end_attempt(
        self,
        query: dict[str, Any],
        error: Mapping[str, Any],
        retry_delay_s: float,
        *,
        final: bool = False,
        ran: RunTimes | None = None,
        unstarted_free: bool = False,
    ) -> Job:
        times = _ran(ran) if ran is not None else {}
        ended: Any = times.get("finished_at", NOW)
        started = {"started_at": times["started_at"]} if ran is not None else {}
        again = {"$eq": ["$status", P]}
        doc = await self.jobs.find_one_and_update(
            query,
            [
                *_attempt_budget(unstarted_free),
                {"$set": {"status": _ended_status(final)}},
                {
                    "$set": {
                        "error": _lit(dict(error)),
                        "run_at": {"$cond": [again, _after(retry_delay_s * 1000), "$run_at"]},
                        **started,
                        "finished_at": {"$cond": [again, None, ended]},
                        "expire_at": {"$cond": [again, "$$REMOVE", _expiry(self.retention_s)]},
                        "updated_at": NOW,
                        "owner": None,
                        "lease_expires_at": None,
                        **_history(
                            {
                                "status": "$status",
                                "at": NOW,
                                "attempt": "$attempts",
                                "error": _lit(error.get("type")),
                            }
                        ),
                    }
                },
            ],
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            raise LeaseLost(f"job {query['_id']} attempt {query['attempts']} is no longer held")
        return Job.from_doc(doc)

    # -- limited queues (the slots themselves: `common.store.queues`) ------------------------

    async def pending_queues(self) -> set[str]:
        """The queues that hold pending jobs (one distinct scan of `claim_by_queue`)."""
        return {str(q) for q in await self.jobs.distinct("queue", {"status": P})}

    async def candidates(
        self, limit: int, *, tasks: Collection[str] | None, queue: str
    ) -> list[str]:
        """The ids of the best due pending jobs of these tasks in `queue`, at most `limit`:
        what a claim in a limited queue takes its slots for."""
        docs = await self.jobs.find(
            claim_filter(tasks, queue),
            projection={"_id": 1},
            sort=CLAIM_SORT,
            limit=limit,
            hint=claim_index(tasks, queue),
        ).to_list()
        return [str(d["_id"]) for d in docs]

    async def claim_tagged(
        self, owner: str, lease_seconds: float, ids: Sequence[str], tag: str, before: datetime
    ) -> list[Job]:
        """Lease those of these jobs still due and pending, each marked with the claim's `tag`
        (its slots carry it too), but only while the server's clock is before `before` (the
        slots' `claim_by`): after it the slots may have been freed, and no claim may use them."""
        if not ids:
            return []
        due = {"$lte": ["$run_at", NOW]}
        in_time = {"$lt": [NOW, _lit(before)]}
        query = {"_id": {"$in": list(ids)}, "status": P, "$expr": {"$and": [due, in_time]}}
        update = [{"$set": {**_claimed(owner, lease_seconds), "claim_tag": _lit(tag)}}]
        if len(ids) == 1:  # one round trip, and a retryable write
            doc = await self.jobs.find_one_and_update(
                query, update, return_document=ReturnDocument.AFTER
            )
            return [Job.from_doc(doc)] if doc is not None else []
        await self.jobs.update_many(query, update)
        won = await self.jobs.find(
            {"_id": {"$in": list(ids)}, "claim_tag": tag, "owner": owner, "status": R}
        ).to_list()
        won.sort(key=lambda d: (-d["priority"], d["run_at"], d["_id"]))
        return [Job.from_doc(d) for d in won]

    # -- progress (a running attempt reports how far it got) ---------------------------------

    async def set_progress_many(
        self, owner: str, items: Sequence[tuple[Lease, float, str | None]]
    ) -> set[str]:
        """Write each attempt's latest progress in one round trip, fenced like every other
        write of a running job (`_id`, attempt, owner, running): a stale attempt's progress
        matches nothing. Returns the job ids written."""
        ops = [
            UpdateOne(
                # Not while the attempt's own transaction is open: it writes the last report
                # with its completion (`transaction_opened`).
                {**running_fence(lease, owner), **not_in_transaction(lease.attempt)},
                [
                    {
                        "$set": {
                            "progress": {
                                "fraction": _lit(fraction),
                                "message": _lit(message),
                                "at": NOW,
                                "attempt": lease.attempt,
                            }
                        }
                    }
                ],
            )
            for lease, fraction, message in items
        ]
        if not ops:
            return set()
        res = await self.jobs.bulk_write(ops, ordered=False)
        if res.matched_count == len(ops):
            return {lease.job_id for lease, _, _ in items}
        wanted = {lease.job_id: lease.attempt for lease, _, _ in items}
        held = await self.jobs.find(
            {"_id": {"$in": list(wanted)}, "owner": owner, "status": R},
            projection={"attempts": 1},
        ).to_list()
        return {d["_id"] for d in held if d["attempts"] == wanted[d["_id"]]}

    # -- a long task's start (a short one's is written with its outcome) ---------------------

    async def mark_started(self, owner: str, items: Sequence[tuple[Lease, datetime]]) -> None:
        """Record when these attempts' tasks started, in one round trip, fenced like every
        write of a running job; an attempt already ended or lost matches nothing."""
        ops = [
            UpdateOne(
                {
                    **running_fence(lease, owner),
                    "started_at": None,
                    # never into an attempt's own open transaction (a write conflict there
                    # would abort the task's work)
                    **not_in_transaction(lease.attempt),
                },
                [{"$set": {"started_at": _within_lease(started_at)}}],
            )
            for lease, started_at in items
        ]
        if ops:
            await self.jobs.bulk_write(ops, ordered=False)

    # -- workflows: when a parent ends, its waiting dependents are settled -----------------
    #
    # A child is inserted `waiting` with `depends_on` (its parents, for good) and
    # `parents_left` (those not ended yet). A parent gets `has_dependents` (its completion
    # settles its children) and `unsettled` (a token: its children may still wait on it;
    # the sweep's backstop, and it keeps the parent from expiring). Settling a parent's
    # children is one conditional `update_many` per page of 1,000 children, whatever the
    # fan-out, then one write that clears the parents' `unsettled` tokens.

    async def missing_jobs(self, job_ids: Collection[str]) -> set[str]:
        """Which of these ids name no job (unknown parents)."""
        if not job_ids:
            return set()
        found = await self.jobs.find(
            {"_id": {"$in": list(job_ids)}}, projection={"_id": 1}
        ).to_list()
        return set(job_ids) - {d["_id"] for d in found}

    async def attach_dependents(self, parent_ids: Collection[str]) -> None:
        """Mark these jobs as parents with dependents not settled yet. A parent that ended
        already loses its `expire_at` until they are (`mark_settled` sets it again)."""
        await self.jobs.update_many(
            {"_id": {"$in": list(parent_ids)}},
            {
                "$set": {"has_dependents": True, "unsettled": secrets.token_hex(8)},
                "$unset": {"expire_at": ""},
            },
        )

    async def ended_parents(self, parent_ids: Collection[str]) -> list[EndedParent]:
        """Which of these jobs have ended: finished (with their `unsettled` token), or gone
        (deleted), which their dependents take as a failure."""
        docs = await self.jobs.find(
            {"_id": {"$in": list(parent_ids)}}, projection={"status": 1, "unsettled": 1}
        ).to_list()
        found = {d["_id"] for d in docs}
        ended = [
            EndedParent(job_id=d["_id"], status=JobStatus(d["status"]), token=d.get("unsettled"))
            for d in docs
            if JobStatus(d["status"]) in TERMINAL
        ]
        gone = [
            EndedParent(job_id=i, status=None, token=None) for i in parent_ids if i not in found
        ]
        return ended + gone

    async def settle_children(self, ended: Sequence[EndedParent]) -> list[Settled]:
        """The waiting children of these ended parents forget them; a child left with no
        parent becomes `pending`, and one with a parent that did not complete becomes
        `cancelled` (`DependencyFailed`) unless it runs on parent failure. Returns the
        children whose status this call changed."""
        out: list[Settled] = []
        ids = [p.job_id for p in ended]
        while True:
            page = await self.jobs.find(
                {"parents_left": {"$in": ids}, "status": W},
                projection={"_id": 1},
                limit=SETTLE_PAGE,
                batch_size=SETTLE_PAGE,
                hint="waiting_on",
            ).to_list()
            if not page:
                return out
            children = [d["_id"] for d in page]
            tag = secrets.token_hex(8)
            await self.jobs.update_many(
                {"_id": {"$in": children}, "parents_left": {"$in": ids}, "status": W},
                _settled(ended, tag, self.retention_s),
            )
            changed = await self.jobs.find(
                {"_id": {"$in": children}, "settled.tag": tag},
                projection={"task": 1, "settled": 1, "has_dependents": 1, "error": 1},
                batch_size=SETTLE_PAGE,
            ).to_list()
            out += [Settled.from_doc(d) for d in changed]
            if len(page) < SETTLE_PAGE:
                return out

    async def mark_settled(self, ended: Sequence[EndedParent]) -> None:
        """Clear the `unsettled` token of these finished parents, unless a child attached
        since it was read (a new token), and start their retention from now."""
        ops = [
            UpdateOne(
                {"_id": p.job_id, "unsettled": p.token, "status": {"$in": ENDED}},
                [{"$unset": "unsettled"}, {"$set": {"expire_at": _expiry(self.retention_s)}}],
            )
            for p in ended
            if p.token is not None
        ]
        if ops:
            await self.jobs.bulk_write(ops, ordered=False)

    async def unsettled_parents(self, limit: int = 1000) -> list[str]:
        """Finished parents whose dependents were not settled (say, the dispatcher that
        completed them died first): the sweep settles them."""
        docs = await self.jobs.find(
            {"unsettled": {"$exists": True}, "status": {"$in": ENDED}},
            projection={"_id": 1},
            limit=limit,
            hint="dependents_unsettled",
        ).to_list()
        return [d["_id"] for d in docs]

    async def parent_results(self, job_id: str) -> dict[str, Any]:
        """`{parent id: its result}` for this job's parents, in `depends_on` order (a parent
        deleted meanwhile is left out; one that failed has a null result)."""
        doc = await self.jobs.find_one({"_id": job_id}, projection={"depends_on": 1})
        if doc is None:
            raise JobNotFound(job_id)
        parents: list[str] = list(doc.get("depends_on") or [])
        if not parents:
            return {}
        found = await self.jobs.find(
            {"_id": {"$in": parents}}, projection={"result": 1}
        ).to_list()
        results = {d["_id"]: d.get("result") for d in found}
        return {p: results[p] for p in parents if p in results}

    # -- live events ---------------------------------------------------------------------------
    # What the API's event streams read: post-images on the change stream, a job's raw
    # document, and the current state after a client lost its history.

    async def enable_post_images(self) -> None:
        """Have the change stream carry each job as that change left it (a post-image), not
        as a later lookup finds it. Idempotent; creates the collection if need be."""
        try:
            await self.db.command("collMod", JOBS, changeStreamPreAndPostImages={"enabled": True})
        except OperationFailure as exc:
            if exc.code != 26:  # NamespaceNotFound
                raise
            options: dict[str, Any] = {"changeStreamPreAndPostImages": {"enabled": True}}
            try:
                await self.db.create_collection(JOBS, **options)
            except CollectionInvalid:  # a peer created it meanwhile
                await self.enable_post_images()

    async def job_doc(self, job_id: str) -> Doc | None:
        """The job's stored document, fields this version's `Job` does not know included."""
        return await self.jobs.find_one({"_id": job_id})

    async def job_doc_now(self, job_id: str) -> tuple[Doc | None, Timestamp | None]:
        """The job's stored document and the cluster time it was read at: every change up
        to that time is in it."""
        async with self.db.client.start_session(causal_consistency=True) as session:
            doc = await self.jobs.find_one({"_id": job_id}, session=session)
            return doc, session.operation_time

    async def changed_since(
        self,
        since: datetime,
        *,
        job_id: str | None = None,
        queue: str | None = None,
        task: str | None = None,
        status: JobStatus | None = None,
        limit: int = 500,
    ) -> list[Doc]:
        """Jobs changed at or after `since`, oldest change first (a client's catch-up after its
        history was lost; rare, and not indexed: it scans what the other filters leave)."""
        query: dict[str, Any] = {"updated_at": {"$gte": since}}
        if job_id is not None:
            query["_id"] = job_id
        if queue is not None:
            query["queue"] = {"$in": [queue, None]} if queue == DEFAULT_QUEUE else queue
        if task is not None:
            query["task"] = task
        if status is not None:
            query["status"] = status.value
        return await self.jobs.find(query).sort("updated_at", ASCENDING).limit(limit).to_list()
