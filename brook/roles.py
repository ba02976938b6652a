"""The composition root of the dispatcher role: one client, one worker pool, one dispatcher.

`dispatcher/` knows only the `Runner` protocol; this is where the executor's pool is
chosen and handed to it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import NoReturn

from common.db import database, make_client
from common.events import Event, emit
from common.log import configure_logging
from common.metrics import serve_metrics
from common.runner import Runner
from common.settings import Settings
from common.store import JobStore
from dispatcher.service import Dispatcher
from executor.pool import WorkerPool
from executor.registry import load_tasks

# After the dispatcher stopped: how long closing the pool and the client may take.
CLOSE_S = 1.0


async def serve_dispatcher(
    settings: Settings, stop: asyncio.Event, runner: Runner | None = None
) -> None:
    client = make_client(settings, appname="brook-dispatcher")
    store = JobStore(database(client, settings))
    pool = runner or WorkerPool(settings, settings.concurrency)
    dispatcher = Dispatcher(settings, store, pool)
    pool.on_free = dispatcher.wake
    metrics = serve_metrics(settings)
    await pool.start()
    try:
        await dispatcher.run(stop)
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
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_dispatcher(settings: Settings) -> int:
    configure_logging(settings.log_level, role="dispatcher")
    load_tasks(settings)  # a bad BROOK_TASKS fails here, in one line, before any worker spawns

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            if stop.is_set():
                # Second Ctrl-C: exit now. Running jobs come back at lease expiry; the
                # workers die with this process (PR_SET_PDEATHSIG).
                emit(Event.DISPATCHER_STOPPING, signal=sig.name, now=True)
                exit_now(130)
            emit(Event.DISPATCHER_STOPPING, signal=sig.name)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            await serve_dispatcher(settings, stop)
        except Exception as exc:
            emit(
                Event.DISPATCHER_CRASHED,
                level="error",
                error=f"{type(exc).__name__}: {exc}",
                exc_info=exc,
            )
            exit_now(1)
        exit_now(0)

    asyncio.run(main())
    return 0
