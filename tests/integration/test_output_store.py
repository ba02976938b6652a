"""A job's output stream in the store and a worker process's writer, on the real replica
set: appends are fenced by attempt and owner (a zombie's batch is never kept), taken once
and in order, batched into few transactions; positions; carrying a step's output to
another job; output goes with its job."""

from __future__ import annotations

import asyncio

import pytest
from pymongo.errors import PyMongoError

from brook.common.domain.errors import LeaseLost, OutputLimitExceeded
from brook.common.domain.models import JobSpec
from brook.common.domain.output import Chunk
from brook.common.protocol.runner import RunJob
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore, Lease
from brook.common.store.output import Appended, AttemptOutput, OutputStore
from brook.executor.output import OutputWriter, in_step
from tests.integration.test_store import expire_now

A, B = "dispatcher-a", "dispatcher-b"


async def claimed(store: JobStore, owner: str) -> Lease:
    job = (await store.claim(owner, 30)).job
    assert job is not None
    return Lease(job_id=job.id, attempt=job.attempts)


async def lease_lost(store: JobStore, lease: Lease) -> None:
    """The attempt's lease runs out and the watchdog requeues its job."""
    await expire_now(store, lease.job_id)
    [expired] = await store.expired()
    await store.requeue_expired(expired, 0.0)


def chunks(first: int, n: int, step: str | None = None) -> list[Chunk]:
    return [
        Chunk(seq=s, kind="text", data=f"t{s}", size=len(f"t{s}"), step=step)
        for s in range(first, first + n)
    ]


async def stream_of(output: OutputStore, job_id: str) -> list[tuple[int, int, str]]:
    return [(d["attempt"], d["seq"], d["data"]) for d in await output.read(job_id)]


def written(verdict: dict[tuple[str, int], Appended]) -> dict[tuple[str, int], bool]:
    return {key: v.written for key, v in verdict.items()}


async def test_a_zombie_attempt_cannot_append_and_the_live_one_goes_on_after_the_kept_chunks(
    store: JobStore,
) -> None:
    output = OutputStore(store.db)
    await store.submit(JobSpec(task="noop", payload={}))
    zombie = await claimed(store, A)
    first = AttemptOutput(lease=zombie, owner=A, chunks=chunks(1, 3))
    assert written(await output.append([first])) == {first.key: True}
    await lease_lost(store, zombie)
    live = await claimed(store, B)
    job = await store.get(live.job_id)
    assert job.output == {"chunks": 3, "bytes": 6}  # where the new attempt starts
    late = AttemptOutput(lease=zombie, owner=A, chunks=chunks(4, 2))
    assert written(await output.append([late])) == {late.key: False}
    wrong_owner = AttemptOutput(lease=live, owner=A, chunks=chunks(4, 2))
    assert written(await output.append([wrong_owner])) == {wrong_owner.key: False}
    mine = AttemptOutput(lease=live, owner=B, chunks=chunks(4, 2), bytes_before=6)
    assert written(await output.append([mine])) == {mine.key: True}
    assert await stream_of(output, live.job_id) == [
        (1, 1, "t1"),
        (1, 2, "t2"),
        (1, 3, "t3"),
        (2, 4, "t4"),
        (2, 5, "t5"),
    ]
    assert (await store.get(live.job_id)).output == {"chunks": 5, "bytes": 10}


async def test_a_batch_is_taken_once_in_order_and_each_attempt_of_a_transaction_on_its_own(
    store: JobStore,
) -> None:
    output = OutputStore(store.db)
    for _ in range(2):
        await store.submit(JobSpec(task="noop", payload={}))
    one, two = await claimed(store, A), await claimed(store, A)
    assert await output.append([AttemptOutput(lease=one, owner=A, chunks=chunks(1, 2))])
    # The same batch again with one more chunk (a retry after a write whose answer was
    # lost), a batch with a gap, and another job's next batch: the retry keeps only its new
    # chunk, the gap nothing.
    again = AttemptOutput(lease=one, owner=A, chunks=chunks(1, 3))
    other = AttemptOutput(lease=two, owner=A, chunks=chunks(1, 1))
    verdict = await output.append([again, other])
    assert written(verdict) == {again.key: True, other.key: True}
    assert (verdict[again.key].skip, verdict[again.key].last_seq) == (2, 3)
    gap = AttemptOutput(lease=one, owner=A, chunks=chunks(5, 1))
    assert written(await output.append([gap])) == {gap.key: False}
    assert await stream_of(output, one.job_id) == [(1, 1, "t1"), (1, 2, "t2"), (1, 3, "t3")]
    assert await stream_of(output, two.job_id) == [(1, 1, "t1")]


