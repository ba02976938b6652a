"""The API fuzzed from its own OpenAPI document (schemathesis): every operation, valid and
invalid inputs, a fixed seed and a bounded number of examples.

Every response must be below 500 and match what the document says: its status code, its
content type, its headers and its body's schema, errors included. (Invalid inputs need not
be refused where the API is lenient on purpose, as with unknown query parameters: only
that the answer is one the document gives.) Event streams are read
briefly (their status, headers and first bytes), since they do not end by themselves.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.e2e.conftest import Cluster
from tests.e2e.test_events import api
from tests.support.http import TLS

TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = 12
STREAM_READ_S = 0.3
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def call(case: Any, base_url: str) -> httpx.Response:
    """Send the case with httpx; an event stream is read for a moment, then hung up."""
    kwargs = case.as_transport_kwargs(base_url=base_url, headers=AUTH)
    request = httpx.Request(
        kwargs["method"],
        kwargs["url"],
        params=kwargs.get("params"),
        headers=kwargs.get("headers"),
        cookies=kwargs.get("cookies"),
        json=kwargs.get("json"),
        content=kwargs.get("data"),
    )
    with httpx.Client(timeout=10, verify=TLS) as client:
        resp = client.send(request, stream=True)
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            # From here on, reads wait a moment only (httpcore reads the request's timeouts
            # again for every read of the body).
            resp.request.extensions["timeout"] = {
                **resp.request.extensions.get("timeout", {}),
                "read": STREAM_READ_S,
            }
        body = b""
        deadline = time.monotonic() + STREAM_READ_S
        try:
            for chunk in resp.iter_raw():
                body += chunk
                if time.monotonic() > deadline:
                    break
        except httpx.ReadTimeout:
            pass  # a quiet event stream
        finally:
            resp.close()
    seen = httpx.Response(resp.status_code, headers=resp.headers, content=body, request=request)
    seen.elapsed = resp.elapsed  # known once the streamed response is closed
    return seen


def test_the_fuzzed_api_answers_no_5xx_and_only_what_its_document_says(
    cluster: Cluster, http: httpx.Client
) -> None:
    api(cluster, BROOK_API_TOKEN=TOKEN, BROOK_MAX_BODY_BYTES="4096")
    pending = http.post("/jobs", json={"task": "noop"}, headers=AUTH).json()["id"]
    cancelled = http.post("/jobs", json={"task": "noop"}, headers=AUTH).json()["id"]
    assert http.post(f"/jobs/{cancelled}/cancel", headers=AUTH).status_code == 200
    schema = schemathesis.openapi.from_url(f"{cluster.api_url}/openapi.json", headers=AUTH)
    operations: list[Any] = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    labels = {f"{op.method.upper()} {op.path}" for op in operations}
    assert {"POST /jobs", "GET /jobs/{job_id}/events", "GET /events", "GET /stats"} <= labels
    statuses: dict[str, set[int]] = {}
    for op in operations:
        label = f"{op.method.upper()} {op.path}"
        strategies = [op.as_strategy(mode) for mode in GenerationMode]
        if "{job_id}" in op.path:  # real jobs too, not only ids that do not exist
            # A pending job of its own: the bulk cancel fuzzed before may have ended the first.
            fresh = http.post("/jobs", json={"task": "noop"}, headers=AUTH).json()["id"]
            strategies += [
                op.as_strategy(path_parameters={"job_id": j}) for j in (fresh, pending, cancelled)
            ]
        if label == "POST /jobs":  # a task this API knows, and a body over the limit
            strategies.append(op.as_strategy(body={"task": "noop", "payload": {"n": 1}}))
            big = {"task": "noop", "payload": {"x": "y" * 5000}}
            strategies.append(op.as_strategy(body=big))
        for strategy in strategies:
            _fuzz(strategy, cluster.api_url, statuses.setdefault(label, set()))
    # The runs reached more than the happy path and the 404s.
    assert {202, 413, 422} <= statuses["POST /jobs"], statuses
    assert {200, 404, 409} <= statuses["POST /jobs/{job_id}/cancel"], statuses
    assert {200, 404} <= statuses["GET /jobs/{job_id}/events"], statuses
    assert 401 in statuses["GET /events"], statuses  # invalid inputs include a bad token


def _fuzz(
    strategy: Any,
    base_url: str,
    seen: set[int],
    *,
    checks: list[Any] = CHECKS,
    examples: int = EXAMPLES,
) -> None:
    @settings(
        max_examples=examples,
        derandomize=True,  # the fixed seed: the same cases every run
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        resp = call(case, base_url)
        seen.add(resp.status_code)
        case.validate_response(resp, checks=checks, headers=AUTH)

    # Unsatisfiable: no input of that kind exists (an invalid one for a route without inputs).
    with contextlib.suppress(Unsatisfiable):
        run()


def test_with_no_primary_every_route_answers_as_documented(cluster: Cluster) -> None:
    """No MongoDB at all: `503` + `Retry-After` (documented on every route but `/healthz`)."""
    cluster.settings = cluster.settings.model_copy(
        update={"mongo_uri": "mongodb://127.0.0.1:1/?directConnection=true"}
    )
    api(cluster, BROOK_API_TOKEN=TOKEN, BROOK_SERVER_SELECTION_TIMEOUT_MS="300")
    schema = schemathesis.openapi.from_url(f"{cluster.api_url}/openapi.json", headers=AUTH)
    seen: dict[str, set[int]] = {}
    checks = [
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
        response_headers_conformance,
    ]
    for result in schema.get_all_operations():
        op = result.ok()  # type: ignore[union-attr]
        statuses = seen.setdefault(f"{op.method.upper()} {op.path}", set())
        _fuzz(op.as_strategy(), cluster.api_url, statuses, checks=checks, examples=2)
    assert seen["GET /readyz"] == {503} and seen["GET /healthz"] == {200}
    for label in ("GET /stats", "GET /metrics"):
        assert seen[label] == {503}, seen
    for label in ("GET /jobs", "GET /events", "POST /jobs", "GET /jobs/{job_id}/events"):
        assert 503 in seen[label], seen
    resp = httpx.get(f"{cluster.api_url}/jobs", headers=AUTH)
    assert resp.status_code == 503 and resp.headers["retry-after"]
