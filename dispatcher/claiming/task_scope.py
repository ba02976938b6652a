"""Which tasks a claim may take: a dispatcher whose tasks share worker processes claims for
its free processes and for its free shared seats apart (`Room.parts`), each claim scoped to
the tasks that fit there. The scope is set around one claim (a context variable: claims in
flight at once, the urgent one beside a batch, each keep their own) and read by the
policies where they name the tasks they claim."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_scope: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
    "brook_claim_tasks", default=None
)


@contextlib.contextmanager
def scoped(tasks: frozenset[str] | None) -> Iterator[None]:
    """Claims made within take jobs of `tasks` only (None: every task of the dispatcher)."""
    token = _scope.set(tasks)
    try:
        yield
    finally:
        _scope.reset(token)


def tasks_now(every: frozenset[str]) -> frozenset[str]:
    """The tasks the claim being made may take, of `every` task the dispatcher runs."""
    scope = _scope.get()
    return every if scope is None else every & scope
