"""Which task names a submit may use.

A job names a task; a name that nothing can run would wait forever. The HTTP API accepts
the tasks it registered itself (`BROOK_TASKS`) and those a live dispatcher published. The
Python client may not import the worker code at all, so it accepts its own registered
tasks, and any other name only if a live dispatcher runs it — or any name at all while no
dispatcher is live (the workers may simply not be started yet).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Protocol

from brook.common.domain.errors import InvalidInput
from brook.common.domain.models import JobSpec
from brook.common.domain.validation import unknown_task_detail
from brook.common.store.presence import LiveDispatcher

# A name found among the live dispatchers' tasks is trusted this long without a new look;
# a name not found is looked up again, at most this often.
TRUST_S = 5.0
LOOK_AGAIN_S = 0.5


class LiveSource(Protocol):
    """Where the live dispatchers are read: `PresenceStore`, or `SyncJobs` on a blocking
    client."""

    async def live_dispatchers(self) -> list[LiveDispatcher]: ...


class TaskDirectory:
    def __init__(
        self,
        store: LiveSource,
        local: Callable[[], Collection[str]],
        *,
        open_while_none_live: bool,
    ) -> None:
        self.store = store
        self.local = local
        self.open_while_none_live = open_while_none_live
        self._live: frozenset[str] = frozenset()
        self._any_live = False
        self._looked = -float("inf")  # time.monotonic() of the last look

    async def unknown(self, tasks: Iterable[str]) -> dict[str, frozenset[str]]:
        """The names in `tasks` no one is known to run, each with the names that are known."""
        local = frozenset(self.local())
        rest = {t for t in tasks if t not in local}
        if not rest:
            return {}
        age = time.monotonic() - self._looked
        if age > TRUST_S or (not rest <= self._live and age > LOOK_AGAIN_S):
            await self._look()
        if not self._any_live and self.open_while_none_live:
            return {}
        known = local | self._live
        return {t: known for t in rest if t not in known}

    async def known(self) -> frozenset[str]:
        """Every name a submit may use now: this process's own, and the live dispatchers'
        (looked up again once older than `TRUST_S`)."""
        if time.monotonic() - self._looked > TRUST_S:
            await self._look()
        return frozenset(self.local()) | self._live

    async def _look(self) -> None:
        live = await self.store.live_dispatchers()
        self._live = frozenset(name for d in live for name in d.tasks)
        self._any_live = bool(live)
        self._looked = time.monotonic()

    async def check(self, specs: Sequence[JobSpec], *, batch: bool) -> None:
        """Raise `InvalidInput` (the API's `422` detail) for the first spec whose task no
        one runs."""
        unknown = await self.unknown({spec.task for spec in specs})
        if unknown:
            raise InvalidInput(unknown_task_detail(specs, unknown, batch=batch))
