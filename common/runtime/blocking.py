"""Blocking and delegating forms of async operations, without writing them twice.

`brook.Client` and a plain-`def` task's context offer the operations of `ClientCore`
(async) as blocking calls; they declare them as `submit = blocking(ClientCore.submit)`: the
same signature, docstring and code, run on an event loop on another thread. The loop that
runs them owns the `AsyncMongoClient`: a private loop thread (`LoopThread`) for `Client`,
the worker process's own loop for a task that runs on a worker thread.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, Self, TypeVar, overload

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C")
C_co = TypeVar("C_co", covariant=True)

Coro = Coroutine[Any, Any, T]


def run_on(loop: asyncio.AbstractEventLoop, coro: Coro[T]) -> T:
    """Run `coro` on `loop` (running on another thread) and block for its result. An
    interrupt of the caller (Ctrl-C) cancels the operation as well."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("a blocking call on the event loop's own thread would never return")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


def drive(coro: Coro[T]) -> T:
    """Run to its end, here and without an event loop, a coroutine that never suspends: one
    whose awaits are all blocking calls dressed as coroutines
    (`brook.common.store.transactions.SyncTxOps`).
    So code written once, async, also runs on a blocking pymongo session, whose calls block
    and belong to the caller's thread."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise RuntimeError("a coroutine run without an event loop tried to suspend")


class LoopThread:
    """An event loop running forever on a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coro[T]) -> T:
        if not self._thread.is_alive():
            # Closed, or this is a forked child (threads do not survive a fork): waiting on
            # the loop would block forever.
            coro.close()
            raise RuntimeError(
                "the client's event-loop thread is not running: closed, or "
                "the process forked; create the client in this process"
            )
        return run_on(self.loop, coro)

    def stop(self, timeout: float = 5.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


class BlockingHost(Protocol[C_co]):
    def _target(self) -> C_co: ...

    def _block(self, coro: Coro[T]) -> T: ...


class DelegatingHost(Protocol[C_co]):
    def _target(self) -> C_co: ...


class SessionHost(Protocol[C_co]):
    def _target(self) -> C_co: ...

    def _block(self, coro: Coro[T]) -> T: ...

    def _session_target(self) -> C_co: ...


class blocking(Generic[C, P, T]):
    """`name = blocking(Core.method)`: `obj.name(...)` runs `Core.method(obj._target(), ...)`
    through `obj._block` and returns its result."""

    def __init__(self, fn: Callable[Concatenate[C, P], Coro[T]]) -> None:
        self.fn = fn

    @overload
    def __get__(self, obj: None, owner: type) -> Self: ...

    @overload
    def __get__(self, obj: BlockingHost[C], owner: type) -> Callable[P, T]: ...

    def __get__(self, obj: BlockingHost[C] | None, owner: type) -> Self | Callable[P, T]:
        if obj is None:
            return self
        fn = self.fn
        host = obj

        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return host._block(fn(host._target(), *args, **kwargs))

        functools.update_wrapper(call, fn)
        return call


class delegating(Generic[C, P, T]):
    """`name = delegating(Core.method)`: `await obj.name(...)` awaits
    `Core.method(obj._target(), ...)`."""

    def __init__(self, fn: Callable[Concatenate[C, P], Coro[T]]) -> None:
        self.fn = fn

    @overload
    def __get__(self, obj: None, owner: type) -> Self: ...

    @overload
    def __get__(self, obj: DelegatingHost[C], owner: type) -> Callable[P, Coro[T]]: ...

    def __get__(self, obj: DelegatingHost[C] | None, owner: type) -> Self | Callable[P, Coro[T]]:
        if obj is None:
            return self
        fn = self.fn
        host = obj

        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return await fn(host._target(), *args, **kwargs)

        functools.update_wrapper(call, fn)
        return call


class blocking_or_in_session(Generic[C, P, T]):
    """`name = blocking_or_in_session(Core.method)`: as `blocking`, except that a call given a
    `session=` (a blocking pymongo `ClientSession`, in the caller's transaction) runs
    `Core.method(obj._session_target(), ...)` right here, on the caller's thread (`drive`):
    that session's calls block, and it belongs to the caller, not to an event loop."""

    def __init__(self, fn: Callable[Concatenate[C, P], Coro[T]]) -> None:
        self.fn = fn

    @overload
    def __get__(self, obj: None, owner: type) -> Self: ...

    @overload
    def __get__(self, obj: SessionHost[C], owner: type) -> Callable[P, T]: ...

    def __get__(self, obj: SessionHost[C] | None, owner: type) -> Self | Callable[P, T]:
        if obj is None:
            return self
        fn = self.fn
        host = obj

        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            if kwargs.get("session") is not None:
                return drive(fn(host._session_target(), *args, **kwargs))
            return host._block(fn(host._target(), *args, **kwargs))

        functools.update_wrapper(call, fn)
        return call
