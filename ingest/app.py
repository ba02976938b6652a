"""The HTTP API: submit (one or a batch), read, list, cancel and retry jobs; queues;
schedules; health, readiness and metrics.

`create_app` only wires the parts together: the typed state (`ingest.state`, built by the
lifespan), the dependencies that reach it (`ingest.deps`), the routers (`ingest.routes`),
the error handlers (`ingest.errors`) and the request counter (`ingest.metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import Depends, FastAPI

from common.settings import Settings
from ingest.deps import require_token
from ingest.errors import install_error_handlers
from ingest.metrics import RequestCounter
from ingest.routes import docs, jobs, ops, queues, schedules
from ingest.state import RequestCounts, open_state

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]
CLOSE_TIMEOUT_S = 1.0


def _lifespan(settings: Settings, known_tasks: frozenset[str], requests: RequestCounts) -> Lifespan:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = await open_state(settings, known_tasks, requests)
        app.state.brook = state
        try:
            yield
        finally:
            # Closing ends the server sessions; an unreachable MongoDB must not stop the exit.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.client.close(), CLOSE_TIMEOUT_S)

    return lifespan


def create_app(settings: Settings, known_tasks: Iterable[str]) -> FastAPI:
    """The API for these settings; `known_tasks` comes from the caller (the composition root
    in `brook/`), so the API never imports the task registry itself."""
    requests: RequestCounts = Counter()
    app = FastAPI(
        title="Brook",
        version="0.1.0",
        description="Event-driven job engine on MongoDB.",
        lifespan=_lifespan(settings, frozenset(known_tasks), requests),
        # Replaced by `ingest.routes.docs`, which puts them behind the token.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.add_middleware(RequestCounter, counts=requests)
    install_error_handlers(app)
    protected = [Depends(require_token)]
    app.include_router(jobs.router, dependencies=protected)
    app.include_router(queues.router, dependencies=protected)
    app.include_router(schedules.router, dependencies=protected)
    app.include_router(ops.probes)
    app.include_router(ops.router, dependencies=protected)
    app.include_router(docs.router, dependencies=protected)
    return app
