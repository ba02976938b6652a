"""Cluster-wide queue limits: what a queue allows (concurrency, rate, pause), how a change
to them is validated, and the arithmetic on a queue's slot document that needs no database.

The state itself lives in `brook_queues` (`brook.common.store.queues`): one document per queue
that has ever been given a limit, holding the limits, the **slots** of claims in flight
and of running jobs, and the recent **starts** (for the rate).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from brook.common.domain.errors import InvalidInput, invalid_body
from brook.common.domain.models import QUEUE_NAME
from brook.common.domain.numbers import WHOLE

MAX_CONCURRENCY = 100_000
# The rate keeps one timestamp per start inside its window in the queue's document.
MAX_RATE_LIMIT = 10_000
MAX_RATE_SECONDS = 86_400.0
# A rate is kept on the claims' times (the server's clock), and a claimed job of a queue
# with a rate must start within this many seconds of its claim, or it is handed back
# (`dispatcher.claiming.queue_slots`). The window the claims are counted in is this much longer than
# `per_seconds`, so that the tasks' real starts (`started_at`) hold the rate too: no
# window of `per_seconds` holds more than `limit` of them.
RATE_START_MARGIN_S = 0.25

_QUEUE_NAME = re.compile(QUEUE_NAME)

# Why a claim got no slot: the queue is paused, its slots are all taken, its rate window is
# full, it has no limits at all (a stale view), or there is room after all (try again).
BlockReason = Literal["paused", "full", "rate", "unlimited", "room"]


@dataclass(frozen=True, kw_only=True)
class Rate:
    limit: int
    per_seconds: float

    def to_api(self) -> dict[str, Any]:
        return {"limit": self.limit, "per_seconds": self.per_seconds}

    def __str__(self) -> str:
        return f"{self.limit}/{self.per_seconds:g}s"


@dataclass(frozen=True, kw_only=True)
class QueueLimits:
    """What a queue allows. A queue with none of these is unlimited and costs nothing."""

    concurrency: int | None = None
    rate: Rate | None = None
    paused: bool = False
    # Per key (a job's `key`): running jobs at most, and starts per window, cluster-wide.
    key_concurrency: int | None = None
    key_rate: Rate | None = None
    # Claimed fairly across keys (round-robin) even without a per-key limit.
    fair: bool = False

    @property
    def limited(self) -> bool:
        """Claims for this queue go through its slots (a paused queue counts: it starts nothing)."""
        return self.concurrency is not None or self.rate is not None or self.paused or self.keyed

    @property
    def keyed(self) -> bool:
        """Claims for this queue take turns across keys (`dispatcher.claiming.limits`)."""
        return self.key_concurrency is not None or self.key_rate is not None or self.fair

    @property
    def slotless(self) -> bool:
        """Fair claiming and nothing to count (no concurrency or rate, on the queue or per
        key): claimed by turns across keys, without slots to take and give back."""
        return (
            self.fair
            and not self.paused
            and self.concurrency is None
            and self.rate is None
            and self.key_concurrency is None
            and self.key_rate is None
        )

    @property
    def slots_on_jobs(self) -> bool:
        """A per-key concurrency and nothing else to count (no queue-wide concurrency or
        rate, no per-key rate, not paused): each running job of a key holds one of its
        `key_concurrency` slots in its own document (`key_slot`, unique among running jobs
        by an index), taken by the claim and given back by the write that ends the attempt.
        No `brook_queues` slots to take, settle or give back."""
        return (
            self.key_concurrency is not None
            and not self.paused
            and self.concurrency is None
            and self.rate is None
            and self.key_rate is None
        )

    @property
    def rated(self) -> bool:
        """Starts are counted (a rate on the queue or per key): claims wait for a worker."""
        return self.rate is not None or self.key_rate is not None

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> QueueLimits:
        return cls(
            concurrency=doc.get("concurrency"),
            rate=_rate(doc.get("rate")),
            paused=bool(doc.get("paused", False)),
            key_concurrency=doc.get("key_concurrency"),
            key_rate=_rate(doc.get("key_rate")),
            fair=bool(doc.get("fair", False)),
        )


def _rate(doc: Mapping[str, Any] | None) -> Rate | None:
    if not doc:
        return None
    return Rate(limit=int(doc["limit"]), per_seconds=float(doc["per_seconds"]))


UNLIMITED = QueueLimits()


def key_slot(queue: str, key: str, index: int) -> str:
    """The `key_slot` a running job of `key` holds in `queue` (a queue name has no `:`)."""
    return f"{queue}:{index}:{key}"


class RateSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: Annotated[int, Strict(), Field(ge=1, le=MAX_RATE_LIMIT), WHOLE] = Field(
        description="starts per window"
    )
    # Strict: a JSON number (an int too), never a string or a boolean read as one; one type,
    # so the document carries its bounds (a union's bounds were left out of it).
    per_seconds: Annotated[float, Strict()] = Field(
        gt=0, le=MAX_RATE_SECONDS, description="the window, in seconds"
    )

    @field_validator("per_seconds")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return float(value)


# A number of running jobs at most (a JSON integer, `2.0` too).
Slots = Annotated[int, Strict(), Field(ge=1, le=MAX_CONCURRENCY), WHOLE]


def _true_or_false(schema: dict[str, Any]) -> None:
    """`paused` and `fair` may be left out, never null (as `_paused_is_a_bool` checks)."""
    schema.pop("anyOf", None)
    schema.pop("default", None)
    schema["type"] = "boolean"


class QueueUpdate(BaseModel):
    """The body of `PUT /queues/{name}`: each field given replaces that limit (`null` clears
    it); a field left out keeps its value."""

    model_config = ConfigDict(extra="forbid")

    concurrency: Slots | None = Field(
        default=None, description="running jobs at most; null: no limit"
    )
    rate: RateSpec | None = Field(default=None, description="starts per window; null: no limit")
    paused: bool | None = Field(
        default=None, description="true: nothing new starts", json_schema_extra=_true_or_false
    )
    key_concurrency: Slots | None = Field(
        default=None,
        description="running jobs per key (a job's `key`) at most; null: no limit",
    )
    key_rate: RateSpec | None = Field(
        default=None, description="starts per window per key; null: no limit"
    )
    fair: bool | None = Field(
        default=None,
        description="true: claims take turns across keys even without a key limit",
        json_schema_extra=_true_or_false,
    )

    @field_validator("paused", "fair", mode="before")
    @classmethod
    def _strict_bool(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value

    @model_validator(mode="after")
    def _paused_is_a_bool(self) -> QueueUpdate:
        for name in ("paused", "fair"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} must be true or false")
        return self

    def changes(self) -> dict[str, Any]:
        """The fields to write: only those the caller sent (`paused: null` is refused)."""
        out: dict[str, Any] = {}
        sent = self.model_fields_set
        if "concurrency" in sent:
            out["concurrency"] = self.concurrency
        if "rate" in sent:
            out["rate"] = None if self.rate is None else self.rate.model_dump()
        if "paused" in sent:
            out["paused"] = self.paused
        if "key_concurrency" in sent:
            out["key_concurrency"] = self.key_concurrency
        if "key_rate" in sent:
            out["key_rate"] = None if self.key_rate is None else self.key_rate.model_dump()
        if "fair" in sent:
            out["fair"] = self.fair
        return out


def validate_queue_update(name: str, body: Any) -> dict[str, Any]:
    """The fields a valid `PUT /queues/{name}` body changes; `InvalidInput` (the API's 422
    detail) otherwise. An empty body changes nothing and is valid."""
    if not isinstance(name, str) or not _QUEUE_NAME.fullmatch(name):
        raise InvalidInput(f"{name!r} is not a queue name (pattern {QUEUE_NAME})")
    if not isinstance(body, Mapping):
        raise InvalidInput("the body must be a JSON object")
    try:
        update = QueueUpdate.model_validate(dict(body))
    except ValidationError as exc:
        raise invalid_body(exc) from None
    return update.changes()


# -- a queue document, read -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class QueueSlot:
    """One slot of a limited queue, held for one job.

    A claim writes its slots first, each naming its job and the claim's `tag` (the job gets
    the same `claim_tag` when claimed), with `claim_by`: until then the claim may still land,
    so the slot counts whatever the job shows; it also counts as a start at `claim_by` (the
    latest the job can start) until the claim settles it with the real start. After
    `claim_by`, the slot is in use exactly while its job runs under its tag. A slot adopted
    for a job that was running before the queue had limits is matched by attempt instead.
    """

    job: str
    tag: str
    owner: str = ""
    claim_by: datetime | None = None
    attempt: int | None = None
    adopted: bool = False
    key: str | None = None  # the job's key: counted against the queue's per-key limits

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> QueueSlot:
        attempt = doc.get("attempt")
        return cls(
            key=doc.get("key"),
            job=str(doc["job"]),
            tag=str(doc["tag"]),
            owner=str(doc.get("owner", "")),
            claim_by=doc.get("claim_by"),
            attempt=int(attempt) if attempt is not None else None,
            adopted=bool(doc.get("adopted", False)),
        )

    def held_by(self, job: Mapping[str, Any] | None) -> bool:
        """Whether `job` (its stored fields) is running under this slot."""
        if job is None or job.get("status") != "running":
            return False
        if self.adopted:
            return job.get("attempts") == self.attempt
        return job.get("claim_tag") == self.tag

    def in_use(self, job: Mapping[str, Any] | None, now: datetime) -> bool:
        """In use: its claim may still land, or its job runs under it."""
        return (self.claim_by is not None and self.claim_by > now) or self.held_by(job)


@dataclass(frozen=True, kw_only=True)
class QueueDoc:
    name: str
    limits: QueueLimits
    slots: tuple[QueueSlot, ...] = ()
    starts: tuple[datetime, ...] = ()
    used: int = 0  # slots counted against the concurrency
    now: datetime | None = None  # the server's clock when read, when asked for
    key_starts: tuple[tuple[str, datetime], ...] = ()  # (key, start) in the key rate's window

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> QueueDoc:
        # A slot given back is a `null` where it stood until a take compacts the array.
        slots = tuple(QueueSlot.from_doc(s) for s in doc.get("slots") or () if s is not None)
        return cls(
            name=str(doc["_id"]),
            limits=QueueLimits.from_doc(doc),
            slots=slots,
            starts=tuple(doc.get("starts") or ()),
            used=int(doc.get("used", len(slots))),
            now=doc.get("now"),
            key_starts=tuple((str(k["key"]), k["at"]) for k in doc.get("key_starts") or ()),
        )

    def key_waits(self, keys: Iterable[str | None], now: datetime) -> dict[str, datetime | None]:
        """Of these keys, those that can start nothing now by the per-key limits, each with
        when it may again: None for a key at its `key_concurrency` (when a slot of it is
        released), the moment its rate window frees for one out of starts."""
        limits = self.limits
        out: dict[str, datetime | None] = {}
        per_key = Counter(s.key for s in self.slots if s.key is not None)
        window = (
            timedelta(seconds=limits.key_rate.per_seconds + RATE_START_MARGIN_S)
            if limits.key_rate is not None
            else None
        )
        for key in set(keys):
            if key is None:
                continue
            if limits.key_concurrency is not None and per_key[key] >= limits.key_concurrency:
                out[key] = None
                continue
            if window is None or limits.key_rate is None:
                continue
            recent = sorted(
                [at for k, at in self.key_starts if k == key and at > now - window]
                + [
                    s.claim_by
                    for s in self.slots
                    if s.key == key and s.claim_by is not None and s.claim_by > now - window
                ]
            )
            if len(recent) >= limits.key_rate.limit:
                out[key] = recent[len(recent) - limits.key_rate.limit] + window
        return out

    def window_starts(self, now: datetime) -> list[datetime]:
        """Starts that count in the rate window ending `now`: recorded starts, and each
        unsettled slot at its `claim_by` (the latest its job could have started)."""
        rate = self.limits.rate
        if rate is None:
            return []
        since = now - timedelta(seconds=rate.per_seconds + RATE_START_MARGIN_S)
        out = [s for s in self.starts if s > since]
        out += [s.claim_by for s in self.slots if s.claim_by is not None and s.claim_by > since]
        return sorted(out)

    def blocked(self, now: datetime) -> tuple[BlockReason, datetime | None]:
        """Why no slot can be taken at `now`, and for the rate, when the next one can: the
        moment enough starts have left the window."""
        limits = self.limits
        if not limits.limited:
            return "unlimited", None
        if limits.paused:
            return "paused", None
        if limits.concurrency is not None and self.used >= limits.concurrency:
            return "full", None
        rate = limits.rate
        if rate is not None:
            recent = self.window_starts(now)
            if len(recent) >= rate.limit:
                oldest = recent[len(recent) - rate.limit]
                return "rate", oldest + timedelta(seconds=rate.per_seconds + RATE_START_MARGIN_S)
        # Room now (a slot freed, or the window moved, since the claim looked): try again.
        return "room", now


def slot_usage(
    doc: QueueDoc, jobs: Mapping[str, Mapping[str, Any]], now: datetime
) -> tuple[int, list[QueueSlot]]:
    """The slots in use by the jobs' stored state at `now`, and those that are over."""
    dead = [s for s in doc.slots if not s.in_use(jobs.get(s.job), now)]
    return len(doc.slots) - len(dead), dead
