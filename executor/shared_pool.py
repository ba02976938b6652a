"""Shared worker processes (`BROOK_SHARED_PROCESSES`), each running many jobs at once as
asyncio tasks (`executor.shared_worker`): the jobs of tasks declared `@task(..., shared=N)`.

The parent side keeps, per process, a seat per job it runs (by job id) and the waiter of
each. Seats are counted three ways: at most `BROOK_SHARED_MAX` in flight per dispatcher,
at most a task's `shared=` count of its jobs in one process, and at most the seats left in
a process that is being replaced (after `BROOK_SHARED_RECYCLE` jobs, or once its resident
memory passed `BROOK_SHARED_MEMORY_MIB`: none).

Stopping one job (timeout, cancel, lost lease, shutdown) cancels its asyncio task only; its
`JobDone` settles it with the stop's reason. One that has not ended
`BROOK_SHARED_STOP_GRACE_SECONDS` later (it does not yield: a blocking call) has its process
killed. A process that dies (SIGKILL, OOM, segfault, `os._exit`, or that kill) ends every
job it held: the stopped one with its stop's reason, each other one as `crashed`
(`WorkerCrashed`); the dispatcher retries them (the attempt is not charged to the job's
budget: `common.store.fields.shared_death_budget`) and a new process takes their place.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

import aiomultiprocess
import aiomultiprocess.core

from brook.common.protocol.runner import (
    CancelJob,
    KillReason,
    LoopBlocked,
    Outcome,
    ProgressReport,
    ReservedWorker,
    RunJob,
    StepAck,
    StepRecord,
    TxOpened,
)
from brook.common.runtime.backoff import exponential
from brook.common.runtime.log_events import Event, job_fields, log_event
from brook.common.runtime.metrics import LOOPS_BLOCKED, SHARED_IN_FLIGHT
from brook.common.runtime.settings import Settings
from brook.common.runtime.supervision import Spawn, spawn_logged
from brook.executor.forking import start_method
from brook.executor.pool import _done_outcome, _no_steps, _NoManager, _signal_name
from brook.executor.shared_worker import shared_worker_main
from brook.executor.worker import READY, STOP, JobDone


@dataclasses.dataclass(kw_only=True)
class _Seat:
    job: RunJob
    waiter: asyncio.Future[Outcome]
    sent_at: float
    kill_reason: KillReason | None = None
    tx_session: dict[str, Any] | None = None
    overdue: asyncio.TimerHandle | None = None


MEMORY_READ_EVERY_S = 0.5
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def past_memory_ceiling(proc: _Shared, settings: Settings) -> dict[str, Any] | None:
    """After one of its jobs ended: why a process whose resident memory has reached
    `BROOK_SHARED_MEMORY_MIB` (a slow leak in user code) is to be replaced, or None. Read at
    most every `MEMORY_READ_EVERY_S` while it runs jobs, and always when its last one ends."""
    ceiling = settings.shared_memory_mib
    if not ceiling or proc.exited.done() or proc.pid is None:
        return None
    now = time.monotonic()
    if proc.in_flight() and now - proc.memory_read_at < MEMORY_READ_EVERY_S:
        return None
    proc.memory_read_at = now
    rss = resident_mib(proc.pid)
    if rss is None or rss < ceiling:
        return None
    return {"reason": "memory", "rss_mib": round(rss, 1), "ceiling_mib": ceiling}


def resident_mib(pid: int) -> float | None:
    """The resident memory of process `pid` in MiB (`/proc/<pid>/statm`), None where it
    cannot be read (gone, or no procfs)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * PAGE_BYTES / 2**20


class _Shared:
    def __init__(self, name: str, proc: aiomultiprocess.Process, conn: Connection) -> None:
        self.name = name
        self.proc = proc
        self.conn = conn
        self.ready = False
        self.seats: dict[str, _Seat] = {}
        self.reserved: Counter[str] = Counter()  # seats reserved, by task
        self.runs = 0  # jobs it was given (seats reserved)
        self.retiring = False  # replaced once it drains (`BROOK_SHARED_RECYCLE`, memory)
        self.retired_for: dict[str, Any] = {}  # why: its jobs, or its memory
        self.memory_read_at = 0.0  # time.monotonic() of its last memory reading
        self.exited = asyncio.get_running_loop().create_future()

    def in_flight(self) -> int:
        return len(self.seats) + self.reserved.total()

    def gauge(self) -> None:
        SHARED_IN_FLIGHT.labels(worker=self.name).set(len(self.seats))

    def of_task(self, task: str) -> int:
        return sum(1 for s in self.seats.values() if s.job.task == task) + self.reserved[task]

    @property
    def pid(self) -> int | None:
        pid: int | None = self.proc.pid
        return pid


