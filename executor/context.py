"""What a task may ask of Brook while it runs: who it is, this process's MongoDB client,
`submit` (a follow-up job, with the arguments of `Client.submit`), `progress` (how far it
got), `transaction` (its MongoDB writes, committed together with its completion),
`parent_results` (what the jobs it depends on returned), and durable execution: `step`
(run once, its result checkpointed and replayed by later attempts), `sleep` and
`wait_for_signal` (the job waits without a worker; `executor.steps`), and `changed` (which
side of a code change a job runs, recorded like a step).

An `async def` task gets a `TaskContext` (`await ctx.submit(...)`, `async with
ctx.transaction() as session`); a plain `def` task runs on a worker thread and gets a
`SyncTaskContext` (`ctx.submit(...)` returns the job, `with ctx.transaction() as session`),
whose calls without a session run on the worker process's event loop. Either way they go
through this process's own clients, created in this process (`executor.clients`). Neither
is a copy of the other: the client operations are `ClientCore`'s (`submit` calls its
`Submitting.submit`, blocking through `blocking_or_in_session` in a plain `def` task, and
records this job as the new job's `spawned_by` unless `detach=True`), and the durable ones
are written once in `DurableContext`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.synchronous.client_session import ClientSession
from pymongo.synchronous.database import Database

from brook.common.client.core import ClientCore, Submitting, spawning
from brook.common.domain.errors import SignalTimeout
from brook.common.domain.models import Job
from brook.common.domain.quota_specs import check_quota_name
from brook.common.domain.steps import (
    change_marker,
    check_signal_key,
    check_step_name,
    seconds_of,
)
from brook.common.runtime import tracing
from brook.common.runtime.blocking import Coro, T, blocking_or_in_session, drive, run_on
from brook.common.runtime.log import get_logger
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, sync_database
from brook.common.store.quotas import QuotaStore
from brook.common.store.records import Lease
from brook.common.store.signals import SignalStore
from brook.executor.clients import (
    process_client,
    process_core,
    process_sessions,
    process_sync_client,
)
from brook.executor.output import OutputStream, in_step
from brook.executor.progress import ProgressReporter, check_progress
from brook.executor.step_transaction import transactional_step
from brook.executor.steps import (
    WAIT_IN_PLACE_S,
    Journal,
    Suspended,
    as_datetime,
    mark_failed,
    sleep_suspend,
    timeout_seconds,
    wait_suspend,
)
from brook.executor.transaction import AttemptTransaction

__all__ = ["SyncTaskContext", "TaskContext", "process_client", "process_core"]


@dataclass(frozen=True, kw_only=True)
class BaseContext:
    job_id: str
    attempt: int
    task: str
    # The worker's own settings, the MongoDB password included: only this process's clients
    # read them. A task sees `settings`, without the password.
    process_settings: Settings = field(repr=False)
    log: Any = field(default_factory=get_logger)
    reporter: ProgressReporter | None = None
    tx: AttemptTransaction | None = None
    journal: Journal | None = None
    send: Callable[[Any], None] | None = None
    output: OutputStream | None = None
    owner: str = ""  # the dispatcher holding the attempt's lease: its writes are fenced by it

    @property
    def settings(self) -> Settings:
        """The settings this worker runs with, the password of `mongo_uri` replaced by
        `***` (a task talks to MongoDB through `ctx.database()`, never through the URI)."""
        return self.process_settings.redacted()

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far this attempt got: `fraction` in [0, 1], an optional `message`.

        Cheap to call often, from a plain `def` or an `async def` task: reports are
        coalesced to a few a second, and the job shows the latest as `progress`.
        """
        if self.reporter is None:
            check_progress(fraction, message)  # outside a worker: still check the arguments
            return
        self.reporter.report(fraction, message)

    def emit(self, data: Any) -> None:
        """Append `data` (text, or a JSON-encodable value) to the job's output stream, as
        this attempt's. Returns at once: chunks are written in batches, a few tens of
        milliseconds later, and an attempt's last ones before its end is recorded.
        `OutputLimitExceeded` past a chunk's size or the job's cap (the chunk is not kept);
        `LeaseLost` once the attempt has lost its lease. Inside a step, the chunks are the
        step's: a replay of the finished step does not emit them again."""
        if self.output is None:
            raise RuntimeError("ctx.emit needs a running attempt of a Brook worker")
        if self.tx is not None and self.tx.opened and self.tx.state != "ended":
            raise RuntimeError(
                "ctx.emit cannot run after ctx.transaction() opened in this attempt (nothing "
                "else may write the job until it commits): emit before opening it"
            )
        self.output.emit(data)

    async def _flush_output(self, *, count: bool = False) -> None:
        if self.output is not None:
            await self.output.flush(count=count)

    def _target(self) -> ClientCore:
        return process_core(self.process_settings)

    async def _usage(self, quota: str, total: int) -> float:
        check_quota_name(quota)
        if isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise ValueError("ctx.usage: the usage is a whole number of units, at least 0")
        if not self.owner:
            raise RuntimeError("ctx.usage needs a running attempt of a Brook worker")
        said = time.monotonic()
        db = database(process_client(self.process_settings), self.process_settings)
        lease = Lease(job_id=self.job_id, attempt=self.attempt)
        store = QuotaStore(db)
        return await store.usage(quota, lease, self.owner, float(total), said=said)

    def _attempt_tx(self) -> AttemptTransaction:
        if self.tx is None:
            raise RuntimeError("ctx.transaction() needs a running attempt of a Brook worker")
        return self.tx

    def _journal(self, what: str) -> Journal:
        if self.journal is None:
            raise RuntimeError(f"{what} needs a running attempt of a Brook worker")
        if self.tx is not None and self.tx.opened and self.tx.state != "ended":
            raise RuntimeError(
                f"{what} cannot run after ctx.transaction() opened in this attempt (the "
                "transaction commits when the task returns, and nothing else may write the "
                "job until then): use a transactional step, ctx.step(..., transactional=True)"
            )
        return self.journal

    def _step_span(
        self, name: str, *, transactional: bool, replayed: bool
    ) -> contextlib.AbstractContextManager[Any]:
        """A span for one durable step (when tracing), a child of the attempt's run: its
        name, whether it ran in a transaction, and whether this attempt replayed its
        recorded result instead of running it. An exception marks it failed."""
        return tracing.span(
            "brook.step",
            attributes={
                "brook.job.id": self.job_id,
                "brook.task": self.task,
                "brook.attempt": self.attempt,
                "brook.step.name": name,
                "brook.step.transactional": transactional,
                "brook.step.replayed": replayed,
            },
        )

    def _signals(self) -> SignalStore:
        return SignalStore(database(process_client(self.process_settings), self.process_settings))


