"""A job's output stream on real processes: emitted by async, plain `def` and shared tasks,
kept per attempt across a SIGKILLed worker, once across a replayed step, in order and
within its cap."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource
from pymongo import MongoClient

from brook import Job
from brook.common.domain.models import JobSpec
from brook.common.store.jobs import JobStore
from brook.common.store.output import OutputStore
from tests.e2e.conftest import Cluster
from tests.support.http import TLS
from tests.support.procs import BrookProcess

OUTPUT = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.output"}


async def submit(store: JobStore, task: str, payload: dict[str, Any], **kw: Any) -> str:
    return (await store.submit(JobSpec(task=task, payload=payload, **kw))).job.id


async def finished(store: JobStore, job_id: str, timeout: float = 60) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        job = await store.get(job_id)
        if job.status in ("completed", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, f"job still {job.status}: {job}"
        await asyncio.sleep(0.1)


async def chunks(store: JobStore, job_id: str) -> list[tuple[int, int, Any]]:
    """(attempt, seq, data) of the job's output, in order."""
    docs = await OutputStore(store.db).read(job_id, limit=100_000)
    return [(d["attempt"], d["seq"], d["data"]) for d in docs]


def holding(proc: BrookProcess, job_id: str) -> int:
    event = proc.wait_for_event(
        "output.holding", timeout=30, where=lambda e: e.get("job_id") == job_id
    )
    return int(event["pid"])


async def test_async_plain_def_and_shared_tasks_emit_their_output_in_order_in_few_writes(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**OUTPUT)
    tasks = ["emit_tokens", "emit_tokens_sync", "emit_tokens_shared"]
    ids = [await submit(store, t, {"n": 100, "pause": 0.01}) for t in tasks]
    for job_id in ids:
        job = await finished(store, job_id)
        assert job.status == "completed" and job.result == 100, job
        got = await chunks(store, job_id)
        want = [(1, i + 1, f"t{i} ") for i in range(100)] + [(1, 101, {"done": 100, "attempt": 1})]
        assert got == want
        assert job.output is not None and job.output["chunks"] == 101
        [ended] = [e for e in disp.events("output.ended") if e.get("job_id") == job_id]
        assert ended["chunks"] == 101 and ended["written"] is True


async def test_a_worker_sigkilled_mid_stream_keeps_attempt_ones_output_apart_from_attempt_twos(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**OUTPUT)
    # Its chunks 50 ms apart: the first batch writes the job's count, the next ones (within
    # a second) do not, so attempt 2 starts numbering from a count behind the stream.
    job_id = await submit(store, "emit_until_killed", {"n": 5, "later": 3, "pause": 0.05})
    pid = holding(disp, job_id)
    assert (await store.get(job_id)).output["chunks"] < 5  # type: ignore[index]
    os.kill(pid, signal.SIGKILL)
    job = await finished(store, job_id)
    assert job.status == "completed" and job.attempts == 2, job
    assert job.output == {"chunks": 8, "bytes": 8 * 5}
    assert await chunks(store, job_id) == [
        *[(1, i + 1, f"a1-{i} ") for i in range(5)],
        *[(2, i + 6, f"a2-{i} ") for i in range(3)],
    ]


async def test_a_job_that_completes_in_its_own_transaction_counts_all_of_its_output(
    cluster: Cluster, store: JobStore
) -> None:
    """Nothing writes the job while its transaction is open: its output is written and
    counted before the transaction opens."""
    cluster.dispatcher(**OUTPUT)
    job_id = await submit(store, "emit_then_commit", {"n": 5})
    job = await finished(store, job_id)
    assert job.status == "completed", job
    assert job.output == {"chunks": 5, "bytes": 5 * 3}
    assert [d["data"] for d in await OutputStore(store.db).read(job_id)] == [
        f"c{i} " for i in range(5)
    ]


async def test_a_finished_steps_output_appears_once_when_the_step_is_replayed(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**OUTPUT)
    job_id = await submit(store, "emit_in_step", {})
    os.kill(holding(disp, job_id), signal.SIGKILL)
    job = await finished(store, job_id)
    assert job.status == "completed" and job.attempts == 2, job
    assert [(s["name"], s["attempt"]) for s in job.steps] == [("answer", 1)]
    docs = await OutputStore(store.db).read(job_id)
    assert [(d["attempt"], d["data"], d.get("step")) for d in docs] == [
        (1, "the ", "answer"),
        (1, "answer ", "answer"),
        (1, "is ", "answer"),
        (1, "42 ", "answer"),
        (2, {"attempt": 2, "after": "the step"}, None),
    ]


