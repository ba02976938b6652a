"""The Python API: `Client` (blocking) and `AsyncClient` (asyncio).

Both write to MongoDB directly, through the same code as the HTTP API (`common.core`):
the same validation and messages, the same task-name check, the same store. `Client` is
not a second copy of `AsyncClient`: each of its methods runs the `AsyncClient` coroutine
of the same name on a private event-loop thread.

    from brook import Client

    with Client() as client:
        job = client.submit("echo", {"x": 1})
        print(client.wait(job.id, timeout=30).result)
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from pymongo import AsyncMongoClient

from common.blocking import Coro, LoopThread, T, blocking
from common.core import ClientCore
from common.db import database, make_client
from common.directory import TaskDirectory
from common.models import Doc
from common.settings import Settings, load_settings
from common.store import JobStore
from executor.registry import registered


def _settings(uri: str | None, db: str | None) -> Settings:
    overrides: dict[str, Any] = {}
    if uri is not None:
        overrides["mongo_uri"] = uri
    if db is not None:
        overrides["db"] = db
    return load_settings(**overrides)


class AsyncClient(ClientCore):
    """Submit, read, cancel, retry and wait for jobs from asyncio code.

    `uri` and `db` default to `BROOK_MONGO_URI` (unset: the embedded replica set) and
    `BROOK_DB`. Use it from one event loop (the one of its first call), and `close()` it,
    or use `async with`.
    """

    def __init__(self, uri: str | None = None, db: str | None = None) -> None:
        settings = _settings(uri, db)
        self._open(settings, make_client(settings, appname="brook-client"))

    def _open(self, settings: Settings, mongo: AsyncMongoClient[Doc]) -> None:
        store = JobStore(database(mongo, settings), retention_s=settings.retention_seconds)
        super().__init__(store, TaskDirectory(store, registered, open_while_none_live=True))
        self.settings = settings
        self._mongo = mongo

    @classmethod
    def _wrap(cls, settings: Settings, mongo: AsyncMongoClient[Doc]) -> AsyncClient:
        """A client on a given `AsyncMongoClient` (tests pass one with a command listener);
        closing this client closes that one."""
        client = cls.__new__(cls)
        client._open(settings, mongo)
        return client

    async def close(self) -> None:
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
    instead of coroutines. `close()` it, or use `with`."""

    def __init__(self, uri: str | None = None, db: str | None = None) -> None:
        self._inner = AsyncClient(uri, db)
        self._thread = LoopThread("brook-client")

    @property
    def settings(self) -> Settings:
        return self._inner.settings

    def _target(self) -> AsyncClient:
        return self._inner

    def _block(self, coro: Coro[T]) -> T:
        return self._thread.run(coro)

    submit = blocking(ClientCore.submit)
    submit_many = blocking(ClientCore.submit_many)
    get = blocking(ClientCore.get)
    list = blocking(ClientCore.list)
    queues = blocking(ClientCore.queues)
    cancel = blocking(ClientCore.cancel)
    retry = blocking(ClientCore.retry)
    wait = blocking(ClientCore.wait)

    def close(self) -> None:
        try:
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