@contextlib.contextmanager
def _spawning(job_id: str, detach: bool) -> Generator[None]:
    """A submit made in this block records `job_id` as its job's `spawned_by` (nothing with
    `detach`)."""
    token = spawning.set(None if detach else job_id)
    try:
        yield
    finally:
        spawning.reset(token)


def _elapsed_ms(started: float) -> float:
    return (time.monotonic() - started) * 1000


def _signal_result(key: str, recorded: Any) -> Any:
    """A wait's recorded step: the signal's payload, or its timeout."""
    if isinstance(recorded, dict) and recorded.get("timed_out"):
        raise SignalTimeout(f"no signal on {key!r} before the wait's timeout")
    return recorded.get("payload") if isinstance(recorded, dict) else None


# The durable operations (`step`, `sleep`, `wait_for_signal`) are written once, as
# generators shared by both contexts. Each yields what it needs done where the task runs,
# and gets the answer back (or the exception, raised at the `yield`):
# - a coroutine: run it on this process's event loop (journal writes, signal reads);
# - `_Nap`: wait here for a while;
# - `_Call`: call the step's own function here (an `async def` task awaits what it returns);
# - `_InTransaction`: a transactional step, on a new session of this task's kind (async, or
#   blocking on a plain `def` task's thread).
# `TaskContext` awaits each; `SyncTaskContext` blocks for each on the task's thread.


