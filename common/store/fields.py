"""The pieces the jobs collection's updates are built of (`brook.common.store.queries` puts them
together into named writes; the queue and presence stores share `lit` and `NOW`):
user data as literals, times on the server's clock, the capped history, a new job's fields,
and the fields each transition sets. Pure: nothing here touches MongoDB.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from brook.common.domain.models import DEBOUNCE_MAX_FACTOR, Doc, Job, JobSpec, whole_ms
from brook.common.domain.status import JobStatus
from brook.common.store.records import Lease, RunTimes

HISTORY_CAP = 50
NOW = "$$NOW"
P, R = JobStatus.PENDING.value, JobStatus.RUNNING.value
W = JobStatus.WAITING.value
C = JobStatus.CANCELLED.value


def lit(value: Any) -> dict[str, Any]:
    """User data inside an update pipeline must never be read as an expression or field path."""
    return {"$literal": value}


def after(ms: float) -> dict[str, Any]:
    return {"$add": [NOW, int(ms)]}


def history(entry: dict[str, Any]) -> dict[str, Any]:
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


def expiry(default_retention_s: float) -> dict[str, Any]:
    """When a job finishing now is to be deleted: its own `retention_s`, else the default.
    Never while it is a parent whose dependents are not settled yet (`unsettled`): they
    are to read its result. Settling them sets its `expire_at` (`mark_settled`)."""
    seconds = {"$ifNull": ["$retention_s", default_retention_s]}
    at = {"$add": [NOW, {"$toLong": {"$multiply": [seconds, 1000]}}]}
    return {"$cond": [{"$eq": [{"$type": "$unsettled"}, "missing"]}, at, "$$REMOVE"]}


def new_job(
    spec: JobSpec, now: datetime | None = None, parents: Sequence[str] = ()
) -> dict[str, Any]:
    """A new job's fields: pending, or waiting for `parents` (job ids). Without `now`: `$set`
    expressions for an update pipeline, the server stamping the times (`$$NOW`) and user
    data wrapped in `$literal`. With `now` (the server's time, read just before): the same
    fields as a document to insert as it is."""

    def value(given: Any) -> Any:
        return lit(given) if now is None else given

    def at(ms: float = 0) -> Any:
        if now is None:
            return after(ms) if ms else NOW
        return now + timedelta(milliseconds=int(ms))

    run_at: Any = at()
    if spec.run_at is not None:
        run_at = value(whole_ms(spec.run_at))
    elif spec.delay_s is not None:
        run_at = at(spec.delay_s * 1000)
    status = W if parents else P
    fields: dict[str, Any] = {
        "task": value(spec.task),
        "payload": value(spec.payload),
        "status": status,
        "queue": value(spec.queue),
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
    fields.update(_workflow_fields(spec, parents, value))
    fields.update(_optional_fields(spec, value, at))
    return fields


def _optional_fields(
    spec: JobSpec, value: Callable[[Any], Any], at: Callable[[float], Any]
) -> dict[str, Any]:
    """The fields a job has only when its spec asks for them."""
    fields: dict[str, Any] = {}
    named = {
        "idempotency_key": spec.idempotency_key,
        "schedule": spec.schedule,
        "trigger": spec.trigger,
        "trace": spec.trace,
        "key": spec.key,
        "spawned_by": spec.spawned_by,
        "quotas": spec.quotas,
    }
    fields.update({name: value(given) for name, given in named.items() if given is not None})
    if spec.unique_for_s is not None:
        fields["unique_until"] = at(spec.unique_for_s * 1000)
    if spec.retention_s is not None:
        fields["retention_s"] = spec.retention_s
    for name, given, within in (
        ("start_by", spec.start_by, spec.start_within_s),
        ("deadline", spec.deadline, spec.deadline_s),
    ):
        if given is not None:
            fields[name] = value(whole_ms(given))
        elif within is not None:
            fields[name] = at(within * 1000)
    if spec.debounce_key is not None and spec.debounce_s is not None:
        fields["debounce_key"] = value(spec.debounce_key)
        fields["debounce_open"] = True  # joinable until claimed (`claimed_fields`)
        longest = spec.debounce_max_s or spec.debounce_s * DEBOUNCE_MAX_FACTOR
        fields["debounce_until"] = at(longest * 1000)
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


def claimed_fields(owner: str, lease_seconds: float) -> dict[str, Any]:
    """A lease, not a start: a claimed job may wait in its dispatcher's prefetch buffer, so
    `started_at` stays null until its task really starts (see `RunTimes`)."""
    attempt = {"$add": ["$attempts", 1]}
    return {
        "status": R,
        "owner": lit(owner),
        "attempts": attempt,
        "claimed_at": NOW,
        # `started_at` is the current attempt's: the first start is kept for `start_by`.
        "first_started_at": {"$ifNull": ["$first_started_at", "$started_at"]},
        "started_at": None,
        "updated_at": NOW,
        "lease_expires_at": after(lease_seconds * 1000),
        **history({"status": R, "at": NOW, "attempt": attempt, "owner": lit(owner)}),
        "progress": None,  # a new attempt starts from nothing
        "waiting_for": "$$REMOVE",  # a sleep or a signal wait is over: it runs again
        # A debounced job ran (or runs) with the payload it had: its key's next submit
        # starts a new job, and this one, back to pending for a retry, holds no key.
        "debounce_open": "$$REMOVE",
        "woken_at": "$$REMOVE",
        # A per-key slot is taken by the claims that name one (`QueueLimits.slots_on_jobs`);
        # any other claim drops what an earlier attempt held.
        "key_slot": "$$REMOVE",
    }


def as_claimed(doc: Doc, owner: str) -> Job:
    """A pending job as `claimed_fields` left it (the fields a dispatcher reads of its claim)."""
    return Job.from_doc(
        {
            **doc,
            "status": R,
            "owner": owner,
            "attempts": int(doc.get("attempts", 0)) + 1,
            "claimed_at": None,  # the server's; not read back
            "first_started_at": doc.get("first_started_at") or doc.get("started_at"),
            "started_at": None,
            "progress": None,
        }
    )


def shared_mark(lease: Lease) -> dict[str, Any]:
    """What an attempt's history entry adds when it ran in a shared worker process."""
    return {"shared": True} if lease.shared else {}


def shared_death_budget() -> list[dict[str, Any]]:
    """An attempt ended by the death of its shared worker process (its neighbour may have
    caused it) does not use up one of the job's attempts: `max_attempts` grows by one, the
    rule durable sleeps use. `attempts` still counts it: it is the fencing token."""
    return [{"$set": {"max_attempts": {"$add": ["$max_attempts", 1]}}}]


def attempt_budget(unstarted_free: bool) -> list[dict[str, Any]]:
    """With `unstarted_free`, an attempt whose task is not known to have started does not
    use up one of the job's attempts: `max_attempts` grows by one."""
    if not unstarted_free:
        return []
    unstarted = {"$eq": [{"$ifNull": ["$started_at", None]}, None]}
    grown = {"$cond": [unstarted, {"$add": ["$max_attempts", 1]}, "$max_attempts"]}
    return [{"$set": {"max_attempts": grown}}]


def ended_status(final: bool) -> dict[str, Any]:
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


def within_lease(at: datetime) -> dict[str, Any]:
    """`at` (a dispatcher's reading of the server clock) kept between the attempt's claim
    and now, on the server's clock."""
    return {"$min": [{"$max": [lit(at), "$claimed_at"]}, NOW]}


def ran_times(ran: RunTimes | None) -> dict[str, Any]:
    """`started_at` / `finished_at` of an attempt that ran: the task's own start and end as
    its dispatcher measured them; without them, the time of this write."""
    if ran is None:
        return {"started_at": {"$ifNull": ["$started_at", NOW]}, "finished_at": NOW}
    # Within the attempt's lease, on the server's clock: never before its claim, never after
    # this write (a dispatcher's reading of the server clock errs by a round trip). So a
    # queue's jobs never show more runs at once than the slots they held.
    finished = within_lease(ran.finished_at)
    started = {"$min": [{"$max": [lit(ran.started_at), "$claimed_at"]}, finished]}
    return {"started_at": started, "finished_at": finished}


def completed_fields(
    lease: Lease, result: Any, retention_s: float, ran: RunTimes | None = None
) -> dict[str, Any]:
    """What a completion sets: the result, the run times, the retention, no lease."""
    return {
        "status": JobStatus.COMPLETED.value,
        "result": lit(result),
        "error": None,
        **ran_times(ran),
        "expire_at": expiry(retention_s),
        "updated_at": NOW,
        "owner": None,
        "lease_expires_at": None,
        **history(
            {
                "status": JobStatus.COMPLETED.value,
                "at": NOW,
                "attempt": lease.attempt,
                **shared_mark(lease),
            }
        ),
    }


def retried_fields(waiting_on: Sequence[str]) -> dict[str, Any]:
    """A finished job back to pending (or waiting for the parents in `waiting_on`), with as
    many attempts again as it was submitted with. `attempts` keeps counting: it is the
    fencing token, and must never be reused."""
    status = W if waiting_on else P
    return {
        "status": status,
        "parents_left": lit(list(waiting_on)) if waiting_on else "$$REMOVE",
        "max_attempts": {"$add": ["$attempts", {"$ifNull": ["$attempt_budget", "$max_attempts"]}]},
        "run_at": NOW,
        "finished_at": None,
        "expire_at": "$$REMOVE",
        "updated_at": NOW,
        "owner": None,
        "lease_expires_at": None,
        "cancel_requested": False,
        "cancel_error": "$$REMOVE",
        "spawn_cancel": "$$REMOVE",
        "debounce_open": "$$REMOVE",  # a retried job is not joined (its key may be taken)
        **history({"status": status, "at": NOW, "attempt": "$attempts", "reason": "retry"}),
    }


def session_of(doc: Doc, attempt: int) -> dict[str, Any] | None:
    """The session of the transaction this attempt opened (`transaction_opened`), if any."""
    tx = doc.get("tx")
    if not isinstance(tx, dict) or tx.get("attempt") != attempt:
        return None
    session = tx.get("session")
    return session if isinstance(session, dict) else None
