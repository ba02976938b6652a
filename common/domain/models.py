"""The job as Brook's code sees it, and its JSON shape at the API."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from brook.common.domain.status import JobStatus
from brook.common.domain.steps import step_view

Doc = dict[str, Any]

DEFAULT_QUEUE = "default"
# What a queue may be called (in job specs, `BROOK_QUEUES` and queue limits alike).
QUEUE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_QUEUE_NAME = re.compile(QUEUE_NAME)


def is_queue_name(name: object) -> bool:
    """Whether `name` is a queue name, matched whole (`default\\n` is not one)."""
    return isinstance(name, str) and _QUEUE_NAME.fullmatch(name) is not None


def whole_ms(value: datetime) -> datetime:
    """`value` cut to whole milliseconds, as a BSON date keeps it: a job built here reads back
    from MongoDB exactly as it was sent."""
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


# Reading the state documents the dispatchers share (`brook_triggers`, `brook_schedules`):
# a field written by hand with another type (or a date past year 9999, read as a
# `bson.DatetimeMS`) reads as unknown, never as an error that stops the loop reading it.


def as_date(value: object) -> datetime | None:
    return value if isinstance(value, datetime) else None


def as_count(value: object) -> int:
    return int(value) if isinstance(value, int | float) and math.isfinite(value) else 0


class UnreadableJob(ValueError):
    """A stored job document whose fields Brook cannot read (it did not write them)."""


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """What a client asks for; validated at the edge (`brook.common.domain.validation`) before the
    store."""

    task: str
    payload: dict[str, Any]
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    run_at: datetime | None = None
    delay_s: float | None = None  # run_at = the server's now + delay_s
    max_attempts: int = 3
    timeout_s: float | None = None
    idempotency_key: str | None = None
    # {"name", "tick"} for a job a cron schedule submitted (its key names both).
    schedule: dict[str, Any] | None = None
    # {"name", "change_id", "operation"} for a job a trigger made from a change.
    trigger: dict[str, Any] | None = None
    # The submitter's W3C trace context (`traceparent`, `tracestate`) when it traced.
    trace: dict[str, str] | None = None
    unique_for_s: float | None = None  # how long `idempotency_key` returns this job
    retention_s: float | None = None  # None: the deployment's BROOK_RETENTION_SECONDS
    # Workflows: the jobs (ids, or refs of specs in the same batch) that must end first.
    depends_on: tuple[str, ...] = ()
    ref: str | None = None  # a name other specs of the same batch may depend on
    run_on_parent_failure: bool = False  # run once every parent ended, however it ended
    # Whose job this is (a customer, an API key): a queue's per-key limits and its fair
    # claiming count jobs by it.
    key: str | None = None
    # Debounce: submits with the same `debounce_key` while its job is pending become that
    # one job, with the latest payload, due once no submit came for `debounce_s` and never
    # later than `debounce_max_s` after the first.
    debounce_key: str | None = None
    debounce_s: float | None = None
    debounce_max_s: float | None = None
    # The job whose task submitted this one with `ctx.submit` (not `detach=True`): cancelling
    # that job cancels this one. Set by `ctx.submit` only, never by a spec.
    spawned_by: str | None = None
    # The quotas it draws on, each with its cost in units (None: its task's default).
    quotas: dict[str, int] | None = None
    # Deadlines (`brook.common.domain.deadlines`): the latest first start, and the end of the
    # job's whole life; each as a time, or counted from the submit on the server's clock.
    start_by: datetime | None = None
    start_within_s: float | None = None
    deadline: datetime | None = None
    deadline_s: float | None = None


# Without `debounce_max_s`, a debounced job waits at most this many times `debounce_s`.
DEBOUNCE_MAX_FACTOR = 10


@dataclass(frozen=True, kw_only=True)
class Job:
    id: str
    task: str
    payload: dict[str, Any]
    status: JobStatus
    queue: str
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result: Any
    error: dict[str, Any] | None
    timeout_s: float | None
    idempotency_key: str | None
    unique_until: datetime | None
    retention_s: float | None
    expire_at: datetime | None  # set when the job finishes; the TTL index deletes it then
    owner: str | None
    lease_expires_at: datetime | None
    cancel_requested: bool
    history: list[dict[str, Any]]
    schedule: dict[str, Any] | None = None  # {"name", "tick"}
    trigger: dict[str, Any] | None = None  # {"name", "change_id", "operation"}
    trace: dict[str, str] | None = None  # the submitter's W3C trace context
    progress: dict[str, Any] | None = None  # {"fraction", "message", "at", "attempt"}
    history_truncated: int  # entries dropped from the middle of `history` by its cap
    depends_on: list[str] = field(default_factory=list)  # parent job ids
    parents_left: list[str] = field(default_factory=list)  # parents not ended yet (waiting)
    ref: str | None = None
    run_on_parent_failure: bool = False
    has_dependents: bool = False  # some job depends on this one
    # When the current attempt was claimed (the server's clock), or None if not known. Not
    # its start: a claimed job may wait in its dispatcher's prefetch buffer.
    claimed_at: datetime | None = None
    # Durable steps (`ctx.step`, `ctx.sleep`, `ctx.wait_for_signal`): each recorded step,
    # its result included, in the order they were recorded; and what a job that ended its
    # run to sleep or wait is waiting for (`{"kind": "sleep" | "signal", ...}`).
    steps: list[dict[str, Any]] = field(default_factory=list)
    steps_bytes: int = 0
    waiting_for: dict[str, Any] | None = None
    key: str | None = None  # whose job it is: per-key limits and fair claiming
    debounce_key: str | None = None
    debounced: int = 0  # submits this debounced job took (the first included)
    spawned_by: str | None = None  # the job whose task submitted it (`ctx.submit`)
    # Only on a cancel's answer, never stored: the spawned jobs that cancel cancelled (or,
    # under `dry_run`, would).
    spawned_cancelled: int | None = None
    # Its output stream's count (`ctx.emit`), every attempt together: `{"chunks", "bytes"}`.
    output: dict[str, Any] | None = None
    # Rerun from a step: the job this one reruns, and the reruns of this one, oldest first.
    rerun_of: str | None = None
    reruns: list[str] = field(default_factory=list)
    # The quotas it draws on, with their costs (None: its task's default, if any).
    quotas: dict[str, int] | None = None
    start_by: datetime | None = None  # not started by then: cancelled (`StartByPassed`)
    deadline: datetime | None = None  # still unfinished then: failed (`DeadlineExceeded`)
    # The start of its first attempt that started (`started_at` is the current attempt's).
    first_started_at: datetime | None = None

    @property
    def job_id(self) -> str:
        return self.id

    @property
    def attempt(self) -> int:
        """The current attempt: the fencing token of the lease that holds the job."""
        return self.attempts

    @property
    def lease_owner(self) -> str | None:
        """The dispatcher holding the job's lease (the API's name for `owner`)."""
        return self.owner

    @classmethod
    def from_doc(cls, doc: Doc) -> Job:
        """The job a stored document holds; `UnreadableJob` for one whose fields Brook did
        not write (a document put into `jobs` by hand: no task name, a due time that is no
        date, a count that is no number)."""
        try:
            job = cls._from_doc(doc)
        except (KeyError, ValueError, TypeError) as exc:
            raise UnreadableJob(f"job {doc.get('_id')!r}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(job.task, str):
            raise UnreadableJob(f"job {job.id!r}: its task is no name")
        if not isinstance(job.run_at, datetime) or not isinstance(job.created_at, datetime):
            raise UnreadableJob(f"job {job.id!r}: run_at or created_at is no date")
        return job

    @classmethod
    def _from_doc(cls, doc: Doc) -> Job:
        return cls(
            id=str(doc["_id"]),
            task=doc["task"],
            payload=doc.get("payload") or {},
            status=JobStatus(doc["status"]),
            queue=doc.get("queue") or DEFAULT_QUEUE,
            priority=int(doc.get("priority", 0)),
            attempts=int(doc.get("attempts", 0)),
            max_attempts=int(doc.get("max_attempts", 1)),
            run_at=doc["run_at"],
            created_at=doc["created_at"],
            started_at=doc.get("started_at"),
            claimed_at=doc.get("claimed_at"),
            finished_at=doc.get("finished_at"),
            result=doc.get("result"),
            error=doc.get("error"),
            timeout_s=doc.get("timeout_s"),
            idempotency_key=doc.get("idempotency_key"),
            unique_until=doc.get("unique_until"),
            retention_s=doc.get("retention_s"),
            expire_at=doc.get("expire_at"),
            owner=doc.get("owner"),
            lease_expires_at=doc.get("lease_expires_at"),
            cancel_requested=bool(doc.get("cancel_requested", False)),
            history=list(doc.get("history") or []),
            schedule=doc.get("schedule"),
            trigger=doc.get("trigger"),
            trace=doc.get("trace"),
            progress=doc.get("progress"),
            history_truncated=int(doc.get("history_truncated", 0)),
            depends_on=list(doc.get("depends_on") or []),
            parents_left=list(doc.get("parents_left") or []),
            ref=doc.get("ref"),
            run_on_parent_failure=bool(doc.get("run_on_parent_failure", False)),
            has_dependents=bool(doc.get("has_dependents", False)),
            steps=list(doc.get("steps") or []),
            steps_bytes=int(doc.get("steps_bytes", 0)),
            waiting_for=doc.get("waiting_for"),
            key=doc.get("key"),
            debounce_key=doc.get("debounce_key"),
            debounced=int(doc.get("debounced", 0)),
            spawned_by=doc.get("spawned_by"),
            output=doc.get("output"),
            rerun_of=doc.get("rerun_of"),
            reruns=list(doc.get("reruns") or []),
            quotas=doc.get("quotas"),
            start_by=as_date(doc.get("start_by")),
            deadline=as_date(doc.get("deadline")),
            first_started_at=as_date(doc.get("first_started_at")),
        )

    def to_api(self) -> dict[str, Any]:
        """The contract's job document (JSON-ready except datetimes, which FastAPI encodes)."""
        return {
            "id": self.id,
            "task": self.task,
            "payload": self.payload,
            "status": self.status.value,
            "queue": self.queue,
            "priority": self.priority,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "run_at": self.run_at,
            "start_by": self.start_by,
            "deadline": self.deadline,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "result": self.result,
            "error": self.error,
            "timeout_s": self.timeout_s,
            "idempotency_key": self.idempotency_key,
            "unique_until": self.unique_until,
            "retention_s": self.retention_s,
            "expire_at": self.expire_at,
            "cancel_requested": self.cancel_requested,
            "lease_owner": self.owner,
            "lease_expires_at": self.lease_expires_at,
            "history": self.history,
            "schedule": self.schedule,
            "trigger": self.trigger,
            "trace": self.trace,
            "progress": self.progress,
            "history_truncated": self.history_truncated,
            "depends_on": self.depends_on,
            "parents_left": self.parents_left,
            "ref": self.ref,
            "run_on_parent_failure": self.run_on_parent_failure,
            # Steps without their results (a result can be large): name, at, duration, size.
            "steps": [step_view(e) for e in self.steps],
            "waiting_for": self.waiting_for,
            "key": self.key,
            "debounce_key": self.debounce_key,
            "debounced": self.debounced,
            "spawned_by": self.spawned_by,
            "output": self.output,
            "rerun_of": self.rerun_of,
            "reruns": self.reruns,
            "quotas": self.quotas,
            **self._cancel_answer(),
        }

    def _cancel_answer(self) -> dict[str, Any]:
        if self.spawned_cancelled is None:
            return {}
        return {"spawned_cancelled": self.spawned_cancelled}

    def step_results(self) -> dict[str, Any]:
        """The recorded steps' results by name: what a new run replays."""
        return {str(e["name"]): e.get("result") for e in self.steps if "name" in e}
