"""The job statuses, the active/terminal sets and every allowed transition, in one place."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE: frozenset[JobStatus] = frozenset({JobStatus.PENDING, JobStatus.RUNNING})
TERMINAL: frozenset[JobStatus] = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}
)

# (from, to) pairs the engine performs on its own: a job's life from submit to its end.
TRANSITIONS: frozenset[tuple[JobStatus, JobStatus]] = frozenset(
    {
        (JobStatus.PENDING, JobStatus.RUNNING),  # claim
        (JobStatus.PENDING, JobStatus.CANCELLED),  # cancel before start
        (JobStatus.RUNNING, JobStatus.COMPLETED),  # fenced completion
        (JobStatus.RUNNING, JobStatus.PENDING),  # retry, lease expiry, graceful release
        (JobStatus.RUNNING, JobStatus.FAILED),  # attempts exhausted
        (JobStatus.RUNNING, JobStatus.CANCELLED),  # worker stopped after a cancel request
    }
)

# Only a caller's explicit `retry` (`POST /jobs/{id}/retry`) brings a finished job back:
# the engine itself never leaves a terminal status. Which finished jobs may be retried.
RETRYABLE: frozenset[JobStatus] = frozenset({JobStatus.FAILED, JobStatus.CANCELLED})
RETRIES: frozenset[tuple[JobStatus, JobStatus]] = frozenset(
    (status, JobStatus.PENDING) for status in RETRYABLE
)

# Every (from, to) pair the store may perform; anything else is a bug.
ALLOWED: frozenset[tuple[JobStatus, JobStatus]] = TRANSITIONS | RETRIES
