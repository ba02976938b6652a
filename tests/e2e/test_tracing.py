"""Tracing end to end: a real API, dispatcher and workers with `OTEL_TRACES_EXPORTER=console`
(one span per line of JSON on stdout, beside the logs). One trace goes from an HTTP submit
(the caller's `traceparent`), through the run and its durable step, to the run of the child
job the task submitted; a workflow child links to its parent; a trigger-made job's run continues the
span of its change."""

from __future__ import annotations

import secrets
from typing import Any

import httpx

from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster, wait_terminal
from tests.support.procs import BrookProcess, wait_until

TRACED = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.traced", "OTEL_TRACES_EXPORTER": "console"}


def spans(*procs: BrookProcess) -> list[dict[str, Any]]:
    return [e for p in procs for e in p.logs() if "context" in e and "name" in e]


def hex_id(value: str) -> str:
    return value.removeprefix("0x")


def one(found: list[dict[str, Any]], name: str, **attributes: Any) -> dict[str, Any]:
    matching = [
        s
        for s in found
        if s["name"] == name and all(s["attributes"].get(k) == v for k, v in attributes.items())
    ]
    assert len(matching) == 1, (name, attributes, [s["name"] for s in found])
    return matching[0]


async def test_one_trace_from_an_http_submit_through_the_run_to_a_child_jobs_run(
    cluster: Cluster, store: JobStore, http: httpx.Client
) -> None:
    api = cluster.api(**TRACED)
    disp = cluster.dispatcher(**TRACED)
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    headers = {"traceparent": f"00-{trace_id}-{caller}-01"}
    posted = http.post("/jobs", json={"task": "traced_parent"}, headers=headers)
    assert posted.status_code == 202, posted.text
    parent = posted.json()
    assert parent["trace"]["traceparent"].split("-")[1] == trace_id  # stored with the job
    done = wait_terminal(http, parent["id"])
    assert done["status"] == "completed"
    child_id = done["result"]
    assert wait_terminal(http, child_id)["status"] == "completed"

    def ours() -> list[dict[str, Any]] | None:
        found = [s for s in spans(api, disp) if hex_id(s["context"]["trace_id"]) == trace_id]
        names = {s["name"] for s in found}
        return found if {"brook.run traced_parent", "brook.run echo"} <= names else None

    found = wait_until(ours, timeout=30)
    server = [s for s in found if s["kind"] == "SpanKind.SERVER"]
    assert server and all(hex_id(s["parent_id"]) == caller for s in server)  # the caller's
    submit = one(found, "brook.submit traced_parent")
    assert submit["kind"] == "SpanKind.PRODUCER"
    run = one(found, "brook.run traced_parent", **{"brook.job.id": parent["id"]})
    wait = one(found, "brook.wait traced_parent")
    submit_id = hex_id(submit["context"]["span_id"])
    assert hex_id(run["parent_id"]) == submit_id and hex_id(wait["parent_id"]) == submit_id
    assert run["attributes"] | {"brook.wait_ms": 0} == {
        "brook.job.id": parent["id"],
        "brook.task": "traced_parent",
        "brook.queue": "default",
        "brook.attempt": 1,
        "brook.outcome": "completed",
        "brook.wait_ms": 0,
    }
    # Its durable step, a span under the run.
    step = one(found, "brook.step", **{"brook.step.name": "prepare"})
    assert hex_id(step["parent_id"]) == hex_id(run["context"]["span_id"])
    assert step["attributes"] == {
        "brook.job.id": parent["id"],
        "brook.task": "traced_parent",
        "brook.attempt": 1,
        "brook.step.name": "prepare",
        "brook.step.transactional": False,
        "brook.step.replayed": False,
    }
    assert step["status"]["status_code"] == "UNSET"
    # The child, submitted by the task with ctx.submit, in the same trace under the run.
    child_submit = one(found, "brook.submit echo")
    assert hex_id(child_submit["parent_id"]) == hex_id(run["context"]["span_id"])
    child_run = one(found, "brook.run echo", **{"brook.job.id": child_id})
    assert hex_id(child_run["parent_id"]) == hex_id(child_submit["context"]["span_id"])

    # A workflow child links to its parent's trace.
    first = http.post("/jobs", json={"task": "noop"}).json()
    second = http.post("/jobs", json={"task": "noop", "depends_on": [first["id"]]}).json()
    assert wait_terminal(http, second["id"])["status"] == "completed"
    linked = wait_until(
        lambda: [
            s
            for s in spans(disp)
            if s["name"] == "brook.run noop" and s["attributes"]["brook.job.id"] == second["id"]
        ]
    )
    [link] = linked[0]["links"]
    assert hex_id(link["context"]["span_id"]) == first["trace"]["traceparent"].split("-")[2]

    # A trigger-made job: its run continues the span of its change.
    await store.db["traced_orders"].insert_one({"_id": "o-1", "total": 42})
    changed = wait_until(
        lambda: [s for s in spans(disp) if s["name"] == "brook.trigger traced-orders"], timeout=30
    )
    [change] = changed
    assert change["attributes"]["brook.operation"] == "insert"
    assert change["attributes"]["brook.document_key"] == "o-1"
    made = wait_until(
        lambda: [
            s
            for s in spans(disp)
            if s["name"] == "brook.run echo"
            and s["attributes"].get("brook.trigger") == "traced-orders"
        ],
        timeout=30,
    )
    assert hex_id(made[0]["parent_id"]) == hex_id(change["context"]["span_id"])
    assert made[0]["context"]["trace_id"] == change["context"]["trace_id"]
