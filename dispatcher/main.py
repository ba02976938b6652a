"""Process entry point of `brook dispatcher`: one client, one pool, one dispatcher."""

from __future__ import annotations

import asyncio
import signal

from common.db import database, make_client
from common.events import Event, emit
from common.log import configure_logging
from common.runner import Runner
from common.settings import Settings
from common.store import JobStore
from dispatcher.service import Dispatcher


def make_runner(settings: Settings) -> Runner:
    # Imported here: the composition root picks the executor; dispatcher code only knows
    # the `Runner` protocol.
    from executor.pool import WorkerPool
    from executor.registry import load_tasks

    load_tasks(settings)  # fail fast on a bad BROOK_TASKS, before any worker spawns
    return WorkerPool(settings, settings.concurrency)


async def serve(settings: Settings, stop: asyncio.Event, runner: Runner | None = None) -> None:
    client = make_client(settings, appname="brook-dispatcher")
    store = JobStore(database(client, settings))
    runner = runner or make_runner(settings)
    dispatcher = Dispatcher(settings, store, runner)
    runner.on_free = dispatcher.wake
    await runner.start()
    try:
        await dispatcher.run(stop)
    finally:
        await runner.close()
        await client.close()


def run_dispatcher(settings: Settings) -> int:
    configure_logging(settings.log_level, role="dispatcher")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = {"count": 0}

        def on_signal(sig: signal.Signals) -> None:
            signals["count"] += 1
            emit(Event.DISPATCHER_STOPPING, signal=sig.name, count=signals["count"])
            if signals["count"] > 1:
                raise SystemExit(130)  # second Ctrl-C: stop now; leases expire and requeue
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        await serve(settings, stop)

    asyncio.run(main())
    return 0
