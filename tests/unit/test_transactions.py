"""The pure parts of transactions: running async code on a blocking session without a loop,
routing a blocking client's calls by `session=`, session checks, and progress held while a
task's transaction is open."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from pymongo.errors import BulkWriteError, DuplicateKeyError

from common.domain.errors import InvalidSession
from common.protocol.runner import ProgressReport, RunJob
from common.runtime.blocking import blocking_or_in_session, drive
from common.store.transactions import _key_taken, check_session
from executor.progress import ProgressReporter


async def _blocking_add(a: int, b: int) -> int:
    return a + b  # awaits nothing that suspends


async def _twice(a: int) -> int:
    return await _blocking_add(a, a)


def test_drive_runs_a_coroutine_that_never_suspends_on_this_thread_without_a_loop() -> None:
    assert drive(_twice(21)) == 42
    with pytest.raises(ZeroDivisionError):
        drive(_raises())


async def _raises() -> None:
    await _blocking_add(1, 1)
    raise ZeroDivisionError


def test_drive_refuses_a_coroutine_that_suspends() -> None:
    with pytest.raises(RuntimeError, match="tried to suspend"):
        drive(asyncio.sleep(0))  # yields to a loop, which there is none of


class Core:
    def __init__(self, name: str) -> None:
        self.name = name

    async def submit(self, task: str, *, session: Any = None) -> tuple[str, str, int]:
        return self.name, task, threading.get_ident()


class Host:
    """A blocking client: calls without a session go to its loop, with one stay here."""

    def __init__(self) -> None:
        self.blocked: list[str] = []

    def _target(self) -> Core:
        return Core("async core")

    def _session_target(self) -> Core:
        return Core("session core")

    def _block(self, coro: Any) -> Any:
        self.blocked.append("loop")
        return asyncio.run(coro)

    submit = blocking_or_in_session(Core.submit)


def test_a_blocking_call_with_a_session_runs_here_and_one_without_goes_to_the_loop() -> None:
    host = Host()
    assert host.submit("a", session=object())[:2] == ("session core", "a")
    assert host.submit("a", session=object())[2] == threading.get_ident()
    assert host.blocked == []
    assert host.submit("b")[:2] == ("async core", "b")
    assert host.blocked == ["loop"]


class FakeSession:
    def __init__(self, client: object, in_transaction: bool) -> None:
        self.client = client
        self.in_transaction = in_transaction


def test_a_session_is_checked_for_its_kind_its_client_and_its_transaction() -> None:
    mine, theirs = object(), object()
    good = FakeSession(mine, True)
    assert check_session(good, mine, FakeSession) is good
    with pytest.raises(InvalidSession, match="must be a pymongo FakeSession"):
        check_session("not a session", mine, FakeSession)
    with pytest.raises(InvalidSession, match=r"session\.client is not the client"):
        check_session(FakeSession(theirs, True), mine, FakeSession)
    with pytest.raises(InvalidSession, match="in_transaction is False"):
        check_session(FakeSession(mine, False), mine, FakeSession)


def test_a_key_taken_after_the_snapshot_says_so_with_the_label_drivers_retry_on() -> None:
    taken = _key_taken(BulkWriteError({"writeErrors": [{"index": 0, "code": 11000}]}))
    assert isinstance(taken, DuplicateKeyError)
    assert taken.has_error_label("TransientTransactionError") and "run it again" in str(taken)
    other = BulkWriteError({"writeErrors": [{"index": 0, "code": 2}]})
    assert _key_taken(other) is other


def test_progress_is_held_while_a_transaction_is_open_and_goes_with_the_completion() -> None:
    sent: list[ProgressReport] = []
    job = RunJob(job_id="j", attempt=3, task="t", payload={})
    reporter = ProgressReporter(sent.append, job, interval=0.0)
    reporter.report(0.1)
    assert [r.fraction for r in sent] == [0.1]
    reporter.hold()
    reporter.report(0.5, "half")
    reporter.report(0.7, "more")
    assert [r.fraction for r in sent] == [0.1]
    assert reporter.take_last() == {"fraction": 0.7, "message": "more", "attempt": 3}
    reporter.close()
    assert [r.fraction for r in sent] == [0.1]


def test_held_progress_is_sent_when_the_transaction_ends_without_the_completion() -> None:
    sent: list[ProgressReport] = []
    reporter = ProgressReporter(sent.append, RunJob(job_id="j", attempt=1, task="t", payload={}))
    reporter.hold()
    reporter.report(0.4)
    reporter.release()
    assert [r.fraction for r in sent] == [0.4]
    reporter.close()
