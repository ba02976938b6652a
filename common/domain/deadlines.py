"""Deadlines: a job's `start_by` (its first start) and `deadline` (its whole life).

A job gets them from its spec, as times (`start_by`, `deadline`) or counted from its submit
(`start_within_s`, `deadline_s`), or from its task's declaration (`@task(...,
start_within_s=, deadline_s=)`), which the dispatchers apply: a submit's value wins. A job
not started by its `start_by` ends `cancelled` with `StartByPassed`; one that reaches its
`deadline` ends `failed` with `DeadlineExceeded`, never retried.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from brook.common.domain.models import Job

START_BY_PASSED = "StartByPassed"
DEADLINE_EXCEEDED = "DeadlineExceeded"

# Why a job ends by one of its bounds (a dispatcher's stop reason of the same name).
Bound = Literal["start_by_passed", "deadline_exceeded"]


@dataclass(frozen=True, kw_only=True)
class TaskDeadlines:
    """A task's defaults (`@task(..., start_within_s=, deadline_s=)`), counted from a job's
    submit (`created_at`), for the jobs whose spec gave none."""

    start_within_s: float | None = None
    deadline_s: float | None = None


Defaults = Mapping[str, TaskDeadlines]


def _after(at: datetime, seconds: float) -> datetime:
    return at + timedelta(seconds=seconds)


def start_by_of(job: Job, defaults: Defaults) -> datetime | None:
    """The job's `start_by`: its own, else its task's default from its submit."""
    if job.start_by is not None:
        return job.start_by
    own = defaults.get(job.task)
    if own is None or own.start_within_s is None:
        return None
    return _after(job.created_at, own.start_within_s)


def deadline_of(job: Job, defaults: Defaults) -> datetime | None:
    """The job's `deadline`: its own, else its task's default from its submit."""
    if job.deadline is not None:
        return job.deadline
    own = defaults.get(job.task)
    if own is None or own.deadline_s is None:
        return None
    return _after(job.created_at, own.deadline_s)


def never_started(job: Job) -> bool:
    """No attempt of it has started its task (`start_by` covers the first start only)."""
    return job.started_at is None and job.first_started_at is None


def next_bound(job: Job, defaults: Defaults) -> tuple[Bound, datetime] | None:
    """The first of its bounds still ahead of it, or passed: `start_by` while it never
    started, else (or if sooner) its `deadline`."""
    bounds: list[tuple[datetime, Bound]] = []
    start_by = start_by_of(job, defaults)
    if start_by is not None and never_started(job):
        bounds.append((start_by, "start_by_passed"))
    deadline = deadline_of(job, defaults)
    if deadline is not None:
        bounds.append((deadline, "deadline_exceeded"))
    if not bounds:
        return None
    at, bound = min(bounds, key=lambda b: (b[0], b[1] != "deadline_exceeded"))
    return bound, at


def passed(job: Job, defaults: Defaults, now: datetime) -> Bound | None:
    """Which bound of the job has passed at `now` (its deadline first), if any."""
    deadline = deadline_of(job, defaults)
    if deadline is not None and deadline <= now:
        return "deadline_exceeded"
    start_by = start_by_of(job, defaults)
    if start_by is not None and start_by <= now and never_started(job):
        return "start_by_passed"
    return None


def bound_error(bound: Bound, at: datetime | None) -> dict[str, str]:
    """The stored error of a job ended by `bound` (at `at`, when known)."""
    when = f" ({at.isoformat()})" if at is not None else ""
    if bound == "start_by_passed":
        return {"type": START_BY_PASSED, "message": f"not started by its start_by{when}"}
    return {"type": DEADLINE_EXCEEDED, "message": f"its deadline passed{when}"}


def logged_bounds(job: Job) -> dict[str, str]:
    """The job's own bounds, for a log line of its story (none: nothing)."""
    given = {"start_by": job.start_by, "deadline": job.deadline}
    return {name: at.isoformat() for name, at in given.items() if at is not None}
