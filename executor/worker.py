"""The worker process: a long-lived child that runs one job at a time (a shared worker
process, which runs many at once, is `executor.shared_worker`; both run an attempt with
`run_one`).

The parent (the dispatcher) owns every state write, fenced by the lease, progress included
(sent up the pipe, see `executor.progress`), with one exception: a task that opened
`ctx.transaction()` has its completion written here, in its own transaction, fenced by
the same attempt and owner (`executor.transaction`). A task that wants MongoDB gets this
process's own client.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import multiprocessing.forkserver
import os
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from typing import Any, Literal

import bson
import structlog

from brook.common.domain.errors import RateLimited, Retry
from brook.common.domain.quota_specs import rate_limited_waiting
from brook.common.protocol.runner import RunJob, Suspend
from brook.common.runtime import tracing
from brook.common.runtime.log import configure_logging
from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.settings import Settings
from brook.common.store.transactions import TxEnd
from brook.executor.context import SyncTaskContext, TaskContext
from brook.executor.output import OutputStream, process_writer
from brook.executor.progress import ProgressReporter
from brook.executor.registry import get_task, load_tasks
from brook.executor.steps import Journal, Suspended, deliver, failed_step, set_current
from brook.executor.transaction import AttemptTransaction

PR_SET_PDEATHSIG = 1
MAX_RESULT_BYTES = 8 * 1024 * 1024  # half of MongoDB's 16 MiB document limit


class ResultTooLarge(Exception):
    """A task returned more than a job document can hold."""


@dataclass(frozen=True, kw_only=True)
class JobDone:
    job_id: str
    attempt: int
    ok: bool
    result: Any = None
    error: dict[str, Any] | None = None
    retry_delay: float | None = None
    # Set when the task opened `ctx.transaction()`: "committed" (the job is completed, with
    # the task's writes), "lost" (its lease was lost: aborted) or "unknown" (the commit's
    # outcome could not be learnt: the dispatcher decides by its fenced write).
    tx: Literal["committed", "lost", "unknown"] | None = None
    # The run ended to sleep or to wait for a signal (`ctx.sleep`, `ctx.wait_for_signal`).
    suspend: Suspend | None = None
    steps_replayed: int = 0
    steps_committed: int = 0


STOP = "stop"
READY = "ready"


def _die_with_parent() -> None:
    """If the dispatcher dies (even by SIGKILL), its workers die too: no orphan runs a job.

    A worker's parent is the dispatcher, or its fork server (`executor.forking`), which
    exits when the dispatcher dies, once no process holds the write end of its "alive"
    pipe. The fork server hands that end to every process it forks (so that they may start
    processes of their own through it); a worker never does, and closes it: otherwise the
    fork server would outlive a SIGKILLed dispatcher for as long as its workers live, and
    they for as long as it lives."""
    _close_forkserver_alive_fd()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent is already gone
        os._exit(0)


def _close_forkserver_alive_fd() -> None:
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if server is not None and isinstance(fd, int):
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None


async def _recv(conn: Connection) -> Any:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()

    def readable() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await fut
    finally:
        loop.remove_reader(fd)
    return conn.recv()


def error_doc(exc: BaseException) -> dict[str, Any]:
    doc = {
        "type": type(exc).__name__,
        "message": str(exc)[:4000],
        "traceback": "".join(traceback.format_exception(exc))[-8000:],
    }
    step = failed_step(exc)
    if step is not None:  # raised by a step's function: the job's error names it
        doc["step"] = step
        doc["message"] = f"step {step!r}: {doc['message']}"[:4000]
    return doc


def _context(
    msg: RunJob,
    settings: Settings,
    is_async: bool,
    reporter: ProgressReporter | None,
    tx: AttemptTransaction,
    journal: Journal,
    send: Callable[[Any], None] | None,
    output: OutputStream | None,
) -> TaskContext | SyncTaskContext:
    fields: dict[str, Any] = {
        "output": output,
        "job_id": msg.job_id,
        "attempt": msg.attempt,
        "task": msg.task,
        "process_settings": settings,
        "reporter": reporter,
        "tx": tx,
        "journal": journal,
        "send": send,
        "owner": msg.owner,
    }
    if is_async:
        return TaskContext(**fields)
    return SyncTaskContext(**fields, loop=asyncio.get_running_loop())


async def _call(msg: RunJob, settings: Settings, ctx: Callable[[bool], Any]) -> Any:
    """Run the task; fail here, with a clear error, not at the store, if its result cannot
    be stored."""
    spec = get_task(msg.task)
    args: list[Any] = [msg.payload]
    if spec.wants_context:
        args.append(ctx(spec.is_async))
    # A plain `def` runs on a thread, so this process's event loop stays free to serve its
    # context (`ctx.submit` blocks on it).
    result = await spec.fn(*args) if spec.is_async else await asyncio.to_thread(spec.fn, *args)
    size = len(bson.encode({"result": result}))
    if size > MAX_RESULT_BYTES:
        raise ResultTooLarge(f"result is {size} bytes as BSON; the limit is {MAX_RESULT_BYTES}")
    return result


async def run_one(
    msg: RunJob, settings: Settings, send: Callable[[Any], None] | None = None
) -> JobDone:
    """Run one attempt; its progress reports go to `send`, the last one before this returns
    (or, for a task that opened `ctx.transaction()`, with its completion). When tracing, the
    run is a span continuing the submitter's trace (after a span of its wait)."""
    if not tracing.active():
        return await _run_one(msg, settings, send)
    with _run_span(msg) as span:
        done = await _run_one(msg, settings, send)
        outcome = "completed" if done.ok else "retry" if done.retry_delay is not None else "failed"
        tracing.set_attribute(span, "brook.outcome", outcome)
        if done.error is not None:
            tracing.set_attribute(span, "brook.error.type", done.error.get("type"))
        return done


