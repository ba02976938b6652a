"""The shared worker process: a long-lived child that runs many jobs at once, each attempt
an asyncio task (`@task(..., shared=N)`, `async def` tasks only).

Every message on its pipe names its job and attempt: the dispatcher sends `RunJob`,
`CancelJob` and step acknowledgements; the worker sends each attempt's progress, steps,
transaction and `JobDone`, as a worker of its own would (`run_one` is the same code). A
`CancelJob` ends that attempt's asyncio task only; its neighbours go on. One that does not
end within `BROOK_SHARED_STOP_GRACE_SECONDS` gets its whole process killed by the
dispatcher (`executor.shared_pool`).

A job that blocks the event loop (CPU work, a blocking call) delays every job here: a
watchdog thread sees the loop's heartbeat stop, logs `worker.loop_blocked` with the jobs
this process holds, and tells the dispatcher (which counts it in a metric).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import structlog

from brook.common.protocol.runner import CancelJob, LoopBlocked, RunJob
from brook.common.runtime import tracing
from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.settings import Settings
from brook.executor.steps import deliver
from brook.executor.worker import READY, STOP, JobDone, error_doc, run_one, send_done, start_worker


class LoopWatchdog:
    """A thread that reports an event loop blocked past `threshold` seconds, once per block:
    the loop stamps a heartbeat a few times per threshold; the thread compares."""

    def __init__(
        self,
        name: str,
        threshold: float,
        jobs: Callable[[], tuple[str, ...]],
        send: Callable[[Any], None],
    ) -> None:
        self.name = name
        self.threshold = threshold
        self.jobs = jobs
        self.send = send
        self.beat = time.monotonic()

    async def heartbeat(self) -> None:
        while True:
            self.beat = time.monotonic()
            await asyncio.sleep(self.threshold / 4)

    def start(self) -> None:
        threading.Thread(target=self._watch, name="brook-loop-watchdog", daemon=True).start()

    def _watch(self) -> None:
        reported = False
        while True:
            time.sleep(self.threshold / 4)
            blocked = time.monotonic() - self.beat
            if blocked <= self.threshold:
                reported = False
                continue
            if reported:
                continue
            reported = True
            try:
                job_ids = self.jobs()  # the loop is blocked: nothing changes them meanwhile
            except RuntimeError:
                job_ids = ()
            log_event(
                Event.WORKER_LOOP_BLOCKED,
                level="warning",
                worker=self.name,
                job_ids=list(job_ids),
                blocked_s=round(blocked, 3),
                remedy="run it in a process of its own (no shared=), or use asyncio.to_thread",
            )
            try:
                self.send(LoopBlocked(worker=self.name, job_ids=job_ids, seconds=blocked))
            except (OSError, ValueError):
                return  # the dispatcher is gone


class SharedRuns:
    """The attempts this process runs, by job id."""

    def __init__(self, settings: Settings, send: Callable[[Any], None]) -> None:
        self.settings = settings
        self.send = send
        self.tasks: dict[str, tuple[int, asyncio.Task[JobDone]]] = {}

    def job_ids(self) -> tuple[str, ...]:
        return tuple(self.tasks)

    def handle(self, msg: Any) -> None:
        if isinstance(msg, RunJob):
            task = asyncio.create_task(run_one(msg, self.settings, self.send))
            self.tasks[msg.job_id] = (msg.attempt, task)
            task.add_done_callback(functools.partial(self._ended, msg))
        elif isinstance(msg, CancelJob):
            held = self.tasks.get(msg.job_id)
            if held is not None and held[0] == msg.attempt:
                held[1].cancel()
        else:
            deliver(msg)  # a step's acknowledgement, for the attempt it names

    def _ended(self, run: RunJob, task: asyncio.Task[JobDone]) -> None:
        held = self.tasks.get(run.job_id)
        if held is not None and held[1] is task:
            del self.tasks[run.job_id]
        if task.cancelled():
            stopped = {"type": "Stopped", "message": "the dispatcher stopped this attempt"}
            done = JobDone(job_id=run.job_id, attempt=run.attempt, ok=False, error=stopped)
        elif (exc := task.exception()) is not None:  # not the task's: `run_one` catches those
            done = JobDone(job_id=run.job_id, attempt=run.attempt, ok=False, error=error_doc(exc))
        else:
            done = task.result()
        # If the dispatcher is gone, this process dies with it.
        with contextlib.suppress(OSError, ValueError):
            send_done(self.send, done)


async def shared_worker_main(conn: Connection, settings: Settings, name: str) -> None:
    """Entry point of a shared worker process (an `aiomultiprocess.Process` target)."""
    send = start_worker(conn, settings, name)
    runs = SharedRuns(settings, send)
    watchdog = LoopWatchdog(name, settings.loop_blocked_seconds, runs.job_ids, send)
    beating = asyncio.create_task(watchdog.heartbeat())
    watchdog.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    fd = conn.fileno()

    def readable() -> None:
        try:
            while conn.poll():
                msg = conn.recv()
                if msg == STOP:
                    stop.set()
                    return
                runs.handle(msg)
        except (EOFError, OSError):
            loop.remove_reader(fd)
            stop.set()  # the dispatcher is gone: nothing to do but leave

    structlog.contextvars.bind_contextvars(shared=True)
    loop.add_reader(fd, readable)
    send(READY)
    try:
        await stop.wait()
    finally:
        loop.remove_reader(fd)
        beating.cancel()
        tracing.flush()
