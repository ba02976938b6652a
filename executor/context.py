"""What a task may ask of Brook while it runs: who it is, this process's MongoDB client, and
a way to report how far it got."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from common.db import database, make_client
from common.log import get_logger
from common.settings import Settings
from executor.progress import ProgressReporter, check_progress

_client: AsyncMongoClient[dict[str, Any]] | None = None


def process_client(settings: Settings) -> AsyncMongoClient[dict[str, Any]]:
    """One client per worker process, created lazily in that process (the DB factory)."""
    global _client
    if _client is None:
        _client = make_client(settings, appname="brook-worker")
    return _client


@dataclass(frozen=True, kw_only=True)
class TaskContext:
    job_id: str
    attempt: int
    task: str
    settings: Settings
    log: Any = field(default_factory=get_logger)
    reporter: ProgressReporter | None = None

    def database(self) -> AsyncDatabase[dict[str, Any]]:
        """Brook's database through this worker process's own client (for `async def` tasks)."""
        return database(process_client(self.settings), self.settings)

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far this attempt got: `fraction` in [0, 1], an optional `message`.

        Cheap to call often, from a plain `def` or an `async def` task: reports are
        coalesced to a few a second, and the job shows the latest as `progress`.
        """
        if self.reporter is None:
            check_progress(fraction, message)  # outside a worker: still check the arguments
            return
        self.reporter.report(fraction, message)
