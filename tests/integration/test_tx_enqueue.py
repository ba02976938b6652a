"""Enqueue inside the application's own transaction, on the real replica set: a job exists
(and its change event happens) only if the transaction commits; idempotency keys keep
their meaning; foreign sessions and sessions outside a transaction are refused."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import OperationFailure
from pymongo.synchronous.client_session import ClientSession
from structlog.testing import capture_logs

from brook import AsyncClient, Client, InvalidInput, InvalidSession, JobNotFound, JobStatus
from brook.common.domain.models import Doc
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore

App = AsyncMongoClient[Doc]


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[App]:
    """The application's own client, with pymongo's defaults (naive datetimes, w:1)."""
    client: App = AsyncMongoClient(settings.mongo_uri)
    yield client
    await client.close()


@pytest.fixture
def sync_app(settings: Settings) -> Iterator[MongoClient[Doc]]:
    client: MongoClient[Doc] = MongoClient(settings.mongo_uri)
    yield client
    client.close()


@pytest.fixture
async def brook(app: App, settings: Settings, store: JobStore) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(mongo_client=app, db=settings.db)
    yield client
    await client.close()


async def inserts(store: JobStore) -> AsyncChangeStream[Doc]:
    return await store.jobs.watch([{"$match": {"operationType": "insert"}}], max_await_time_ms=200)


async def inserted_until_marker(stream: AsyncChangeStream[Doc], store: JobStore) -> list[str]:
    """The ids of the jobs inserted before a marker job written now (the stream saw them all)."""
    marker = (await store.submit(_marker())).job.id
    seen: list[str] = []
    while True:
        change = await stream.next()
        job_id = str(change["documentKey"]["_id"])
        if job_id == marker:
            return seen
        seen.append(job_id)


def _marker() -> Any:
    from brook.common.domain.models import JobSpec

    return JobSpec(task="noop", payload={"marker": True})


# -- commit and abort ---------------------------------------------------------------------------


async def test_a_job_submitted_in_an_aborted_transaction_never_existed_no_job_no_event_no_log(
    app: App, brook: AsyncClient, store: JobStore, settings: Settings
) -> None:
    async with await inserts(store) as stream:
        with capture_logs() as logs:
            async with app.start_session() as s:
                await s.start_transaction()
                await app[settings.db]["orders"].insert_one({"n": 1}, session=s)
                job = await brook.submit("echo", {"n": 1}, session=s)
                assert job.status == JobStatus.PENDING and job.task == "echo"
                assert await store.jobs.find_one({"_id": job.id}) is None  # not before commit
                await s.abort_transaction()
        assert await inserted_until_marker(stream, store) == []
    assert not [e for e in logs if e.get("event") == "job.submitted"]
    with pytest.raises(JobNotFound):
        await brook.get(job.id)
    assert await app[settings.db]["orders"].count_documents({}) == 0


async def test_a_job_submitted_in_a_committed_transaction_appears_at_the_commit_with_its_rows(
    app: App, brook: AsyncClient, store: JobStore, settings: Settings
) -> None:
    async with await inserts(store) as stream:
        async with app.start_session() as s:
            await s.start_transaction()
            await app[settings.db]["orders"].insert_one({"_id": "o1"}, session=s)
            job = await brook.submit("echo", {"order": "o1"}, priority=2, session=s)
            [a, b] = await brook.submit_many(
                [{"task": "noop"}, {"task": "echo", "delay": 60}], session=s
            )
            assert job.created_at.tzinfo is not None  # Brook's own codec, not the app's
            assert b.run_at > a.run_at
            await s.commit_transaction()
        assert await inserted_until_marker(stream, store) == [job.id, a.id, b.id]
    stored = await brook.get(job.id)
    assert stored.status == JobStatus.PENDING and stored.priority == 2
    assert stored.payload == {"order": "o1"} and [h["status"] for h in stored.history] == ["pending"]
    assert await app[settings.db]["orders"].count_documents({"_id": "o1"}) == 1


def test_the_blocking_client_submits_inside_the_applications_transaction(
    sync_app: MongoClient[Doc], settings: Settings, store: JobStore
) -> None:
    orders = sync_app[settings.db]["orders"]
    brook = Client(mongo_client=sync_app, db=settings.db)

    def place(s: ClientSession) -> str:
        orders.insert_one({"_id": "o2"}, session=s)
        [j] = brook.submit_many([{"task": "echo", "payload": {"order": "o2"}}], session=s)
        return brook.submit("noop", session=s).id + " " + j.id

    with sync_app.start_session() as s:
        ids = s.with_transaction(place).split()
    with (
        sync_app.start_session() as s,
        pytest.raises(RuntimeError, match="changed my mind"),
        s.start_transaction(),
    ):
        orders.insert_one({"_id": "o3"}, session=s)
        lost = brook.submit("echo", session=s)
        raise RuntimeError("changed my mind")
    assert sorted(j.id for j in brook.list()) == sorted(ids)  # the companion client reads
    with pytest.raises(JobNotFound):
        brook.get(lost.id)
    assert sorted(d["_id"] for d in orders.find()) == ["o2"]
    brook.close()
    assert sync_app.admin.command("ping")["ok"]  # the application's client stays open


# -- idempotency keys ---------------------------------------------------------------------------


async def test_idempotency_keys_inside_a_transaction_return_the_existing_job(
    app: App, brook: AsyncClient, store: JobStore
) -> None:
    held = await brook.submit("noop", idempotency_key="k1")
    async with app.start_session() as s:
        await s.start_transaction()
        same = await brook.submit("echo", idempotency_key="k1", session=s)
        jobs = await brook.submit_many(
            [
                {"task": "noop", "idempotency_key": "k1"},
                {"task": "noop", "idempotency_key": "k2"},
                {"task": "echo", "idempotency_key": "k2"},
            ],
            session=s,
        )
        again = await brook.submit("noop", idempotency_key="k2", session=s)
        await s.commit_transaction()
    assert same.id == held.id and same.task == "noop"
    assert [j.id for j in jobs][:1] == [held.id] and jobs[1].id == jobs[2].id == again.id
    assert await store.jobs.count_documents({}) == 2


async def test_a_key_a_concurrent_transaction_takes_is_a_transient_conflict_then_its_job(
    app: App, brook: AsyncClient, store: JobStore
) -> None:
    async with app.start_session() as first:
        await first.start_transaction()
        mine = await brook.submit("noop", idempotency_key="race", session=first)
        tries = 0

        async def second(s: AsyncClientSession) -> str:
            nonlocal tries
            tries += 1
            return (await brook.submit("echo", idempotency_key="race", session=s)).id

        async with app.start_session() as other:
            racing = asyncio.ensure_future(other.with_transaction(second))
            await asyncio.sleep(0.5)  # the second one conflicts, and retries
            assert not racing.done()
            await first.commit_transaction()
            assert await racing == mine.id
    assert tries >= 2
    assert await store.jobs.count_documents({"idempotency_key": "race"}) == 1


async def test_a_unique_window_that_is_over_is_released_only_if_the_transaction_commits(
    app: App, brook: AsyncClient, store: JobStore
) -> None:
    old = await brook.submit("noop", idempotency_key="u", unique_for_s=0.2)
    await asyncio.sleep(0.4)
    async with app.start_session() as s:
        await s.start_transaction()
        assert (await brook.submit("noop", idempotency_key="u", session=s)).id != old.id
        await s.abort_transaction()
    assert (await store.jobs.find_one({"idempotency_key": "u"}) or {}).get("_id") == old.id
    async with app.start_session() as s:
        await s.start_transaction()
        new = await brook.submit("noop", idempotency_key="u", session=s)
        await s.commit_transaction()
    assert (await brook.get(new.id)).idempotency_key == "u"
    assert (await store.jobs.find_one({"_id": old.id}) or {}).get("released_key") == "u"


# -- refusals -----------------------------------------------------------------------------------


async def test_a_session_of_another_client_or_outside_a_transaction_is_refused(
    app: App, brook: AsyncClient, store: JobStore, settings: Settings, sync_app: MongoClient[Doc]
) -> None:
    other: App = AsyncMongoClient(settings.mongo_uri)
    try:
        async with other.start_session() as foreign:
            await foreign.start_transaction()
            with pytest.raises(InvalidSession, match=r"session\.client is not the client"):
                await brook.submit("noop", session=foreign)
            await foreign.abort_transaction()
    finally:
        await other.close()
    async with app.start_session() as s:
        with pytest.raises(InvalidSession, match="in_transaction is False"):
            await brook.submit("noop", session=s)
        with pytest.raises(InvalidSession, match="in_transaction is False"):
            await brook.submit_many([{"task": "noop"}], session=s)
        await s.start_transaction()
        with pytest.raises(InvalidInput):  # checked before any write: the transaction lives on
            await brook.submit("noop", priority="high", session=s)  # type: ignore[arg-type]
        await brook.submit("noop", session=s)
        await s.commit_transaction()
        async with AsyncClient(settings.mongo_uri, settings.db) as own:
            await s.start_transaction()
            with pytest.raises(InvalidSession, match=r"session\.client is not"):
                await own.submit("noop", session=s)
            await s.abort_transaction()
    with sync_app.start_session() as ss:
        ss.start_transaction()
        with Client(settings.mongo_uri, settings.db) as own_sync, pytest.raises(
            InvalidSession, match="its own MongoClient"
        ):
            own_sync.submit("noop", session=ss)
        with pytest.raises(InvalidSession, match="must be a pymongo AsyncClientSession"):
            await brook.submit("noop", session=ss)
        ss.abort_transaction()
    with pytest.raises(TypeError, match=r"use brook\.AsyncClient"):
        Client(mongo_client=app)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"use brook\.Client"):
        AsyncClient(mongo_client=sync_app)  # type: ignore[arg-type]
    assert await store.jobs.count_documents({}) == 1


# -- many at once -------------------------------------------------------------------------------


async def test_100_concurrent_transactions_half_aborted_leave_exactly_the_committed_jobs(
    app: App, brook: AsyncClient, store: JobStore, settings: Settings
) -> None:
    # The application's collection exists (concurrent transactions creating it would
    # conflict with each other, which is MongoDB's business, not Brook's).
    orders = await app[settings.db].create_collection("orders")

    async def place(n: int) -> tuple[str, bool]:
        async with app.start_session() as s:
            await s.start_transaction()
            await orders.insert_one({"n": n}, session=s)
            job = await brook.submit("echo", {"n": n}, session=s)
            await asyncio.sleep(random.random() * 0.05)
            commit = n % 2 == 0
            if commit:
                await s.commit_transaction()
            else:
                await s.abort_transaction()
            return job.id, commit

    async with await inserts(store) as stream:
        placed = await asyncio.gather(*[place(n) for n in range(100)])
        seen = await inserted_until_marker(stream, store)
    committed = {job_id for job_id, ok in placed if ok}
    assert len(committed) == 50
    assert set(seen) == committed and len(seen) == 50
    docs = await store.jobs.find({"payload.marker": {"$exists": False}}).to_list()
    assert {d["_id"] for d in docs} == committed
    assert sorted(d["payload"]["n"] for d in docs) == list(range(0, 100, 2))
    assert sorted(d["n"] for d in await orders.find().to_list()) == list(range(0, 100, 2))


async def test_the_first_submit_on_a_fresh_database_is_retried_by_with_transaction(
    app: App, settings: Settings
) -> None:
    fresh = f"t_{uuid.uuid4().hex[:12]}"
    brook = AsyncClient(mongo_client=app, db=fresh)
    calls = 0

    async def place(s: AsyncClientSession) -> str:
        nonlocal calls
        calls += 1
        await app[fresh]["orders"].insert_one({"call": calls}, session=s)
        return (await brook.submit("noop", session=s)).id

    try:
        async with app.start_session() as s:
            job_id = await s.with_transaction(place)
        assert calls in (1, 2)  # the first may meet the new collection and be run again
        assert (await brook.get(job_id)).status == JobStatus.PENDING
        assert await app[fresh]["jobs"].count_documents({}) == 1
        assert await app[fresh]["orders"].count_documents({}) == 1
    except OperationFailure:  # pragma: no cover - shows what the server said
        raise
    finally:
        await app.drop_database(fresh)
