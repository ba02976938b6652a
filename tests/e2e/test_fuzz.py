"""The API fuzzed from its own OpenAPI document (schemathesis).

`schemathesis run --checks all`, as an outsider would run it, against a real API and
dispatcher, in every phase (examples, coverage, fuzzing, stateful) with the seed, example
counts and step counts `schemathesis.toml` fixes: it must find no failure. Its checks hold
every response to the document (status, content type, headers, schema: no 5xx), every
request the document allows to be accepted and every one it forbids to be refused, `Allow`
on a 405 to list the documented methods, and the token to be needed. The API's document
says what the API enforces (patterns, lengths, bounds, the tasks it knows, a bulk filter
that names something) so both can hold.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
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

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
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


def test_schemathesis_run_with_every_check_in_every_phase_finds_no_failure(
    cluster: Cluster,
) -> None:
    api(cluster, BROOK_API_TOKEN=TOKEN)
    cluster.dispatcher(BROOK_API_TOKEN=TOKEN)
    cli = Path(sys.executable).with_name("schemathesis")
    argv = [str(cli), "--config-file", str(ROOT / "schemathesis.toml"), "run"]
    argv += ["--checks", "all", "--header", f"Authorization: Bearer {TOKEN}", "--no-color"]
    argv += [f"{cluster.api_url}/openapi.json"]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": ""}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    # Every phase ran, and cases were sent (a run that tested nothing would pass too).
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in out, out[-3000:]
    assert " passed" in out and "failure" not in out.split("Test cases:")[-1], out[-3000:]


def _fuzz(
    strategy: Any,
    base_url: str,
    seen: set[int],
    *,
    checks: list[Any] = CHECKS,
    examples: int = 2,
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
