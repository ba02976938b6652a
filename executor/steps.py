"""Durable steps in a worker process: `ctx.step`, `ctx.sleep`, `ctx.wait_for_signal` and
`ctx.changed`.

An attempt's `Journal` holds the steps earlier runs recorded (handed over with the job,
`RunJob.steps`): a step found there is replayed, its function not called. A new step runs,
and its result goes up the pipe to the dispatcher holding the lease, which writes it fenced
by attempt and owner (`dispatcher.attempts.step_keeper`); the step returns only once that write is
majority-acknowledged (`StepAck`), so a step that returned is never run again. A sleep is
a step whose result is its wake time; a signal wait is a step whose result is the signal.
Either ends the run (`Suspended`) when it cannot return yet: the dispatcher writes the job
back to pending until its wake time or a signal, and the next run replays up to it. A
`ctx.changed` marker is a step whose result is its answer: `True` when the run reached it
with no recorded step left to replay (it is at its frontier and runs the new code), `False`
when earlier runs recorded steps past it (they ran the old code there).

A transactional step (`transactional=True`) is the exception to "the dispatcher writes":
its function's writes and its checkpoint commit in one MongoDB transaction, so the worker
writes the checkpoint in it, fenced by attempt and owner like `ctx.transaction()`'s
completion (`executor.step_transaction`).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from brook.common.domain.errors import DuplicateStep, LeaseLost, StepError
from brook.common.domain.steps import CHANGED, check_steps_total, encode_step_result
from brook.common.protocol.runner import RunJob, StepAck, StepRecord, Suspend
from brook.common.runtime.log_events import Event, log_event

# A sleep replayed this close to its wake time waits in its worker instead of ending the
# run again (a dispatcher's reading of the server clock errs by a round trip).
WAIT_IN_PLACE_S = 1.0

# The running attempt's journal: per asyncio task (a shared worker process runs many
# attempts at once), and seen by a plain `def` task's thread (`asyncio.to_thread` copies
# the context). Step acknowledgements are routed by job and attempt (`_journals`).
_current: contextvars.ContextVar[Journal | None] = contextvars.ContextVar(
    "brook_journal", default=None
)
_journals: dict[tuple[str, int], Journal] = {}


class Suspended(BaseException):
    """Ends a run that sleeps or waits for a signal. A `BaseException`, so that a task's
    `except Exception` does not swallow it."""

    def __init__(self, suspend: Suspend) -> None:
        super().__init__(suspend.waiting.get("kind", "suspended"))
        self.suspend = suspend


class StepFailedMark:
    """The name of the step an exception came out of, kept on the exception (the job's
    error and history name it)."""

    ATTR = "_brook_step"


def mark_failed(exc: BaseException, name: str) -> None:
    if getattr(exc, StepFailedMark.ATTR, None) is None:
        try:
            setattr(exc, StepFailedMark.ATTR, name)
        except AttributeError:  # pragma: no cover - an exception type with __slots__
            return


def failed_step(exc: BaseException) -> str | None:
    name = getattr(exc, StepFailedMark.ATTR, None)
    return name if isinstance(name, str) else None


class Journal:
    """One attempt's steps: the ones recorded by earlier runs, and this run's."""

    def __init__(self, run: RunJob, send: Callable[[Any], None] | None) -> None:
        self.run = run
        self._send = send
        self.recorded: dict[str, Any] = dict(run.steps)
        # Recorded steps this run has not reached yet: while any is left, the run replays
        # what an earlier run (maybe older code) did past this point (`ctx.changed`). The
        # markers of `ctx.changed` are answers, not progress: one whose call a later deploy
        # removed must not hold every later marker on the old path.
        self._unreached: set[str] = {n for n in run.steps if not n.startswith(CHANGED)}
        self.total = run.steps_bytes
        self.used: set[str] = set()
        self._counters: dict[str, int] = {}
        self._waiting: dict[str, asyncio.Future[StepAck]] = {}
        self.replayed = 0
        self.ran = 0
        self.committed = 0  # transactional steps: recorded by this worker, not the dispatcher

    def enter(self, name: str) -> tuple[bool, Any]:
        """Start the step `name`: (True, its result) if an earlier run recorded it."""
        if name in self.used:
            raise DuplicateStep(
                f"step {name!r} already ran in this run: step names must be unique within a run"
            )
        self.used.add(name)
        self._unreached.discard(name)
        if name in self.recorded:
            self.replayed += 1
            log_event(Event.STEP_REPLAYED, step=name)
            return True, self.recorded[name]
        return False, None

    def past_here(self) -> bool:
        """Whether earlier runs recorded steps this run has not reached yet: they went past
        the current point of the task."""
        return bool(self._unreached)

    def auto_name(self, prefix: str) -> str:
        """`prefix#n`: the n-th sleep (or wait on one key) of this run."""
        n = self._counters.get(prefix, 0) + 1
        self._counters[prefix] = n
        return f"{prefix}#{n}"

    async def record(
        self, name: str, value: Any, duration_ms: float, *, wake_in_s: float | None = None
    ) -> Any:
        """Have the dispatcher checkpoint this step; return its result as stored (what a
        replay returns), once the checkpoint is majority-written."""
        stored, size = encode_step_result(name, value)
        check_steps_total(name, self.total + size)
        if self._send is None:
            raise RuntimeError("steps need a running attempt of a Brook worker")
        run = self.run
        future: asyncio.Future[StepAck] = asyncio.get_running_loop().create_future()
        self._waiting[name] = future
        self._send(
            StepRecord(
                job_id=run.job_id,
                attempt=run.attempt,
                task=run.task,
                name=name,
                result=stored,
                size=size,
                duration_ms=duration_ms,
                wake_in_s=wake_in_s,
            )
        )
        try:
            ack = await future
        finally:
            self._waiting.pop(name, None)
        if not ack.ok:
            if ack.error == "lease lost":
                raise LeaseLost(
                    f"step {name!r}: job {run.job_id} attempt {run.attempt} no longer holds "
                    "its lease; the step was not recorded"
                )
            raise StepError(f"step {name!r} was not recorded: {ack.error}")
        self.note_recorded(name, ack.result if wake_in_s is not None else stored, size)
        return self.recorded[name]

    def note_recorded(self, name: str, stored: Any, size: int) -> None:
        self.recorded[name] = stored
        self.total += size
        self.ran += 1

    def deliver(self, ack: StepAck) -> None:
        """The dispatcher answered (called on this process's event loop)."""
        future = self._waiting.get(ack.name)
        if future is not None and not future.done():
            future.set_result(ack)

    def server_now(self) -> datetime:
        return datetime.fromtimestamp(time.time() + self.run.server_offset, UTC)

    def until_due(self, until: datetime) -> float:
        return (until - self.server_now()).total_seconds()


def current() -> Journal | None:
    return _current.get()


def set_current(journal: Journal | None) -> None:
    """The running attempt's journal (None: its run is over)."""
    previous = _current.get()
    if previous is not None:
        _journals.pop((previous.run.job_id, previous.run.attempt), None)
    _current.set(journal)
    if journal is not None:
        _journals[(journal.run.job_id, journal.run.attempt)] = journal


def deliver(message: Any) -> None:
    """A message from the dispatcher while a job runs: a step's acknowledgement, for the
    attempt it names (if it still runs here)."""
    if not isinstance(message, StepAck):
        return
    journal = _journals.get((message.job_id, message.attempt))
    if journal is not None:
        journal.deliver(message)


def as_datetime(value: Any) -> datetime:
    if not isinstance(value, datetime):
        raise StepError(f"a sleep's recorded wake time is not a date: {value!r}")
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def sleep_suspend(name: str, until: datetime) -> Suspend:
    return Suspend(until=until, waiting={"kind": "sleep", "step": name, "until": until})


def wait_suspend(name: str, key: str, until: datetime | None) -> Suspend:
    return Suspend(
        until=until, waiting={"kind": "signal", "key": key, "step": name, "until": until}
    )


def timeout_seconds(timeout: float | timedelta | None) -> float | None:
    if timeout is None:
        return None
    from brook.common.domain.steps import seconds_of

    return seconds_of(timeout, "wait_for_signal timeout")
