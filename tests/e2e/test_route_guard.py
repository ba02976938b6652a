"""Every route needs a valid token, and a read-only token changes nothing (docs/security.md),
walked from the application's own route table: a route added later is held to it without
editing this test. Only the documented public routes answer without a token."""

from __future__ import annotations

from typing import Any

import httpx

from brook.common.runtime.settings import Settings
from brook.ingest.app import create_app
from tests.e2e.conftest import JSON, Cluster

# docs/security.md: the probes, the dashboard's page (it asks for the token, then sends it)
# and the static files of the page and of the API's document viewers.
PUBLIC = {"/healthz", "/readyz", "/", "/static/{name}", "/docs/assets/{name}"}
SAFE = {"GET", "HEAD", "OPTIONS"}


def every_route(router: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(method, path) of every route the application answers, through included routers."""
    found: list[tuple[str, str]] = []
    for route in router.routes:
        if hasattr(route, "original_router"):  # an included router (FastAPI 0.16x)
            context = getattr(route, "include_context", None)
            found += every_route(route.original_router, prefix + getattr(context, "prefix", ""))
        elif hasattr(route, "methods") and route.methods:
            found += [(m, prefix + route.path) for m in sorted(route.methods) if m != "HEAD"]
        elif hasattr(route, "routes"):  # a mounted app or a plain router
            found += every_route(route, prefix + getattr(route, "path", ""))
    return found


def test_the_route_table_is_walked_whole() -> None:
    routes = every_route(create_app(Settings(), {"noop"}))
    paths = {p for _, p in routes}
    # What the walk must see, or it would prove nothing: every router's kind of route.
    assert {"/jobs", "/jobs/{job_id}/cancel", "/queues/{name}", "/signals/{key}"} <= paths
    assert {"/triggers/{name}/pause", "/events", "/metrics", "/openapi.json"} <= paths
    assert paths >= PUBLIC
    assert len(routes) > 25


def test_every_route_but_the_public_ones_needs_a_token_and_the_read_token_changes_nothing(
    cluster: Cluster,
) -> None:
    cluster.api(BROOK_API_TOKEN="admin-token", BROOK_API_READ_TOKEN="read-token")
    routes = every_route(create_app(Settings(), {"noop"}))
    wrong: list[str] = []
    with httpx.Client(base_url=cluster.api_url, timeout=10) as http:

        def ask(method: str, path: str, token: str | None) -> int:
            url = path.replace("{", "").replace("}", "")  # each parameter: its own name
            headers = dict(JSON)
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
            body = None if method in SAFE else b"{}"
            with http.stream(method, url, headers=headers, content=body) as reply:
                return reply.status_code  # an event stream is not read

        for method, path in routes:
            if path in PUBLIC:
                assert ask(method, path, None) != 401, path
                continue
            for token in (None, "wrong-token"):
                if (code := ask(method, path, token)) != 401:
                    wrong.append(f"{method} {path} with {token}: {code}, not 401")
            if method not in SAFE and (code := ask(method, path, "read-token")) != 403:
                wrong.append(f"{method} {path} with the read token: {code}, not 403")
    assert wrong == []
