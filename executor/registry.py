"""The task registry: `@task("name")` on a plain `def` or an `async def`.

A job names a registered task and never carries code. Modules listed in `BROOK_TASKS`
are imported at start (in the API, to validate names, and in every worker process).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from brook.common.domain.errors import ConfigError, UnknownTask
from brook.common.runtime.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])

DEMO_MODULE = "brook.executor.demo"


@dataclass(frozen=True, kw_only=True)
class TaskDef:
    name: str
    fn: Callable[..., Any]
    is_async: bool
    wants_context: bool


_REGISTRY: dict[str, TaskDef] = {}


def task(name: str) -> Callable[[F], F]:
    """Register `fn` as task `name`. It is called as `fn(payload)` or `fn(payload, ctx)`."""
    if not name or not isinstance(name, str):
        raise ValueError("a task needs a non-empty name")

    def register(fn: F) -> F:
        params = list(inspect.signature(fn).parameters.values())
        existing = _REGISTRY.get(name)
        if existing is not None and existing.fn is not fn:
            same = getattr(existing.fn, "__qualname__", None) == getattr(fn, "__qualname__", None)
            if not same:
                raise ValueError(f"task {name!r} is already registered by {existing.fn!r}")
        _REGISTRY[name] = TaskDef(
            name=name,
            fn=fn,
            is_async=inspect.iscoroutinefunction(fn),
            wants_context=len(params) >= 2,
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


def registered() -> frozenset[str]:
    """The names registered in this process so far (nothing is imported to find more)."""
    return frozenset(_REGISTRY)


def get_task(name: str) -> TaskDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownTask(name) from None

