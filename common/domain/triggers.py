"""Triggers as Brook's code sees them: the declaration, the change a job is made from, and
the cluster-wide state.

A `Trigger` is declared in a task module (`executor.trigger`): a change stream on an
application's collection, filtered by operation and by a `$match` on the change event;
each matching change becomes one job of `task`, whose payload is the change
(`change_payload`) and whose idempotency key names the trigger and the change's own id
(`change_key`), so a change seen twice (a takeover replays from the saved token) makes
one job. Its `TriggerState` is the `brook_triggers` document the dispatchers share
(follower, lease, saved resume token, jobs made, changes skipped, paused, history lost).

A change that cannot become a job is skipped, and recorded (`SkippedChange`): one that
cannot be read (a string that is not UTF-8, say), one whose job would be over
`MAX_JOB_BYTES`, one MongoDB refuses to store as a job (nested too deeply, say), or one
whose payload cannot be built at all. The trigger goes on past it: a poison change never
stops it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import bson

from brook.common.domain.models import Doc, as_count, as_date, is_queue_name

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")
COLLECTION = re.compile(r"^[^$\x00]{1,200}$")
OPERATIONS = ("insert", "update", "replace", "delete")
FullDocument = Literal["updateLookup"] | None
TRIGGER_KEY_PREFIX = "trigger:"
# The largest job a trigger makes, as BSON: MongoDB holds at most 16 MiB in a document, and
# the job must keep room for what Brook adds to it while it runs (its claims, its history,
# an error). A change whose job would be larger is skipped. (A task's result that does not
# fit beside its payload fails the job then, as for any job.)
MAX_JOB_BYTES = 16 * 1024 * 1024 - 256 * 1024

# The top-level fields of a change event a `match` may filter on.
CHANGE_FIELDS = frozenset(
    {
        "operationType",
        "fullDocument",
        "documentKey",
        "updateDescription",
        "ns",
        "clusterTime",
        "wallTime",
        "txnNumber",
        "lsid",
    }
)
# Query operators a change stream's `$match` accepts (no `$where`, `$text`, `$near`).
OPERATORS = frozenset(
    {
        "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin",
        "$and", "$or", "$nor", "$not",
        "$exists", "$type", "$regex", "$options", "$mod", "$size", "$all", "$elemMatch",
        "$expr", "$jsonSchema", "$comment",
        "$bitsAllSet", "$bitsAnySet", "$bitsAllClear", "$bitsAnyClear",
    }
)  # fmt: skip
_LOGICAL = ("$and", "$or", "$nor")


def brook_collection(name: str) -> bool:
    """Whether `name` is a collection Brook itself uses in its database (the jobs, every
    `brook_*` collection) or a system one."""
    return name == "jobs" or name.startswith(("brook_", "system."))


def change_key(name: str, change_id: Mapping[str, Any]) -> str:
    """The idempotency key of the job a change makes: the trigger and the change's own id
    (its resume token), the same on every member and on every replay."""
    return f"{TRIGGER_KEY_PREFIX}{name}:{change_id['_data']}"


def token_time(token: Mapping[str, Any] | None) -> datetime | None:
    """The cluster time a resume token stands at, or None if it cannot be read. A token's
    `_data` is a KeyString whose first value is that timestamp: type byte 0x82, then the
    seconds and the increment, 4 bytes each, big-endian."""
    data = (token or {}).get("_data")
    if not isinstance(data, str) or len(data) < 18 or not data.startswith("82"):
        return None
    try:
        return datetime.fromtimestamp(int(data[2:10], 16), UTC)
    except ValueError:
        return None


def _check_match(match: Any, path: str = "match", top: bool = True) -> None:
    if not isinstance(match, dict):
        raise ValueError(f"{path} must be a dict (a $match on the change event)")
    for key, value in match.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{path} has a key that is not a non-empty string")
        if key.startswith("$"):
            if key not in OPERATORS:
                raise ValueError(f"{path} uses {key!r}, not a query operator a change stream takes")
            if key in _LOGICAL:
                if not isinstance(value, list) or not value:
                    raise ValueError(f"{path}.{key} must be a non-empty list of filters")
                for i, sub in enumerate(value):
                    _check_match(sub, f"{path}.{key}[{i}]", top)
            continue
        if top and key.split(".", 1)[0] not in CHANGE_FIELDS:
            raise ValueError(
                f"{path} key {key!r} is not a field of the change event: a filter on the "
                f"document is 'fullDocument.{key}' (fields: {', '.join(sorted(CHANGE_FIELDS))})"
            )
        if isinstance(value, dict):
            _check_operators(value, f"{path}.{key}")


def _check_operators(value: dict[str, Any], path: str) -> None:
    for key, sub in value.items():
        if isinstance(key, str) and key.startswith("$"):
            if key not in OPERATORS:
                raise ValueError(f"{path} uses {key!r}, not a query operator a change stream takes")
            if isinstance(sub, dict) and key in ("$not", "$elemMatch"):
                _check_operators(sub, f"{path}.{key}")


@dataclass(frozen=True, kw_only=True)
class Trigger:
    name: str
    collection: str
    operations: tuple[str, ...]
    match: dict[str, Any]
    task: str
    db: str | None = None  # None: Brook's own database (BROOK_DB)
    full_document: FullDocument = "updateLookup"
    queue: str = "default"
    max_attempts: int = 3

    @classmethod
    def declare(
        cls,
        name: str,
        *,
        collection: str,
        operations: Sequence[str] = OPERATIONS,
        match: dict[str, Any] | None = None,
        task: str,
        db: str | None = None,
        full_document: str | None = "updateLookup",
        queue: str = "default",
        max_attempts: int = 3,
    ) -> Trigger:
        """A checked trigger; `ValueError` naming the trigger and what is wrong."""
        try:
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise ValueError(
                    "a name is 1-100 letters, digits and _ . : - (a letter or digit first)"
                )
            if not isinstance(collection, str) or not COLLECTION.fullmatch(collection):
                raise ValueError("collection must be a collection name")
            if db is not None and (not isinstance(db, str) or not COLLECTION.fullmatch(db)):
                raise ValueError("db must be a database name or None (Brook's own)")
            if not isinstance(task, str) or not task:
                raise ValueError("task must be a task name")
            if isinstance(operations, str) or not operations:
                raise ValueError(f"operations must be a non-empty list of {', '.join(OPERATIONS)}")
            bad = [op for op in operations if op not in OPERATIONS]
            if bad:
                raise ValueError(f"unknown operations {bad}; known: {', '.join(OPERATIONS)}")
            if full_document not in ("updateLookup", None):
                raise ValueError(
                    f"full_document must be 'updateLookup' or None, not {full_document!r}"
                )
            if not is_queue_name(queue):
                raise ValueError("queue must be a queue name (letters, digits, '_', '.', '-')")
            if not isinstance(max_attempts, int) or max_attempts < 1:
                raise ValueError("max_attempts must be an int >= 1")
            match = {} if match is None else match
            _check_match(match)
            try:
                bson.encode({"match": match})
            except Exception as exc:  # bson raises several types for values it cannot encode
                raise ValueError(f"match cannot be sent to MongoDB: {exc}") from None
            return cls(
                name=name,
                collection=collection,
                operations=tuple(dict.fromkeys(operations)),
                match=match,
                task=task,
                db=db,
                full_document="updateLookup" if full_document else None,
                queue=queue,
                max_attempts=max_attempts,
            )
        except ValueError as exc:
            raise ValueError(f"trigger {name!r}: {exc}") from None

    def problem(self, known_tasks: Collection[str], brook_db: str) -> str | None:
        """What makes this trigger unusable in a deployment whose database is `brook_db`
        with these tasks (one line), or None."""
        if self.task not in known_tasks:
            known = ", ".join(sorted(known_tasks)) or "(none)"
            return f"trigger {self.name!r} names unknown task {self.task!r}; known tasks: {known}"
        if (self.db is None or self.db == brook_db) and brook_collection(self.collection):
            return (
                f"trigger {self.name!r} watches {self.collection!r}, a collection Brook itself "
                f"uses in database {brook_db!r}; triggers follow your own collections"
            )
        if self.db in ("admin", "local", "config"):
            return f"trigger {self.name!r} watches the system database {self.db!r}"
        return None

    def definition(self) -> Doc:
        """The fields a dispatcher writes into the trigger's document when it starts (the
        match as JSON text: its `$` keys are no field names for a stored document)."""
        return {
            "collection": self.collection,
            "db": self.db,
            "operations": list(self.operations),
            "match": json.dumps(self.match, sort_keys=True, default=str),
            "task": self.task,
            "full_document": self.full_document,
            "queue": self.queue,
        }


def change_payload(trigger: Trigger, change: Mapping[str, Any]) -> dict[str, Any]:
    """What the task receives: the change's operation, document key and (where the operation
    has one) full document, its update description, namespace and cluster time."""
    ns = change.get("ns") or {}
    update = change.get("updateDescription")
    payload: dict[str, Any] = {
        "trigger": trigger.name,
        "operation": change.get("operationType"),
        "document_key": change.get("documentKey"),
        "full_document": change.get("fullDocument"),
        "db": ns.get("db"),
        "collection": ns.get("coll"),
        "cluster_time": change.get("wallTime"),
    }
    if update is not None:
        payload["update_description"] = {
            "updated_fields": update.get("updatedFields") or {},
            "removed_fields": list(update.get("removedFields") or []),
        }
    return payload


@dataclass(frozen=True, kw_only=True)
class SkippedChange:
    """A change that could not become a job: its id (its resume token's `_data`), its
    operation and its document's `_id` (as text) when they could be read, and why (one
    line)."""

    change_id: str
    operation: str | None
    document_id: str | None
    reason: str

    def to_doc(self) -> Doc:
        return {
            "change_id": self.change_id,
            "operation": self.operation,
            "document_id": self.document_id,
            "reason": self.reason,
        }


def document_id(change: Mapping[str, Any]) -> str | None:
    """The changed document's `_id`, as text (for a log line), if the change names one."""
    key = change.get("documentKey")
    return str(key["_id"]) if isinstance(key, Mapping) and "_id" in key else None


