"""The fixed vocabulary of log events. Every job state change is one line with one of these."""

from __future__ import annotations

from contextvars import ContextVar
from enum import StrEnum
from typing import Any, Protocol

from brook.common.runtime.log import enabled, get_logger


class Event(StrEnum):
    JOB_SUBMITTED = "job.submitted"
    JOB_DEDUPLICATED = "job.deduplicated"
    JOB_DEBOUNCED = "job.debounced"  # a submit joined the pending job of its debounce key
    JOB_CLAIMED = "job.claimed"
    JOB_COMPLETED = "job.completed"
    JOB_RETRY_SCHEDULED = "job.retry_scheduled"
    JOB_FAILED = "job.failed"
    JOB_CANCELLED = "job.cancelled"
    JOB_CANCEL_REQUESTED = "job.cancel_requested"
    JOB_RETRIED = "job.retried"  # a caller brought a failed or cancelled job back
    JOB_RERUN = "job.rerun"  # a new job from a finished one's steps (rerun_of, from_step)
    JOB_UNBLOCKED = "job.unblocked"  # waiting → pending: its parents ended
    JOB_DEPENDENCY_FAILED = "job.dependency_failed"  # waiting → cancelled: a parent failed
    JOB_RELEASED = "job.released"
    JOB_RELEASE_FAILED = "job.release_failed"  # shutdown could not hand it back: lease expiry will
    JOB_TIMED_OUT = "job.timed_out"
    JOB_SUSPENDED = "job.suspended"  # a sleep or a signal wait: the job waits without a worker
    JOB_WOKEN = "job.woken"  # a signal came for a waiting job
    STEP_RECORDED = "step.recorded"  # a step's checkpoint, majority-written
    STEP_DISCARDED = "step.discarded"  # a stale attempt's step: fenced out
    STEP_REPLAYED = "step.replayed"  # a step of an earlier run, returned without running it
    STEP_FAILED = "step.failed"  # a step's function raised
    SIGNAL_SENT = "signal.sent"
    JOB_RESULT_DISCARDED = "job.result_discarded"
    TRANSACTION_ENDED = "transaction.ended"  # a dead or killed worker's open one, by its dispatcher
    LEASE_EXPIRED = "lease.expired"
    LEASE_LOST = "lease.lost"
    LEASE_SELF_FENCED = "lease.self_fenced"  # not renewed in time: worker stopped before it ends
    WORKER_STARTED = "worker.started"
    WORKER_CRASHED = "worker.crashed"
    WORKER_KILLED = "worker.killed"
    WORKER_STOPPED = "worker.stopped"
    # A shared worker process's event loop was blocked past BROOK_LOOP_BLOCKED_SECONDS,
    # with the jobs it held (`job_ids`).
    WORKER_LOOP_BLOCKED = "worker.loop_blocked"
    # A shared worker process was replaced once drained: after BROOK_SHARED_RECYCLE jobs
    # (`reason: jobs`) or past BROOK_SHARED_MEMORY_MIB of resident memory (`reason: memory`).
    WORKER_RECYCLED = "worker.recycled"
    TASK_STARTED = "task.started"
    TASK_FINISHED = "task.finished"
    PROGRESS_DISCARDED = "progress.discarded"  # a stale attempt's progress: fenced out
    # An attempt's output stream (`ctx.emit`): its end, with what it wrote; a batch fenced
    # out (a stale attempt: none of it is kept); the job's cap reached (emit raised).
    OUTPUT_ENDED = "output.ended"
    OUTPUT_DISCARDED = "output.discarded"
    OUTPUT_LIMIT = "output.limit"
    SCHEDULE_DECLARED = "schedule.declared"
    SCHEDULE_MISSED = "schedule.missed"  # ticks passed while no dispatcher ran (catch_up)
    SCHEDULE_SKIPPED = "schedule.skipped"  # a tick made no job: its previous run (overlap)
    SCHEDULE_PAUSED = "schedule.paused"
    SCHEDULE_RESUMED = "schedule.resumed"
    TRIGGER_IDLE = "trigger.idle"  # its follower saw the pause: reads nothing until resumed
    TRIGGER_DECLARED = "trigger.declared"
    TRIGGER_FOLLOWING = "trigger.following"  # this dispatcher took the trigger's lease
    TRIGGER_OPENED = "trigger.opened"  # its change stream, from its token or start time
    TRIGGER_HISTORY_LOST = "trigger.history_lost"  # the oplog no longer held its token
    TRIGGER_INVALIDATED = "trigger.invalidated"  # its collection was dropped or renamed
    TRIGGER_LEASE_LOST = "trigger.lease_lost"  # another follower holds it now
    TRIGGER_RELEASED = "trigger.released"  # given up at shutdown: another takes over at once
    TRIGGER_CHANGE_SKIPPED = "trigger.change_skipped"  # a change that cannot become a job
    TRIGGER_ERROR = "trigger.error"
    TRIGGER_PAUSED = "trigger.paused"
    TRIGGER_RESUMED = "trigger.resumed"
    QUEUE_UPDATED = "queue.updated"  # a queue's limits were set (API, client)
    QUOTA_UPDATED = "quota.updated"  # a quota's limits were set (API, client)
    QUOTA_DELETED = "quota.deleted"
    QUOTA_HELD = "quota.held"  # a claimed job was handed back: a quota had no room
    QUOTA_CLOSED = "quota.closed"  # a task's RateLimited closed a quota for everyone
    QUEUE_PAUSED = "queue.paused"
    QUEUE_RESUMED = "queue.resumed"
    QUEUE_LIMITS_SEEN = "queue.limits_seen"  # a dispatcher applies a queue's new limits
    SLOTS_RECLAIMED = "slots.reclaimed"  # slots a dead or lost attempt left, freed by a prune
    SLOTS_ADOPTED = "slots.adopted"  # running jobs that held no slot of a limited queue
    KEY_HELD_ELSEWHERE = "key.held_elsewhere"  # a claim found a key's slot held by another
    STREAM_OPENED = "stream.opened"
    STREAM_RESUMED = "stream.resumed"
    STREAM_HISTORY_LOST = "stream.history_lost"
    STREAM_INVALIDATED = "stream.invalidated"
    STREAM_ERROR = "stream.error"
    STREAM_CHANGE_SKIPPED = "stream.change_skipped"  # a wake-up it could not use (sweep claims)
    HINTS_OPENED = "hints.opened"  # following the primary's oplog for new jobs
    HINTS_ERROR = "hints.error"  # lost it (a failover, say): reopened after a pause
    HINTS_UNAVAILABLE = "hints.unavailable"  # cannot read the oplog here: the stream alone
    SWEEP_DONE = "sweep.done"
    CLAIM_UNREADABLE = "claim.unreadable"  # a claimed job Brook cannot read: failed for good
    SWEEP_SKIPPED = "sweep.skipped"  # a job it could not read: the sweep goes on
    BACKGROUND_CRASHED = "background.crashed"
    DISPATCHER_STARTED = "dispatcher.started"
    DISPATCHER_READY = "dispatcher.ready"
    DISPATCHER_STOPPING = "dispatcher.stopping"
    DISPATCHER_STOPPED = "dispatcher.stopped"
    DISPATCHER_CRASHED = "dispatcher.crashed"
    API_STARTED = "api.started"
    API_ERROR = "api.error"  # the database refused a request (not unavailable): 500, with ref
    SSE_CLIENT_DROPPED = "sse.client_dropped"  # fell too far behind; it resumes by Last-Event-ID
    SSE_RESET = "sse.reset"  # a client's Last-Event-ID is older than the oplog: told so
    SEARCH_TOO_BROAD = "search.too_broad"  # a listing stopped by BROOK_QUERY_MAX_MS: 422
    TRACING_UNAVAILABLE = "tracing.unavailable"  # OTEL_* asks for traces; the extra is missing
    METRICS_LISTENING = "metrics.listening"
    METRICS_UNAVAILABLE = "metrics.unavailable"
    MONGO_UNAVAILABLE = "mongo.unavailable"
    MONGO_REFUSED = "mongo.refused"  # MongoDB rejected a write itself (e.g. too large)
    MONGO_UP = "mongo.up"
    MONGO_DOWN = "mongo.down"
    UP_STARTED = "up.started"
    UP_CHILD_EXITED = "up.child_exited"
    UP_CHILD_RESTARTED = "up.child_restarted"
    UP_GIVING_UP = "up.giving_up"
    UP_KILL = "up.kill"
    UP_STOPPING = "up.stopping"
    UP_STOPPED = "up.stopped"


_log = get_logger()

# Who asked for the state change being logged: the API sets it per request (`admin` or
# `read`, the token's name, never the token; `none` with tokens off); anything else using
# the client core (the Python client, a task's `ctx.submit`) is `python-client`.
requested_by: ContextVar[str] = ContextVar("brook_requested_by", default="python-client")


_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


def log_event(event: Event, *, level: str = "info", **fields: Any) -> None:
    """Log one event from the fixed vocabulary (nothing at all below the configured level:
    the per-job lines cost nothing in a process logging at WARNING)."""
    if enabled(_LEVELS.get(level, 50)):
        getattr(_log, level)(event.value, **fields)


class JobRef(Protocol):
    """Anything that names one attempt of one job (`Job`, `RunJob`, `ExpiredLease`)."""

    @property
    def job_id(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def task(self) -> str: ...


def job_fields(job: JobRef) -> dict[str, Any]:
    """`job_id`, `attempt` and `task`: the fields every job-scoped log line carries."""
    return {"job_id": job.job_id, "attempt": job.attempt, "task": job.task}
