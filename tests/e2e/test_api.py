"""The API's edges beyond the core: its self-description and what stays open."""

from __future__ import annotations

import httpx

from tests.e2e.conftest import Cluster
from tests.support.metrics import value


def test_without_a_token_the_docs_and_openapi_are_open(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api()
    schema = http.get("/openapi.json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/cancel", "/healthz", "/metrics"} <= set(
        paths
    )
    # The hand-read submit body still shows its schema; the docs routes hide themselves.
    submit_body = paths["/jobs"]["post"]["requestBody"]["content"]["application/json"]
    assert "task" in submit_body["schema"]["properties"]
    assert not {"/docs", "/redoc", "/openapi.json"} & set(paths)
    for page in ("/docs", "/redoc"):
        resp = http.get(page)
        assert resp.status_code == 200 and "text/html" in resp.headers["content-type"]
        assert "/openapi.json" in resp.text


def test_metrics_count_requests_by_route_and_code(cluster: Cluster, http: httpx.Client) -> None:
    cluster.api()
    assert http.get("/jobs/nope").status_code == 404
    assert http.get("/nowhere").status_code == 404
    text = http.get("/metrics").text
    requests = "brook_api_requests_total"
    assert value(text, requests, method="GET", route="/jobs/{job_id}", code="404") == 1
    assert value(text, requests, method="GET", route="unmatched", code="404") == 1
    assert value(text, "brook_api_up_seconds") > 0
