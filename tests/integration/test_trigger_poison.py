"""A trigger's poison changes against the real replica set: the stream reads past a change
it cannot decode, and a batch of a trigger's jobs refuses only those that cannot be
stored. (End to end, with dispatchers and a follower kill: tests/e2e/test_triggers.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from bson import DBRef
from pymongo.errors import BulkWriteError

from brook.common.domain.models import Doc, JobSpec
from brook.common.domain.triggers import SkippedChange, Trigger
from brook.common.store.jobs import JobStore, Refused, Submitted
from brook.common.store.triggers import TriggerStore, read_change
from tests.support.poison import YEAR_10000, nested, not_utf8


def job_spec(n: int, payload: dict[str, Any]) -> JobSpec:
    return JobSpec(task="noop", payload=payload, idempotency_key=f"poison:{n}")


async def test_the_stream_reads_past_a_change_it_cannot_decode_and_dates_past_year_9999(
    store: JobStore,
) -> None:
    trigger = Trigger.declare("orders", collection="orders", operations=["insert"], task="noop")
    orders = store.db["orders"]
    async with await TriggerStore(store.db).changes(
        trigger, start_after=None, start_at=None, max_await_ms=300
    ) as stream:
        await orders.insert_one({"_id": "good-1", "status": "paid"})
        await orders.insert_one(not_utf8("bad-utf8"))
        await orders.insert_one({"_id": "date", "due": YEAR_10000, "ref": DBRef("users", 7)})
        await orders.insert_one({"_id": "good-2", "status": "paid"})
        read: list[Doc | SkippedChange] = []
        while len(read) < 4:
            raw = await stream.try_next()
            assert raw is not None or stream.alive
            if raw is not None:
                read.append(read_change(raw))
    good_1, bad, date, good_2 = read
    assert isinstance(good_1, dict) and good_1["documentKey"] == {"_id": "good-1"}
    assert isinstance(bad, SkippedChange) and bad.operation == "insert"
    assert bad.document_id == "bad-utf8"  # its key is readable, the document is not
    assert bad.reason.startswith("cannot be read: InvalidBSON") and bad.change_id
    assert isinstance(date, dict) and date["fullDocument"]["due"] == YEAR_10000
    assert date["fullDocument"]["ref"] == DBRef("users", 7)
    assert isinstance(good_2, dict) and good_2["documentKey"] == {"_id": "good-2"}


async def test_a_batch_of_trigger_jobs_refuses_only_those_that_cannot_be_stored(
    store: JobStore,
) -> None:
    await store.submit(job_spec(3, {"n": 3}))  # its job exists: a change seen again
    specs = [
        job_spec(0, {"n": 0}),
        job_spec(1, {"blob": "x" * 20_000}),  # over the limit given below
        job_spec(2, {"full_document": nested(179)}),  # a job nested past MongoDB's 180 levels
        job_spec(3, {"n": 3}),
        job_spec(4, {"due": YEAR_10000}),
    ]
    with pytest.raises(BulkWriteError):  # one refused job fails the whole `submit_many`
        await store.submit_many(specs[2:3])

    results = await store.submit_or_refuse(specs, max_bytes=16_000)

    made, large, deep, seen, date = results
    assert isinstance(made, Submitted) and made.created
    assert isinstance(large, Refused) and large.reason.startswith("too large: its job is 20")
    assert large.reason.endswith("bytes as BSON; the limit is 16000")
    assert isinstance(deep, Refused) and deep.reason.startswith("refused by MongoDB: 15: ")
    assert isinstance(seen, Submitted) and not seen.created
    assert isinstance(date, Submitted) and date.created
    stored = await store.jobs.find({}, {"idempotency_key": 1}).to_list()
    assert sorted(d["idempotency_key"] for d in stored) == ["poison:0", "poison:3", "poison:4"]
    job = await store.get(date.job.id)
    assert job.payload == {"due": YEAR_10000}  # read back, not an InvalidBSON
