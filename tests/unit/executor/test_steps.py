"""Durable steps without a database: names, size caps, and an attempt's journal (what it
replays, what it asks the dispatcher to record, and what it refuses)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from brook.common.domain.steps import (
    MAX_STEP_BYTES,
    MAX_STEPS_BYTES,
    check_signal_key,
    check_signal_payload,
    check_step_name,
    encode_step_result,
    seconds_of,
)
from brook.common.protocol.runner import RunJob, StepAck, StepRecord
from brook.errors import DuplicateStep, LeaseLost, SignalTimeout, StepError
from brook.executor.steps import Journal, failed_step, mark_failed


def test_a_step_name_is_a_short_string_without_a_hash() -> None:
    assert check_step_name("charge card") == "charge card"
    for bad in ("", None, 3, "x" * 201, "sleep#1"):
        with pytest.raises(StepError):
            check_step_name(bad)


def test_a_result_is_returned_as_bson_keeps_it_and_too_large_ones_name_the_step() -> None:
    assert encode_step_result("s", (1, 2))[0] == [1, 2]  # what a replay returns
    with pytest.raises(StepError, match=r"'big'.*1048576"):
        encode_step_result("big", "x" * MAX_STEP_BYTES)
    with pytest.raises(StepError, match=r"'odd'.*BSON"):
        encode_step_result("odd", object())
    assert MAX_STEPS_BYTES == 4 * MAX_STEP_BYTES


def test_signal_keys_and_payloads_are_checked() -> None:
    assert check_signal_key("approval:order-1") == "approval:order-1"
    for bad in ("", "has space", "a/b", "x" * 201, 7):
        with pytest.raises(StepError):
            check_signal_key(bad)
    assert check_signal_payload({"ok": True}) > 0
    with pytest.raises(StepError, match="limit"):
        check_signal_payload("x" * (300 * 1024))
    assert issubclass(SignalTimeout, TimeoutError)


def test_durations_are_seconds_or_timedeltas() -> None:
    assert seconds_of(timedelta(minutes=2)) == 120.0 and seconds_of(3) == 3.0
    with pytest.raises(ValueError):
        seconds_of(-1)
    with pytest.raises(TypeError):
        seconds_of("5")  # type: ignore[arg-type]


RUN = RunJob(
    job_id="j1", attempt=2, task="t", payload={}, owner="d", steps={"a": 1}, steps_bytes=12
)


def test_a_journal_replays_recorded_steps_and_refuses_a_name_twice() -> None:
    journal = Journal(RUN, None)
    assert journal.enter("a") == (True, 1)
    assert journal.enter("b") == (False, None)
    with pytest.raises(DuplicateStep, match="'a'"):
        journal.enter("a")
    assert journal.replayed == 1
    assert [journal.auto_name("sleep"), journal.auto_name("sleep")] == ["sleep#1", "sleep#2"]


async def test_a_step_returns_only_once_the_dispatcher_acknowledged_its_write() -> None:
    sent: list[Any] = []
    journal = Journal(RUN, sent.append)
    recording = asyncio.ensure_future(journal.record("b", (1, 2), 3.0))
    await asyncio.sleep(0)
    [record] = sent
    assert isinstance(record, StepRecord) and record.result == [1, 2] and record.name == "b"
    assert not recording.done()  # no answer yet: the step has not returned
    journal.deliver(StepAck(job_id="j1", attempt=2, name="b", ok=True))
    assert await recording == [1, 2]
    assert journal.recorded["b"] == [1, 2] and journal.ran == 1
    lost = asyncio.ensure_future(journal.record("c", 1, 0.0))
    await asyncio.sleep(0)
    journal.deliver(StepAck(job_id="j1", attempt=2, name="c", ok=False, error="lease lost"))
    with pytest.raises(LeaseLost, match="'c'"):
        await lost
    assert "c" not in journal.recorded


async def test_a_journal_refuses_a_step_that_would_overflow_the_jobs_steps() -> None:
    journal = Journal(RUN, lambda message: None)
    journal.total = MAX_STEPS_BYTES - 10
    with pytest.raises(StepError, match=r"'d'.*all the steps"):
        await journal.record("d", "x" * 100, 0.0)


def test_an_exception_from_a_step_carries_its_name() -> None:
    exc = RuntimeError("boom")
    mark_failed(exc, "fetch")
    mark_failed(exc, "outer")  # the innermost step named it first
    assert failed_step(exc) == "fetch"
    assert failed_step(ValueError()) is None
