"""Cluster-wide queue limits: what a queue allows (concurrency, rate, pause), how a change
to them is validated, and the arithmetic on a queue's slot document that needs no database.

The state itself lives in `brook_queues` (`common.queues_store`): one document per queue
that has ever been given a limit, holding the limits, the **tickets** of claims in flight,
the **slots** held by running jobs, and the recent **starts** (for the rate).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from common.errors import InvalidInput
from common.settings import QUEUE_NAME

MAX_CONCURRENCY = 100_000
# The rate keeps one timestamp per start inside its window in the queue's document.
MAX_RATE_LIMIT = 10_000
MAX_RATE_SECONDS = 86_400.0

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

    @property
    def limited(self) -> bool:
        """Claims for this queue go through its slots (a paused queue counts: it starts nothing)."""
        return self.concurrency is not None or self.rate is not None or self.paused

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> QueueLimits:
        rate = doc.get("rate")
        return cls(
            concurrency=doc.get("concurrency"),
            rate=Rate(limit=int(rate["limit"]), per_seconds=float(rate["per_seconds"]))
            if rate
            else None,
            paused=bool(doc.get("paused", False)),
        )


UNLIMITED = QueueLimits()


class RateSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: StrictInt = Field(ge=1, le=MAX_RATE_LIMIT, description="starts per window")
    per_seconds: StrictInt | StrictFloat = Field(
        gt=0, le=MAX_RATE_SECONDS, description="the window, in seconds"
    )

    @field_validator("per_seconds")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return float(value)


class QueueUpdate(BaseModel):
    """The body of `PUT /queues/{name}`: each field given replaces that limit (`null` clears
    it); a field left out keeps its value."""

    model_config = ConfigDict(extra="forbid")

    concurrency: StrictInt | None = Field(
        default=None, ge=1, le=MAX_CONCURRENCY, description="running jobs at most; null: no limit"
    )
    rate: RateSpec | None = Field(default=None, description="starts per window; null: no limit")
    paused: bool | None = Field(default=None, description="true: nothing new starts")

    @field_validator("paused", mode="before")
    @classmethod
    def _strict_bool(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value

    @model_validator(mode="after")
    def _paused_is_a_bool(self) -> QueueUpdate:
        if "paused" in self.model_fields_set and self.paused is None:
            raise ValueError("paused must be true or false")
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
        return out


def validate_queue_update(name: str, body: Any) -> dict[str, Any]:
    """The fields a valid `PUT /queues/{name}` body changes; `InvalidInput` (the API's 422
    detail) otherwise. An empty body changes nothing and is valid."""
    if not isinstance(name, str) or not _QUEUE_NAME.match(name):
        raise InvalidInput(f"{name!r} is not a queue name (pattern {QUEUE_NAME})")
    if not isinstance(body, Mapping):
        raise InvalidInput("the body must be a JSON object")
    try:
        # As FastAPI validates the API's body (`from_attributes`): the same messages.
        update = QueueUpdate.model_validate(dict(body), from_attributes=True)
    except ValidationError as exc:
        raise InvalidInput(
            [
                {"loc": ["body", *e.get("loc", ())], "msg": e.get("msg"), "type": e.get("type")}
                for e in exc.errors()
            ]
        ) from None
    return update.changes()


# -- a queue document, read -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Ticket:
    """A claim in flight: `n` slots taken for the jobs listed, to be claimed before `claim_by`
    (the server's clock). Until settled it counts `n` slots, and `n` starts at `claim_by`."""

    id: str
    owner: str
    n: int
    jobs: tuple[str, ...]
    claim_by: datetime

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Ticket:
        return cls(
            id=str(doc["id"]),
            owner=str(doc.get("owner", "")),
            n=int(doc["n"]),
            jobs=tuple(str(j) for j in doc.get("jobs") or ()),
            claim_by=doc["claim_by"],
        )


@dataclass(frozen=True, kw_only=True)
class SlotEntry:
    """A slot held by one running attempt: `tag` is the claim's token, also written on the
    job (`claim_tag`); an adopted entry (a job already running when the limit came) is
    matched by attempt alone."""

    job: str
    attempt: int
    tag: str
    adopted: bool = False

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> SlotEntry:
        return cls(
            job=str(doc["job"]),
            attempt=int(doc["attempt"]),
            tag=str(doc["tag"]),
            adopted=bool(doc.get("adopted", False)),
        )

    def held_by(self, job: Mapping[str, Any] | None) -> bool:
        """Whether `job` (its stored fields) is still running under this slot."""
        if job is None or job.get("status") != "running" or job.get("attempts") != self.attempt:
            return False
        return self.adopted or job.get("claim_tag") == self.tag


@dataclass(frozen=True, kw_only=True)
class QueueDoc:
    name: str
    limits: QueueLimits
    tickets: tuple[Ticket, ...]
    slots: tuple[SlotEntry, ...]
    starts: tuple[datetime, ...]
    now: datetime | None = None  # the server's clock when read, when asked for

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> QueueDoc:
        return cls(
            name=str(doc["_id"]),
            limits=QueueLimits.from_doc(doc),
            tickets=tuple(Ticket.from_doc(t) for t in doc.get("tickets") or ()),
            slots=tuple(SlotEntry.from_doc(s) for s in doc.get("slots") or ()),
            starts=tuple(doc.get("starts") or ()),
            now=doc.get("now"),
        )

    @property
    def used(self) -> int:
        """Slots counted against the concurrency: tickets in flight plus held slots."""
        return sum(t.n for t in self.tickets) + len(self.slots)

    def window_starts(self, now: datetime) -> list[datetime]:
        """Starts that count in the rate window ending `now`: recorded starts, and each
        unsettled ticket's `n` at its `claim_by` (the latest its jobs could have started)."""
        rate = self.limits.rate
        if rate is None:
            return []
        since = now - timedelta(seconds=rate.per_seconds)
        out = [s for s in self.starts if s > since]
        for t in self.tickets:
            if t.claim_by > since:
                out += [t.claim_by] * t.n
        return sorted(out)

    def blocked(self) -> tuple[BlockReason, datetime | None]:
        """Why no slot can be taken now (read with the server's `now`), and for the rate,
        when the next one can: the moment enough starts leave the window."""
        limits = self.limits
        if not limits.limited:
            return "unlimited", None
        if limits.paused:
            return "paused", None
        if limits.concurrency is not None and self.used >= limits.concurrency:
            return "full", None
        assert self.now is not None, "read the queue with the server's clock"
        rate = limits.rate
        if rate is not None:
            recent = self.window_starts(self.now)
            if len(recent) >= rate.limit:
                oldest = recent[len(recent) - rate.limit]
                return "rate", oldest + timedelta(seconds=rate.per_seconds)
        # Room now (a slot freed, or the window moved, since the claim looked): try again.
        return "room", self.now


def live_slots(
    doc: QueueDoc, jobs: Mapping[str, Mapping[str, Any]], now: datetime
) -> tuple[int, list[SlotEntry], list[Ticket]]:
    """Slots in use by the jobs' stored state: (in use, dead slot entries, stale tickets).
    A ticket still before its `claim_by` is in use as it is; a stale one counts the jobs
    it really claimed (running with its tag)."""
    in_use = 0
    dead: list[SlotEntry] = []
    stale: list[Ticket] = []
    for entry in doc.slots:
        if entry.held_by(jobs.get(entry.job)):
            in_use += 1
        else:
            dead.append(entry)
    for ticket in doc.tickets:
        if ticket.claim_by > now:
            in_use += ticket.n
            continue
        stale.append(ticket)
        in_use += len(won_by(ticket, jobs))
    return in_use, dead, stale


def won_by(ticket: Ticket, jobs: Mapping[str, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The jobs a ticket's claim took, by their stored state."""
    out = []
    for job_id in ticket.jobs:
        job = jobs.get(job_id)
        if job is not None and job.get("status") == "running" and job.get("claim_tag") == ticket.id:
            out.append(job)
    return out


def slot_ids(doc: QueueDoc) -> Sequence[str]:
    """Every job id a queue's slots and tickets name."""
    ids = {s.job for s in doc.slots}
    for t in doc.tickets:
        ids.update(t.jobs)
    return sorted(ids)