class SeatReservation(ReservedWorker):
    """A reserved seat in a shared worker process; hand it a job with `SharedPool.run`."""

    def __init__(self, proc: _Shared, task: str) -> None:
        self.proc = proc
        self.task = task


class SharedPool:
    def __init__(
        self, settings: Settings, shared: Mapping[str, int], *, spawn: Spawn = spawn_logged
    ) -> None:
        """`shared`: the tasks whose jobs it runs, each with its `shared=` count."""
        self.settings = settings
        self.shared = dict(shared)
        self.size = settings.shared_processes
        self.on_free: Callable[[], None] = lambda: None
        self.on_progress: Callable[[ProgressReport], None] = lambda report: None
        self.on_step: Callable[[StepRecord, Callable[[StepAck], None]], None] = _no_steps
        self._spawn_task = spawn
        self._procs: dict[str, _Shared] = {}
        self._names = itertools.count(1)
        self._closing = False
        self._spawn_failures = 0
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, timeout: float = 60.0) -> None:
        if aiomultiprocess.core._manager is None:
            aiomultiprocess.core._manager = _NoManager()
        aiomultiprocess.set_start_method(start_method())
        async with asyncio.timeout(timeout):
            self._watch(*await asyncio.to_thread(self._launch))
            for _ in range(self.size - 1):
                self._watch(*self._launch())
            while sum(p.ready for p in self._procs.values()) < self.size:
                if self._spawn_failures >= self.size:
                    raise RuntimeError("shared worker processes exit at start; see worker logs")
                await asyncio.sleep(0.02)

    def _launch(self) -> tuple[str, aiomultiprocess.Process, Connection]:
        name = f"s{next(self._names)}"
        parent_conn, child_conn = multiprocessing.Pipe(duplex=True)
        proc = aiomultiprocess.Process(
            target=shared_worker_main,
            args=(child_conn, self.settings, name),
            name=f"brook-{name}",
            daemon=True,
        )
        proc.start()
        child_conn.close()
        return name, proc, parent_conn

    def _watch(self, name: str, proc: aiomultiprocess.Process, conn: Connection) -> None:
        shared = _Shared(name, proc, conn)
        self._procs[name] = shared
        loop = asyncio.get_running_loop()
        loop.add_reader(conn.fileno(), self._on_message, shared)
        loop.add_reader(proc.aio_process.sentinel, self._on_exit, shared)

    async def close(self, timeout: float = 5.0) -> None:
        """Stop idle processes politely and busy ones by force; leave no process behind."""
        self._closing = True
        for proc in list(self._procs.values()):
            if proc.seats:
                self._kill(proc, "shutdown")
            else:
                with contextlib.suppress(OSError):
                    proc.conn.send(STOP)
        exits = [p.exited for p in self._procs.values()]
        if exits:
            _, pending = await asyncio.wait(exits, timeout=timeout)
            if pending:
                for proc in list(self._procs.values()):
                    self._kill(proc, "shutdown")
                await asyncio.wait(exits, timeout=timeout)
        for task in list(self._tasks):
            task.cancel()

    # -- seats -----------------------------------------------------------------------------

    def _open(self) -> list[_Shared]:
        return [p for p in self._procs.values() if p.ready and not p.retiring]

    def _room(self, proc: _Shared, task: str) -> int:
        return self.shared.get(task, 0) - proc.of_task(task)

    def free_seats(self, task: str | None = None) -> int:
        if self._closing:
            return 0
        procs = self._open()
        left = self.settings.shared_max - sum(p.in_flight() for p in self._procs.values())
        if task is None:
            return max(left, 0) if procs else 0
        return max(min(left, sum(max(self._room(p, task), 0) for p in procs)), 0)

    def reserve(self, task: str) -> SeatReservation | None:
        """A seat for a job of `task`, in the open process with the fewest jobs."""
        if self.free_seats(task) <= 0:
            return None
        procs = [p for p in self._open() if self._room(p, task) > 0]
        proc = min(procs, key=lambda p: p.in_flight())
        proc.reserved[task] += 1
        proc.runs += 1
        recycle = self.settings.shared_recycle
        if recycle and proc.runs >= recycle:
            self._retire(proc, reason="jobs")  # its last job
        return SeatReservation(proc, task)

    def _retire(self, proc: _Shared, **why: Any) -> None:
        """`proc` takes no new job and is replaced now; it stops once drained."""
        proc.retiring = True
        proc.retired_for = why
        if not self._closing:
            self._watch(*self._launch())

    def unreserve(self, reserved: SeatReservation) -> None:
        reserved.proc.reserved[reserved.task] -= 1
        reserved.proc.runs -= 1
        self._maybe_retire(reserved.proc)

    # -- running ---------------------------------------------------------------------------

    async def run(self, reserved: SeatReservation, job: RunJob, timeout: float | None) -> Outcome:
        proc = reserved.proc
        proc.reserved[reserved.task] -= 1
        waiter: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        seat = _Seat(job=job, waiter=waiter, sent_at=time.monotonic())
        proc.seats[job.job_id] = seat
        proc.gauge()
        if proc.exited.done():  # it died between the reservation and now
            self._settle(proc, seat, _death(proc, seat, proc.proc.exitcode))
        else:
            with contextlib.suppress(OSError, ValueError):
                proc.conn.send(job)  # if it died meanwhile, its sentinel reports it
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
        if not done:
            self._stop(proc, seat, "timeout")
        return await waiter

    def kill(self, job_id: str, reason: KillReason) -> bool:
        """Stop the attempt of `job_id` (its waiter then resolves with `reason`)."""
        for proc in self._procs.values():
            seat = proc.seats.get(job_id)
            if seat is not None:
                self._stop(proc, seat, reason)
                return True
        return False

    def _stop(self, proc: _Shared, seat: _Seat, reason: KillReason) -> None:
        if reason == "shutdown":
            self._closing = True  # the owner is going away: replace no process
        if seat.kill_reason is not None:
            return
        seat.kill_reason = reason
        with contextlib.suppress(OSError, ValueError):
            proc.conn.send(CancelJob(job_id=seat.job.job_id, attempt=seat.job.attempt))
        grace = self.settings.shared_stop_grace_seconds
        seat.overdue = asyncio.get_running_loop().call_later(grace, self._overdue, proc, seat)

    def _overdue(self, proc: _Shared, seat: _Seat) -> None:
        """A stopped job did not end within the grace period: it does not yield (a blocking
        call), so its process goes, and with it every job it holds."""
        if proc.seats.get(seat.job.job_id) is seat:
            self._kill(proc, seat.kill_reason or "cancelled", job=seat.job)

    def _kill(self, proc: _Shared, reason: KillReason, job: RunJob | None = None) -> None:
        if proc.exited.done():
            return
        log_event(
            Event.WORKER_KILLED,
            worker=proc.name,
            pid=proc.pid,
            reason=reason,
            shared=True,
            job_ids=sorted(proc.seats),
            **(job_fields(job) if job is not None else {}),
        )
        with contextlib.suppress(ProcessLookupError, OSError, AttributeError):
            proc.proc.kill()

    # -- process events --------------------------------------------------------------------

    def _on_message(self, proc: _Shared) -> None:
        try:
            while proc.conn.poll():
                self._handle(proc, proc.conn.recv())
        except (EOFError, OSError):
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(proc.conn.fileno())

    def _handle(self, proc: _Shared, msg: Any) -> None:
        if msg == READY:
            proc.ready = True
            self._spawn_failures = 0
            log_event(Event.WORKER_STARTED, worker=proc.name, pid=proc.pid, shared=True)
            proc.gauge()
            self.on_free()
            return
        if isinstance(msg, LoopBlocked):
            LOOPS_BLOCKED.inc()
            return
        seat = _held(proc, getattr(msg, "job_id", None), getattr(msg, "attempt", None))
        if seat is None:
            return
        if isinstance(msg, JobDone):
            self._settle(proc, seat, _done(seat, msg))
            self.on_free()
        elif seat.kill_reason is not None:
            return  # being stopped: its progress and steps no longer count
        elif isinstance(msg, ProgressReport):
            self.on_progress(msg)
        elif isinstance(msg, StepRecord):
            self.on_step(msg, lambda ack: self._answer(proc, ack))
        elif isinstance(msg, TxOpened):
            seat.tx_session = msg.session_id

    def _answer(self, proc: _Shared, ack: StepAck) -> None:
        seat = _held(proc, ack.job_id, ack.attempt)
        if seat is not None and seat.kill_reason is None:
            with contextlib.suppress(OSError, ValueError):
                proc.conn.send(ack)

    def _settle(self, proc: _Shared, seat: _Seat, outcome: Outcome) -> None:
        outcome = dataclasses.replace(outcome, started=seat.sent_at, ended=time.monotonic())
        if proc.seats.get(seat.job.job_id) is seat:
            del proc.seats[seat.job.job_id]
        if seat.overdue is not None:
            seat.overdue.cancel()
        proc.gauge()
        if not seat.waiter.done():
            seat.waiter.set_result(outcome)
        if not proc.retiring and (why := past_memory_ceiling(proc, self.settings)):
            self._retire(proc, **why)
        self._maybe_retire(proc)

    def _maybe_retire(self, proc: _Shared) -> None:
        """After `BROOK_SHARED_RECYCLE` jobs a process takes no more (`reserve`), and is
        stopped once it drains (so that a slow leak in user code does not grow without
        bound); its replacement started when it took its last job."""
        if proc.retiring and proc.in_flight() == 0 and not proc.exited.done():
            why = {"jobs": proc.runs, **proc.retired_for}
            log_event(Event.WORKER_RECYCLED, worker=proc.name, pid=proc.pid, **why)
            with contextlib.suppress(OSError):
                proc.conn.send(STOP)

    def _on_exit(self, proc: _Shared) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(proc.proc.aio_process.sentinel)
        self._on_message(proc)  # results sent just before it exited still count
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(proc.conn.fileno())
        proc.proc.aio_process.join(1.0)
        code = proc.proc.exitcode
        self._procs.pop(proc.name, None)
        with contextlib.suppress(KeyError):
            SHARED_IN_FLIGHT.remove(proc.name)
        with contextlib.suppress(OSError):
            proc.conn.close()
        if not proc.exited.done():
            proc.exited.set_result(None)
        if proc.seats:
            log_event(
                Event.WORKER_CRASHED,
                level="warning",
                worker=proc.name,
                pid=proc.pid,
                exitcode=code,
                signal=_signal_name(code),
                shared=True,
                job_ids=sorted(proc.seats),
            )
            for seat in list(proc.seats.values()):
                self._settle(proc, seat, _death(proc, seat, code))
        elif not proc.ready:
            self._spawn_failures += 1
            log_event(
                Event.WORKER_CRASHED,
                level="error",
                worker=proc.name,
                pid=proc.pid,
                exitcode=code,
                during="startup",
            )
        else:
            log_event(Event.WORKER_STOPPED, worker=proc.name, pid=proc.pid, exitcode=code)
        if not self._closing and len(self._open()) < self.size:
            self._respawn_later()
        self.on_free()

    def _respawn_later(self) -> None:
        failures = self._spawn_failures
        delay = exponential(failures - 1, 0.5, 30.0) if failures else 0.0

        async def respawn() -> None:
            await asyncio.sleep(delay)
            if not self._closing and len(self._open()) + self._starting() < self.size:
                self._watch(*self._launch())

        task = self._spawn_task(respawn(), "respawn-shared-worker")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _starting(self) -> int:
        return sum(1 for p in self._procs.values() if not p.ready)


