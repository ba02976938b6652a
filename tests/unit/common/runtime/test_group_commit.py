"""Group commit: a lone item is written at once; under load, a linger gathers more."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from brook.common.runtime.group_commit import GroupCommit


async def _batches_with(linger_s: float) -> list[list[int]]:
    batches: list[list[int]] = []
    started, first_write = asyncio.Event(), asyncio.Event()

    async def write(items: Sequence[int]) -> Sequence[int]:
        batches.append(list(items))
        started.set()
        if len(batches) == 1:
            await first_write.wait()  # a round trip that takes a while
        return [i * 10 for i in items]

    commit: GroupCommit[int, int] = GroupCommit(write, linger_s=linger_s)
    one = asyncio.create_task(commit.submit(1))
    await asyncio.wait_for(started.wait(), 5)
    assert batches == [[1]]  # a lone item goes at once, no linger
    two = asyncio.create_task(commit.submit(2))  # arrives while that write is in flight
    await asyncio.sleep(0.01)
    first_write.set()  # the write returns and finds 2 waiting: load
    await asyncio.sleep(0.05)
    three = asyncio.create_task(commit.submit(3))  # 50 ms later
    assert list(await asyncio.gather(one, two, three)) == [10, 20, 30]
    return batches


async def test_a_lone_item_is_written_at_once_and_a_linger_gathers_more_under_load() -> None:
    assert await _batches_with(linger_s=0.5) == [[1], [2, 3]]
    assert await _batches_with(linger_s=0.0) == [[1], [2], [3]]


async def test_items_waiting_behind_a_write_in_flight_can_ride_another_write() -> None:
    own: list[list[int]] = []
    release = asyncio.Event()

    async def write(items: Sequence[int]) -> Sequence[int]:
        own.append(list(items))
        await release.wait()
        return [i * 10 for i in items]

    commit: GroupCommit[int, int] = GroupCommit(write)
    first = asyncio.create_task(commit.submit(1))  # in flight
    await asyncio.sleep(0.01)
    waiting = [asyncio.create_task(commit.submit(i)) for i in (2, 3)]
    await asyncio.sleep(0.01)
    carried: list[list[int]] = []

    async def other(items: Sequence[int]) -> tuple[str, list[int]]:
        carried.append(list(items))
        return "taken", [i * 100 for i in items]

    assert await commit.carry(other) == "taken"
    assert carried == [[2, 3]]  # the waiting ones, not the one in flight
    assert await asyncio.gather(*waiting) == [200, 300]
    release.set()
    assert await first == 10
    await asyncio.sleep(0.01)
    assert own == [[1]]  # nothing was left for a write of its own
    assert await commit.carry(other) == "taken" and carried[-1] == []  # none waiting


async def test_a_failed_carrying_write_fails_the_items_it_carried() -> None:
    gate = asyncio.Event()

    async def write(items: Sequence[int]) -> Sequence[int]:
        await gate.wait()
        return list(items)

    commit: GroupCommit[int, int] = GroupCommit(write)
    first = asyncio.create_task(commit.submit(1))
    await asyncio.sleep(0.01)
    rider = asyncio.create_task(commit.submit(2))
    await asyncio.sleep(0.01)

    async def broken(items: Sequence[int]) -> tuple[None, list[int]]:
        raise RuntimeError("no primary")

    try:
        await commit.carry(broken)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the carrying write's failure was swallowed")
    gate.set()
    assert await first == 1
    try:
        await rider
    except RuntimeError as exc:
        assert "no primary" in str(exc)
    else:
        raise AssertionError("the carried item did not fail with its write")
