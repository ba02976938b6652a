"""The OpenAPI document and its two viewers, served behind the token like the API itself.

FastAPI's own `/docs`, `/redoc` and `/openapi.json` are turned off (they would be open to
anyone, and their pages load Swagger UI and ReDoc from a CDN, with an inline script);
these routes replace them. The viewers' assets come from the `fastapi-offline` package
and are served here (`/docs/assets/...`), so the pages work offline and load nothing from
another site; their start-up code is a file too (`/static/swagger-init.js`), so their
Content-Security-Policy allows scripts from this origin only. A browser cannot send a
bearer header, so with a token set one fetches `/openapi.json` with the header (curl)
rather than opening `/docs`.
"""

from __future__ import annotations

import html
from functools import cache
from importlib import resources
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pymongo.errors import PyMongoError

from brook.ingest.deps import State
from brook.ingest.openapi import served

OPENAPI_PATH = "/openapi.json"
# Swagger UI and ReDoc set styles inline and ReDoc starts a worker from a blob: nothing
# else is allowed beyond this origin.
DOCS_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; worker-src 'self' blob:; font-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}

router = APIRouter(include_in_schema=False)
assets = APIRouter(include_in_schema=False)  # open: the packaged files hold no data


def _root(request: Request) -> str:
    root: str = request.scope.get("root_path", "")
    return root


@cache
def _asset(name: str) -> bytes:
    return resources.files("fastapi_offline").joinpath("static", name).read_bytes()


@assets.get("/docs/assets/{name}")
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise HTTPException(404, f"no asset {name}")
    return Response(
        _asset(name),
        media_type=ASSETS[name],
        headers={"Cache-Control": "public, max-age=86400"},
    )


@router.get(OPENAPI_PATH)
async def openapi(request: Request, state: State) -> JSONResponse:
    """The document, its job specs naming the tasks known now (without a primary to read
    the live dispatchers from: this process's own)."""
    schema: dict[str, Any] = request.app.openapi()
    try:
        tasks = await state.core.known_tasks()
    except PyMongoError:
        tasks = state.known_tasks
    return JSONResponse(served(schema, tasks, state.settings.retention_max_seconds))


def _page(title: str, head: str, body: str) -> HTMLResponse:
    page = (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n{head}</head>\n<body>\n{body}</body>\n</html>\n"
    )
    return HTMLResponse(page, headers={"Content-Security-Policy": DOCS_CSP})


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = html.escape(_root(request))
    spec = html.escape(_root(request) + OPENAPI_PATH)
    return _page(
        "Brook - Swagger UI",
        f'<link rel="stylesheet" href="{root}/docs/assets/swagger-ui.css">\n'
        f'<link rel="icon" href="{root}/docs/assets/favicon.png">\n',
        f'<div id="swagger-ui" data-openapi-url="{spec}"></div>\n'
        f'<script src="{root}/docs/assets/swagger-ui-bundle.js"></script>\n'
        f'<script src="{root}/static/swagger-init.js"></script>\n',
    )


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    root = html.escape(_root(request))
    spec = html.escape(_root(request) + OPENAPI_PATH)
    return _page(
        "Brook - ReDoc",
        f'<link rel="icon" href="{root}/docs/assets/favicon.png">\n',
        f'<redoc spec-url="{spec}"></redoc>\n'
        f'<script src="{root}/docs/assets/redoc.standalone.js"></script>\n',
    )