@dataclass(frozen=True)
class _Nap:
    seconds: float


@dataclass(frozen=True)
class _Call:
    fn: Callable[[], Any]


@dataclass(frozen=True)
class _InTransaction:
    run: Callable[[Any], Coro[Any]]


Effect = Coro[Any] | _Nap | _Call | _InTransaction
Durable = Generator[Effect, Any, T]


@dataclass(frozen=True, kw_only=True)
class DurableContext(BaseContext):
    """`BaseContext` with the durable operations, written once for either kind of task."""

    async def _perform(self, effect: Effect) -> Any:
        raise NotImplementedError

    async def _run(self, op: Durable[T]) -> T:
        """Run a durable operation to its end, performing each effect it yields."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = op.send(reply) if error is None else op.throw(error)
            except StopIteration as done:
                result: T = done.value
                return result
            try:
                reply, error = await self._perform(effect), None
            except BaseException as exc:  # raised in the operation, where it asked
                reply, error = None, exc

    def _step(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        transactional: bool,
    ) -> Durable[Any]:
        journal = self._journal("ctx.step")
        check_step_name(name)
        found, value = journal.enter(name)
        with self._step_span(name, transactional=transactional, replayed=found):
            if found:
                return value
            started = time.monotonic()
            try:
                if transactional:
                    return (
                        yield _InTransaction(
                            lambda session: transactional_step(
                                session,
                                journal,
                                name,
                                lambda s: fn(s, *args, **kwargs),
                                settings=self.process_settings,
                                send=self.send,
                                reporter=self.reporter,
                            )
                        )
                    )
                with in_step(name):
                    value = yield _Call(functools.partial(fn, *args, **kwargs))
            except Exception as exc:
                mark_failed(exc, name)
                raise
            # The step's chunks are written before its checkpoint: a replay, which emits
            # nothing, never leaves a reader without them.
            yield self._flush_output()
            return (yield journal.record(name, value, _elapsed_ms(started)))

    def _sleep(self, duration: float | timedelta) -> Durable[None]:
        seconds = seconds_of(duration)
        journal = self._journal("ctx.sleep")
        name = journal.auto_name("sleep")
        found, until = journal.enter(name)
        if not found:
            until = yield journal.record(name, None, 0.0, wake_in_s=seconds)
        wake = as_datetime(until)
        left = journal.until_due(wake)
        if left <= 0:
            return
        if left <= WAIT_IN_PLACE_S:
            yield _Nap(left)
            return
        raise Suspended(sleep_suspend(name, wake))

    def _changed(self, change_id: str) -> Durable[bool]:
        name = change_marker(change_id)
        journal = self._journal("ctx.changed")
        if name in journal.used and name in journal.recorded:
            return bool(journal.recorded[name])  # asked again in this run: the same answer
        found, answer = journal.enter(name)
        if not found:
            # Recorded steps not reached yet: an earlier run went past here without this
            # marker, on the code before it (its replay must take the old path).
            answer = yield journal.record(name, not journal.past_here(), 0.0)
        return bool(answer)

    def _wait_for_signal(self, key: str, timeout: float | timedelta | None) -> Durable[Any]:
        check_signal_key(key)
        seconds = timeout_seconds(timeout)
        journal = self._journal("ctx.wait_for_signal")
        name = journal.auto_name(f"signal:{key}")
        found, recorded = journal.enter(name)
        if found:
            return _signal_result(key, recorded)
        until = None
        if seconds is not None:
            deadline = f"{name}.deadline"
            known, at = journal.enter(deadline)
            if not known:
                at = yield journal.record(deadline, None, 0.0, wake_in_s=seconds)
            until = as_datetime(at)
        sent, payload = yield self._signals().get(key)
        if sent:
            return _signal_result(key, (yield journal.record(name, {"payload": payload}, 0.0)))
        if until is not None and journal.until_due(until) <= 0:
            return _signal_result(key, (yield journal.record(name, {"timed_out": True}, 0.0)))
        raise Suspended(wait_suspend(name, key, until))


@dataclass(frozen=True, kw_only=True)
class TaskContext(DurableContext):
    """The context of an `async def` task."""

    def database(self) -> AsyncDatabase[dict[str, Any]]:
        """Brook's database through this worker process's own client."""
        return database(process_client(self.process_settings), self.process_settings)

    def transaction(self) -> contextlib.AbstractAsyncContextManager[AsyncClientSession]:
        """`async with ctx.transaction() as session:` — write through `session` (any database
        of `session.client`); when the task returns, the job's completion and these writes
        commit together, fenced by attempt and owner. A lost lease, an exception or a dead
        worker aborts them. One per attempt; it commits when the task returns, not when the
        block ends."""
        return self._open_transaction()

    @contextlib.asynccontextmanager
    async def _open_transaction(self) -> AsyncIterator[AsyncClientSession]:
        tx = self._attempt_tx()
        # Its output so far, written and counted, before the job is the task's own.
        await self._flush_output(count=True)
        async with tx.open_async(process_client(self.process_settings)) as session:
            yield session

    async def submit(
        self,
        task: str,
        payload: Mapping[str, Any] | None = None,
        *,
        detach: bool = False,
        **options: Any,
    ) -> Job:
        """Submit a job with `Client.submit`'s arguments. It is spawned by this job
        (`spawned_by`): cancelling this job cancels it too, unless `detach=True`."""
        with _spawning(self.job_id, detach):
            return await self._target().submit(task, payload, **options)

    async def parent_results(self) -> dict[str, Any]:
        """`{parent job id: result}` for this job's `depends_on`, in that order."""
        return await self._target().parent_results(self.job_id)

    async def usage(self, quota: str, total: int) -> float:
        """Report this attempt's real usage of `quota` so far, in units (the cumulative
        figure: each call says the total): the difference from what its start was charged
        (the estimate, or the last report) is charged or refunded. A charge can overdraw
        the quota's window (a debt: it admits nothing more until that is repaid). Inside a
        step it is part of the step: a replay does not charge it again. `LeaseLost` once
        the attempt lost its lease. Returns the difference charged (negative: refunded)."""
        return await self._usage(quota, total)

    async def _perform(self, effect: Effect) -> Any:
        if isinstance(effect, _Nap):
            return await asyncio.sleep(effect.seconds)
        if isinstance(effect, _Call):
            value = effect.fn()
            return await value if inspect.isawaitable(value) else value
        if isinstance(effect, _InTransaction):
            return await effect.run(process_client(self.process_settings).start_session())
        return await effect

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        transactional: bool = False,
        **kwargs: Any,
    ) -> Any:
        """`result = await ctx.step("name", fn, *args, **kwargs)`: run `fn` once for this
        job. Its result is checkpointed (majority-written, fenced by attempt and owner)
        before it is returned; a later attempt returns the recorded result without calling
        `fn`. `fn` may be a plain or an `async` function. With `transactional=True`, `fn`
        is called as `fn(session, *args, **kwargs)` and its writes with `session` commit in
        one MongoDB transaction with the checkpoint: both or neither."""
        return await self._run(self._step(name, fn, args, kwargs, transactional))

    async def sleep(self, duration: float | timedelta) -> None:
        """Sleep durably: the wake time (the server's clock) is recorded as a step, the run
        ends and frees its worker, and the job is claimed again at the wake time and replayed
        up to here, where this returns. Not an attempt and not a failure."""
        await self._run(self._sleep(duration))

    async def wait_for_signal(self, key: str, timeout: float | timedelta | None = None) -> Any:
        """The payload of a signal on `key` (`client.signal(key, payload)`, `POST
        /signals/{key}`): one already sent (within its retention) returns at once; otherwise
        the run ends and the job waits without a worker until one comes, then replays up to
        here. After `timeout` (seconds or a timedelta) without one: `SignalTimeout`. The
        outcome is recorded as a step: a later attempt gets the same answer."""
        return await self._run(self._wait_for_signal(key, timeout))

    async def changed(self, change_id: str) -> bool:
        """Whether this job runs the code of the change `change_id` (a deploy changed the
        task under jobs that were sleeping, waiting or retrying): `True` for a job that
        reaches this call with no recorded step past it (a new job, or one that had not got
        this far), `False` for one whose recorded steps already go past it (it ran the old
        code there, and its replay must take the old path). Recorded like a step the first
        time: every later call and replay of the job gets the same answer."""
        return await self._run(self._changed(change_id))


