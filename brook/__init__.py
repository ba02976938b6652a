"""Brook: an event-driven job engine on MongoDB. One import for everything public::

    from brook import task, schedule, trigger, TaskContext, Retry   # in a task module
    from brook import Client, AsyncClient                  # in an application

Importing `brook` opens no connection and starts nothing: a `Client` connects when it
is created, and a task module only registers its tasks. `brook.executor`,
`brook.dispatcher`, `brook.ingest` and `brook.common` are internal packages; the top of
`brook` sits above them and none of them imports it, so a task module that imports
`brook` is loaded without a cycle by the API, a dispatcher and each worker process.

Each name is imported when it is first used (PEP 562), not with the package: the `brook`
command imports `brook.cli`, and a command that only speaks HTTP (`brook ls`, `brook
queue set`, ...) then starts without loading the client, PyMongo or the task runtime
(`brook --help` in 0.3 s instead of 0.6 on a 2-core host).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The public names, each listed once: one import each, what a type checker and an editor
# see. At run time these imports do not run: `_HOME` reads them from this file, and
# `__getattr__` imports a name from its module when it is first used.
if TYPE_CHECKING:
    from brook.client import AsyncClient as AsyncClient
    from brook.client import Client as Client
    from brook.common.domain.bulk import JobFilter as JobFilter
    from brook.common.domain.models import Job as Job
    from brook.common.domain.output import OutputChunk as OutputChunk
    from brook.common.domain.status import JobStatus as JobStatus
    from brook.errors import BrookError as BrookError
    from brook.errors import ConfigError as ConfigError
    from brook.errors import DuplicateStep as DuplicateStep
    from brook.errors import EmbeddedMongoError as EmbeddedMongoError
    from brook.errors import InvalidInput as InvalidInput
    from brook.errors import InvalidSession as InvalidSession
    from brook.errors import JobConflict as JobConflict
    from brook.errors import JobNotFound as JobNotFound
    from brook.errors import LeaseLost as LeaseLost
    from brook.errors import OutputLimitExceeded as OutputLimitExceeded
    from brook.errors import QuotaNotFound as QuotaNotFound
    from brook.errors import RateLimited as RateLimited
    from brook.errors import Retry as Retry
    from brook.errors import ScheduleNotFound as ScheduleNotFound
    from brook.errors import SearchTooBroad as SearchTooBroad
    from brook.errors import SignalTimeout as SignalTimeout
    from brook.errors import StepError as StepError
    from brook.errors import TriggerNotFound as TriggerNotFound
    from brook.errors import UnknownParent as UnknownParent
    from brook.errors import UnknownTask as UnknownTask
    from brook.errors import WaitTimeout as WaitTimeout
    from brook.executor.context import SyncTaskContext as SyncTaskContext
    from brook.executor.context import TaskContext as TaskContext
    from brook.executor.registry import task as task
    from brook.executor.schedules import schedule as schedule
    from brook.executor.triggers import trigger as trigger


def _homes() -> dict[str, str]:
    """`{public name: its module}`, read from the `TYPE_CHECKING` block above."""
    import ast

    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    return {
        alias.asname or alias.name: str(node.module)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


_HOME = _homes()
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'brook' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