def _run_span(msg: RunJob) -> Any:
    """The run's span: a child of the submitter's (the job's stored trace context), linked to
    the job's workflow parents; and before it, its wait, from the job's due time to now."""
    now = datetime.now(UTC)
    if msg.due_at is not None:
        tracing.record_span(
            f"brook.wait {msg.task}",
            start=msg.due_at,
            end=now,
            parent=msg.trace,
            attributes={"brook.job.id": msg.job_id, "brook.queue": msg.queue},
        )
    wait_ms = None if msg.due_at is None else round((now - msg.due_at).total_seconds() * 1000, 3)
    return tracing.span(
        f"brook.run {msg.task}",
        kind="CONSUMER",
        parent=msg.trace,
        links=msg.links,
        attributes={
            "brook.job.id": msg.job_id,
            "brook.task": msg.task,
            "brook.queue": msg.queue,
            "brook.attempt": msg.attempt,
            "brook.trigger": msg.trigger,
            "brook.wait_ms": wait_ms,
        },
    )


async def _run_one(
    msg: RunJob, settings: Settings, send: Callable[[Any], None] | None = None
) -> JobDone:
    structlog.contextvars.bind_contextvars(job_id=msg.job_id, attempt=msg.attempt, task=msg.task)
    reporter = ProgressReporter(send, msg) if send is not None else None
    tx = AttemptTransaction(msg, settings, send, reporter)
    journal = Journal(msg, send)
    set_current(journal)
    # In a worker (with a pipe), its output goes through this process's writer.
    output = process_writer(settings).open(msg, settings) if send is not None else None
    try:
        with tx.current():
            log_event(Event.TASK_STARTED)
            done = await _attempt(msg, settings, reporter, tx, journal, send, output)
            if output is not None:
                await output.close()  # its last chunks are written before its end is told
            return dataclasses.replace(
                done, steps_replayed=journal.replayed, steps_committed=journal.committed
            )
    finally:
        set_current(None)
        if output is not None:
            output.writer.forget(output)
        await tx.abandon()  # cancelled mid-task: nothing of its transaction remains
        if reporter is not None:
            reporter.close()
        structlog.contextvars.unbind_contextvars("job_id", "attempt", "task")


