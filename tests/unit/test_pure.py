"""Pure logic: backoff, edge validation, the status table."""

from __future__ import annotations

import pytest

from common.domain.status import ACTIVE, TERMINAL, TRANSITIONS, JobStatus
from common.runtime.backoff import Backoff, backoff_delay
from ingest.validation import InvalidInput, body_depth, check_document, parse_submit


def test_backoff_doubles_per_attempt_within_jitter_and_stops_at_the_cap() -> None:
    assert backoff_delay(1, 1.0, 300, rand=1.0) == 1.0
    assert backoff_delay(1, 1.0, 300, rand=0.0) == 0.5
    assert backoff_delay(4, 1.0, 300, rand=1.0) == 8.0
    assert backoff_delay(30, 1.0, 300, rand=1.0) == 300.0
    for _ in range(100):
        assert 2.0 <= backoff_delay(3, 1.0, 300) <= 4.0


def test_statuses_split_into_active_and_terminal_and_terminal_is_final() -> None:
    assert set(JobStatus) == ACTIVE | TERMINAL and not ACTIVE & TERMINAL
    assert not any(src in TERMINAL for src, _ in TRANSITIONS)


def test_body_depth_counts_brackets_outside_strings() -> None:
    assert body_depth(b'{"a": [1, {"b": "[[[[{{{"}]}') == 3
    assert body_depth(b'"[[["') == 0
    assert body_depth(b'{"a": "\\"[[["}') == 1


@pytest.mark.parametrize(
    "payload",
    [{"$x": 1}, {"a": [{"$b": 1}]}, {"a\x00": 1}],
)
def test_payload_keys_that_mongodb_would_misread_are_rejected(payload: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        check_document(payload)


def test_payload_values_may_look_like_operators() -> None:
    check_document({"a": "$notAnOperator", "b": ["$x"]})


def test_nesting_of_32_is_accepted_and_33_rejected() -> None:
    def nest(n: int) -> dict[str, object]:
        d: dict[str, object] = {}
        for _ in range(n - 1):
            d = {"a": d}
        return d

    check_document(nest(32))
    with pytest.raises(ValueError, match="nesting deeper than 32"):
        check_document(nest(33))


def test_parse_submit_applies_defaults_and_normalises_run_at_to_utc() -> None:
    job = parse_submit(b'{"task": "noop", "run_at": "2030-01-01T12:00:00.123456+02:00"}')
    assert job.payload == {} and job.priority == 0 and job.max_attempts == 3
    assert job.run_at is not None and job.run_at.isoformat() == "2030-01-01T10:00:00.123000+00:00"
    with pytest.raises(InvalidInput):
        parse_submit(b'{"task": "noop", "max_attempts": "3"}')


def test_failures_are_classified_transient_or_permanent_in_one_place() -> None:
    from pymongo.errors import (
        AutoReconnect,
        DocumentTooLarge,
        DuplicateKeyError,
        NotPrimaryError,
        OperationFailure,
        ServerSelectionTimeoutError,
    )

    from common.store.db import is_transient

    assert is_transient(ServerSelectionTimeoutError("no primary"))
    assert is_transient(AutoReconnect("connection reset"))
    assert is_transient(NotPrimaryError("not primary"))
    assert is_transient(OperationFailure("stepped down", code=189))
    assert is_transient(
        OperationFailure("x", code=1, details={"errorLabels": ["RetryableWriteError"]})
    )
    assert not is_transient(DuplicateKeyError("dup", code=11000))
    assert not is_transient(DocumentTooLarge("too big"))
    assert not is_transient(OperationFailure("bad query", code=2))


def test_a_loop_backoff_doubles_to_its_cap_and_resets_after_a_success() -> None:
    b = Backoff(0.1, 0.5)
    assert [b.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    b.reset()
    assert b.next() == 0.1


def test_a_dispatcher_holds_about_a_fifth_of_a_second_of_work_ahead_and_none_of_long_tasks() -> None:
    from dispatcher.held_jobs import Holdings

    holdings = Holdings()
    assert holdings.ahead(2, 32) == 0  # no task has ended yet: it does not know its tasks
    for _ in range(20):
        holdings.record_run(0.001)
    assert holdings.ahead(2, 32) == 32  # 1 ms tasks: capped by the prefetch
    for _ in range(50):
        holdings.record_run(0.05)
    assert holdings.ahead(2, 32) == 8  # 2 workers x 0.2 s / 50 ms
    for _ in range(50):
        holdings.record_run(2.0)
    assert holdings.ahead(2, 32) == 0  # long tasks: nothing held where another could run it


async def test_the_server_clock_offset_moves_only_when_a_reading_rules_it_out() -> None:
    from datetime import UTC, datetime
    from unittest import mock

    from common.store.clock import ServerClock

    class Store:
        server = 0.0

        async def server_now(self) -> datetime:
            return datetime.fromtimestamp(self.server, UTC)

    store = Store()
    clock = ServerClock(store)

    async def read(local_before: float, local_after: float, server: float) -> float:
        store.server = server
        with mock.patch("common.store.clock.time.time", side_effect=[local_before, local_after]):
            await clock.sync()
        return clock.offset

    assert abs(await read(100.0, 100.002, 200.001) - 100.0) < 0.001  # the first reading
    first = clock.offset
    assert await read(110.0, 110.200, 210.150) == first  # a slow reading that allows it
    moved = await read(120.0, 120.002, 220.010)  # the server clock stepped 10 ms ahead
    assert abs(moved - (220.010 - 120.002)) < 1e-6  # to the nearest value the reading allows
