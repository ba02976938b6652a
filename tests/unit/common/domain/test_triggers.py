"""Triggers without a database: the declaration and its checks, the change a job is made
from, its key, the pipeline, and the trigger store's fenced writes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from bson import DatetimeMS, Timestamp

from brook.common.domain.errors import ConfigError
from brook.common.domain.triggers import (
    MAX_JOB_BYTES,
    SkippedChange,
    Trigger,
    TriggerState,
    brook_collection,
    change_key,
    change_payload,
    token_time,
)
from brook.common.store.pipelines import INVALIDATING, OVERSIZE, trigger_pipeline
from brook.common.store.triggers import acquired, checkpointed, history_lost, released
from brook.executor import triggers as registry
from brook.executor.triggers import declared_triggers, trigger

PAID = {"fullDocument.status": "paid"}


def declare(**overrides: Any) -> Trigger:
    fields: dict[str, Any] = {
        "collection": "orders",
        "operations": ["insert", "update"],
        "match": PAID,
        "task": "send_receipt",
    }
    return Trigger.declare("receipts", **(fields | overrides))


def test_a_trigger_is_declared_with_its_operations_match_and_update_lookup_by_default() -> None:
    t = declare()
    assert (t.name, t.collection, t.operations, t.match, t.task) == (
        "receipts",
        "orders",
        ("insert", "update"),
        PAID,
        "send_receipt",
    )
    assert t.db is None and t.full_document == "updateLookup" and t.queue == "default"
    assert declare(full_document=None).full_document is None
    assert Trigger.declare("all", collection="c", task="t").operations == (
        "insert",
        "update",
        "replace",
        "delete",
    )


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"operations": ["insert", "upsert"]}, "unknown operations ['upsert']"),
        ({"operations": "insert"}, "operations must be a non-empty list"),
        ({"operations": []}, "operations must be a non-empty list"),
        ({"match": {"status": "paid"}}, "match key 'status' is not a field of the change event"),
        ({"match": {"fullDocument.n": {"$where": "1"}}}, "'$where', not a query operator"),
        ({"match": {"$or": {"a": 1}}}, "match.$or must be a non-empty list"),
        ({"match": {"$or": [{"status": 1}]}}, "match.$or[0] key 'status' is not a field"),
        ({"match": ["fullDocument.a"]}, "match must be a dict"),
        ({"full_document": "whenAvailable"}, "full_document must be 'updateLookup' or None"),
        ({"collection": ""}, "collection must be a collection name"),
        ({"task": ""}, "task must be a task name"),
    ],
)
def test_a_bad_declaration_fails_naming_the_trigger_and_the_problem(
    overrides: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError) as info:
        declare(**overrides)
    assert str(info.value).startswith("trigger 'receipts': ")
    assert problem in str(info.value)


def test_operators_and_change_fields_a_change_stream_takes_are_accepted() -> None:
    declare(
        match={
            "$or": [
                {"fullDocument.total": {"$gte": 100}},
                {"updateDescription.updatedFields.status": {"$in": ["paid", "refunded"]}},
            ],
            "documentKey._id": {"$exists": True},
            "fullDocument.tags": {"$elemMatch": {"$eq": "vip"}},
        }
    )


def test_brooks_own_collections_are_refused_in_its_database_only() -> None:
    assert brook_collection("jobs") and brook_collection("brook_state")
    assert brook_collection("system.views") and not brook_collection("orders")
    on_jobs = declare(collection="jobs", task="noop")
    assert on_jobs.problem({"noop"}, "brook") == (
        "trigger 'receipts' watches 'jobs', a collection Brook itself uses in database "
        "'brook'; triggers follow your own collections"
    )
    assert declare(collection="brook_queues", task="noop", db="brook").problem({"noop"}, "brook")
    assert declare(collection="jobs", task="noop", db="shop").problem({"noop"}, "brook") is None
    assert declare(collection="orders", task="noop", db="local").problem({"noop"}, "brook")


@pytest.fixture
def clean_registry() -> Iterator[None]:
    before = dict(registry._TRIGGERS)
    yield
    registry._TRIGGERS.clear()
    registry._TRIGGERS.update(before)


@pytest.mark.usefixtures("clean_registry")
def test_a_trigger_naming_an_unknown_task_is_one_config_error_line() -> None:
    trigger("unit-orphan", collection="orders", task="no-such-task")
    with pytest.raises(ConfigError) as info:
        declared_triggers({"noop", "echo"}, "brook")
    assert str(info.value) == (
        "trigger 'unit-orphan' names unknown task 'no-such-task'; known tasks: echo, noop"
    )


@pytest.mark.usefixtures("clean_registry")
def test_declaring_the_same_trigger_twice_differently_is_refused() -> None:
    trigger("unit-twice", collection="orders", task="noop")
    trigger("unit-twice", collection="orders", task="noop")  # the same again: a re-import
    with pytest.raises(ValueError, match="already declared"):
        trigger("unit-twice", collection="other", task="noop")
    assert [t.name for t in declared_triggers({"noop"}, "brook")] == ["unit-twice"]


def test_the_job_key_is_the_trigger_and_the_changes_own_id() -> None:
    assert change_key("receipts", {"_data": "8265AB"}) == "trigger:receipts:8265AB"


def test_a_tokens_cluster_time_is_read_from_its_first_bytes() -> None:
    # 0x82, then the seconds (0x65AB0000) and the increment (1), as the server encodes them.
    token = {"_data": "8265AB0000000000012B022C0100296E5A1004"}
    assert token_time(token) == datetime.fromtimestamp(0x65AB0000, UTC)
    assert token_time(None) is None and token_time({"_data": "zz"}) is None


def test_the_task_receives_the_operation_the_document_key_and_the_full_document() -> None:
    t = declare()
    at = datetime(2025, 1, 1, tzinfo=UTC)
    change = {
        "_id": {"_data": "82"},
        "operationType": "update",
        "documentKey": {"_id": 7},
        "fullDocument": {"_id": 7, "status": "paid"},
        "ns": {"db": "shop", "coll": "orders"},
        "wallTime": at,
        "updateDescription": {"updatedFields": {"status": "paid"}, "removedFields": ["note"]},
    }
    assert change_payload(t, change) == {
        "trigger": "receipts",
        "operation": "update",
        "document_key": {"_id": 7},
        "full_document": {"_id": 7, "status": "paid"},
        "db": "shop",
        "collection": "orders",
        "cluster_time": at,
        "update_description": {"updated_fields": {"status": "paid"}, "removed_fields": ["note"]},
    }
    deleted = change_payload(t, {"operationType": "delete", "documentKey": {"_id": 7}})
    assert deleted["full_document"] is None and "update_description" not in deleted


def test_the_pipeline_keeps_the_operations_and_the_match_and_the_events_that_end_a_stream() -> None:
    stage, *_ = trigger_pipeline(("update", "insert"), PAID)
    assert stage == {
        "$match": {
            "$or": [
                {"operationType": {"$in": list(INVALIDATING)}},
                {"$and": [{"operationType": {"$in": ["insert", "update"]}}, PAID]},
            ]
        }
    }
    bare, *_ = trigger_pipeline(("insert",), {})
    assert bare["$match"]["$or"][1] == {"$and": [{"operationType": {"$in": ["insert"]}}]}


def test_a_change_too_large_for_a_job_loses_its_document_after_the_match_has_seen_it() -> None:
    match, sized, stripped = trigger_pipeline(("insert",), PAID)
    assert "$match" in match  # first: the match filters on the whole change
    size = sized["$set"][OVERSIZE]["$let"]
    assert size["in"]["$cond"][0] == {"$gt": ["$$size", MAX_JOB_BYTES]}
    fits = {"$eq": [{"$type": f"${OVERSIZE}"}, "missing"]}
    assert stripped["$set"] == {
        "fullDocument": {"$cond": [fits, "$fullDocument", "$$REMOVE"]},
        "updateDescription": {"$cond": [fits, "$updateDescription", "$$REMOVE"]},
    }


def test_a_lease_is_taken_when_free_expired_by_the_server_clock_or_already_ours() -> None:
    write = acquired("receipts", "d1:1:ab", 5)
    assert write.filter == {
        "_id": "receipts",
        "$or": [
            {"follower": "d1:1:ab"},
            {"follower": None},
            {"$expr": {"$lt": ["$lease_expires_at", "$$NOW"]}},
        ],
    }
    assert write.update == [
        {
            "$set": {
                "follower": {"$literal": "d1:1:ab"},
                "lease_expires_at": {"$add": ["$$NOW", 5000]},
            }
        }
    ]


def test_every_follower_write_is_fenced_by_its_owner() -> None:
    token = {"_data": "8265AB0000000000012B"}
    at = datetime(2025, 1, 1, tzinfo=UTC)
    write = checkpointed(
        "receipts", "d1:1:ab", 5, token=token, handled_through=at, made=3, last_change_at=at
    )
    assert write.filter == {"_id": "receipts", "follower": "d1:1:ab"}
    fields = write.update[0]["$set"]
    assert fields["token"] == {"$literal": token} and fields["handled_through"] == {"$literal": at}
    # The count moves in the same write as the token past the changes it counts.
    assert fields["jobs_made"] == {"$add": [{"$ifNull": ["$jobs_made", 0]}, 3]}
    assert "skipped" not in fields and "last_skipped" not in fields
    renewal = checkpointed(
        "receipts", "d1:1:ab", 5, token=None, handled_through=None, made=0, last_change_at=None
    )
    assert "token" not in renewal.update[0]["$set"]
    # Skipped changes are counted by the same write that moves the token past them.
    skips = [
        SkippedChange(change_id=f"82{i}", operation="insert", document_id=str(i), reason=f"r{i}")
        for i in range(2)
    ]
    past = checkpointed(
        "receipts",
        "d1:1:ab",
        5,
        token=token,
        handled_through=at,
        made=1,
        last_change_at=at,
        skipped=skips,
    ).update[0]["$set"]
    assert past["token"] == {"$literal": token}
    assert past["skipped"] == {"$add": [{"$ifNull": ["$skipped", 0]}, 2]}
    assert past["last_skipped"] == {
        "change_id": {"$literal": "821"},
        "operation": {"$literal": "insert"},
        "document_id": {"$literal": "1"},
        "reason": {"$literal": "r1"},
        "at": "$$NOW",
    }
    for fenced in (history_lost("receipts", "d1:1:ab"), released("receipts", "d1:1:ab")):
        assert fenced.filter == {"_id": "receipts", "follower": "d1:1:ab"}
    lost = history_lost("receipts", "d1:1:ab").update[0]["$set"]
    assert lost["token"] is None and lost["start_at"] is None and lost["history_lost_at"] == "$$NOW"


def test_the_api_shows_the_follower_only_while_its_lease_runs_and_the_lag_from_the_token() -> None:
    now = datetime(2025, 1, 1, 0, 0, 10, tzinfo=UTC)
    doc = {
        "_id": "receipts",
        "collection": "orders",
        "match": '{"fullDocument.status": "paid"}',
        "follower": "d1:1:ab",
        "lease_expires_at": datetime(2025, 1, 1, 0, 0, 12, tzinfo=UTC),
        "handled_through": datetime(2025, 1, 1, 0, 0, 7, tzinfo=UTC),
        "jobs_made": 4,
        "skipped": 1,
        "last_skipped": {"change_id": "82AB", "operation": "insert", "reason": "too large"},
        "start_at": Timestamp(1, 1),
    }
    shown = TriggerState.from_doc(doc).to_api(now)
    assert shown["follower"] == "d1:1:ab" and shown["lag_s"] == 3.0 and shown["jobs_made"] == 4
    assert shown["skipped"] == 1 and shown["last_skipped"]["change_id"] == "82AB"
    assert TriggerState.from_doc({"_id": "new"}).to_api(now)["skipped"] == 0
    assert shown["match"] == {"fullDocument.status": "paid"} and shown["paused"] is False
    expired = doc | {"lease_expires_at": datetime(2025, 1, 1, 0, 0, 9, tzinfo=UTC)}
    assert TriggerState.from_doc(expired).to_api(now)["follower"] is None
    assert TriggerState.from_doc({"_id": "new"}).to_api(now)["lag_s"] is None


def test_a_state_document_edited_by_hand_reads_as_unknown_not_as_an_error() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    doc = {
        "_id": "receipts",
        "jobs_made": "many",
        "skipped": None,
        "history_lost": float("inf"),
        "lease_expires_at": DatetimeMS(253402300800000),  # past year 9999
        "handled_through": "yesterday",
        "follower": 7,
        "token": "not a token",
    }
    state = TriggerState.from_doc(doc)
    assert (state.jobs_made, state.skipped, state.history_lost) == (0, 0, 0)
    assert state.lease_expires_at is None and state.handled_through is None
    assert state.follower is None and state.token is None
    assert state.to_api(now)["lag_s"] is None
