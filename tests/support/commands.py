"""Counting the commands a MongoDB client sends (a pymongo command listener)."""

from __future__ import annotations

from collections import Counter

from pymongo import monitoring


class CommandCounter(monitoring.CommandListener):
    """Counts started commands by (name, collection), and keeps each write's statements."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.statements: list[int] = []  # per `update`/`insert` command: how many it carried

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        name = event.command_name
        target = event.command.get(name)
        self.counts[(name, target if isinstance(target, str) else "")] += 1
        if name in ("update", "insert"):
            docs = event.command.get("updates") or event.command.get("documents") or []
            self.statements.append(len(docs))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def of(self, name: str, collection: str = "jobs") -> int:
        return self.counts[(name, collection)]

    def reset(self) -> None:
        self.counts.clear()
        self.statements.clear()
