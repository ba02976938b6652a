"""Every route needs a valid token, and a read-only token changes nothing (docs/security.md),
walked from the application's own route table: a route added later is held to it without
editing this test. Only the documented public routes answer without a token."""

from __future__ import annotations

from typing import Any

import httpx

from brook.common.domain.models import JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore
from brook.ingest.app import create_app
from tests.e2e.conftest import JSON, Cluster
from tests.e2e.test_faults import wait_all_terminal
from tests.support.procs import wait_until

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


# A valid body for each state change with one: refused, it would otherwise have done its work.
BODIES: dict[str, Any] = {
    "/jobs": {"task": "noop"},
    "/jobs/batch": {"jobs": [{"task": "noop"}]},
    "/jobs/retry": {"status": "failed"},
    "/jobs/cancel": {"status": "pending"},
    "/queues/{name}": {"concurrency": 1, "rate": None, "paused": True},
    "/signals/{key}": {"payload": {"approved": True}},
    "/quotas/{name:path}": {"units": {"limit": 1, "per_seconds": 1}, "concurrency": 1},
}


async def test_every_state_change_sent_with_the_read_token_to_a_live_system_changes_nothing(
    cluster: Cluster, store: JobStore
) -> None:
    """A job waits for `approval:1`, a trigger (`paid-orders`) is followed, a queue has limits and jobs have
    failed, with a dispatcher running: each state change the route table holds, sent with
    the read-only token and a body that would do its work, changes none of it."""
    tasks = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.durable,tests.tasks.triggered"}
    cluster.api(BROOK_API_TOKEN="admin-token", BROOK_API_READ_TOKEN="read-token", **tasks)
    disp = cluster.dispatcher(**tasks)
    admin = {"Authorization": "Bearer admin-token"}
    read = {"Authorization": "Bearer read-token"}
    failed = [
        s.job.id
        for s in await store.submit_many(
            [JobSpec(task="fail", payload={}, max_attempts=1) for _ in range(3)]
        )
    ]
    await wait_all_terminal(store, 3)
    [waiting] = await store.submit_many([JobSpec(task="waiter", payload={"key": "approval:1"})])
    disp.wait_for_event("job.suspended", timeout=30)
    disp.wait_for_event("trigger.opened", timeout=30)
    params = {"job_id": waiting.job.id, "name": "paid-orders", "key": "approval:1"}
    with httpx.Client(base_url=cluster.api_url, timeout=30) as http:
        limits = {"concurrency": 3, "rate": {"limit": 10, "per_seconds": 2.0}, "paused": False}
        assert http.put("/queues/default", json=limits, headers=admin).status_code == 200
        queues_before = http.get("/queues", headers=admin).json()
        quota = {"units": {"limit": 90000, "per_seconds": 60}, "concurrency": 5}
        assert http.put("/quotas/openai:gpt-4o", json=quota, headers=admin).status_code == 200
        quotas_before = http.get("/quotas", headers=admin).json()
        jobs_before = await store.jobs.find({}).to_list()
        sent = []
        for method, path in every_route(create_app(Settings(), {"noop"})):
            if method in SAFE or path in PUBLIC:
                continue
            if path.startswith("/quotas/"):
                url = "/quotas/openai:gpt-4o"
            else:
                url = path.format(**{k: v for k, v in params.items() if "{" + k + "}" in path})
            if path.startswith("/queues/"):
                url = "/queues/default"
            resp = http.request(method, url, json=BODIES.get(path), headers=read)
            assert resp.status_code == 403, (method, url, resp.text)
            sent.append(f"{method} {path}")
        must = {"POST /signals/{key}", "POST /jobs/retry", "POST /jobs/cancel"}
        must |= {"POST /triggers/{name}/pause", "PUT /queues/{name}", "POST /jobs/{job_id}/cancel"}
        must |= {"PUT /quotas/{name:path}", "DELETE /quotas/{name:path}"}
        assert must <= set(sent), sent
        assert http.get("/queues", headers=admin).json() == queues_before  # limits unchanged
        assert http.get("/quotas", headers=admin).json() == quotas_before  # quota unchanged
        [trigger] = http.get("/triggers", headers=admin).json()["triggers"]
        assert trigger["paused"] is False and trigger["jobs_made"] == 0
    assert await store.db["brook_signals"].count_documents({}) == 0  # no signal stored
    job = await store.get(waiting.job.id)
    assert job.status == "pending" and job.waiting_for is not None  # still waits
    assert job.waiting_for["key"] == "approval:1"
    for job_id in failed:  # none retried
        again = await store.get(job_id)
        assert again.status == "failed" and again.attempts == 1
    assert await store.jobs.find({}).to_list() == jobs_before  # no job made, none changed
    # The same calls with the admin token would have changed it: the job wakes on its signal.
    body = BODIES["/signals/{key}"]
    assert http_post(cluster, "/signals/approval:1", body, admin) == {"woken": 1}
    wait_until(lambda: disp.events("job.completed"), timeout=30)


def http_post(cluster: Cluster, path: str, body: Any, headers: dict[str, str]) -> Any:
    return httpx.post(f"{cluster.api_url}{path}", json=body, headers=headers, timeout=30).json()