async def _attempt(
    msg: RunJob,
    settings: Settings,
    reporter: ProgressReporter | None,
    tx: AttemptTransaction,
    journal: Journal,
    send: Callable[[Any], None] | None,
    output: OutputStream | None,
) -> JobDone:
    def context(is_async: bool) -> TaskContext | SyncTaskContext:
        return _context(msg, settings, is_async, reporter, tx, journal, send, output)

    try:
        result = await _call(msg, settings, context)
    except Suspended as pause:
        await tx.abandon()
        waiting = pause.suspend.waiting
        log_event(
            Event.TASK_FINISHED, ok=True, suspended=waiting.get("kind"), step=waiting.get("step")
        )
        return JobDone(job_id=msg.job_id, attempt=msg.attempt, ok=True, suspend=pause.suspend)
    except RateLimited as exc:
        await tx.abandon()
        log_event(Event.TASK_FINISHED, ok=False, error_type="RateLimited", quota=exc.quota)
        quota_wait = rate_limited_waiting(exc.quota, exc.delay)
        if quota_wait is None:
            return _failed(msg, error_doc(exc))
        suspend = Suspend(until=None, waiting=quota_wait)
        return JobDone(job_id=msg.job_id, attempt=msg.attempt, ok=True, suspend=suspend)
    except Retry as exc:
        await tx.abandon()
        log_event(Event.TASK_FINISHED, ok=False, error_type="Retry", delay=exc.delay)
        return _failed(msg, error_doc(exc), retry_delay=exc.delay)
    except Exception as exc:
        await tx.abandon()
        step = failed_step(exc)
        if step is not None:
            log_event(Event.STEP_FAILED, level="warning", step=step, error_type=type(exc).__name__)
        log_event(Event.TASK_FINISHED, ok=False, error_type=type(exc).__name__)
        return _failed(msg, error_doc(exc))
    if tx.opened:
        progress = reporter.take_last() if reporter is not None else None
        return _transaction_done(msg, await tx.finish(result, progress), result)
    log_event(Event.TASK_FINISHED, ok=True)
    return JobDone(job_id=msg.job_id, attempt=msg.attempt, ok=True, result=result)


def _failed(msg: RunJob, error: dict[str, Any], **kw: Any) -> JobDone:
    return JobDone(job_id=msg.job_id, attempt=msg.attempt, ok=False, error=error, **kw)


def _transaction_done(msg: RunJob, end: TxEnd, result: Any) -> JobDone:
    """What the dispatcher hears of an attempt that committed (or not) in its own
    transaction."""
    if end.kind == "committed":
        log_event(Event.TASK_FINISHED, ok=True, transaction="committed")
        return JobDone(
            job_id=msg.job_id, attempt=msg.attempt, ok=True, result=result, tx="committed"
        )
    if end.kind == "lost":
        log_event(Event.TASK_FINISHED, ok=False, error_type="LeaseLost", transaction="aborted")
        error = {"type": "LeaseLost", "message": "the lease was lost; the transaction aborted"}
        return _failed(msg, error, tx="lost")
    error = end.error or {"type": "TransactionAborted", "message": end.kind}
    log_event(Event.TASK_FINISHED, ok=False, error_type=error["type"], transaction=end.kind)
    return _failed(msg, error, tx="unknown" if end.kind == "unknown" else None)


async def _run_listening(
    conn: Connection, msg: RunJob, settings: Settings, send: Callable[[Any], None]
) -> JobDone:
    """`run_one`, while the pipe is read for what the dispatcher sends during a job: the
    acknowledgements of its steps."""
    loop = asyncio.get_running_loop()
    fd = conn.fileno()

    def readable() -> None:
        try:
            while conn.poll():
                deliver(conn.recv())
        except (EOFError, OSError):
            loop.remove_reader(fd)  # the dispatcher is gone: this process dies with it

    loop.add_reader(fd, readable)
    try:
        return await run_one(msg, settings, send)
    finally:
        loop.remove_reader(fd)


def start_worker(conn: Connection, settings: Settings, name: str) -> Callable[[Any], None]:
    """What every worker process (one job at a time, or shared) does first: die with its
    dispatcher, leave Ctrl-C to it, log and trace as a worker, import the task modules.
    Returns how to send up the pipe."""
    _die_with_parent()
    # Ctrl-C reaches the whole process group; the parent decides what happens to a job.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(settings.log_level, role="worker")
    tracing.configure("worker")
    structlog.contextvars.bind_contextvars(worker=name)
    load_tasks(settings)
    lock = threading.Lock()

    def send(message: Any) -> None:
        # Progress timers, a plain `def` task's thread, a watchdog thread and this loop all
        # send: one at a time.
        with lock:
            conn.send(message)

    return send


def send_done(send: Callable[[Any], None], done: JobDone) -> None:
    """Report an attempt's end; one whose result cannot be sent (say, not picklable) fails."""
    try:
        send(done)
    except Exception as exc:
        send(JobDone(job_id=done.job_id, attempt=done.attempt, ok=False, error=error_doc(exc)))


async def worker_main(conn: Connection, settings: Settings, name: str) -> None:
    """Entry point of a worker process (an `aiomultiprocess.Process` target)."""
    send = start_worker(conn, settings, name)
    send(READY)
    while True:
        try:
            msg = await _recv(conn)
        except (EOFError, OSError):
            tracing.flush()
            return  # the parent closed the pipe: nothing to do but leave
        if msg == STOP:
            tracing.flush()
            return
        send_done(send, await _run_listening(conn, msg, settings, send))
