"""The job statuses, the active/terminal sets and every allowed transition, in one place."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    WAITING = "waiting"  # some parent (`depends_on`) has not finished yet
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE: frozenset[JobStatus] = frozenset(
    {JobStatus.WAITING, JobStatus.PENDING, JobStatus.RUNNING}
)
TERMINAL: frozenset[JobStatus] = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}
)

# (from, to) pairs the engine performs on its own: a job's life from submit to its end.
TRANSITIONS: frozenset[tuple[JobStatus, JobStatus]] = frozenset(
    {
        (JobStatus.WAITING, JobStatus.PENDING),  # every parent completed (or ended, if allowed)
        (JobStatus.WAITING, JobStatus.CANCELLED),  # a parent failed (DependencyFailed), or cancel
        (JobStatus.PENDING, JobStatus.RUNNING),  # claim
        (JobStatus.PENDING, JobStatus.CANCELLED),  # cancel before start (or StartByPassed)
        (JobStatus.WAITING, JobStatus.FAILED),  # its deadline passed (DeadlineExceeded)
        (JobStatus.PENDING, JobStatus.FAILED),  # its deadline passed (DeadlineExceeded)
        (JobStatus.RUNNING, JobStatus.COMPLETED),  # fenced completion
        (JobStatus.RUNNING, JobStatus.PENDING),  # retry, lease expiry, graceful release
        (JobStatus.RUNNING, JobStatus.FAILED),  # attempts exhausted
        (JobStatus.RUNNING, JobStatus.CANCELLED),  # worker stopped after a cancel request
    }
)

# Only a caller's explicit `retry` (`POST /jobs/{id}/retry`) brings a finished job back:
# the engine itself never leaves a terminal status. Which finished jobs may be retried.
# A retried job with a parent that has not completed waits for it again.
RETRYABLE: frozenset[JobStatus] = frozenset({JobStatus.FAILED, JobStatus.CANCELLED})
RETRIES: frozenset[tuple[JobStatus, JobStatus]] = frozenset(
    (status, to) for status in RETRYABLE for to in (JobStatus.PENDING, JobStatus.WAITING)
)

# Every (from, to) pair the store may perform; anything else is a bug.
ALLOWED: frozenset[tuple[JobStatus, JobStatus]] = TRANSITIONS | RETRIES