def _held(proc: _Shared, job_id: object, attempt: object) -> _Seat | None:
    """The seat of this attempt in `proc`, if it still runs there."""
    seat = proc.seats.get(job_id) if isinstance(job_id, str) else None
    return seat if seat is not None and seat.job.attempt == attempt else None


def _done(seat: _Seat, msg: JobDone) -> Outcome:
    """How an attempt ended, as its worker reported it; a stopped one with its stop's
    reason, unless its own transaction had already committed its completion."""
    if seat.kill_reason is None or msg.tx == "committed":
        return _done_outcome(msg, seat.tx_session)
    return _stopped(seat, None)


def _stopped(seat: _Seat, code: int | None) -> Outcome:
    """The end of an attempt that was being stopped, for its stop's reason."""
    reason = seat.kill_reason
    assert reason is not None
    if reason == "timeout":
        error = {"type": "Timeout", "message": "attempt exceeded its timeout; it was stopped"}
        return Outcome(kind="timeout", exitcode=code, error=error, tx_session=seat.tx_session)
    return Outcome(kind=reason, exitcode=code, tx_session=seat.tx_session)


def _death(proc: _Shared, seat: _Seat, code: int | None) -> Outcome:
    """How an attempt ended whose shared process exited while it ran: its stop's reason if
    it was being stopped, else a crash (a transaction it opened may still be open on the
    server: its session goes with the outcome)."""
    if seat.kill_reason is not None:
        return _stopped(seat, code)
    sig = _signal_name(code)
    message = f"shared worker process {proc.pid} exited with code {code}" + (
        f" ({sig})" if sig else ""
    )
    return Outcome(
        kind="crashed",
        exitcode=code,
        error={"type": "WorkerCrashed", "message": message},
        tx_session=seat.tx_session,
    )
