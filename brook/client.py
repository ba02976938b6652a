"""The Python API: `Client` (blocking) and `AsyncClient` (asyncio).

Both write to MongoDB directly, through the same code as the HTTP API
(`brook.common.client.core`): the same validation and messages, the same task-name
check, the same store. `Client` is not a second copy of `AsyncClient`: each of its methods
runs the `AsyncClient` coroutine of the same name on a private event-loop thread.

    from brook import Client

    with Client() as client:
        job = client.submit("echo", {"x": 1})
        print(client.wait(job.id, timeout=30).result)
        for chunk in client.output(job.id, follow=True):   # what its task emits, live
            print(chunk.text, end="")

Wrapping the application's own client, jobs are inserted inside its transactions:

    app = MongoClient(uri)
    brook = Client(mongo_client=app)
    with app.start_session() as s, s.start_transaction():
        app.shop.orders.insert_one(order, session=s)
        brook.submit("send_receipt", {"order": order["_id"]}, session=s)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from pymongo import AsyncMongoClient, MongoClient

from brook.common.client.core import BlockingSessions, ClientCore, Submitting
from brook.common.client.task_directory import TaskDirectory
from brook.common.domain.errors import InvalidSession
from brook.common.domain.models import Doc
from brook.common.domain.output import OutputChunk
from brook.common.runtime.blocking import Coro, LoopThread, T, blocking, blocking_or_in_session
from brook.common.runtime.settings import Settings, load_settings
from brook.common.store.db import database, make_client, sync_database
from brook.common.store.jobs import JobStore
from brook.executor.registry import registered


def _settings(uri: str | None, db: str | None) -> Settings:
    overrides: dict[str, Any] = {}
    if uri is not None:
        overrides["mongo_uri"] = uri
    if db is not None:
        overrides["db"] = db
    return load_settings(**overrides)


class AsyncClient(ClientCore):
    """Submit, read, cancel, retry, rerun and wait for jobs from asyncio code.

    `uri` and `db` default to `BROOK_MONGO_URI` (unset: the embedded replica set) and
    `BROOK_DB`. Or give it your application's own `AsyncMongoClient` as `mongo_client`:
    then `submit(..., session=s)` and `submit_many(..., session=s)` insert jobs inside your
    transaction on that client, and `close()` leaves your client open. Use it from one
    event loop (the one of its first call), and `close()` it, or use `async with`.
    """

    def __init__(
        self,
        uri: str | None = None,
        db: str | None = None,
        *,
        mongo_client: AsyncMongoClient[Any] | None = None,
    ) -> None:
        if mongo_client is None:
            settings = _settings(uri, db)
            self._open(settings, make_client(settings, appname="brook-client"), owned=True)
            return
        if uri is not None:
            raise TypeError("give uri or mongo_client, not both")
        if not isinstance(mongo_client, AsyncMongoClient):
            raise TypeError(
                f"AsyncClient wraps a pymongo AsyncMongoClient, not {type(mongo_client).__name__}"
                " (for a MongoClient, use brook.Client)"
            )
        self._open(_settings(None, db), mongo_client, owned=False)

    def _open(self, settings: Settings, mongo: AsyncMongoClient[Doc], *, owned: bool) -> None:
        store = JobStore(
            database(mongo, settings),
            retention_s=settings.retention_seconds,
            query_max_ms=settings.query_max_ms,
        )
        directory = TaskDirectory(store.presence, registered, open_while_none_live=True)
        super().__init__(store, directory, signal_retention_s=settings.signal_retention_seconds)
        self.settings = settings
        self._mongo = mongo
        self._owned = owned

    @classmethod
    def _wrap(cls, settings: Settings, mongo: AsyncMongoClient[Doc]) -> AsyncClient:
        """A client on a given `AsyncMongoClient` (tests pass one with a command listener);
        closing this client closes that one."""
        client = cls.__new__(cls)
        client._open(settings, mongo, owned=True)
        return client

    async def close(self) -> None:
        """Close Brook's own MongoDB client; an application's (`mongo_client=`) stays open."""
        if self._owned:
            await self._mongo.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class Client:
    """`AsyncClient`, blocking: the same methods, arguments and errors, returning results
    instead of coroutines. `close()` it, or use `with`.

    With `mongo_client` (your application's `MongoClient`), `submit(..., session=s)` and
    `submit_many(..., session=s)` insert jobs inside your transaction, on your client and
    in your thread. The other calls (and submits without a session) go through Brook's
    async core on a companion `AsyncMongoClient` with your client's settings, opened on
    first use; `close()` closes that one and leaves yours open.
    """

    def __init__(
        self,
        uri: str | None = None,
        db: str | None = None,
        *,
        mongo_client: MongoClient[Any] | None = None,
    ) -> None:
        self._inner: AsyncClient | None = None
        self._sessions: BlockingSessions | None = None
        self._app: MongoClient[Any] | None = None
        if mongo_client is None:
            self._inner = AsyncClient(uri, db)
            self._settings = self._inner.settings
        else:
            if uri is not None:
                raise TypeError("give uri or mongo_client, not both")
            if not isinstance(mongo_client, MongoClient):
                raise TypeError(
                    f"Client wraps a pymongo MongoClient, not {type(mongo_client).__name__}"
                    " (for an AsyncMongoClient, use brook.AsyncClient)"
                )
            self._settings = _settings(None, db)
            self._app = mongo_client
            self._sessions = BlockingSessions(
                mongo_client, sync_database(mongo_client, self._settings), registered
            )
        self._thread = LoopThread("brook-client")

    @property
    def settings(self) -> Settings:
        return self._settings

    def _target(self) -> AsyncClient:
        if self._inner is None:
            assert self._app is not None
            # The same deployment, credentials and options as the application's client
            # (pymongo keeps the arguments it was built with, for its own copies).
            companion: AsyncMongoClient[Doc] = AsyncMongoClient(**self._app._init_kwargs)
            self._inner = AsyncClient._wrap(self._settings, companion)
        return self._inner

    def _session_target(self) -> Submitting:
        if self._sessions is None:
            raise InvalidSession(
                "this Client has its own MongoClient, so no session of yours belongs to it: "
                "wrap yours to submit inside your transactions, Client(mongo_client=...)"
            )
        return self._sessions

    def _block(self, coro: Coro[T]) -> T:
        return self._thread.run(coro)

    submit = blocking_or_in_session(Submitting.submit)
    submit_many = blocking_or_in_session(Submitting.submit_many)
    get = blocking(ClientCore.get)
    list = blocking(ClientCore.list)
    queues = blocking(ClientCore.queues)
    set_queue = blocking(ClientCore.set_queue)
    set_quota = blocking(ClientCore.set_quota)
    quota = blocking(ClientCore.quota)
    quotas = blocking(ClientCore.quotas)
    delete_quota = blocking(ClientCore.delete_quota)
    cancel = blocking(ClientCore.cancel)
    retry = blocking(ClientCore.retry)
    rerun = blocking(ClientCore.rerun)
    retry_many = blocking(ClientCore.retry_many)
    cancel_many = blocking(ClientCore.cancel_many)
    wait = blocking(ClientCore.wait)
    parent_results = blocking(ClientCore.parent_results)
    signal = blocking(ClientCore.signal)

    def output(
        self,
        job_id: str,
        *,
        follow: bool = False,
        after: str | None = None,
        attempt: int | None = None,
    ) -> Iterator[OutputChunk]:
        """`AsyncClient.output`, as a blocking iterator: `for chunk in client.output(id,
        follow=True): print(chunk.text, end="")`. Its errors (`JobNotFound`, ...) come with
        the first chunk asked for; leaving the loop early closes the stream."""
        source = self._target().output(job_id, follow=follow, after=after, attempt=attempt)

        async def next_chunk() -> tuple[bool, OutputChunk | None]:
            try:
                return True, await anext(source)
            except StopAsyncIteration:
                return False, None

        try:
            while True:
                more, chunk = self._block(next_chunk())
                if not more:
                    return
                assert chunk is not None
                yield chunk
        finally:
            with contextlib.suppress(RuntimeError):  # closed, or stopped mid-read
                self._block(source.aclose())

    def close(self) -> None:
        try:
            if self._inner is not None:
                self._thread.run(self._inner.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
