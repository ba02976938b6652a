"""The blocking forms of the client's operations: running async code on a blocking session
without a loop, routing a blocking client's calls by `session=`, loop threads and delegation."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from brook.common.runtime.blocking import (
    Coro,
    LoopThread,
    T,
    blocking,
    blocking_or_in_session,
    delegating,
    drive,
)


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


class Doubler:
    def __init__(self) -> None:
        self.threads: list[str] = []

    async def double(self, n: int, *, plus: int = 0) -> int:
        """Twice `n`, plus `plus`."""
        self.threads.append(threading.current_thread().name)
        await asyncio.sleep(0)
        return 2 * n + plus


class Blocking:
    double = blocking(Doubler.double)

    def __init__(self) -> None:
        self.core = Doubler()
        self.thread = LoopThread("unit-loop")

    def _target(self) -> Doubler:
        return self.core

    def _block(self, coro: Coro[T]) -> T:
        return self.thread.run(coro)


class Delegating:
    double = delegating(Doubler.double)

    def __init__(self) -> None:
        self.core = Doubler()

    def _target(self) -> Doubler:
        return self.core


def test_a_blocking_form_runs_the_coroutine_on_its_loop_thread_with_the_same_signature() -> None:
    host = Blocking()
    try:
        assert host.double(3, plus=1) == 7
        assert host.core.threads == ["unit-loop"]
        assert Blocking.double.fn is Doubler.double and host.double.__doc__ == "Twice `n`, plus `plus`."
    finally:
        host.thread.stop()
    with pytest.raises(RuntimeError, match="not running"):
        host.double(1)  # after close: an error, never a hang


async def test_a_delegating_form_awaits_the_target_and_a_blocking_call_on_its_own_loop_fails() -> None:
    assert await Delegating().double(2) == 4
    thread = LoopThread("unit-loop-2")
    try:
        with pytest.raises(RuntimeError, match="never return"):
            asyncio.run_coroutine_threadsafe(_block_on_own_loop(thread), thread.loop).result()
    finally:
        thread.stop()


async def _block_on_own_loop(thread: LoopThread) -> int:
    return thread.run(Doubler().double(1))
