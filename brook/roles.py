"""The composition root of the dispatcher role: one client, one worker pool, one dispatcher.

`dispatcher/` knows only the `Runner` protocol; this is where the executor's pool is
chosen and handed to it, and where the schedules and triggers the task modules declared
reach it.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing.process
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from brook.common.domain.schedules import Schedule
from brook.common.domain.triggers import Trigger
from brook.common.protocol.runner import Runner
from brook.common.runtime import tracing
from brook.common.runtime.log import configure_logging
from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.metrics import serve_metrics
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import JobStore
from brook.dispatcher.dispatcher import Dispatcher
from brook.executor.pool import WorkerPool
from brook.executor.registry import load_tasks, shared_tasks, task_deadlines, task_quotas
from brook.executor.runners import Runners
from brook.executor.schedules import declared_schedules
from brook.executor.triggers import declared_triggers

# After the dispatcher stopped: how long closing the pool and the client may take.
CLOSE_S = 1.0


def load_dispatcher_tasks(
    settings: Settings,
) -> tuple[frozenset[str], tuple[Schedule, ...], tuple[Trigger, ...]]:
    """Import the task modules: the task names this dispatcher runs (all it claims), and the
    schedules and triggers they declare. A bad BROOK_TASKS, a schedule or trigger naming an
    unknown task, a `shared=` on a plain `def` task, or a trigger on a collection Brook uses
    raises `ConfigError` (one line) before anything starts."""
    tasks = frozenset(load_tasks(settings))
    return tasks, declared_schedules(set(tasks)), declared_triggers(set(tasks), settings.db)


def make_runner(settings: Settings) -> Runner:
    """The workers for the tasks loaded: a process each, and beside them shared worker
    processes when some task declares `shared=`."""
    shared = shared_tasks(load_tasks(settings))
    if shared:
        return Runners(settings, shared)
    return WorkerPool(settings, settings.worker_slots)


async def serve_dispatcher(
    settings: Settings,
    stop: asyncio.Event,
    tasks: frozenset[str],
    runner: Runner | None = None,
    schedules: Sequence[Schedule] = (),
    triggers: Sequence[Trigger] = (),
) -> None:
    """`tasks`: what the workers run (they import the same modules); all it claims."""
    client = make_client(settings, appname="brook-dispatcher")
    store = JobStore(database(client, settings), retention_s=settings.retention_seconds)
    pool = runner or make_runner(settings)
    declared = load_tasks(settings)
    quotas = task_quotas(declared)
    # The tasks' default deadlines, from their declarations (as `shared=` reaches the runner).
    bounds = task_deadlines(declared)
    dispatcher = Dispatcher(
        settings, store, pool, tasks, schedules, triggers, quotas=quotas, bounds=bounds
    )
    pool.on_free = dispatcher.wake
    pool.on_progress = dispatcher.on_progress
    pool.on_step = dispatcher.on_step
    metrics = serve_metrics(settings)
    try:
        await dispatcher.run(stop)  # it starts the pool alongside its own start-up
    finally:
        if metrics is not None:
            metrics.close()
        await pool.close(CLOSE_S)
        try:
            # Ending server sessions needs a primary; never wait long for one.
            async with asyncio.timeout(CLOSE_S):
                await client.close()
        except TimeoutError:
            pass


def exit_now(code: int) -> NoReturn:
    """End the process at once, logs flushed: nothing left (say, a driver call stuck on an
    unreachable server) may hold the exit past the shutdown deadline."""
    from brook.executor.forking import stop_server

    stop_server()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    _remove_multiprocessing_tempdir()
    os._exit(code)


def _remove_multiprocessing_tempdir() -> None:
    """`os._exit` skips multiprocessing's exit hooks, among them the one that removes the
    folder it made in the temp dir (`pymp-*`, the fork server's socket): remove it here, so
    a stopped dispatcher leaves nothing behind. The fork server was stopped and waited for
    just before (`stop_server`); its workers die with it."""
    config = getattr(multiprocessing.process.current_process(), "_config", {})
    tempdir = config.get("tempdir") if isinstance(config, dict) else None
    if isinstance(tempdir, str):
        shutil.rmtree(tempdir, ignore_errors=True)


def run_dispatcher(settings: Settings) -> int:
    # A configuration error is one line on stderr (exit 2), before any log or process.
    tasks, schedules, triggers = load_dispatcher_tasks(settings)
    configure_logging(settings.log_level, role="dispatcher")
    tracing.configure("dispatcher")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            if stop.is_set():
                # Second Ctrl-C: exit now. Running jobs come back at lease expiry; the
                # workers die with this process (PR_SET_PDEATHSIG).
                log_event(Event.DISPATCHER_STOPPING, signal=sig.name, now=True)
                exit_now(130)
            log_event(Event.DISPATCHER_STOPPING, signal=sig.name)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            await serve_dispatcher(settings, stop, tasks, schedules=schedules, triggers=triggers)
        except Exception as exc:
            log_event(
                Event.DISPATCHER_CRASHED,
                level="error",
                error=f"{type(exc).__name__}: {exc}",
                exc_info=exc,
            )
            exit_now(1)
        exit_now(0)

    asyncio.run(main())
    return 0
