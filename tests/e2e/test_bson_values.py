"""Jobs holding values only BSON can hold (as a trigger copies them from an application's
documents) are listed, read, streamed and shown by the CLI, as documented extended JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
from bson.codec_options import DatetimeConversion
from pymongo import MongoClient
from pymongo.write_concern import WriteConcern

from brook.common.store.db import CODEC
from tests.e2e.conftest import Cluster
from tests.support.procs import wait_until
from tests.support.sse import Reader, read_events
from tests.unit.ingest.test_encoding import BSON_ONLY

# Dates out of `datetime`'s range decode only where the client reads them as `DatetimeMS`.
OUT_OF_RANGE = ("year_10000", "year_0")
READS_ANY_DATE = CODEC.datetime_conversion == DatetimeConversion.DATETIME_AUTO
CASES = {k: v for k, v in BSON_ONLY.items() if READS_ANY_DATE or k not in OUT_OF_RANGE}
VALUES = {name: value for name, (value, _) in CASES.items()}
SHAPES = {name: shape for name, (_, shape) in CASES.items()}
BOTH = {"include": "payload,result"}


def test_jobs_holding_bson_only_values_are_listed_read_streamed_and_shown_by_the_cli(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(BROOK_SSE_PING_SECONDS="0.5")
    everything = Reader(f"{cluster.api_url}/events", params=BOTH, timeout=60)
    plain = Reader(f"{cluster.api_url}/events", timeout=60)
    assert everything.connected.wait(10) and plain.connected.wait(10)
    job_id = http.post("/jobs", json={"task": "noop"}).json()["id"]  # no dispatcher: pending
    client: MongoClient[dict[str, Any]] = MongoClient(cluster.settings.mongo_uri)
    try:
        jobs = client[cluster.settings.db].get_collection(
            "jobs", write_concern=WriteConcern("majority")
        )
        # Written around the API, as a trigger's copy of `fullDocument` or a task's result.
        changed = jobs.update_one(
            {"_id": job_id},
            {
                "$set": {
                    "payload": VALUES,
                    "result": {"values": list(VALUES.values())},
                    "status": "completed",
                    "finished_at": datetime.now(UTC),
                }
            },
        )
        assert changed.modified_count == 1
    finally:
        client.close()

    def shown(job: dict[str, Any]) -> None:
        assert job["id"] == job_id and job["status"] == "completed"
        assert job["payload"] == SHAPES
        assert job["result"] == {"values": list(SHAPES.values())}

    shown(http.get(f"/jobs/{job_id}").json())
    page = http.get("/jobs", params=BOTH)
    assert page.status_code == 200, page.text
    [listed] = [j for j in page.json()["jobs"] if j["id"] == job_id]
    shown(listed)
    [one] = read_events(f"{cluster.api_url}/jobs/{job_id}/events", params=BOTH, timeout=30)
    shown(one.data)
    def completed(reader: Reader) -> bool:
        return any(e.data["status"] == "completed" for e in reader.events)

    wait_until(lambda: completed(everything) and completed(plain), timeout=30)
    shown(everything.stop()[-1].data)
    left_out = plain.stop()  # its pending state, then the change
    assert [e.status for e in left_out] == ["pending", "completed"]
    assert not any({"payload", "result"} & e.data.keys() for e in left_out)

    status = cluster.cli("status", job_id)
    assert status.returncode == 0, status.stderr
    shown(json.loads(status.stdout))
    ls = cluster.cli("ls")
    assert ls.returncode == 0 and job_id in ls.stdout, ls.stderr
    watched = cluster.cli("watch", job_id, "--json", "--include", "payload,result")
    assert watched.returncode == 0, watched.stderr
    shown(json.loads(watched.stdout.splitlines()[-1]))
    line = cluster.cli("watch", job_id)
    assert line.returncode == 0 and f"{job_id}  completed" in line.stdout, line.stderr
