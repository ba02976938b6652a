"""Prometheus metrics from real processes: the API's /metrics and each dispatcher's."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from pymongo import MongoClient

from tests.e2e.conftest import Cluster, free_port, wait_terminal
from tests.e2e.test_events import api, submit
from tests.support.metrics import value
from tests.support.procs import wait_until


def test_after_n_jobs_the_metrics_count_them_right(cluster: Cluster, http: httpx.Client) -> None:
    api(cluster)
    port = free_port()
    disp = cluster.dispatcher(BROOK_METRICS_PORT=str(port))
    listening = disp.wait_for_event("metrics.listening")
    assert listening["port"] == port
    ok = submit(http, "noop", 5)
    bad = submit(http, "fail", 2, payload={"message": "no"}, max_attempts=2)
    for job_id in ok + bad:
        wait_terminal(http, job_id)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    jobs = "brook_jobs_total"
    assert value(text, jobs, task="noop", queue="default", outcome="completed") == 5
    assert value(text, jobs, task="fail", queue="default", outcome="retried") == 2
    assert value(text, jobs, task="fail", queue="default", outcome="failed") == 2
    assert value(text, "brook_claims_total") == 9  # 5 + 2 jobs of 2 attempts
    assert value(text, "brook_job_wait_seconds_count") == 9
    assert value(text, "brook_job_wait_seconds_bucket", le="+Inf") == 9
    assert value(text, "brook_job_duration_seconds_count", task="noop") == 5
    assert value(text, "brook_job_duration_seconds_count", task="fail") == 4
    assert value(text, "brook_leases_lost_total") == 0
    assert value(text, "brook_stream_history_lost_total", stream="dispatcher") == 0
    depth = http.get("/metrics").text
    assert value(depth, "brook_queue_depth", queue="default", status="completed") == 5
    assert value(depth, "brook_queue_depth", queue="default", status="failed") == 2
    assert value(depth, "brook_queue_depth", queue="default", status="pending") == 0


def test_a_scrape_never_costs_more_than_one_aggregation(
    cluster: Cluster, http: httpx.Client
) -> None:
    api(cluster, BROOK_METRICS_CACHE_SECONDS="60")
    submit(http, "noop", 3)
    client: MongoClient[dict[str, Any]] = MongoClient(cluster.settings.mongo_uri)
    db = client[cluster.settings.db]
    db.command("profile", 2)
    try:
        with ThreadPoolExecutor(16) as pool:
            texts = list(pool.map(lambda _: http.get("/metrics").text, range(16)))
            stats = list(pool.map(lambda _: http.get("/stats").json(), range(8)))
        db.command("profile", 0)
        counts = db["system.profile"].count_documents(
            {"command.aggregate": "jobs", "command.pipeline.0.$group": {"$exists": True}}
        )
    finally:
        client.close()
    assert counts == 1  # 16 scrapes and 8 dashboards at once: one aggregation, shared
    assert {value(t, "brook_queue_depth", queue="default", status="pending") for t in texts} == {3}
    assert {s["counts"]["pending"] for s in stats} == {3}


def test_a_dispatcher_whose_metrics_port_is_taken_runs_on_without_it(cluster: Cluster) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        disp = cluster.dispatcher(BROOK_METRICS_PORT=str(taken.getsockname()[1]))
        refused = disp.wait_for_event("metrics.unavailable")
        assert "BROOK_METRICS_PORT" in refused["hint"]
    off = cluster.dispatcher(BROOK_METRICS_PORT="0")
    wait_until(lambda: off.events("dispatcher.ready"), timeout=10)
    assert not off.events("metrics.listening") and not off.events("metrics.unavailable")
