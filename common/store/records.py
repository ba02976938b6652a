"""What the store hands back and takes: leases, submits, completions, run times, expired
leases, ended parents and settled children (plain frozen records, no collection of their own).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from brook.common.domain.models import Doc, Job
from brook.common.domain.status import JobStatus


@dataclass(frozen=True, kw_only=True)
class Submitted:
    job: Job
    created: bool


@dataclass(frozen=True, kw_only=True)
class Refused:
    """A job that was not stored, and why (one line): too large, or refused by MongoDB."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class Lease:
    """What a dispatcher holds: the job and the attempt number that fences its writes.
    `has_dependents`: the job had dependents when it was claimed (its completion then
    settles them; see `complete_many`)."""

    job_id: str
    attempt: int
    has_dependents: bool = False
    # Its task runs in a shared worker process: the attempt's history entry says so, and
    # the death of that process does not use up one of the job's attempts.
    shared: bool = False


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
