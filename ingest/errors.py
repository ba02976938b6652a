"""How the API answers failures: `{"detail": ...}`; `503` + `Retry-After` only while MongoDB
cannot serve (no primary, a network error, a step-down, a timeout); any other error of the
database is a `500` naming a reference its error log line carries (a client retrying it
would fail the same way); a search stopped by its time bound is `422` with `code`
`search_too_broad`; a `405` names in `Allow` every method the path answers."""

from __future__ import annotations

import secrets

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pymongo.errors import ExecutionTimeout, PyMongoError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from brook.common.domain.errors import InvalidInput, SearchTooBroad, UnknownParent
from brook.common.runtime.log_events import Event, log_event
from brook.common.store.db import is_transient
from brook.ingest.methods import allowed_methods

RETRY_AFTER_S = "2"


async def _mongo_error(_: Request, exc: Exception) -> JSONResponse:
    if not (is_transient(exc) or isinstance(exc, ExecutionTimeout)):
        ref = secrets.token_hex(6)
        log_event(
            Event.API_ERROR,
            level="error",
            ref=ref,
            error_type=type(exc).__name__,
            code=getattr(exc, "code", None),
            error=str(exc)[:300],
        )
        detail = f"the database refused this request: {type(exc).__name__} (ref {ref})"
        return JSONResponse({"detail": detail}, status_code=500)
    log_event(Event.MONGO_UNAVAILABLE, level="warning", op="api", error=str(exc)[:200])
    return JSONResponse(
        {"detail": "database unavailable (no primary); retry shortly"},
        status_code=503,
        headers={"Retry-After": RETRY_AFTER_S},
    )


async def _invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")}
        for e in exc.errors()
    ]
    return JSONResponse({"detail": errors}, status_code=422)


async def _invalid_job(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidInput)
    # A parent that is no job is not there: the well-formed spec names something missing.
    status = 404 if isinstance(exc, UnknownParent) else 422
    return JSONResponse({"detail": exc.detail}, status_code=status)


async def _too_broad(_: Request, exc: Exception) -> JSONResponse:
    # Not a 503: nothing is down, and the same request would be stopped again.
    assert isinstance(exc, SearchTooBroad)
    log_event(Event.SEARCH_TOO_BROAD, level="warning", error=str(exc)[:200])
    return JSONResponse({"detail": str(exc), "code": exc.code}, status_code=422)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        allow = ", ".join(allowed_methods(request.app, request.url.path))
        headers = {**(exc.headers or {}), "Allow": allow}
        exc = StarletteHTTPException(405, exc.detail, headers=headers)
    return await http_exception_handler(request, exc)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(PyMongoError, _mongo_error)
    app.add_exception_handler(SearchTooBroad, _too_broad)
    app.add_exception_handler(InvalidInput, _invalid_job)
    app.add_exception_handler(RequestValidationError, _invalid)
