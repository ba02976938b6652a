"""Supervised worker processes (`aiomultiprocess.Process`), one job at a time each.

`aiomultiprocess.Pool` hangs when a child dies and cannot time out or cancel one task, so
Brook supervises its own long-lived `aiomultiprocess.Process` children instead:

* each worker has a private pipe; the parent always knows which job each process holds;
* the parent watches each process's sentinel, so a death (crash, SIGKILL, OOM) is seen
  within milliseconds, the job's waiter gets a `crashed` outcome and the worker is replaced;
* timeouts, cancellations and lost leases are enforced by the parent killing the process;
* a running task's progress reports come up the same pipe and go to `on_progress`; the
  session of a transaction it opens comes too, and goes with its outcome; so do its
  steps (`on_step`), whose acknowledgement goes back down the pipe to the worker, which
  waits for it (only while it still runs that attempt);
* a worker that reports its job's result is free at once (`on_free`): the dispatcher
  hands it the next job while the outcome is written behind it.

Workers are forks of a fork server that imported the heavy modules once
(`executor.forking`), so a pool of 32 is ready in about two seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import multiprocessing
import signal
import time
import types
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

import aiomultiprocess
import aiomultiprocess.core

from brook.common.protocol.runner import (
    KillReason,
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
from brook.common.runtime.settings import Settings
from brook.common.runtime.supervision import Spawn, spawn_logged
from brook.executor.forking import start_method
from brook.executor.worker import READY, STOP, JobDone, worker_main


class _NoManager:
    """aiomultiprocess gives every Process a Manager namespace, which starts an extra server
    process that would outlive a SIGKILLed dispatcher. Brook's workers talk over their own
    pipes and never use it, so a plain namespace stands in."""

    def Namespace(self) -> types.SimpleNamespace:
        return types.SimpleNamespace()


class _Worker:
    def __init__(self, name: str, proc: aiomultiprocess.Process, conn: Connection) -> None:
        self.name = name
        self.proc = proc
        self.conn = conn
        self.ready = False
        self.reserved = False
        self.job: RunJob | None = None
        self.waiter: asyncio.Future[Outcome] | None = None
        self.sent_at = 0.0  # time.monotonic() when its job was sent
        self.kill_reason: KillReason | None = None
        self.tx_session: dict[str, Any] | None = None  # the running attempt's transaction
        self.exited = asyncio.get_running_loop().create_future()

    @property
    def pid(self) -> int | None:
        pid: int | None = self.proc.pid
        return pid


class PoolReservation(ReservedWorker):
    """A reserved idle worker; hand it a job with `WorkerPool.run`, or give it back."""

    def __init__(self, worker: _Worker) -> None:
        self.worker = worker


class WorkerPool:
    def __init__(
        self,
        settings: Settings,
        size: int,
        on_free: Callable[[], None] = lambda: None,
        *,
        spawn: Spawn = spawn_logged,
        on_progress: Callable[[ProgressReport], None] = lambda report: None,
    ) -> None:
        self.settings = settings
        self.size = size
        self.on_free = on_free
        self.on_progress = on_progress
        self.on_step: Callable[[StepRecord, Callable[[StepAck], None]], None] = _no_steps
        self.shared: Mapping[str, int] = {}  # no shared jobs here (`executor.runners`)
        self._spawn_task = spawn
        self._workers: dict[str, _Worker] = {}
        self._names = itertools.count(1)
        self._closing = False
        self._spawn_failures = 0  # workers that died before they were ready, in a row
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, timeout: float = 60.0) -> None:
        """Start every worker and wait until each has imported its tasks."""
        if aiomultiprocess.core._manager is None:
            aiomultiprocess.core._manager = _NoManager()
        aiomultiprocess.set_start_method(start_method())
        async with asyncio.timeout(timeout):
            # The first start waits for the fork server to be up: off the event loop, so
            # the dispatcher's own start-up goes on meanwhile. The others take a fork each.
            self._watch(*await asyncio.to_thread(self._launch))
            for _ in range(self.size - 1):
                self._spawn()
            while sum(w.ready for w in self._workers.values()) < self.size:
                if self._spawn_failures >= self.size:
                    raise RuntimeError("worker processes exit at start; see worker logs")
                await asyncio.sleep(0.02)

    def _spawn(self) -> None:
        self._watch(*self._launch())

    def _launch(self) -> tuple[str, aiomultiprocess.Process, Connection]:
        """Start one worker process (no event loop needed: it may run on a thread)."""
        name = f"w{next(self._names)}"
        parent_conn, child_conn = multiprocessing.Pipe(duplex=True)
        proc = aiomultiprocess.Process(
            target=worker_main,
            args=(child_conn, self.settings, name),
            name=f"brook-{name}",
            daemon=True,
        )
        proc.start()
        child_conn.close()
        return name, proc, parent_conn

    def _watch(self, name: str, proc: aiomultiprocess.Process, parent_conn: Connection) -> None:
        worker = _Worker(name, proc, parent_conn)
        self._workers[name] = worker
        loop = asyncio.get_running_loop()
        loop.add_reader(parent_conn.fileno(), self._on_message, worker)
        loop.add_reader(proc.aio_process.sentinel, self._on_exit, worker)

    async def close(self, timeout: float = 5.0) -> None:
        """Stop idle workers politely and busy ones by force; leave no process behind."""
        self._closing = True
        for worker in list(self._workers.values()):
            if worker.job is None:
                with contextlib.suppress(OSError):
                    worker.conn.send(STOP)
            else:
                self._kill(worker, "shutdown")
        exits = [w.exited for w in self._workers.values()]
        if exits:
            _, pending = await asyncio.wait(exits, timeout=timeout)
            if pending:
                for worker in list(self._workers.values()):
                    self._kill(worker, "shutdown")
                await asyncio.wait(exits, timeout=timeout)
        for task in list(self._tasks):
            task.cancel()

    # -- workers ---------------------------------------------------------------------------

    @staticmethod
    def _idle(w: _Worker) -> bool:
        return w.ready and not w.reserved and w.job is None and w.kill_reason is None

    def free_workers(self) -> int:
        return sum(1 for w in self._workers.values() if self._idle(w))

    def free_seats(self, task: str | None = None) -> int:
        return 0

    def reserve(self, shared_task: str | None = None) -> PoolReservation | None:
        if self._closing or shared_task is not None:
            return None
        for w in self._workers.values():
            if self._idle(w):
                w.reserved = True
                return PoolReservation(w)
        return None

    def unreserve(self, reserved: ReservedWorker) -> None:
        _worker_of(reserved).reserved = False

    # -- running ---------------------------------------------------------------------------

    async def run(self, reserved: ReservedWorker, job: RunJob, timeout: float | None) -> Outcome:
        worker = _worker_of(reserved)
        worker.job = job
        worker.tx_session = None
        waiter: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        worker.waiter = waiter
        worker.sent_at = time.monotonic()
        # If the process died between reserve and send, its sentinel reports it.
        with contextlib.suppress(OSError):
            worker.conn.send(job)
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
        if not done:
            self._kill(worker, "timeout")
        return await waiter

    def kill(self, job_id: str, reason: KillReason) -> bool:
        """Stop the worker holding `job_id` (its waiter then resolves with `reason`)."""
        for w in self._workers.values():
            if w.job is not None and w.job.job_id == job_id:
                self._kill(w, reason)
                return True
        return False

    def _kill(self, worker: _Worker, reason: KillReason) -> None:
        if reason == "shutdown":
            self._closing = True  # the owner is going away: replace no worker
        if worker.kill_reason is None:
            worker.kill_reason = reason
        if worker.exited.done():
            return
        log_event(
            Event.WORKER_KILLED,
            worker=worker.name,
            pid=worker.pid,
            reason=reason,
            **_job_log(worker.job),
        )
        with contextlib.suppress(ProcessLookupError, OSError, AttributeError):
            worker.proc.kill()

    # -- process events ------------------------------------------------------------------------

    def _on_message(self, worker: _Worker) -> None:
        try:
            while worker.conn.poll():
                self._handle(worker, worker.conn.recv())
        except (EOFError, OSError):
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(worker.conn.fileno())

    def _handle(self, worker: _Worker, msg: Any) -> None:
        if msg == READY:
            worker.ready = True
            self._spawn_failures = 0
            log_event(Event.WORKER_STARTED, worker=worker.name, pid=worker.pid)
            self.on_free()
            return
        if isinstance(msg, ProgressReport):
            if self._holds(worker, msg.job_id, msg.attempt):
                self.on_progress(msg)
            return
        if isinstance(msg, StepRecord):
            if self._holds(worker, msg.job_id, msg.attempt):
                self.on_step(msg, lambda ack: self._answer(worker, ack))
            return
        if isinstance(msg, TxOpened):
            job = worker.job
            if job is not None and (job.job_id, job.attempt) == (msg.job_id, msg.attempt):
                worker.tx_session = msg.session_id
            return
        if isinstance(msg, JobDone) and self._holds(worker, msg.job_id, msg.attempt):
            self._settle(worker, _done_outcome(msg, worker.tx_session))
            # Free at once: its next job need not wait for this one's outcome write.
            self.on_free()

    def _answer(self, worker: _Worker, ack: StepAck) -> None:
        """A step's acknowledgement, to the worker that asked, if it still runs that attempt
        (a killed one is gone, or about to be)."""
        if self._holds(worker, ack.job_id, ack.attempt):
            with contextlib.suppress(OSError, ValueError):
                worker.conn.send(ack)

    @staticmethod
    def _holds(worker: _Worker, job_id: str, attempt: int) -> bool:
        """The worker still runs this attempt, and nobody is stopping it."""
        job = worker.job
        return (
            job is not None
            and worker.kill_reason is None
            and (job.job_id, job.attempt) == (job_id, attempt)
        )

    def _settle(self, worker: _Worker, outcome: Outcome) -> None:
        outcome = dataclasses.replace(outcome, started=worker.sent_at, ended=time.monotonic())
        waiter = worker.waiter
        worker.job = None
        worker.waiter = None
        worker.reserved = False
        if waiter is not None and not waiter.done():
            waiter.set_result(outcome)

    def _on_exit(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(worker.proc.aio_process.sentinel)
        self._on_message(worker)  # a result sent just before exiting still counts
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(worker.conn.fileno())
        worker.proc.aio_process.join(1.0)
        code = worker.proc.exitcode
        self._workers.pop(worker.name, None)
        with contextlib.suppress(OSError):
            worker.conn.close()
        if not worker.exited.done():
            worker.exited.set_result(None)
        if worker.job is not None:
            self._settle(worker, _death_outcome(worker, code))
        elif not worker.ready:
            self._spawn_failures += 1
            log_event(
                Event.WORKER_CRASHED,
                level="error",
                worker=worker.name,
                pid=worker.pid,
                exitcode=code,
                during="startup",
            )
        else:
            log_event(Event.WORKER_STOPPED, worker=worker.name, pid=worker.pid, exitcode=code)
        if not self._closing:
            self._respawn_later()

    def _respawn_later(self) -> None:
        # Workers that die before they are ready are respawned ever more slowly.
        failures = self._spawn_failures
        delay = exponential(failures - 1, 0.5, 30.0) if failures else 0.0

        async def respawn() -> None:
            await asyncio.sleep(delay)
            if not self._closing and len(self._workers) < self.size:
                self._spawn()

        task = self._spawn_task(respawn(), "respawn-worker")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _no_steps(record: StepRecord, reply: Callable[[StepAck], None]) -> None:
    reply(
        StepAck(
            job_id=record.job_id,
            attempt=record.attempt,
            name=record.name,
            ok=False,
            error="this worker pool records no steps",
        )
    )


def _done_outcome(msg: JobDone, tx_session: dict[str, Any] | None) -> Outcome:
    """How an attempt ended, as its worker reported it."""
    outcome = _reported(msg, tx_session)
    return dataclasses.replace(
        outcome, steps_replayed=msg.steps_replayed, steps_committed=msg.steps_committed
    )


def _reported(msg: JobDone, tx_session: dict[str, Any] | None) -> Outcome:
    if msg.tx == "committed":  # its own transaction wrote the completion
        return Outcome(kind="ok", result=msg.result, committed=True)
    if msg.tx == "lost":  # its transaction found the lease lost, and aborted
        return Outcome(kind="lease_lost")
    if msg.suspend is not None:
        return Outcome(kind="suspended", suspend=msg.suspend)
    if msg.ok:
        return Outcome(kind="ok", result=msg.result)
    return Outcome(
        kind="error",
        error=msg.error,
        retry_delay=msg.retry_delay,
        tx_session=tx_session if msg.tx == "unknown" else None,
    )


def _death_outcome(worker: _Worker, code: int | None) -> Outcome:
    """How the attempt of a worker that exited while holding a job ended. A transaction it
    opened may still be open on the server: its session goes with the outcome."""
    reason = worker.kill_reason
    tx = worker.tx_session
    if reason == "timeout":
        message = f"attempt exceeded its timeout; worker {worker.pid} was killed"
        error = {"type": "Timeout", "message": message}
        return Outcome(kind="timeout", exitcode=code, error=error, tx_session=tx)
    if reason is not None:
        return Outcome(kind=reason, exitcode=code, tx_session=tx)
    sig = _signal_name(code)
    log_event(
        Event.WORKER_CRASHED,
        level="warning",
        worker=worker.name,
        pid=worker.pid,
        exitcode=code,
        signal=sig,
        **_job_log(worker.job),
    )
    message = f"worker process {worker.pid} exited with code {code}" + (f" ({sig})" if sig else "")
    return Outcome(
        kind="crashed",
        exitcode=code,
        error={"type": "WorkerCrashed", "message": message},
        tx_session=tx,
    )


def _worker_of(reserved: ReservedWorker) -> _Worker:
    assert isinstance(reserved, PoolReservation), f"not a worker of this pool: {reserved!r}"
    return reserved.worker


def _job_log(job: RunJob | None) -> dict[str, Any]:
    return job_fields(job) if job is not None else {}


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    with contextlib.suppress(ValueError):
        return signal.Signals(-code).name
    return None