@dataclass(frozen=True, kw_only=True)
class TriggerState:
    """A trigger's document in `brook_triggers`."""

    name: str
    definition: Doc
    paused: bool
    follower: str | None
    lease_expires_at: datetime | None
    token: Mapping[str, Any] | None
    handled_through: datetime | None  # the cluster time its saved token stands at
    last_change_at: datetime | None  # the cluster time of the last change it made a job of
    jobs_made: int
    skipped: int  # changes that could not become a job, counted as the token moved past them
    # The last of them: `change_id`, `operation`, `document_id`, `reason`, and `at` (the
    # server's time).
    last_skipped: Doc | None
    history_lost: int
    history_lost_at: datetime | None
    start_at: Any  # the cluster time (a bson Timestamp) a trigger without a token starts at

    @classmethod
    def from_doc(cls, doc: Doc) -> TriggerState:
        return cls(
            name=str(doc["_id"]),
            definition={
                k: doc.get(k)
                for k in ("collection", "db", "operations", "match", "task", "full_document")
            },
            paused=bool(doc.get("paused", False)),
            follower=doc.get("follower") if isinstance(doc.get("follower"), str) else None,
            lease_expires_at=as_date(doc.get("lease_expires_at")),
            token=doc.get("token") if isinstance(doc.get("token"), Mapping) else None,
            handled_through=as_date(doc.get("handled_through")),
            last_change_at=as_date(doc.get("last_change_at")),
            jobs_made=as_count(doc.get("jobs_made")),
            skipped=as_count(doc.get("skipped")),
            last_skipped=doc.get("last_skipped"),
            history_lost=as_count(doc.get("history_lost")),
            history_lost_at=as_date(doc.get("history_lost_at")),
            start_at=doc.get("start_at"),
        )

    def to_api(self, now: datetime) -> dict[str, Any]:
        """`lag_s`: the server's time now minus the cluster time the trigger has handled
        every change up to (None before its first save)."""
        following = self.lease_expires_at is not None and self.lease_expires_at > now
        lag = None
        if self.handled_through is not None:
            lag = round(max((now - self.handled_through).total_seconds(), 0.0), 3)
        try:
            match = json.loads(self.definition.get("match") or "{}")
        except ValueError:
            match = None
        return {
            "name": self.name,
            **self.definition,
            "match": match,
            "paused": self.paused,
            "follower": self.follower if following else None,
            "lease_expires_at": self.lease_expires_at,
            "lag_s": lag,
            "handled_through": self.handled_through,
            "last_change_at": self.last_change_at,
            "jobs_made": self.jobs_made,
            "skipped": self.skipped,
            "last_skipped": self.last_skipped,
            "history_lost": self.history_lost,
            "history_lost_at": self.history_lost_at,
        }
