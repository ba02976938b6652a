"""Pure parts of watching Brook live: event ids, time buckets, documented errors, edge checks."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from common.runtime.metrics import MAX_QUEUE_LABELS, queue_label
from ingest.eventids import MAC_BYTES, EventIds, InvalidEventId
from ingest.live import EventFilter, LiveEvent, Position, cluster_seconds, tally
from ingest.livestats import STEP_S, LiveStats
from ingest.metrics import fold_queues
from ingest.openapi import document_errors, hoist_defs
from ingest.validation import InvalidInput, parse_submit

TOKEN = "826B0D3468000000032B022C0100296E5A1004FD"


def event(status: str, wall_s: float) -> LiveEvent:
    return LiveEvent(
        at=Position(token={"_data": TOKEN}, wall_ms=int(wall_s * 1000)),
        job_id="j1",
        task="t",
        queue="default",
        status=status,
        data="{}",
    )


def update(wall_s: float, **fields: Any) -> dict[str, Any]:
    """A change event as the hub reads it: the fields one update set, and the post-image's
    `run_at`."""
    wall = datetime.fromtimestamp(wall_s, UTC)
    return {
        "operationType": "update",
        "wallTime": wall,
        "updateDescription": {"updatedFields": fields},
        "fullDocument": {"run_at": wall - timedelta(seconds=1)},
    }


IDS = EventIds(b"k" * 32)


def test_event_ids_round_trip_and_refuse_what_the_api_did_not_hand_out() -> None:
    at = Position(token={"_data": TOKEN}, wall_ms=1_700_000_000_000)
    for final in (False, True):
        decoded = IDS.decode(IDS.encode(at, final=final))
        assert decoded.at == at and decoded.final is final
    assert len(IDS.encode(at)) < 100  # short enough for a header and a log line
    for junk in ("", "x" * 2000, "not base64!", "AAAA", IDS.encode(at)[:5]):
        with pytest.raises(InvalidEventId):
            IDS.decode(junk)


def _forge(ids: EventIds, at: Position, flip: int) -> str:
    raw = bytearray(base64.urlsafe_b64decode(ids.encode(at) + "=="))
    raw[flip] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def test_an_event_id_altered_or_signed_by_another_deployment_is_refused() -> None:
    at = Position(token={"_data": TOKEN}, wall_ms=1_700_000_000_000)
    other = EventIds(b"o" * 32)
    with pytest.raises(InvalidEventId):
        IDS.decode(other.encode(at))
    # Any byte changed (the wall time, the token, the MAC itself) breaks the MAC.
    for flip in (3, 12, -MAC_BYTES, -1):
        with pytest.raises(InvalidEventId):
            IDS.decode(_forge(IDS, at, flip))


def test_an_event_ids_wall_time_is_range_checked() -> None:
    for wall_ms in (2**62, 0):  # far in the future (fromtimestamp would raise), before 2010
        with pytest.raises(InvalidEventId, match="out of range"):
            IDS.decode(IDS.encode(Position(token={"_data": TOKEN}, wall_ms=wall_ms)))


def test_a_tokens_cluster_time_is_read_from_its_keystring() -> None:
    assert cluster_seconds(TOKEN) == 0x6B0D3468
    assert cluster_seconds("FFFF") is None and cluster_seconds("00" * 20) is None


def test_filters_match_on_every_field_given() -> None:
    ev = event("running", 0)
    assert EventFilter().matches(ev) and EventFilter(job_id="j1", status="running").matches(ev)
    assert not EventFilter(queue="other").matches(ev) and not EventFilter(task="x").matches(ev)


def test_live_stats_count_per_bucket_and_wait_percentiles() -> None:
    now = 10_005.0
    stats = LiveStats(clock=lambda: now)
    started = datetime.fromtimestamp(now - 1, UTC)
    changes = [
        update(now - 1, status="running", claimed_at=started),  # a claim: not a start
        update(now - 1, started_at=started - timedelta(seconds=0.75)),  # the start: 250 ms
        update(now - 1, progress={"fraction": 0.5}),  # progress: neither
        update(now - 1, status="completed", finished_at=started),
        update(now - 1, status="completed", started_at=started),  # started and ended at once
        update(now - STEP_S - 1, status="failed"),
        update(now - 1, status="pending", started_at=None),  # a retry: neither
        {"operationType": "insert", "fullDocument": {"status": "pending"}},
    ]
    for change in changes:
        if (counted := tally(change)) is not None:
            stats.observe(counted)
    series = stats.series()
    assert series["started"][-1] == 2 and series["completed"][-1] == 2
    assert series["failed"][-2] == 1 and series["wait_p50_ms"][-1] == 1000.0
    assert sorted(t.wait_ms or 0 for c in changes[1:2] if (t := tally(c))) == [250.0]
    assert series["end"] == (int(now // STEP_S) + 1) * STEP_S


def test_every_operation_documents_the_errors_it_can_answer() -> None:
    schema: dict[str, Any] = {
        "paths": {
            "/healthz": {"get": {"responses": {"200": {}}}},
            "/jobs": {"post": {"requestBody": {"required": True}, "responses": {"202": {}}}},
            "/jobs/{job_id}/cancel": {
                "post": {"parameters": [{"name": "job_id"}], "responses": {"200": {}}}
            },
        }
    }
    document_errors(schema)
    codes = {
        (path, method): set(op["responses"])
        for path, item in schema["paths"].items()
        for method, op in item.items()
    }
    # Any route may meet a foreign Host (400); a state change, a read-only token or another
    # site's page (403) and a body that is not JSON (415).
    assert codes[("/healthz", "get")] == {"200", "400"}
    assert codes[("/jobs", "post")] == {
        "200", "202", "400", "401", "403", "413", "415", "422", "503"
    }
    assert codes[("/jobs/{job_id}/cancel", "post")] == {
        "200", "400", "401", "403", "404", "409", "415", "422", "503"
    }


@pytest.mark.parametrize(
    "body",
    [
        b'{"task": "noop", "payload": {"n": 18446744073709551616}}',
        b'{"task": "noop", "payload": {"n": [-9223372036854775809]}}',
        b'{"task": "noop", "payload": {"n": NaN}}',
        b'{"task": "noop", "payload": {"n": -Infinity}}',
    ],
)
def test_numbers_bson_or_json_cannot_hold_are_refused_at_the_edge(body: bytes) -> None:
    with pytest.raises(InvalidInput):
        parse_submit(body)


def test_the_widest_64_bit_integers_are_accepted() -> None:
    body = b'{"task": "noop", "payload": {"lo": -9223372036854775808, "hi": 9223372036854775807}}'
    assert parse_submit(body).payload == {"lo": -(2**63), "hi": 2**63 - 1}


def test_queue_labels_are_capped_and_the_rest_folded_into_other() -> None:
    depth = {f"q{i:03}": {"pending": i} for i in range(200)}
    depth["default"] = {"pending": 1}
    folded = fold_queues(depth)
    assert len(folded) == MAX_QUEUE_LABELS
    assert "default" in folded and "q199" in folded and "q000" not in folded
    assert sum(c["pending"] for c in folded.values()) == sum(c["pending"] for c in depth.values())
    assert fold_queues({"default": {"pending": 1}}) == {"default": {"pending": 1}}
    labels = {queue_label(f"dispatcher-q{i}") for i in range(200)}
    assert len(labels) <= MAX_QUEUE_LABELS and "other" in labels
    assert queue_label("default") == "default"


def test_nested_models_of_hand_declared_bodies_are_components_of_the_document() -> None:
    schema: dict[str, Any] = {
        "paths": {
            "/queues/{name}": {
                "put": {
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "properties": {"rate": {"$ref": "#/$defs/RateSpec"}},
                                    "$defs": {"RateSpec": {"type": "object"}},
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    hoist_defs(schema)
    text = json.dumps(schema)
    assert "$defs" not in text and "#/components/schemas/RateSpec" in text
    assert schema["components"]["schemas"]["RateSpec"] == {"type": "object"}
