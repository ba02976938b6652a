"""Builders of durable steps, sleeps and signal waits."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from brook.common.store.fields import (
    NOW,
    C,
    P,
    expiry,
    history,
    lit,
    shared_mark,
)
from brook.common.store.queries.base import (
    FOREVER,
    Write,
    not_in_transaction,
    running_fence,
)
from brook.common.store.queries.spawned import cancel_error_or
from brook.common.store.records import Lease


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
                    "error": {"$cond": [asked, cancel_error_or(cancel_error), "$error"]},
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
                            **shared_mark(lease),
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
