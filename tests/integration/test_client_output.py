"""`Client.output` and `AsyncClient.output` against the real replica set: a job's output
followed to its end (async and blocking) on a change stream, resumed from a position with
no gap and no repeat, one attempt kept, and the errors of an unknown job or position."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from brook import AsyncClient, Client, InvalidInput, JobNotFound, OutputChunk
from brook.common.domain.models import JobSpec
from brook.common.domain.output import Chunk
from brook.common.runtime.settings import Settings
from brook.common.store.db import make_client
from brook.common.store.jobs import JobStore, Lease
from brook.common.store.output import AttemptOutput, OutputStore
from tests.integration.test_store import expire_now
from tests.support.commands import CommandCounter

OWNER = "test-owner"


@pytest.fixture
async def listened(settings: Settings) -> AsyncIterator[tuple[AsyncClient, CommandCounter]]:
    counter = CommandCounter()
    client = AsyncClient._wrap(settings, make_client(settings, event_listeners=[counter]))
    yield client, counter
    await client.close()


async def claim(store: JobStore) -> Lease:
    job = (await store.claim(OWNER, 30)).job
    assert job is not None
    return Lease(job_id=job.id, attempt=job.attempts)


async def running(store: JobStore, max_attempts: int = 3) -> Lease:
    await store.submit(JobSpec(task="noop", payload={}, max_attempts=max_attempts))
    return await claim(store)


async def emit(store: JobStore, lease: Lease, first: int, words: list[str]) -> None:
    """What a worker's writer appends: `words` as chunks from sequence number `first`."""
    chunks = [Chunk(seq=first + i, kind="text", data=w, size=len(w)) for i, w in enumerate(words)]
    out = AttemptOutput(lease=lease, owner=OWNER, chunks=chunks)
    assert (await OutputStore(store.db).append([out]))[out.key].written


async def complete(store: JobStore, lease: Lease) -> None:
    written = await store.complete_many(OWNER, [(lease, "done")])
    assert written.done == {lease.job_id}


def seen(chunks: list[OutputChunk]) -> list[tuple[int, int, object]]:
    return [(c.attempt, c.seq, c.data) for c in chunks]


async def test_the_async_client_follows_a_stream_to_its_end_on_a_change_stream(
    listened: tuple[AsyncClient, CommandCounter], store: JobStore
) -> None:
    client, counter = listened
    lease = await running(store)
    await emit(store, lease, 1, ["a ", "b "])  # before the reader: read from the collection
    counter.reset()
    arrived: asyncio.Queue[OutputChunk] = asyncio.Queue()

    async def read() -> None:
        async for chunk in client.output(lease.job_id, follow=True):
            arrived.put_nowait(chunk)

    async def next_ones(n: int) -> list[OutputChunk]:
        return [await asyncio.wait_for(arrived.get(), 30) for _ in range(n)]

    reader = asyncio.create_task(read())
    got = await next_ones(2)
    for n in range(3, 13, 2):  # five batches, each given as it is written
        await emit(store, lease, n, [f"w{n} ", f"w{n + 1} "])
        got += await next_ones(2)
    assert not reader.done()
    await complete(store, lease)
    await asyncio.wait_for(reader, 30)
    assert [c.data for c in got] == ["a ", "b ", *[f"w{n} " for n in range(3, 13)]]
    assert [c.position for c in got] == [f"1-{n}" for n in range(1, 13)]
    assert "".join(c.text for c in got) == "a b " + "".join(f"w{n} " for n in range(3, 13))
    # One change stream; the collection is read at the start and at the end (the job, and
    # its chunks twice), never once per batch: the stream carries them.
    assert counter.of("aggregate", "") == 1  # a database's stream
    assert counter.of("find", "jobs") == 1
    assert counter.of("find", "brook_output") == 2


async def test_the_blocking_client_follows_a_stream_to_its_end_across_attempts(
    settings: Settings, store: JobStore
) -> None:
    first = await running(store, max_attempts=2)
    await emit(store, first, 1, ["one ", "two "])
    with Client(settings.mongo_uri, settings.db) as client:
        reading = asyncio.create_task(
            asyncio.to_thread(lambda: list(client.output(first.job_id, follow=True)))
        )
        await asyncio.sleep(0.5)
        await expire_now(store, first.job_id)  # attempt 1's lease is lost: attempt 2 runs
        [expired] = await store.expired()
        await store.requeue_expired(expired, 0.0)
        second = await claim(store)
        assert second == Lease(job_id=first.job_id, attempt=2)
        await emit(store, second, 3, ["three"])
        assert not reading.done()
        await complete(store, second)
        got = await asyncio.wait_for(reading, 30)
        assert seen(got) == [(1, 1, "one "), (1, 2, "two "), (2, 3, "three")]
        # Read again, the same; and one attempt only.
        assert seen(list(client.output(first.job_id))) == seen(got)
        assert seen(list(client.output(first.job_id, attempt=2))) == [(2, 3, "three")]


async def test_a_reader_resumes_after_a_position_with_no_gap_and_no_repeat(
    settings: Settings, store: JobStore
) -> None:
    lease = await running(store)
    words = [f"t{i} " for i in range(10)]
    await emit(store, lease, 1, words[:6])
    with Client(settings.mongo_uri, settings.db) as client:
        half: list[OutputChunk] = []
        for chunk in client.output(lease.job_id, follow=True):
            half.append(chunk)
            if len(half) == 4:
                break  # the reader leaves mid-stream (the stream is closed)
        await emit(store, lease, 7, words[6:])
        await complete(store, lease)
        rest = list(client.output(lease.job_id, follow=True, after=half[-1].position))
        assert [c.data for c in half + rest] == words
        assert [c.seq for c in rest] == list(range(5, 11))
        assert list(client.output(lease.job_id, after="1-10")) == []
        with pytest.raises(InvalidInput, match="never had position 1-11"):
            list(client.output(lease.job_id, after="1-11"))
        with pytest.raises(InvalidInput, match="never had position 2-3"):
            list(client.output(lease.job_id, after="2-3"))
        with pytest.raises(InvalidInput, match="not an output position"):
            list(client.output(lease.job_id, after="3"))
        with pytest.raises(JobNotFound):
            list(client.output("no-such-job", follow=True))
        with pytest.raises(JobNotFound):
            list(client.output("no-such-job", after="1-1"))
