"""Durable steps in the jobs collection: a running attempt's step checkpointed (fenced like
a completion), an attempt that ended to sleep or wait for a signal (running → pending until
its wake time), and the jobs a signal wakes."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from brook.common.domain.models import Job
from brook.common.store import queries
from brook.common.store.jobs.base import JobsCollection
from brook.common.store.records import Lease

StepWritten = Literal["recorded", "lost"]


class JobSteps(JobsCollection):
    """Steps, suspensions and wake-ups."""

    async def record_step(
        self,
        lease: Lease,
        owner: str,
        name: str,
        result: Any,
        size: int,
        duration_ms: float,
    ) -> StepWritten:
        """Checkpoint one step of a running attempt, majority-written. `lost`: the attempt no
        longer holds the job (a zombie's step is never recorded). A write that matches
        nothing because an earlier try of this very call applied (its reply lost to a
        failover) is `recorded`: the job says so."""
        write = queries.step_recorded(lease, owner, name, result, size, duration_ms)
        res = await self.jobs.update_one(write.filter, write.update)
        if res.matched_count:
            return "recorded"
        held = await self.jobs.find_one(
            {
                **queries.running_fence(lease, owner),
                "steps": {"$elemMatch": {"name": name, "attempt": lease.attempt}},
            },
            projection={"_id": 1},
        )
        return "recorded" if held is not None else "lost"

    async def suspend(
        self,
        lease: Lease,
        owner: str,
        until: datetime | None,
        waiting: Mapping[str, Any],
    ) -> Job:
        """running → pending until `until`: the attempt slept or waits for a signal
        (`queries.suspended`). Raises `LeaseLost` if the attempt no longer holds the job."""
        write = queries.suspended(lease, owner, until, waiting, self.retention_s)
        return await self.write_held(write, f"job {lease.job_id} attempt {lease.attempt}")

    async def wake_signal_waiters(self, key: str, job_id: str | None = None) -> int:
        """Every pending job waiting for a signal on `key` (or just `job_id`) is due now;
        returns how many."""
        write = queries.woken_by_signal(key, job_id)
        res = await self.jobs.update_many(write.filter, write.update)
        return res.modified_count
