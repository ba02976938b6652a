"""Brook's claim order and filter, the `Write` every builder returns, and the fences."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING

from brook.common.domain.status import TERMINAL
from brook.common.store.fields import (
    NOW,
    P,
    R,
)
from brook.common.store.records import ExpiredLease, Lease

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


def without_unknown_dependents(lease: Lease) -> dict[str, Any]:
    """A filter clause: a completion whose lease did not know of dependents completes only
    a job that has none (a child attached after the claim must be settled by it)."""
    return {} if lease.has_dependents else {"has_dependents": {"$ne": True}}
