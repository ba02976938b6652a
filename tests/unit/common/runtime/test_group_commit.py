"""Group commit: a lone item is written at once; under load, a linger gathers more."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from common.runtime.group_commit import GroupCommit


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