@dataclass(frozen=True, kw_only=True)
class SyncTaskContext(DurableContext):
    """The context of a plain `def` task (it runs on a worker thread)."""

    loop: asyncio.AbstractEventLoop

    def database(self) -> Database[dict[str, Any]]:
        """Brook's database through this worker process's own blocking client."""
        return sync_database(process_sync_client(self.process_settings), self.process_settings)

    def transaction(self) -> contextlib.AbstractContextManager[ClientSession]:
        """`with ctx.transaction() as session:` — as `TaskContext.transaction`, with a
        blocking session of this worker process's blocking client."""
        return self._open_sync_transaction()

    @contextlib.contextmanager
    def _open_sync_transaction(self) -> Iterator[ClientSession]:
        tx = self._attempt_tx()
        # Its output so far, written and counted, before the job is the task's own.
        self._block(self._flush_output(count=True))
        with tx.open_sync(process_sync_client(self.process_settings)) as session:
            yield session

    def _block(self, coro: Coro[T]) -> T:
        return run_on(self.loop, coro)

    def _session_target(self) -> Submitting:
        return process_sessions(self.process_settings)

    _submit = blocking_or_in_session(Submitting.submit)

    def submit(
        self,
        task: str,
        payload: Mapping[str, Any] | None = None,
        *,
        detach: bool = False,
        **options: Any,
    ) -> Job:
        """As `TaskContext.submit`, blocking (with `session=`, in this task's transaction)."""
        with _spawning(self.job_id, detach):
            return self._submit(task, payload, **options)

    def parent_results(self) -> dict[str, Any]:
        """`{parent job id: result}` for this job's `depends_on`, in that order."""
        return self._block(self._target().parent_results(self.job_id))

    def usage(self, quota: str, total: int) -> float:
        """As `TaskContext.usage`, blocking."""
        return self._block(self._usage(quota, total))

    async def _perform(self, effect: Effect) -> Any:
        # Never suspends (so `drive` runs `_run` here): each effect blocks this task's thread.
        return self._perform_here(effect)

    def _perform_here(self, effect: Effect) -> Any:
        if isinstance(effect, _Nap):
            return time.sleep(effect.seconds)
        if isinstance(effect, _Call):
            return effect.fn()
        if isinstance(effect, _InTransaction):
            return drive(effect.run(process_sync_client(self.process_settings).start_session()))
        return self._block(effect)

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        transactional: bool = False,
        **kwargs: Any,
    ) -> Any:
        """As `TaskContext.step`, blocking: `fn` runs on this task's thread (with
        `transactional=True`, on a blocking session of this process's blocking client)."""
        return drive(self._run(self._step(name, fn, args, kwargs, transactional)))

    def sleep(self, duration: float | timedelta) -> None:
        """As `TaskContext.sleep`, blocking."""
        drive(self._run(self._sleep(duration)))

    def wait_for_signal(self, key: str, timeout: float | timedelta | None = None) -> Any:
        """As `TaskContext.wait_for_signal`, blocking."""
        return drive(self._run(self._wait_for_signal(key, timeout)))

    def changed(self, change_id: str) -> bool:
        """As `TaskContext.changed`, blocking."""
        return drive(self._run(self._changed(change_id)))