async def test_a_killed_attempts_chunks_past_the_count_come_before_the_next_attempts(
    store: JobStore,
) -> None:
    """Batches after an attempt's first do not write the job's count: an attempt killed
    then leaves chunks past it. The next attempt numbers its chunks from the count; its
    first batch goes on after those chunks instead, and the count takes them in."""
    output = OutputStore(store.db)
    await store.submit(JobSpec(task="noop", payload={}, max_attempts=3))
    killed = await claimed(store, A)
    await output.append([AttemptOutput(lease=killed, owner=A, chunks=chunks(1, 2))])
    past = AttemptOutput(lease=killed, owner=A, chunks=chunks(3, 2), count=False, bytes_before=4)
    assert written(await output.append([past])) == {past.key: True}
    assert (await store.get(killed.job_id)).output == {"chunks": 2, "bytes": 4}
    await lease_lost(store, killed)
    next_one = await claimed(store, B)
    batch = AttemptOutput(lease=next_one, owner=B, chunks=chunks(3, 2), bytes_before=4)
    verdict = (await output.append([batch]))[batch.key]
    assert (verdict.written, verdict.moved, verdict.moved_bytes, verdict.last_seq) == (
        True,
        2,
        4,
        6,
    )
    assert await stream_of(output, killed.job_id) == [
        (1, 1, "t1"),
        (1, 2, "t2"),
        (1, 3, "t3"),
        (1, 4, "t4"),
        (2, 5, "t3"),
        (2, 6, "t4"),
    ]
    assert (await store.get(killed.job_id)).output == {"chunks": 6, "bytes": 12}


async def test_a_zombies_batch_read_before_its_lease_was_lost_loses_to_the_next_attempts(
    store: JobStore,
) -> None:
    """The zombie's transaction read the job while it still held it; the next attempt then
    claims and writes its first chunk. The zombie's insert of the same sequence number is a
    write conflict (the unique index), its transaction is retried from the start, reads the
    job again and is refused: its chunk never lands after the next attempt's."""
    output = OutputStore(store.db)
    await store.submit(JobSpec(task="noop", payload={}, max_attempts=3))
    zombie = await claimed(store, A)
    await output.append([AttemptOutput(lease=zombie, owner=A, chunks=chunks(1, 1))])
    async with store.db.client.start_session() as session:
        await session.start_transaction()
        await store.jobs.find_one({"_id": zombie.job_id}, session=session)  # its snapshot
        await lease_lost(store, zombie)
        live = await claimed(store, B)
        mine = AttemptOutput(lease=live, owner=B, chunks=chunks(2, 1), bytes_before=2)
        assert (await output.append([mine]))[mine.key].written
        late = AttemptOutput(lease=zombie, owner=A, chunks=chunks(2, 1), count=False)
        with pytest.raises(PyMongoError) as raised:
            await output._append(session, [late])  # as its transaction would, from then
        assert raised.value.has_error_label("TransientTransactionError")
        await session.abort_transaction()
    assert not (await output.append([late]))[late.key].written  # its retry
    assert await stream_of(output, zombie.job_id) == [(1, 1, "t1"), (2, 2, "t2")]


