"""What this dispatcher holds now: an in-memory map of its leases to running attempts.

MongoDB stays the truth; this only answers "which job is mine, and is its worker still
running?" for the claimer (free room), the heartbeat (what to renew) and the watchdog.
"""

from __future__ import annotations

import time

from common.models import Job
from common.store import Lease

# How long a cancel request seen on the stream is remembered, for a job whose claim
# response has not reached us yet when the event does.
CANCEL_MEMORY_S = 30.0


class Holdings:
    def __init__(self) -> None:
        # A job counts from its claim until its final write is done (the concurrency rule);
        # its lease is renewed only while its worker runs.
        self._jobs: dict[str, Job] = {}
        self._running: dict[str, Lease] = {}
        self._cancels_seen: dict[str, float] = {}

    def add(self, job: Job) -> Lease:
        lease = Lease(job_id=job.id, attempt=job.attempts, has_dependents=job.has_dependents)
        self._jobs[job.id] = job
        self._running[job.id] = lease
        return lease

    def worker_done(self, job_id: str) -> None:
        self._running.pop(job_id, None)

    def drop(self, job_id: str) -> None:
        self._running.pop(job_id, None)
        self._jobs.pop(job_id, None)

    def count(self, queue: str | None = None) -> int:
        """Jobs held (in `queue`, or in all queues)."""
        if queue is None:
            return len(self._jobs)
        return sum(1 for job in self._jobs.values() if job.queue == queue)

    def job(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def jobs(self) -> list[Job]:
        return list(self._jobs.values())

    def running(self) -> list[Lease]:
        return list(self._running.values())

    def is_running(self, job_id: str) -> bool:
        return job_id in self._running

    # -- cancel requests that may arrive before the claim's answer ---------------------------

    def note_cancel(self, job_id: str) -> None:
        self._cancels_seen[job_id] = time.monotonic()

    def cancel_was_seen(self, job_id: str) -> bool:
        seen = self._cancels_seen.get(job_id)
        return seen is not None and time.monotonic() - seen < CANCEL_MEMORY_S

    def forget_old_cancels(self) -> None:
        now = time.monotonic()
        for job_id, seen in list(self._cancels_seen.items()):
            if now - seen > CANCEL_MEMORY_S:
                del self._cancels_seen[job_id]