async def test_ten_thousand_chunks_arrive_in_order_and_the_cap_stops_the_next(
    cluster: Cluster, store: JobStore
) -> None:
    cluster.dispatcher(**OUTPUT, BROOK_OUTPUT_MAX_CHUNKS="10000")
    job_id = await submit(store, "emit_many", {"n": 10_001})
    job = await finished(store, job_id)
    assert job.status == "completed", job
    assert job.result["emitted"] == 10_000
    assert "limit is 10000 (BROOK_OUTPUT_MAX_CHUNKS)" in job.result["error"]
    got = await chunks(store, job_id)
    assert got == [(1, i + 1, i) for i in range(10_000)]


# -- reading: GET /jobs/{id}/output ------------------------------------------------------------


@dataclass(frozen=True)
class Out:
    id: str | None
    event: str
    data: dict[str, Any]


def read_output(
    base: str,
    job_id: str,
    *,
    last_id: str | None = None,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    outputs: int | None = None,
    timeout: float = 60,
) -> list[Out]:
    """Events of the job's output stream, to its end (or until `outputs` output events)."""
    sent = {"Accept": "text/event-stream", **(headers or {})}
    if last_id is not None:
        sent["Last-Event-ID"] = last_id
    got: list[Out] = []
    with httpx.stream(
        "GET",
        f"{base}/jobs/{job_id}/output",
        params=params,
        headers=sent,
        timeout=httpx.Timeout(10, read=timeout),
        verify=TLS,
    ) as resp:
        assert resp.status_code == 200, (resp.status_code, resp.read())
        for sse in EventSource(resp).iter_sse():
            if sse.event in ("output", "attempt", "end"):
                # `end` has no id of its own (an SSE client keeps the last one it got).
                ident = None if sse.event == "end" else sse.id or None
                got.append(Out(id=ident, event=sse.event, data=json.loads(sse.data)))
            if outputs is not None and sum(e.event == "output" for e in got) >= outputs:
                return got  # cut: the connection closes here
            if sse.event == "end":
                break
    return got


def text_of(events: list[Out]) -> str:
    return "".join(
        e.data["data"]
        if e.data["kind"] == "text"
        else json.dumps(e.data["data"], separators=(",", ":")) + "\n"
        for e in events
        if e.event == "output"
    )


