"""The methods a path answers to, for the `Allow` header of a `405`.

Starlette names only the methods of the first route whose path matched (`OPTIONS /jobs`
answered `Allow: POST`, though `GET /jobs` is a route too): here every route of the
application is read, through its included routers, so `Allow` lists what the OpenAPI
document lists for that path.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from starlette.routing import compile_path


def _routes(router: Any, prefix: str = "") -> list[tuple[str, frozenset[str]]]:
    found: list[tuple[str, frozenset[str]]] = []
    for route in router.routes:
        if hasattr(route, "original_router"):  # an included router
            context = getattr(route, "include_context", None)
            found += _routes(route.original_router, prefix + getattr(context, "prefix", ""))
        elif getattr(route, "methods", None):
            found.append((prefix + route.path, frozenset(route.methods)))
        elif hasattr(route, "routes"):  # a mounted app or a plain router
            found += _routes(route, prefix + getattr(route, "path", ""))
    return found


@cache
def _table(app: Any) -> list[tuple[str, re.Pattern[str], frozenset[str]]]:
    return [(path, compile_path(path)[0], methods) for path, methods in _routes(app.router)]


def allowed_methods(app: Any, path: str) -> list[str]:
    """Every method some route of `app` answers at `path`, sorted: of the routes whose path
    has no parameter if one matches (`/jobs/batch` is not the job `batch`, as the document
    has it), else of those with parameters."""
    fixed: set[str] = set()
    matched: set[str] = set()
    for template, regex, route_methods in _table(app):
        if regex.match(path):
            (matched if "{" in template else fixed).update(route_methods)
    return sorted(fixed or matched)
