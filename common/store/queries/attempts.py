"""Builders of a running attempt's writes: lease renewed, progress, start, its transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from brook.common.store.fields import (
    NOW,
    R,
    after,
    lit,
    within_lease,
)
from brook.common.store.queries.base import (
    Write,
    not_in_transaction,
    running_fence,
)
from brook.common.store.records import Lease


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