def test_a_reader_cut_halfway_resumes_by_last_event_id_without_gap_or_repeat(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(**OUTPUT)
    cluster.dispatcher(**OUTPUT)
    resp = http.post("/jobs", json={"task": "emit_tokens", "payload": {"n": 40, "pause": 0.05}})
    job_id = resp.json()["id"]
    first = read_output(cluster.api_url, job_id, outputs=15)
    assert first[0] == Out(id="1-0", event="attempt", data={"attempt": 1})
    last_id = first[-1].id
    assert last_id == "1-15"
    rest = read_output(cluster.api_url, job_id, last_id=last_id)
    assert rest[-1] == Out(id=None, event="end", data={"status": "completed"})
    seqs = [e.data["seq"] for e in first + rest if e.event == "output"]
    assert seqs == list(range(1, 42))  # 40 tokens and the JSON chunk: none missed, none twice
    assert [e.id for e in first + rest if e.event == "output"] == [f"1-{s}" for s in seqs]
    assert not [e for e in rest if e.event == "attempt"]  # the same attempt goes on
    whole = http.get(f"/jobs/{job_id}/output", params={"format": "text"})
    assert whole.status_code == 200 and whole.headers["content-type"].startswith("text/plain")
    assert whole.text == text_of(first + rest)
    assert whole.text.endswith('t39 {"done":40,"attempt":1}\n')
    # A finished job's stream: everything at once, then its end.
    again = read_output(cluster.api_url, job_id)
    assert text_of(again) == whole.text and again[-1].event == "end"


def test_a_position_never_issued_is_refused_and_an_unknown_job_is_not_found(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(**OUTPUT)
    cluster.dispatcher(**OUTPUT)
    job_id = http.post("/jobs", json={"task": "emit_tokens", "payload": {"n": 3}}).json()["id"]
    read_output(cluster.api_url, job_id)  # to its end
    for bad in ("abc", "1-2\\n", "-1-0"):  # not a position
        resp = http.get(f"/jobs/{job_id}/output", headers={"Last-Event-ID": bad})
        assert resp.status_code == 400, (bad, resp.text)
    for never in ("1-9", "2-3"):  # a position, but none this job's output had
        resp = http.get(f"/jobs/{job_id}/output", headers={"Last-Event-ID": never})
        assert resp.status_code == 400, (never, resp.text)
    assert http.get("/jobs/nope/output").status_code == 404
    assert http.get(f"/jobs/{job_id}/output", params={"attempt": "-1"}).status_code == 422
    # The last position resumes to the end at once.
    assert read_output(cluster.api_url, job_id, last_id="1-4") == [
        Out(id=None, event="end", data={"status": "completed"})
    ]


async def test_each_attempts_output_is_served_in_turn_and_one_can_be_kept(
    cluster: Cluster, store: JobStore, http: httpx.Client
) -> None:
    cluster.api(**OUTPUT)
    disp = cluster.dispatcher(**OUTPUT)
    job_id = await submit(store, "emit_until_killed", {"n": 2, "later": 2})
    os.kill(holding(disp, job_id), signal.SIGKILL)
    await finished(store, job_id)
    got = await asyncio.to_thread(read_output, cluster.api_url, job_id)
    assert [(e.event, e.id) for e in got] == [
        ("attempt", "1-0"),
        ("output", "1-1"),
        ("output", "1-2"),
        ("attempt", "2-2"),
        ("output", "2-3"),
        ("output", "2-4"),
        ("end", None),
    ]
    second = await asyncio.to_thread(read_output, cluster.api_url, job_id, params={"attempt": "2"})
    assert [e.data.get("data") for e in second] == [None, "a2-0 ", "a2-1 ", None]
    text = http.get(f"/jobs/{job_id}/output", params={"format": "text", "attempt": "1"}).text
    assert text == "a1-0 a1-1 "


def test_a_read_only_token_reads_output(cluster: Cluster) -> None:
    cluster.api(**OUTPUT, BROOK_API_TOKEN="admin-token", BROOK_API_READ_TOKEN="read-token")
    cluster.dispatcher(**OUTPUT)
    admin = {"Authorization": "Bearer admin-token"}
    reader = {"Authorization": "Bearer read-token"}
    with httpx.Client(base_url=cluster.api_url, timeout=30, verify=TLS) as http:
        resp = http.post("/jobs", json={"task": "emit_tokens", "payload": {"n": 3}}, headers=admin)
        job_id = resp.json()["id"]
        got = read_output(cluster.api_url, job_id, headers=reader)
        assert got[-1].event == "end" and text_of(got).startswith("t0 t1 t2 ")
        assert http.get(f"/jobs/{job_id}/output").status_code == 401


def output_cursors(uri: str, db: str, pid: int) -> int:
    """The change-stream cursors the API process `pid` holds on the database `db` (the
    output readers' stream watches the database, not one collection)."""
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    try:
        ops = client.admin.aggregate(
            [
                {"$currentOp": {"allUsers": True, "idleCursors": True}},
                {
                    "$match": {
                        "cursor.originatingCommand.aggregate": 1,
                        "cursor.originatingCommand.$db": db,
                        "cursor.originatingCommand.pipeline.0.$changeStream": {"$exists": True},
                    }
                },
            ]
        )
        return sum(1 for op in ops if str(op.get("appName", "")) == f"brook-api:{pid}")
    finally:
        client.close()


async def test_300_readers_share_one_change_stream_and_each_gets_its_jobs_output(
    cluster: Cluster, http: httpx.Client
) -> None:
    api = cluster.api(**OUTPUT)
    cluster.dispatcher(**OUTPUT, BROOK_CONCURRENCY="2")
    ids = [
        http.post(
            "/jobs", json={"task": "emit_tokens_shared", "payload": {"n": 20, "pause": 0.1}}
        ).json()["id"]
        for _ in range(3)
    ]
    uri = cluster.settings.mongo_uri or ""
    limits = httpx.Limits(max_connections=320, max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=cluster.api_url, limits=limits, timeout=httpx.Timeout(30, read=60), verify=TLS
    ) as client:

        async def one(job_id: str) -> str:
            async with client.stream("GET", f"/jobs/{job_id}/output") as resp:
                assert resp.status_code == 200
                events = [sse async for sse in EventSource(resp).aiter_sse()]
            assert events[-1].event == "end"
            return "".join(
                json.loads(e.data)["data"]
                for e in events
                if e.event == "output" and json.loads(e.data)["kind"] == "text"
            )

        readers = [asyncio.create_task(one(ids[i % 3])) for i in range(300)]

        async def cursors() -> int:
            return await asyncio.to_thread(output_cursors, uri, cluster.settings.db, api.pid)

        # Once the readers are in (300 connections take a while on a loaded host), one
        # cursor serves them all, until the last has left.
        for _ in range(600):  # 60 s at most
            if held := await cursors():
                break
            await asyncio.sleep(0.1)
        assert held == 1
        texts = await asyncio.wait_for(asyncio.gather(*readers), 120)
        assert await cursors() == 1
    assert set(texts) == {"".join(f"t{i} " for i in range(20))}