async def test_positions_issued_are_a_chunks_own_and_the_start_of_an_attempts_output(
    store: JobStore,
) -> None:
    output = OutputStore(store.db)
    await store.submit(JobSpec(task="noop", payload={}, max_attempts=3))
    first = await claimed(store, A)
    await output.append([AttemptOutput(lease=first, owner=A, chunks=chunks(1, 2))])
    await store.jobs.update_one(
        {"_id": first.job_id}, {"$set": {"attempts": 2}}
    )  # as a new claim would: the next attempt
    second = Lease(job_id=first.job_id, attempt=2)
    await output.append([AttemptOutput(lease=second, owner=A, chunks=chunks(3, 1))])
    job = first.job_id
    assert [await output.issued(job, 1, s) for s in (0, 1, 2)] == [True, True, True]
    assert await output.issued(job, 2, 2)  # attempt 2's output starts after seq 2
    assert await output.issued(job, 2, 3)
    assert not await output.issued(job, 2, 1)
    assert not await output.issued(job, 1, 3)
    assert not await output.issued(job, 1, 4)
    assert not await output.issued(job, 3, 3)


async def test_a_finished_steps_output_is_carried_to_another_job_once(store: JobStore) -> None:
    output = OutputStore(store.db)
    source = (await store.submit(JobSpec(task="noop", payload={}))).job.id
    lease = await claimed(store, A)
    batch = [*chunks(1, 2, step="answer"), *chunks(3, 1), *chunks(4, 1, step="other")]
    await output.append([AttemptOutput(lease=lease, owner=A, chunks=batch)])
    target = (await store.submit(JobSpec(task="noop", payload={}))).job.id
    assert await output.copy_step_output(source, {"answer": 1}, target) == 2
    carried = await output.read(target)
    assert [(d["attempt"], d["seq"], d["data"], d["carried_from"]) for d in carried] == [
        (0, 1, "t1", source),
        (0, 2, "t2", source),
    ]
    assert (await store.get(target)).output == {"chunks": 2, "bytes": 4}
    with pytest.raises(LeaseLost):  # it has output now: never carried twice
        await output.copy_step_output(source, {"answer": 1}, target)


async def test_output_goes_with_its_job(store: JobStore) -> None:
    output = OutputStore(store.db)
    await store.submit(JobSpec(task="noop", payload={}))
    await store.submit(JobSpec(task="noop", payload={}))
    gone, kept = await claimed(store, A), await claimed(store, A)
    for lease in (gone, kept):
        await output.append([AttemptOutput(lease=lease, owner=A, chunks=chunks(1, 3))])
    await store.jobs.delete_one({"_id": gone.job_id})  # as its retention's TTL does
    assert await output.prune() == 3
    assert await output.read(gone.job_id) == []
    assert len(await output.read(kept.job_id)) == 3
    assert await output.prune() == 0


def run_of(lease: Lease, owner: str, chunks_so_far: int = 0) -> RunJob:
    return RunJob(
        job_id=lease.job_id,
        attempt=lease.attempt,
        task="noop",
        payload={},
        owner=owner,
        output_chunks=chunks_so_far,
    )


async def test_the_writer_batches_many_emits_into_few_writes_in_order(
    store: JobStore, settings: Settings
) -> None:
    output = OutputStore(store.db)
    writer = OutputWriter(lambda: output, window_s=0.05, settle_s=30)
    await store.submit(JobSpec(task="noop", payload={}))
    lease = await claimed(store, A)
    stream = writer.open(run_of(lease, A), settings)
    for i in range(500):
        stream.emit(f"token {i} ")
        if i % 50 == 0:
            await asyncio.sleep(0.01)  # the writer runs meanwhile
    with in_step("answer"):
        stream.emit({"done": True})
    await stream.close()
    docs = await output.read(lease.job_id)
    assert [d["seq"] for d in docs] == list(range(1, 502))
    assert docs[0]["data"] == "token 0 " and docs[-1] == {
        **docs[-1],
        "kind": "json",
        "step": "answer",
    }
    # 501 chunks in ~100 ms of emitting: a few windows' writes, not one a chunk.
    assert 1 <= writer.writes <= 10
    with pytest.raises(RuntimeError):
        stream.emit("after the end")


