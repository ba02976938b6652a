"""What the parts of one dispatcher share, built once by `Dispatcher`: the parts with long
argument lists (the claimer, the queue limits, the lease keeper, presence) take it whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from brook.common.domain.deadlines import Defaults
from brook.common.runtime.settings import Settings
from brook.common.runtime.supervision import Spawn
from brook.common.store.jobs import JobStore
from brook.dispatcher.claiming.holdings import Holdings

if TYPE_CHECKING:
    from brook.common.store.clock import ServerClock


@dataclass(frozen=True, kw_only=True)
class Wiring:
    settings: Settings
    store: JobStore
    # `name:pid:random`, unique per process run: a restarted dispatcher never matches its
    # old leases.
    owner: str
    name: str  # `BROOK_DISPATCHER_NAME`, or the host name
    tasks: frozenset[str]  # the task names its workers run: it claims only those
    holdings: Holdings  # the jobs it holds, waiting for a worker or running
    clock: ServerClock
    spawn: Spawn  # a supervised task: a crash stops the dispatcher
    # Its tasks' default deadlines (`@task(..., start_within_s=, deadline_s=)`), by task: it
    # applies them to the jobs whose submit gave none.
    bounds: Defaults = field(default_factory=dict)
