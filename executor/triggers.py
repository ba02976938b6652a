"""Triggers, declared in task modules next to their tasks::

    from brook import task, trigger

    @task("send_receipt")
    def send_receipt(change): ...

    trigger("receipts", collection="orders", operations=["insert", "update"],
            match={"fullDocument.status": "paid"}, task="send_receipt")

Declaring records the trigger and checks it at once (a bad name, operation or match fails
the import). Every dispatcher that loads the module may follow it, one at a time; a
dispatcher whose triggers name a task it does not have, or watch a collection Brook itself
uses, refuses to start with one line saying so.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from brook.common.domain.errors import ConfigError
from brook.common.domain.triggers import OPERATIONS, Trigger

_TRIGGERS: dict[str, Trigger] = {}


def trigger(
    name: str,
    *,
    collection: str,
    task: str,
    operations: Sequence[str] = OPERATIONS,
    match: dict[str, Any] | None = None,
    db: str | None = None,
    full_document: str | None = "updateLookup",
    queue: str = "default",
    max_attempts: int = 3,
) -> Trigger:
    """Make one job of `task` for each change to `collection` (in database `db`, default
    Brook's own) whose operation is in `operations` and that `match` (a `$match` on the
    change event, e.g. `{"fullDocument.status": "paid"}`) selects. The task's payload is
    the change: `operation`, `document_key`, `full_document` (for an update, the document
    as it is when the change is read with `full_document="updateLookup"`, the default;
    None for a delete, or for an update with `full_document=None`) and, for an update,
    `update_description`."""
    declared = Trigger.declare(
        name,
        collection=collection,
        operations=operations,
        match=match,
        task=task,
        db=db,
        full_document=full_document,
        queue=queue,
        max_attempts=max_attempts,
    )
    existing = _TRIGGERS.get(name)
    if existing is not None and existing != declared:
        raise ValueError(f"trigger {name!r} is already declared as {existing}")
    _TRIGGERS[name] = declared
    return declared


def declared_triggers(known_tasks: Collection[str], brook_db: str) -> tuple[Trigger, ...]:
    """The triggers the loaded task modules declared, by name; `ConfigError` (one line)
    for one whose task is not registered or that watches one of Brook's own collections."""
    out = tuple(sorted(_TRIGGERS.values(), key=lambda t: t.name))
    for t in out:
        problem = t.problem(known_tasks, brook_db)
        if problem is not None:
            raise ConfigError(problem)
    return out
