"""What a task's context shows of the worker's settings, and the durable operations an
`async def` and a plain `def` task share."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brook.common.protocol.runner import RunJob, StepAck, StepRecord
from brook.common.runtime.settings import Settings
from brook.errors import DuplicateStep, StepError
from brook.executor.context import SyncTaskContext, TaskContext
from brook.executor.steps import Journal, failed_step

URI = "mongodb://brook:s3cret@m1:27017/?replicaSet=rs0"


def test_a_task_sees_the_settings_without_the_mongodb_password() -> None:
    loop = asyncio.new_event_loop()
    try:
        contexts = [
            TaskContext(job_id="j", attempt=1, task="noop", process_settings=Settings(mongo_uri=URI)),
            SyncTaskContext(
                job_id="j", attempt=1, task="noop", process_settings=Settings(mongo_uri=URI), loop=loop
            ),
        ]
        for ctx in contexts:
            assert ctx.settings.mongo_uri == "mongodb://brook:***@m1:27017/?replicaSet=rs0"
            assert ctx.settings.db == "brook"
            assert "s3cret" not in repr(ctx)
    finally:
        loop.close()


def _contexts(
    loop: asyncio.AbstractEventLoop, steps: dict[str, Any] | None = None
) -> list[tuple[Journal, TaskContext | SyncTaskContext]]:
    """An async and a plain-`def` context of one attempt, each with its own journal (an
    earlier run recorded the step `done`) whose dispatcher acknowledges every write at once
    (a sleep's wake time: a tenth of a second from now)."""
    out: list[tuple[Journal, TaskContext | SyncTaskContext]] = []
    for sync in (False, True):
        run = RunJob(
            job_id="j",
            attempt=1,
            task="t",
            payload={},
            owner="d",
            steps={"done": 7} if steps is None else steps,
            steps_bytes=9,
        )
        journal = Journal(run, lambda record: None)

        def acknowledge(record: StepRecord, journal: Journal = journal) -> None:
            wake = datetime.now(UTC) + timedelta(seconds=0.1)
            ack = StepAck(job_id="j", attempt=1, name=record.name, ok=True, result=wake)
            loop.call_soon_threadsafe(journal.deliver, ack)

        journal._send = acknowledge
        fields: dict[str, Any] = {
            "job_id": "j", "attempt": 1, "task": "t", "process_settings": Settings(), "journal": journal
        }
        out.append((journal, SyncTaskContext(**fields, loop=loop) if sync else TaskContext(**fields)))
    return out


async def _call(ctx: TaskContext | SyncTaskContext, method: str, *args: Any) -> Any:
    """`ctx.method(*args)`, awaited, or for a plain-`def` task's context on a worker thread."""
    if isinstance(ctx, TaskContext):
        return await getattr(ctx, method)(*args)
    return await asyncio.to_thread(getattr(ctx, method), *args)


async def test_an_async_and_a_plain_def_task_run_the_same_durable_operations() -> None:
    for journal, ctx in _contexts(asyncio.get_running_loop()):
        calls: list[int] = []

        def double(n: int, calls: list[int] = calls) -> int:
            calls.append(n)
            return n * 2

        def boom() -> None:
            raise ValueError("no")

        assert await _call(ctx, "step", "done", double, 1) == 7  # replayed, not called
        assert await _call(ctx, "step", "new", double, 2) == 4
        assert calls == [2] and journal.recorded["new"] == 4
        with pytest.raises(ValueError) as failed:
            await _call(ctx, "step", "bad", boom)
        assert failed_step(failed.value) == "bad" and "bad" not in journal.recorded
        with pytest.raises(DuplicateStep):
            await _call(ctx, "step", "new", double, 3)
        assert await _call(ctx, "sleep", 5) is None  # due in 0.1 s: waits in its worker
        assert isinstance(journal.recorded["sleep#1"], datetime)
        assert (journal.replayed, journal.ran) == (1, 2), type(ctx).__name__


async def test_changed_is_true_at_the_frontier_false_where_recorded_steps_go_past_it() -> None:
    for journal, ctx in _contexts(asyncio.get_running_loop()):
        kind = type(ctx).__name__
        # The earlier run recorded `done`, not reached yet: it went past here on the old code.
        assert await _call(ctx, "changed", "v2") is False, kind
        assert journal.recorded["changed#v2"] is False
        assert await _call(ctx, "changed", "v2") is False  # asked again: the same answer
        assert await _call(ctx, "step", "done", lambda: 0) == 7
        # Nothing recorded is left to replay: this run is at its frontier, on the new code.
        assert await _call(ctx, "changed", "v3") is True, kind
        assert journal.recorded["changed#v3"] is True
        with pytest.raises(StepError):
            await _call(ctx, "changed", "bad#id")


async def test_a_replay_returns_the_recorded_answer_of_changed() -> None:
    loop = asyncio.get_running_loop()
    for steps, expected in (
        ({"changed#v2": False}, False),  # at the frontier now, but recorded on the old path
        ({"changed#v2": True, "later": 1}, True),  # steps past it, but recorded on the new
    ):
        for journal, ctx in _contexts(loop, steps):
            assert await _call(ctx, "changed", "v2") is expected, (steps, type(ctx).__name__)
            assert journal.ran == 0 and journal.replayed == 1


async def test_a_marker_whose_call_was_removed_does_not_hold_later_ones_on_the_old_path() -> None:
    for journal, ctx in _contexts(asyncio.get_running_loop(), {"changed#gone": True}):
        assert await _call(ctx, "changed", "v3") is True, type(ctx).__name__
        assert journal.ran == 1
