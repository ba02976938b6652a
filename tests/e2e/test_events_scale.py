"""Many SSE clients on one API process: one change stream on the server, bounded memory."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import httpx
from pymongo import MongoClient

from tests.e2e.conftest import Cluster
from tests.e2e.test_events import api, submit
from tests.support.metrics import value
from tests.support.procs import wait_until
from tests.support.sse import Reader, by_job

CLIENTS = 500


def change_stream_cursors(uri: str, db: str, pid: int) -> set[int]:
    """The server-side change-stream cursors on `db.jobs` opened by the API process `pid`,
    active (a getMore waiting for events) or idle, as `$currentOp` reports them."""
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    try:
        ops = client.admin.aggregate(
            [
                {"$currentOp": {"allUsers": True, "idleCursors": True}},
                {
                    "$match": {
                        "ns": f"{db}.jobs",
                        "cursor.originatingCommand.pipeline.0.$changeStream": {"$exists": True},
                    }
                },
            ]
        )
        return {
            int(op["cursor"]["cursorId"])
            for op in ops
            if str(op.get("appName", "")) == f"brook-api:{pid}"
        }
    finally:
        client.close()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def first_job_event(resp: httpx.Response) -> str:
    async for line in resp.aiter_lines():
        if line.startswith("data: "):
            return line
    raise AssertionError("stream ended without an event")


async def test_500_clients_cost_one_server_change_stream_and_bounded_memory(
    cluster: Cluster, http: httpx.Client
) -> None:
    proc = api(cluster)
    uri = cluster.settings.mongo_uri or ""
    for _ in range(3):  # warm up: imports, first requests, the hub's cursor
        http.get("/metrics")
    before = rss_mb(proc.pid)
    limits = httpx.Limits(max_connections=CLIENTS + 10, max_keepalive_connections=0)
    timeout = httpx.Timeout(30, read=60)
    async with (
        httpx.AsyncClient(base_url=cluster.api_url, limits=limits, timeout=timeout) as client,
        contextlib.AsyncExitStack() as stack,
    ):
        streams = await asyncio.gather(
            *[
                stack.enter_async_context(client.stream("GET", "/events"))
                for _ in range(CLIENTS)
            ]
        )
        assert {r.status_code for r in streams} == {200}
        wait_until(
            lambda: value(http.get("/metrics").text, "brook_sse_clients") == CLIENTS, timeout=30
        )
        cursors = change_stream_cursors(uri, cluster.settings.db, proc.pid)
        assert len(cursors) == 1, cursors
        connected = rss_mb(proc.pid)
        # One change reaches every client, through that one stream.
        [job_id] = await asyncio.to_thread(submit, http, "noop")
        got = await asyncio.wait_for(asyncio.gather(*[first_job_event(r) for r in streams]), 60)
        assert all(job_id in line for line in got)
        assert len(change_stream_cursors(uri, cluster.settings.db, proc.pid)) == 1
        after_event = rss_mb(proc.pid)
    # The connections are closed (sockets close on the loop's next turns): the server lets
    # go of every client.
    for _ in range(300):
        if value(await asyncio.to_thread(lambda: http.get("/metrics").text), "brook_sse_clients") == 0:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the server still counts clients that hung up")
    per_client_kb = (connected - before) * 1024 / CLIENTS
    # Each client costs its connection and a few small objects, nothing that grows.
    assert per_client_kb < 200, (before, connected, after_event)
    assert after_event - connected < 50, (before, connected, after_event)
    print(f"rss MB: before {before:.1f}, {CLIENTS} clients {connected:.1f}, after an event {after_event:.1f}")


def test_a_client_that_stops_reading_is_dropped_without_slowing_the_others(
    cluster: Cluster, http: httpx.Client
) -> None:
    proc = api(cluster, BROOK_SSE_BUFFER="20")
    with socket.socket() as stalled:  # closed however the test ends
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", cluster.port))
        # With the payloads (events leave them out unless asked for): ~50 kB each.
        stalled.sendall(
            b"GET /events?include=payload HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Accept: text/event-stream\r\n\r\n"
        )
        reader = Reader(f"{cluster.api_url}/events", timeout=120)
        assert reader.connected.wait(10)
        wait_until(lambda: value(http.get("/metrics").text, "brook_sse_clients") == 2, timeout=10)
        before = rss_mb(proc.pid)
        payload = {"blob": "x" * 50_000}  # 300 events of ~50 kB: far more than socket buffers hold
        ids = [http.post("/jobs", json={"task": "echo", "payload": payload}).json()["id"] for _ in range(300)]
        wait_until(lambda: len(by_job(reader.events)) == 300, timeout=60)
        proc.wait_for_event("sse.client_dropped", timeout=10)
        wait_until(lambda: value(http.get("/metrics").text, "brook_sse_clients") == 1, timeout=10)
        text = http.get("/metrics").text
        assert value(text, "brook_sse_dropped_total") == 1
        assert rss_mb(proc.pid) - before < 40, (before, rss_mb(proc.pid))
        assert sorted(by_job(reader.stop())) == sorted(ids)
