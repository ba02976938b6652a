"""The task registry: `@task("name")` on a plain `def` or an `async def`.

A task's options are part of its declaration (`@task("name", shared=100)`), read by the
dispatchers, which import the task modules: `shared=N` lets up to N of its jobs run at once
in one shared worker process, as asyncio tasks (an `async def` only: anything else fails
the import of its module with a clear message); `start_within_s=` and `deadline_s=` are its
jobs' default deadlines, counted from each job's submit, for the jobs whose submit gave
none (`brook.common.domain.deadlines`).

A job names a registered task and never carries code. Modules listed in `BROOK_TASKS`
are imported at start (in the API, to validate names, and in every worker process).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from brook.common.domain.deadlines import TaskDeadlines
from brook.common.domain.errors import ConfigError, UnknownTask
from brook.common.domain.quota_specs import check_job_quotas
from brook.common.domain.schedules import check_seconds
from brook.common.runtime.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])

DEMO_MODULE = "brook.executor.demo"


@dataclass(frozen=True, kw_only=True)
class TaskDef:
    name: str
    fn: Callable[..., Any]
    is_async: bool
    wants_context: bool
    # Up to this many of its jobs at once in one shared worker process (None: a process each).
    shared: int | None = None
    # The quotas its jobs draw on by default, each with its cost in units (a submit's wins).
    quotas: dict[str, int] | None = None
    # Its jobs' defaults: `start_by` and `deadline` this long after their submit.
    start_within_s: float | None = None
    deadline_s: float | None = None


_REGISTRY: dict[str, TaskDef] = {}


def task(
    name: str,
    *,
    shared: int | None = None,
    quotas: Mapping[str, int] | None = None,
    start_within_s: float | None = None,
    deadline_s: float | None = None,
) -> Callable[[F], F]:
    """Register `fn` as task `name`. It is called as `fn(payload)` or `fn(payload, ctx)`.
    `shared`: up to that many of its jobs run at once in one shared worker process.
    `quotas`: the quotas its jobs draw on, each with its cost in units, unless a submit
    names its own. `start_within_s`, `deadline_s`: its jobs' default `start_by` and
    `deadline`, counted from each job's submit (a submit's own value wins). The dispatchers,
    which import the task modules, apply these defaults."""
    if not name or not isinstance(name, str):
        raise ValueError("a task needs a non-empty name")
    try:
        default_quotas = None if quotas is None else check_job_quotas(quotas)
    except ValueError as exc:
        raise ValueError(f"task {name!r}: quotas= {exc}") from None
    for option, seconds in (("start_within_s", start_within_s), ("deadline_s", deadline_s)):
        try:
            check_seconds(option, seconds)
        except ValueError as exc:
            raise ValueError(f"task {name!r}: {exc}") from None
    if shared is not None and (
        isinstance(shared, bool) or not isinstance(shared, int) or shared < 1
    ):
        raise ValueError(f"task {name!r}: shared= must be a whole number of at least 1")

    def register(fn: F) -> F:
        params = list(inspect.signature(fn).parameters.values())
        is_async = inspect.iscoroutinefunction(fn)
        if shared is not None and not is_async:
            raise TypeError(
                f"task {name!r}: shared= needs an `async def` task; a plain `def` task "
                "runs in a worker process of its own"
            )
        existing = _REGISTRY.get(name)
        if existing is not None and existing.fn is not fn:
            same = getattr(existing.fn, "__qualname__", None) == getattr(fn, "__qualname__", None)
            if not same:
                raise ValueError(f"task {name!r} is already registered by {existing.fn!r}")
        _REGISTRY[name] = TaskDef(
            name=name,
            fn=fn,
            is_async=is_async,
            wants_context=len(params) >= 2,
            shared=shared,
            quotas=default_quotas,
            start_within_s=start_within_s,
            deadline_s=deadline_s,
        )
        return fn

    return register


def load_tasks(settings: Settings) -> dict[str, TaskDef]:
    """Import the demo tasks (unless disabled) and every module in `BROOK_TASKS`."""
    modules = ([DEMO_MODULE] if settings.demo_tasks else []) + list(settings.tasks)
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # any import failure is a configuration error
            raise ConfigError(f"BROOK_TASKS: cannot import {module!r}: {exc}") from exc
    if not settings.demo_tasks:
        for name in [n for n, d in _REGISTRY.items() if d.fn.__module__ == DEMO_MODULE]:
            del _REGISTRY[name]
    return dict(_REGISTRY)


def shared_tasks(tasks: dict[str, TaskDef]) -> dict[str, int]:
    """The tasks whose jobs share worker processes, each with its `shared=` count."""
    return {name: d.shared for name, d in tasks.items() if d.shared is not None}


def task_quotas(tasks: dict[str, TaskDef]) -> dict[str, dict[str, int]]:
    """The tasks that draw on quotas by default, each with its `quotas=`."""
    return {name: d.quotas for name, d in tasks.items() if d.quotas}


def task_deadlines(tasks: dict[str, TaskDef]) -> dict[str, TaskDeadlines]:
    """The tasks that declare default deadlines, each with them: the dispatchers apply them
    to the jobs whose submit gave none."""
    return {
        name: TaskDeadlines(start_within_s=d.start_within_s, deadline_s=d.deadline_s)
        for name, d in tasks.items()
        if d.start_within_s is not None or d.deadline_s is not None
    }


def registered() -> frozenset[str]:
    """The names registered in this process so far (nothing is imported to find more)."""
    return frozenset(_REGISTRY)


def get_task(name: str) -> TaskDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownTask(name) from None