async def test_the_writer_counts_the_jobs_output_with_its_first_batch_and_at_its_end_only(
    store: JobStore, settings: Settings
) -> None:
    """Between an attempt's first batch and its end, the job is written at most once every
    `count_every_s` (here: never): a batch of chunks is not a write of the job."""
    output = OutputStore(store.db)
    writer = OutputWriter(lambda: output, window_s=0.01, settle_s=30, count_every_s=3600)
    await store.submit(JobSpec(task="noop", payload={}))
    lease = await claimed(store, A)
    stream = writer.open(run_of(lease, A), settings)
    stream.emit("a")
    await stream.flush()
    assert (await store.get(lease.job_id)).output == {"chunks": 1, "bytes": 1}
    for word in ("bb", "cc", "dd"):
        stream.emit(word)
        await stream.flush()
    assert writer.writes == 4
    assert (await store.get(lease.job_id)).output == {"chunks": 1, "bytes": 1}
    await stream.close()
    assert (await store.get(lease.job_id)).output == {"chunks": 4, "bytes": 7}
    assert [d["seq"] for d in await output.read(lease.job_id)] == [1, 2, 3, 4]


async def test_the_writer_numbers_an_attempts_chunks_after_a_killed_ones_uncounted_chunks(
    store: JobStore, settings: Settings
) -> None:
    output = OutputStore(store.db)
    await store.submit(JobSpec(task="noop", payload={}, max_attempts=3))
    killed = await claimed(store, A)
    await output.append([AttemptOutput(lease=killed, owner=A, chunks=chunks(1, 1))])
    past = AttemptOutput(lease=killed, owner=A, chunks=chunks(2, 2), count=False, bytes_before=2)
    await output.append([past])
    await lease_lost(store, killed)
    live = await claimed(store, B)
    writer = OutputWriter(lambda: output, window_s=0.2, settle_s=30)
    run = RunJob(
        job_id=live.job_id,
        attempt=live.attempt,
        task="noop",
        payload={},
        owner=B,
        output_chunks=1,
        output_bytes=2,
    )
    stream = writer.open(run, settings)
    stream.emit("x")
    await asyncio.sleep(0.05)  # the first batch is in flight: the next waits for its window
    stream.emit("y")
    await stream.close()
    assert await stream_of(output, live.job_id) == [
        (1, 1, "t1"),
        (1, 2, "t2"),
        (1, 3, "t3"),
        (2, 4, "x"),
        (2, 5, "y"),
    ]
    assert (await store.get(live.job_id)).output == {"chunks": 5, "bytes": 8}


async def test_a_writer_whose_attempt_lost_its_lease_keeps_nothing_more(
    store: JobStore, settings: Settings
) -> None:
    output = OutputStore(store.db)
    writer = OutputWriter(lambda: output, window_s=0.01, settle_s=30)
    await store.submit(JobSpec(task="noop", payload={}))
    zombie = await claimed(store, A)
    stream = writer.open(run_of(zombie, A), settings)
    stream.emit("kept")
    await stream.flush()
    await lease_lost(store, zombie)
    stream.emit("not kept")
    with pytest.raises(LeaseLost):
        await stream.flush()
    with pytest.raises(LeaseLost):
        stream.emit("refused")
    await stream.close()
    assert [d["data"] for d in await output.read(zombie.job_id)] == ["kept"]


async def test_emit_past_the_jobs_cap_fails_and_keeps_what_came_before(
    store: JobStore, settings: Settings
) -> None:
    capped = settings.model_copy(update={"output_max_chunks": 10})
    output = OutputStore(store.db)
    writer = OutputWriter(lambda: output, window_s=0.01, settle_s=30)
    await store.submit(JobSpec(task="noop", payload={}))
    lease = await claimed(store, A)
    stream = writer.open(run_of(lease, A, chunks_so_far=0), capped)
    for i in range(10):
        stream.emit(str(i))
    with pytest.raises(OutputLimitExceeded, match="limit is 10"):
        stream.emit("eleven")
    with pytest.raises(OutputLimitExceeded, match="a chunk's limit"):
        stream.emit("x" * (64 * 1024 + 1))
    with pytest.raises(TypeError):
        stream.emit(object())
    await stream.close()
    assert [d["data"] for d in await output.read(lease.job_id)] == [str(i) for i in range(10)]
