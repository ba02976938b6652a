"""A Last-Event-ID the oplog no longer holds: a `reset` event, then the current state."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from pymongo import MongoClient

from brook.common.runtime.settings import Settings
from brook.replset import ReplicaSet
from tests.conftest import extra_port
from tests.e2e.conftest import Cluster
from tests.e2e.test_events import LIVE
from tests.support.sse import read_events

# A set of its own with a 1 MB oplog (and a checkpoint every second, so it really is
# truncated): the slot of the fault suite's tiny-oplog set, which is down again by the time
# this runs (tests run one at a time, each stops its set).
TINY_PORT = extra_port("tiny_oplog")


def flood_oplog_past(client: MongoClient[dict[str, Any]], db: str, timeout: float = 90) -> None:
    """Write junk until the oplog's oldest entry is newer than its newest one was."""
    oplog = client["local"]["oplog.rs"]

    def ts(direction: int) -> Any:
        entry = oplog.find_one({}, sort=[("$natural", direction)])
        assert entry is not None
        return entry["ts"]

    mark = ts(-1)
    junk = client[db]["junk"]
    deadline = time.monotonic() + timeout
    while ts(1) <= mark:
        assert time.monotonic() < deadline, "the oplog was never truncated"
        junk.insert_many([{"blob": "x" * 500_000} for _ in range(4)])
        time.sleep(0.3)
    junk.drop()


def test_a_position_the_oplog_lost_is_a_reset_then_the_current_state(
    tmp_path: Path, db_name: str
) -> None:
    rs = ReplicaSet(
        home=tmp_path / "tiny",
        base_port=TINY_PORT,
        members=1,
        oplog_mb=1,
        extra_args=("--syncdelay", "1"),
    )
    rs.up()
    settings = Settings(mongo_uri=rs.uri, db=db_name, home=tmp_path / "home")
    cluster = Cluster(settings, tmp_path)
    client: MongoClient[dict[str, Any]] = MongoClient(rs.uri)
    try:
        first_api = cluster.api(**LIVE)
        url = cluster.api_url
        job_id = httpx.post(f"{url}/jobs", json={"task": "noop"}).json()["id"]
        [current] = read_events(f"{url}/jobs/{job_id}/events", until=lambda ev: True)
        assert current.status == "pending"
        assert httpx.post(f"{url}/jobs/{job_id}/cancel").status_code == 200
        first_api.stop()  # a new process remembers nothing: resuming needs the oplog
        flood_oplog_past(client, db_name)
        cluster.api(**LIVE)
        for path in (f"/jobs/{job_id}/events", "/events"):
            events = read_events(
                f"{url}{path}", last_id=current.id, until=lambda ev: len(ev) == 2, timeout=30
            )
            assert [e.event for e in events] == ["reset", "job"], events
            assert "history lost" in events[0].data["reason"]
            assert (events[1].data["id"], events[1].status) == (job_id, "cancelled")
    finally:
        try:
            cluster.close()
            client.close()
        finally:
            rs.down()  # a set of its own, in tmp_path: nothing else to clean
