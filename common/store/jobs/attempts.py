"""A running attempt's writes to the jobs collection besides its outcome: its lease renewed,
its progress, its task's start; and the watchdog's find of expired leases, the cancel
requests a holder missed, and the end of an abandoned attempt's own transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pymongo import UpdateOne

from brook.common.domain.status import JobStatus
from brook.common.store import queries
from brook.common.store.fields import NOW, R, session_of
from brook.common.store.jobs.base import JobsCollection
from brook.common.store.records import ExpiredLease, Lease


class JobAttempts(JobsCollection):
    """What a dispatcher writes of the attempts it holds while they run."""

    async def renew(self, owner: str, leases: Sequence[Lease], lease_seconds: float) -> set[str]:
        """Extend every lease `owner` still holds in one write; return the job ids it lost."""
        if not leases:
            return set()
        ids = queries.held_leases(leases)
        held = {"owner": owner, "status": R, "$or": ids}
        # An attempt with its own transaction open renewed its lease for it, and must not
        # be written meanwhile (`transaction_opened`): it is held, not renewed.
        write = queries.lease_renewed(owner, leases, lease_seconds)
        res = await self.jobs.update_many(write.filter, write.update)
        if res.matched_count == len(leases):
            return set()
        # Not lost either: a job its attempt completed itself, in its own transaction, an
        # instant before its worker says so.
        done = {"status": JobStatus.COMPLETED.value, "$or": ids}
        still = await self.jobs.find({"$or": [held, done]}, projection={"_id": 1}).to_list()
        kept = {d["_id"] for d in still}
        return {lease.job_id for lease in leases} - kept

    async def set_progress_many(
        self, owner: str, items: Sequence[tuple[Lease, float, str | None]]
    ) -> set[str]:
        """Write each attempt's latest progress in one round trip, fenced like every other
        write of a running job (`_id`, attempt, owner, running): a stale attempt's progress
        matches nothing. Returns the job ids written."""
        writes = [
            queries.progress_reported(lease, owner, fraction, message)
            for lease, fraction, message in items
        ]
        ops = [UpdateOne(w.filter, w.update) for w in writes]
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
        writes = [queries.started(lease, owner, started_at) for lease, started_at in items]
        ops = [UpdateOne(w.filter, w.update) for w in writes]
        if ops:
            await self.jobs.bulk_write(ops, ordered=False)

    async def expired(self, limit: int = 100) -> list[ExpiredLease]:
        """Running jobs whose lease is over by the server's clock."""
        docs = await self.jobs.find(
            {
                "status": R,
                "$expr": {"$lt": ["$lease_expires_at", NOW]},
                # A lease names its holder and attempt: a job written by hand without them
                # is no lease to requeue (nor a reason to fail every sweep).
                "owner": {"$type": "string"},
                "attempts": {"$type": "number"},
            },
            projection={"_id": 1, "attempts": 1, "owner": 1, "task": 1, "tx": 1},
            limit=limit,
        ).to_list()
        return [
            ExpiredLease(
                job_id=str(d["_id"]),
                attempt=int(d["attempts"]),
                task=str(d.get("task")),
                owner=d["owner"],
                tx_session=session_of(d, d["attempts"]),
            )
            for d in docs
        ]

    async def cancel_requested(self, owner: str, job_ids: Sequence[str]) -> list[str]:
        """Which of these jobs `owner` holds have a cancel request (a missed event's backup)."""
        if not job_ids:
            return []
        docs = await self.jobs.find(
            {"_id": {"$in": list(job_ids)}, "owner": owner, "cancel_requested": True},
            projection={"_id": 1},
        ).to_list()
        return [str(d["_id"]) for d in docs]

    async def kill_sessions(self, session_ids: Sequence[Mapping[str, Any]]) -> None:
        """End these server sessions, aborting any transaction they left open (a worker that
        died or was killed mid-transaction): its locks go at once, not at the server's
        `transactionLifetimeLimitSeconds`, and nothing it wrote can commit afterwards."""
        if session_ids:
            await self.db.client.admin.command("killSessions", list(session_ids))
