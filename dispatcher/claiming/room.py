"""Room to claim in a target: how many more jobs it may lease now, given its workers, the
jobs it holds (claimed ahead or running) and how far ahead to claim (`Holdings.ahead`);
and the turns the targets take at it."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from brook.common.domain.models import Job
from brook.common.domain.queues import RATE_START_MARGIN_S
from brook.dispatcher.claiming.limits import Limits
from brook.dispatcher.wiring import Wiring

# A claim's target: one queue, or None for "every queue" (BROOK_QUEUES unset).
Target = str | None
# The tasks one claim may take (None: every task of the dispatcher; `task_scope`).
Scope = frozenset[str] | None


class Room:
    def __init__(self, wiring: Wiring, limits: Limits, free_workers: Callable[[], int]) -> None:
        """`free_workers`: the worker processes free now."""
        self.settings = wiring.settings
        self.holdings = wiring.holdings
        self.queues: Mapping[str, int] | None = wiring.settings.queues
        self.limits = limits
        self.free_workers = free_workers
        self.tasks = wiring.tasks
        # The tasks whose jobs share worker processes, and the seats free for them now (the
        # dispatcher sets both from its runner; none by default).
        self.shared: frozenset[str] = frozenset()
        self.free_seats: Callable[[str | None], int] = lambda task: 0

    def parts(self, target: Target, urgent: bool = False) -> list[tuple[Scope, int]]:
        """The claims to make in `target`, each scoped to some tasks, with its room: with
        no shared tasks, one for every task (the room of `of`). Else one for the tasks that
        take a process each, within the processes and their claims ahead (jobs of shared
        tasks not counted), and one for the shared tasks, within the free seats of each
        (and the queue's slots with `BROOK_QUEUES`, which count jobs, shared or not). No
        shared job is claimed ahead of its seat: prefetch stays sized by the processes, so
        a thousand free seats never mean a thousand jobs held here waiting."""
        shared = self.shared & self.tasks
        if not shared:
            return [(None, self.of(target, urgent))]
        plain = self.tasks - shared
        parts: list[tuple[Scope, int]] = []
        if plain:
            parts.append((plain, self.of(target, urgent, lambda j: j.task not in shared)))
        seats = {t: self.free_seats(t) for t in shared}
        open_tasks = frozenset(t for t, n in seats.items() if n > 0)
        waiting = self.holdings.count_claimed_ahead(lambda j: j.task in shared)
        room = min(self.free_seats(None), sum(seats.values())) - waiting
        if self.queues is not None and target is not None:
            room = min(room, self.workers(target) - self.active(target))
        if open_tasks:
            parts.append((open_tasks, room))
        return parts

    def total(self, target: Target, urgent: bool = False) -> int:
        return sum(max(room, 0) for _, room in self.parts(target, urgent))

    def workers(self, target: Target) -> int:
        """The workers of a target: its own with `BROOK_QUEUES`; without, the dispatcher's,
        which the limited queues share with the rest (`active`)."""
        if self.queues is None or target is None:
            return self.settings.worker_slots
        return self.queues.get(target, 0)

    def active(self, target: Target, which: Callable[[Job], bool] | None = None) -> int:
        return self.holdings.active(target if self.queues is not None else None, which)

    def _room(self, workers: int, active: int, urgent: bool) -> int:
        """Room for a target with `workers` workers holding `active` jobs claimed ahead or
        running: up to its workers plus how far ahead it claims (at most its prefetch). A
        target whose workers all have a job waits until half its buffer is free, so it
        refills the buffer in batches (one claim per several jobs), not one job per claim.
        For a job that outranks every job claimed ahead (`urgent`), room for one even in a
        full buffer, while it claims ahead at all: at most one lease over workers plus
        prefetch."""
        extra = self.holdings.ahead(workers, self.settings.prefetch_for(workers))
        room = workers + extra - active
        if urgent:
            return max(room, 1 if extra > 0 and active <= workers + extra else 0)
        if active >= workers and room < (extra + 1) // 2:
            return 0
        return room

    def of(
        self, target: Target, urgent: bool = False, which: Callable[[Job], bool] | None = None
    ) -> int:
        """Room for `target` now (`urgent`: for a job that outranks the jobs claimed ahead),
        counting the jobs held that `which` picks (default: all)."""
        room = self._room(self.workers(target), self.active(target, which), urgent)
        if self.limits.rated(target):
            # A rate counts claims, and a claimed job must start within a margin of its
            # claim (`Limits.latest_start`; it goes to a worker before any other): claim only
            # for the workers free now or soon by the recent tasks' pace.
            soon = self.holdings.frees_within(self.workers(target), RATE_START_MARGIN_S / 2)
            rated = self.holdings.count_claimed_ahead(
                lambda j: self.limits.latest_start(j) is not None
            )
            room = min(room, self.free_workers() + soon - rated)
        # A keyed queue claims ahead as any other: turns across keys decide what is claimed,
        # a new key's job is claimed at once, alone (`Claimer._new_key`), and the hand-off
        # starts the job whose key runs least here first (`Holdings.next_claimed_ahead`), so
        # a key's new job does not wait behind the buffer.
        return room



class TargetTurns:
    """The targets in turn order: one that claimed goes to the back, so targets that share
    the dispatcher's workers (every queue, without BROOK_QUEUES) take turns filling them,
    and no queue's backlog keeps another's jobs from being claimed."""

    def __init__(self) -> None:
        self._order: list[Target] = []

    def order(self, targets: set[Target]) -> list[Target]:
        """`targets` in turn order: the one that claimed longest ago first (new ones first of
        all, in a fixed order)."""
        new = sorted((t for t in targets if t not in self._order), key=lambda t: t or "")
        self._order = new + [t for t in self._order if t in targets]
        return list(self._order)

    def took(self, targets: list[Target]) -> None:
        """These targets claimed: each goes to the back of the turns."""
        self._order = [t for t in self._order if t not in targets] + targets
