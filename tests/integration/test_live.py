"""The live-event hub and its feeds against the real replica set, in process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from pymongo import monitoring
from sse_starlette import ServerSentEvent

from brook.common.domain.errors import SearchTooBroad
from brook.common.domain.models import JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import JobStore, Lease
from brook.common.store.pipelines import LIVE_PIPELINE
from brook.ingest.eventids import EventIds
from brook.ingest.feeds import Feed, FeedOptions
from brook.ingest.live import EventFilter, Hub, Position, Subscription, Tally
from brook.ingest.metrics import DepthCache

OWNER = "test-owner"


async def started(hub: Hub) -> asyncio.Task[None]:
    """The hub running, its stream open."""
    task = asyncio.create_task(hub.run())
    await asyncio.wait_for(hub.ready.wait(), 30)
    return task


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.fixture
async def hub(store: JobStore) -> AsyncIterator[Hub]:
    hub = Hub(store, buffer=100, ring_size=1000)
    task = await started(hub)
    yield hub
    await stopped(task)


async def take(stream: AsyncIterator[ServerSentEvent], n: int, timeout: float = 15) -> list[ServerSentEvent]:
    """The next `n` job or reset events (id-only markers skipped)."""
    out: list[ServerSentEvent] = []
    async with asyncio.timeout(timeout):
        async for sse in stream:
            if sse.event is not None:
                out.append(sse)
            if len(out) == n:
                break
    return out


def statuses(events: list[ServerSentEvent]) -> list[str]:
    return [json.loads(str(e.data))["status"] for e in events]


async def wait_for(check: Callable[[], bool], timeout: float = 10) -> None:
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("not within the timeout")


IDS = EventIds(b"k" * 32)
decode_id = IDS.decode


def feed(
    hub: Hub,
    store: JobStore,
    *,
    job_id: str | None = None,
    idle_s: float = 0.2,
    include: frozenset[str] = frozenset(),
) -> Feed:
    options = FeedOptions(per_job=job_id is not None, idle_s=idle_s, include=include)
    return Feed(hub, store, EventFilter(job_id=job_id), options, IDS)


async def run_one(store: JobStore, task: str = "noop", result: Any = None) -> str:
    """Submit, claim and complete one job as fast as the store allows."""
    job = (await store.submit(JobSpec(task=task, payload={}))).job
    claimed = (await store.claim(OWNER, 30)).job
    assert claimed is not None and claimed.id == job.id
    written = await store.complete_many(OWNER, [(Lease(job_id=job.id, attempt=1), result)])
    assert written.done == {job.id}
    return job.id


async def sees_a_whole_job(hub: Hub, store: JobStore) -> Subscription:
    """A client subscribing now gets pending, running and completed of the next job."""
    sub = hub.subscribe(EventFilter())
    job_id = await run_one(store)
    got = [await sub.next(10) for _ in range(3)]
    assert [(e.job_id, e.status) for e in got if e is not None] == [
        (job_id, "pending"),
        (job_id, "running"),
        (job_id, "completed"),
    ]
    return sub


async def test_each_event_carries_the_job_as_that_change_left_it(store: JobStore, hub: Hub) -> None:
    stream = feed(hub, store).events(None)
    asked = feed(hub, store, include=frozenset({"payload", "result"})).events(None)
    first = asyncio.ensure_future(take(stream, 3))
    first_asked = asyncio.ensure_future(take(asked, 3))
    await asyncio.sleep(0.2)
    job_id = await run_one(store, result={"answer": 42})
    events = await first
    # Three changes in a few milliseconds: post-images, not lookups, so every state shows.
    assert statuses(events) == ["pending", "running", "completed"]
    assert [json.loads(str(e.data))["id"] for e in events] == [job_id] * 3
    assert len({e.id for e in events}) == 3
    # Without the payload and the result, unless asked for: then read for each event.
    assert not any({"payload", "result"} & json.loads(str(e.data)).keys() for e in events)
    with_them = [json.loads(str(e.data)) for e in await first_asked]
    assert [(j["status"], j["payload"], j["result"]) for j in with_them][-1] == (
        "completed",
        {},
        {"answer": 42},
    )
    assert [e.id for e in events] == [e.id for e in await first_asked]
    await stream.aclose()
    await asked.aclose()


async def test_a_lease_renewal_is_not_an_event(store: JobStore, hub: Hub) -> None:
    job = (await store.submit(JobSpec(task="noop", payload={}))).job
    stream = feed(hub, store, job_id=job.id).events(None)
    [current] = await take(stream, 1)
    assert statuses([current]) == ["pending"]
    claimed = (await store.claim(OWNER, 30)).job
    assert claimed is not None
    assert statuses(await take(stream, 1)) == ["running"]
    for _ in range(3):
        assert await store.renew(OWNER, [Lease(job_id=job.id, attempt=1)], 30) == set()
    await store.cancel(job.id)  # → cancel_requested: a real change
    [requested] = await take(stream, 1)
    assert json.loads(str(requested.data))["cancel_requested"] is True
    await stream.aclose()


async def test_a_per_job_stream_starts_with_the_current_state_and_ends_after_a_terminal_one(
    store: JobStore, hub: Hub
) -> None:
    job = (await store.submit(JobSpec(task="noop", payload={}))).job
    await store.claim(OWNER, 30)
    events = feed(hub, store, job_id=job.id).events(None)
    seen = await take(events, 1)
    await store.complete_many(OWNER, [(Lease(job_id=job.id, attempt=1), None)])
    seen += [e async for e in events if e.event is not None]  # ends by itself
    assert statuses(seen) == ["running", "completed"]
    last = decode_id(str(seen[-1].id))
    assert last.final and not decode_id(str(seen[0].id)).final


async def test_resuming_from_memory_or_from_the_oplog_gives_exactly_the_missing_events(
    store: JobStore,
) -> None:
    # A ring of 4 events: older positions must come from a catch-up stream of their own.
    hub = Hub(store, buffer=100, ring_size=4)
    task = await started(hub)
    try:
        whole = feed(hub, store).events(None)
        pending = asyncio.ensure_future(take(whole, 15))
        await asyncio.sleep(0.2)
        for _ in range(5):
            await run_one(store)
        reference = await pending
        for cut in (13, 11, 2):  # from the ring (the last 4), then from the oplog
            since = decode_id(str(reference[cut].id)).at
            resumed = await take(feed(hub, store).events(since), 15 - cut - 1)
            assert [(e.id, e.data) for e in resumed] == [
                (e.id, e.data) for e in reference[cut + 1 :]
            ]
    finally:
        await stopped(task)


async def test_a_position_the_server_cannot_resume_from_is_a_reset_then_the_current_state(
    store: JobStore, hub: Hub
) -> None:
    job = (await store.submit(JobSpec(task="noop", payload={}))).job
    assert hub.position is not None
    bogus = Position(token={"_data": "FFFF"}, wall_ms=hub.position.wall_ms)  # not a KeyString
    events = await take(feed(hub, store, job_id=job.id).events(bogus), 2)
    assert events[0].event == "reset" and "history lost" in json.loads(str(events[0].data))["reason"]
    assert events[1].event == "job" and statuses(events[1:]) == ["pending"]


async def test_a_slow_client_is_dropped_and_the_others_get_everything(store: JobStore) -> None:
    # Room for 8 events: a change-stream batch can bring a few at once (on one member,
    # whose majority commits are quick, a job's three can come together), and the fast
    # client reads them between batches.
    hub = Hub(store, buffer=8)
    task = await started(hub)
    try:
        slow = feed(hub, store).events(None)
        fast = feed(hub, store).events(None)
        first_slow = asyncio.ensure_future(take(slow, 1))
        fast_all = asyncio.ensure_future(take(fast, 12))
        await asyncio.sleep(0.2)
        for _ in range(4):
            await run_one(store)
        assert len(await fast_all) == 12
        assert len(await first_slow) == 1  # then it stopped reading: 11 more queued, limit 8
        rest = [e async for e in slow]
        assert rest[-1].comment is not None and "fell 8 events behind" in rest[-1].comment
        assert len([e for e in rest if e.event == "job"]) <= 8
        assert hub.count() == 1  # the fast one, still there
        await fast.aclose()
        assert hub.count() == 0
    finally:
        await stopped(task)


async def test_concurrent_scrapes_share_one_aggregation(store: JobStore) -> None:
    for _ in range(3):
        await store.submit(JobSpec(task="noop", payload={}))
    cache = DepthCache(store, ttl=60)
    results = await asyncio.gather(*[cache.get() for _ in range(20)])
    assert cache.aggregations == 1
    assert all(r["default"]["pending"] == 3 for r in results)
    await cache.get()
    assert cache.aggregations == 1  # still fresh



async def test_a_quiet_stream_moves_its_last_event_id_past_what_it_did_not_match(
    store: JobStore, hub: Hub
) -> None:
    everything = feed(hub, store).events(None)
    quiet = Feed(
        hub, store, EventFilter(task="no-such-task"), FeedOptions(per_job=False, idle_s=0.1), IDS
    ).events(None)
    pending = asyncio.ensure_future(take(everything, 3))
    await asyncio.sleep(0.2)
    await run_one(store)
    last = decode_id(str((await pending)[-1].id)).at.key
    async with asyncio.timeout(10):
        async for sse in quiet:
            assert sse.event is None  # it matches nothing: only id lines
            if sse.id is not None and decode_id(sse.id).at.key >= last:
                break
    # Resuming from there: nothing it has already been past.
    resumed = feed(hub, store).events(decode_id(str(sse.id)).at)
    assert [e async for e in _until_quiet(resumed)] == []
    await everything.aclose()
    await quiet.aclose()


async def _until_quiet(stream: AsyncIterator[ServerSentEvent]) -> AsyncIterator[ServerSentEvent]:
    """The job events of `stream` until it has caught up: an id-only line, or a second of
    silence."""
    while True:
        try:
            sse = await asyncio.wait_for(anext(stream), 1.0)
        except TimeoutError:
            return
        if sse.event is None:
            return
        yield sse


async def test_dropping_the_jobs_collection_restarts_the_hub_and_lets_its_clients_go(
    store: JobStore, hub: Hub
) -> None:
    await run_one(store)
    before = feed(hub, store).events(None)
    waiting = asyncio.ensure_future(anext(before))
    await asyncio.sleep(0.2)
    await store.jobs.drop()
    async with asyncio.timeout(15):
        closing = await waiting
        while closing.comment is None:
            closing = await anext(before)
    assert "the jobs collection saw drop" in str(closing.comment)
    await asyncio.wait_for(hub.ready.wait(), 15)
    await store.ensure_indexes()  # what the engine's processes do when they start again
    after = feed(hub, store).events(None)
    pending = asyncio.ensure_future(take(after, 3))
    await asyncio.sleep(0.2)
    await run_one(store)
    assert statuses(await pending) == ["pending", "running", "completed"]
    await after.aclose()


async def test_nobody_listening_the_stream_is_lean_and_still_counts_starts_and_ends(
    store: JobStore,
) -> None:
    counted: list[Tally] = []
    hub = Hub(store, buffer=100, observe=counted.append, linger_s=0.3)
    task = await started(hub)
    try:
        assert hub.lean
        for _ in range(3):
            await run_one(store)
        await wait_for(lambda: sum(t.ended == "completed" for t in counted) == 3)
        # A completion that never marked a start sets `started_at` with the end: one write.
        assert [(t.started, t.ended) for t in counted] == [(True, "completed")] * 3
        assert all(t.wait_ms is not None and t.wait_ms >= 0 for t in counted)
        assert not hub._ring  # nothing whole was read: no event kept for anyone
        stream = feed(hub, store).events(None)
        got = asyncio.ensure_future(take(stream, 3))
        await wait_for(lambda: not hub.lean)
        await run_one(store)
        assert statuses(await got) == ["pending", "running", "completed"]
        await stream.aclose()
        await wait_for(lambda: hub.lean)  # the last client left, and the linger passed
        await run_one(store)
        await wait_for(lambda: len(counted) == 5)
        assert [t.ended for t in counted] == ["completed"] * 5  # each end counted once
    finally:
        await stopped(task)


class GetMores(monitoring.CommandListener):
    """Counts the getMore commands a client sends (each a read of a stream's next batch)."""

    def __init__(self) -> None:
        self.count = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "getMore":
            self.count += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def test_a_lean_stream_reads_once_a_pace_and_a_client_cuts_the_wait_short(
    store: JobStore, settings: Settings
) -> None:
    reads = GetMores()
    client = make_client(settings, appname="brook-test-pace", event_listeners=[reads])
    watched = JobStore(database(client, settings))
    counted: list[Tally] = []
    hub = Hub(watched, buffer=100, observe=counted.append, lean_pace_s=1.0)
    task = await started(hub)
    try:
        assert hub.lean
        before, n = reads.count, 0
        loop = asyncio.get_running_loop()
        start = loop.time()
        # A start and an end every few milliseconds, for 3 s and at least 50 jobs (a loaded
        # machine runs fewer a second: then the run goes on until there are that many).
        while loop.time() - start < 3.0 or n < 50:
            assert loop.time() - start < 60, n
            await run_one(store)
            n += 1
        await wait_for(lambda: sum(t.ended == "completed" for t in counted) == n)
        elapsed = loop.time() - start
        # One read a second (and the one that found the last of them), not one per change:
        # without the pace, the stream read as often as a job started or ended.
        reads_made = reads.count - before
        assert reads_made <= math.ceil(elapsed) + 3, (reads_made, n, elapsed)
        # A client arriving does not wait for the pace: a minute-long one is cut short.
        hub.lean_pace_s = 60.0
        await asyncio.sleep(1.5)  # the hub is now inside a minute's wait
        hub.unsubscribe(await sees_a_whole_job(hub, store))
    finally:
        await stopped(task)
        await client.close()


async def test_a_client_arriving_while_the_stream_is_lean_misses_nothing_and_sees_nothing_twice(
    store: JobStore,
) -> None:
    hub = Hub(store, buffer=1000)
    task = await started(hub)
    stop = asyncio.Event()

    async def produce() -> None:
        while not stop.is_set():
            await run_one(store)

    producer = asyncio.create_task(produce())
    try:
        await asyncio.sleep(0.3)  # jobs flowing through the lean stream
        assert hub.lean
        sub = hub.subscribe(EventFilter())
        start = sub.start
        seen = [await sub.next(10) for _ in range(30)]
        stop.set()
        await producer
        hub.unsubscribe(sub)
        # The reference: the whole stream from the client's start, read on its own.
        expected: list[str] = []
        async with await store.changes(
            LIVE_PIPELINE, resume_after=start.token, max_await_ms=200, full_document="whenAvailable"
        ) as raw:
            while len(expected) < 30:
                change = await raw.try_next()
                if change is not None:
                    expected.append(str(change["_id"]["_data"]))
        assert [e.at.key for e in seen if e is not None] == expected
    finally:
        stop.set()
        await stopped(task)


class SlowToOpen(JobStore):
    """The jobs store, each change stream taking a second to open (a slow link): room for a
    client to arrive while the hub reopens."""

    async def changes(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(1.0)
        return await super().changes(*args, **kwargs)


async def test_a_client_arriving_while_the_hub_reopens_lean_gets_its_events(
    store: JobStore,
) -> None:
    slow = SlowToOpen(store.db)
    hub = Hub(slow, buffer=100, linger_s=0.1, max_await_ms=100)
    task = await started(hub)
    try:
        first = hub.subscribe(EventFilter())
        await wait_for(lambda: not hub.lean)
        hub.unsubscribe(first)
        # The linger (0.1 s) and the whole stream's next look (0.1 s) pass; the lean stream
        # is then opening for a second: a client comes in the middle of it.
        await asyncio.sleep(0.6)
        await sees_a_whole_job(hub, store)
    finally:
        await stopped(task)


async def test_the_current_state_after_a_reset_is_read_within_the_query_bound(
    store: JobStore,
) -> None:
    # The read after a reset has no index of its own (jobs by their last change): it runs
    # with the listings' maxTimeMS, and a stopped one is SearchTooBroad, which the feed
    # says and passes over (the reset event went out first). The server's
    # maxTimeAlwaysTimeOut stops every operation that carries a maxTimeMS, and only those.
    await store.submit(JobSpec(task="noop", payload={}))
    since = datetime(2000, 1, 1, tzinfo=UTC)
    assert len(await store.changed_since(since)) == 1
    admin = store.db.client.admin
    await admin.command("configureFailPoint", "maxTimeAlwaysTimeOut", mode="alwaysOn")
    try:
        with pytest.raises(SearchTooBroad, match="too broad"):
            await store.changed_since(since)
    finally:
        await admin.command("configureFailPoint", "maxTimeAlwaysTimeOut", mode="off")
