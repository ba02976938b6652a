"""The HTTP API: submit (one or a batch), read, list, cancel and retry jobs; queues;
schedules; signals; triggers; live events and the dashboard; health, readiness and metrics.

`create_app` only wires the parts together: the typed state (`ingest.state`, built by the
lifespan, which also runs the live-event hub), the dependencies that reach it
(`ingest.deps`), the bearer-token check (`ingest.auth`), the front door (`ingest.guard`),
the routers (`ingest.routes`), the error handlers (`ingest.errors`) and the metrics
(`ingest.metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import Depends, FastAPI

from brook.common.runtime import tracing
from brook.common.runtime.settings import Settings, check_exposure
from brook.common.runtime.supervision import spawn_logged
from brook.ingest.auth import require_token
from brook.ingest.errors import install_error_handlers
from brook.ingest.guard import Guard
from brook.ingest.metrics import ApiMetrics, RequestCounter
from brook.ingest.openapi import install_openapi
from brook.ingest.routes import (
    dashboard,
    docs,
    events,
    health,
    jobs,
    output,
    queues,
    quotas,
    schedules,
    signals,
    triggers,
)
from brook.ingest.state import open_state

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]
CLOSE_TIMEOUT_S = 1.0


def _lifespan(settings: Settings, known_tasks: frozenset[str], metrics: ApiMetrics) -> Lifespan:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = await open_state(settings, known_tasks, metrics)
        app.state.brook = state
        metrics.sse_clients.set_function(state.hub.count)
        hub = spawn_logged(state.hub.run(), "live-events")
        hub.add_done_callback(lambda task: _stop_on_crash(app, task))
        readers = spawn_logged(state.output_hub.run(), "output-readers")
        readers.add_done_callback(lambda task: _stop_on_crash(app, task))
        try:
            yield
        finally:
            state.depth.close()
            hub.cancel()
            readers.cancel()
            # Its stream's goodbye (killCursors) may hang on an unreachable MongoDB: the hub
            # gets a moment, then is abandoned (a crash was logged already).
            await asyncio.wait({hub, readers}, timeout=CLOSE_TIMEOUT_S)
            # Closing ends the server sessions; an unreachable MongoDB must not stop the exit.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.client.close(), CLOSE_TIMEOUT_S)

    return lifespan


def _stop_on_crash(app: FastAPI, task: asyncio.Task[None]) -> None:
    """The hub never ends but by cancellation: if it crashed (logged `background.crashed`),
    stop the process loudly rather than serve event streams that never move; `brook api`
    then exits 1 (and `brook up` restarts it)."""
    if task.cancelled() or task.exception() is None:
        return
    app.state.crashed = True
    os.kill(os.getpid(), signal.SIGTERM)


def create_app(settings: Settings, known_tasks: Iterable[str]) -> FastAPI:
    """The API for these settings; `known_tasks` comes from the caller (the composition root
    in `brook/`), so the API never imports the task registry itself. `ConfigError` if
    these settings would serve it open (no token) beyond this machine."""
    check_exposure(settings)
    metrics = ApiMetrics()
    known_tasks = frozenset(known_tasks)
    app = FastAPI(
        title="Brook",
        version="0.1.0",
        description="Event-driven job engine on MongoDB.",
        lifespan=_lifespan(settings, known_tasks, metrics),
        # Replaced by `brook.ingest.routes.docs`, which puts them behind the token.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.add_middleware(Guard, hosts=settings.host_names)
    app.add_middleware(RequestCounter, metrics=metrics)  # outermost: counts refusals too
    install_error_handlers(app)
    install_openapi(app, bearer=settings.api_token is not None)
    protected = [Depends(require_token)]
    app.include_router(jobs.router, dependencies=protected)
    app.include_router(queues.router, dependencies=protected)
    app.include_router(quotas.router, dependencies=protected)
    app.include_router(schedules.router, dependencies=protected)
    app.include_router(signals.router, dependencies=protected)
    app.include_router(triggers.router, dependencies=protected)
    app.include_router(events.router, dependencies=protected)
    app.include_router(output.router, dependencies=protected)
    app.include_router(health.probes)
    app.include_router(health.router, dependencies=protected)
    app.include_router(docs.router, dependencies=protected)
    app.include_router(docs.assets)
    app.include_router(dashboard.pages)  # the page itself asks for the token, then sends it
    app.include_router(dashboard.router, dependencies=protected)
    tracing.instrument_fastapi(app)  # when tracing: a server span per request
    return app
