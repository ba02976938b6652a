"""The OpenAPI document and its two viewers, served behind the token like the API itself.

FastAPI's own `/docs`, `/redoc` and `/openapi.json` are turned off (they would be open to
anyone); these routes replace them. A browser cannot send a bearer header, so with a
token set one fetches `/openapi.json` with the header (curl) rather than opening `/docs`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

OPENAPI_PATH = "/openapi.json"

router = APIRouter(include_in_schema=False)


def _openapi_url(request: Request) -> str:
    root: str = request.scope.get("root_path", "")
    return root + OPENAPI_PATH


@router.get(OPENAPI_PATH)
async def openapi(request: Request) -> JSONResponse:
    schema: dict[str, Any] = request.app.openapi()
    return JSONResponse(schema)


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url=_openapi_url(request), title="Brook - Swagger UI")


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=_openapi_url(request), title="Brook - ReDoc")
