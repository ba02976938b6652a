"""The contract between the dispatcher and the executor, so neither imports the other."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

OutcomeKind = Literal[
    "ok",
    "error",
    "crashed",
    "timeout",
    "cancelled",
    "lease_lost",
    "shutdown",
    "handed_back",
    "suspended",
    "start_by_passed",
    "deadline_exceeded",
]
# `suspended`: the task slept (`ctx.sleep`) or waits for a signal (`ctx.wait_for_signal`):
# its run ends, the job waits without a worker, and is replayed when it is due again.
# `handed_back`: a job claimed for a rate-limited queue that could not start soon enough
# after its claim (`dispatcher.claiming.queue_slots`); it goes back to pending like a shutdown's.
# `start_by_passed`: a job claimed but not started by its `start_by` is dropped (cancelled);
# `deadline_exceeded`: a held job past its `deadline` is stopped (failed, never retried).
KillReason = Literal[
    "timeout",
    "cancelled",
    "lease_lost",
    "shutdown",
    "handed_back",
    "start_by_passed",
    "deadline_exceeded",
]
RELEASES = ("shutdown", "handed_back")  # the kinds whose job is handed back, not failed


@dataclass(frozen=True, kw_only=True)
class RunJob:
    """What a worker process is asked to run: one attempt of one job."""

    job_id: str
    attempt: int
    task: str
    payload: dict[str, Any]
    # The dispatcher holding the lease: a task's own transaction (`ctx.transaction()`)
    # writes the completion itself, fenced by attempt and this owner.
    owner: str = ""
    # For its spans (`brook.common.runtime.tracing`): where it ran, why it exists, and since when
    # it waited; the submitter's trace context, and those of its workflow parents.
    queue: str = "default"
    trigger: str | None = None
    due_at: datetime | None = None
    trace: dict[str, str] | None = None
    links: tuple[dict[str, str], ...] = ()
    # The job's recorded steps (name → result), replayed instead of run again.
    steps: dict[str, Any] = field(default_factory=dict)
    steps_bytes: int = 0  # their size as stored
    # The server clock minus this host's (seconds), as the dispatcher measured it: a sleep
    # replayed before its wake time (a retry came first) waits on.
    server_offset: float = 0.0
    # It runs in a shared worker process, as one of many asyncio tasks (`@task(shared=N)`).
    shared: bool = False
    # The job's output so far (`ctx.emit`), every attempt together: this attempt's chunks
    # go on from there, within the job's cap.
    output_chunks: int = 0
    output_bytes: int = 0


@dataclass(frozen=True, kw_only=True)
class CancelJob:
    """To a shared worker process: end this attempt's asyncio task (a timeout, a cancel, a
    lost lease, a shutdown); its neighbours go on. The worker answers with its `JobDone`."""

    job_id: str
    attempt: int


@dataclass(frozen=True, kw_only=True)
class LoopBlocked:
    """From a shared worker process: its event loop was blocked for `seconds` while it held
    these jobs (its watchdog thread saw no heartbeat)."""

    worker: str
    job_ids: tuple[str, ...]
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Suspend:
    """A run that ended to wait without a worker: until `until` (the server's clock; None:
    no end), for what `waiting` says (`{"kind": "sleep" | "signal", ...}`)."""

    until: datetime | None
    waiting: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """A running attempt finished a step (`ctx.step`): its worker asks the dispatcher that
    holds the lease to record it, fenced by attempt and owner, and waits for `StepAck`.
    `wake_in_s`: a sleep's step, whose result is its wake time, `wake_in_s` from now on
    the server's clock (the dispatcher reads it)."""

    job_id: str
    attempt: int
    task: str
    name: str
    result: Any
    size: int
    duration_ms: float
    wake_in_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class StepAck:
    """The dispatcher's answer to a `StepRecord`: `ok` once the step is majority-written
    (with the result as stored), else `error` (the lease was lost, or MongoDB refused)."""

    job_id: str
    attempt: int
    name: str
    ok: bool
    result: Any = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How an attempt ended, as the process supervisor saw it. `committed`: the task's own
    transaction already wrote the completion (nothing is left to write). `tx_session`: the
    server session of a transaction the attempt opened and may have left open (its worker
    died, was killed, or could not learn its commit's outcome): end it before writing."""

    kind: OutcomeKind
    result: Any = None
    error: dict[str, Any] | None = None
    retry_delay: float | None = None
    exitcode: int | None = None
    # When the runner handed the job to its worker and saw the attempt end
    # (`time.monotonic()`): the task's real run, whenever the caller gets to look.
    started: float | None = None
    ended: float | None = None
    committed: bool = False
    tx_session: dict[str, Any] | None = None
    suspend: Suspend | None = None
    steps_replayed: int = 0
    steps_committed: int = 0


@dataclass(frozen=True, kw_only=True)
class TxOpened:
    """A running attempt opened `ctx.transaction()` on this server session (its `lsid`),
    sent by its worker process so that the dispatcher can end the session if the worker
    dies before it commits."""

    job_id: str
    attempt: int
    session_id: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ProgressReport:
    """A running attempt's `ctx.progress(...)`, sent by its worker process (coalesced there
    to a few a second) and written by the dispatcher holding the lease."""

    job_id: str
    attempt: int
    task: str
    fraction: float
    message: str | None = None


class ReservedWorker:
    """A reserved idle worker: the runner's own handle, opaque to the dispatcher."""


class Runner(Protocol):
    """Workers that run jobs in isolated processes (implemented by `executor.pool`), and
    shared worker processes that run many jobs each (`executor.shared_pool`, with the two
    together in `executor.runners`)."""

    # The tasks whose jobs run in shared worker processes, each with its `shared=` count
    # (empty: every job has a process of its own).
    shared: Mapping[str, int]
    on_free: Callable[[], None]
    on_progress: Callable[[ProgressReport], None]
    # A running attempt asks for a step to be recorded; the callback answers by calling
    # `reply` once it is written (or not).
    on_step: Callable[[StepRecord, Callable[[StepAck], None]], None]

    async def start(self) -> None: ...

    async def close(self, timeout: float = 5.0) -> None: ...

    def free_workers(self) -> int:
        """Worker processes free now, each for one job."""
        ...

    def free_seats(self, task: str | None = None) -> int:
        """Seats free now in shared worker processes (for a job of `task`, within its
        `shared=` count; 0 for a task that does not share)."""
        ...

    def reserve(self, shared_task: str | None = None) -> ReservedWorker | None:
        """A free worker process; with `shared_task`, a seat for one of its jobs in a shared
        worker process."""
        ...

    def unreserve(self, reserved: ReservedWorker) -> None: ...

    async def run(
        self, reserved: ReservedWorker, job: RunJob, timeout: float | None
    ) -> Outcome: ...

    def kill(self, job_id: str, reason: KillReason) -> bool: ...
