"""Cron schedules as Brook's code sees them: the declaration, and the cluster-wide state.

A `Schedule` is declared in a task module (`executor.schedule`) and run by every
dispatcher that loads the module; its `ScheduleState` is the `brook_schedules` document
those dispatchers keep in MongoDB (definition, `paused`, `last_tick`, `last_job_id`), which
is what the API lists and pauses. Each tick is one job whose idempotency key names the
schedule and the tick, so the unique index lets exactly one dispatcher create it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import bson

from brook.common.domain.cron import latest_tick, next_tick, parse_cron, zone
from brook.common.domain.models import Doc, as_count, as_date, is_queue_name

CatchUp = Literal["latest", "none"]
CATCH_UP: tuple[CatchUp, ...] = ("latest", "none")
# What a tick does while the schedule's previous run is unfinished (not in a terminal state).
Overlap = Literal["allow", "skip", "buffer_one", "cancel_other"]
OVERLAP: tuple[Overlap, ...] = ("allow", "skip", "buffer_one", "cancel_other")
# What one tick was decided to do, once for the cluster: a job (`run`), none (`skip`), a job
# waiting for the unfinished run (`buffer`), or one that waits for it after cancelling it
# (`replace`).
TickDecision = Literal["run", "skip", "buffer", "replace"]


def tick_decision(overlap: str, previous: str | None) -> TickDecision:
    """What a tick does under `overlap`, given the status of the schedule's newest run
    (None: there is none, or it has ended). A `waiting` newest run is one already buffered
    (a tick's job waits only for the run before it)."""
    if previous is None or overlap == "allow":
        return "run"
    if overlap == "skip":
        return "skip"
    if overlap == "buffer_one":
        return "skip" if previous == "waiting" else "buffer"
    return "replace"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")


TICK_KEY_PREFIX = "schedule:"


def tick_key(name: str, tick: datetime) -> str:
    """The idempotency key of one tick's job: `schedule:{name}:{tick in UTC, ISO-8601}`."""
    return f"{TICK_KEY_PREFIX}{name}:{tick.astimezone(UTC).isoformat()}"


def _check_payload(payload: Any) -> dict[str, Any]:
    if payload is None:
        return {}
    if not isinstance(payload, dict):
        raise ValueError(f"payload must be a dict, not {type(payload).__name__}")
    if any(not isinstance(k, str) or k.startswith("$") for k in payload):
        raise ValueError("payload keys must be strings that do not start with '$'")
    try:
        bson.encode({"payload": payload})
    except Exception as exc:  # bson raises several types for values it cannot encode
        raise ValueError(f"payload cannot be stored: {exc}") from None
    return payload


# The longest `start_within_s` or `deadline_s` a declaration may give: a year.
LONGEST_BOUND_S = 365 * 86400.0


def check_seconds(option: str, seconds: object) -> None:
    """A declaration's duration in seconds (None: not given): a positive number, at most a
    year; `ValueError` naming `option`."""
    if seconds is None:
        return
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"{option} must be a number of seconds")
    if not 0 < seconds <= LONGEST_BOUND_S:
        raise ValueError(f"{option} must be more than 0 and at most {LONGEST_BOUND_S:.0f}")


@dataclass(frozen=True, kw_only=True)
class Schedule:
    name: str
    cron: str
    task: str
    payload: dict[str, Any] = field(default_factory=dict)
    queue: str = "default"
    tz: str = "UTC"
    catch_up: CatchUp = "latest"
    overlap: Overlap = "allow"
    # Each tick's job's `start_within_s` and `deadline_s` (counted from its submit).
    start_within_s: float | None = None
    deadline_s: float | None = None

    @classmethod
    def declare(
        cls,
        name: str,
        cron: str,
        *,
        task: str,
        payload: dict[str, Any] | None = None,
        queue: str = "default",
        tz: str = "UTC",
        catch_up: str = "latest",
        overlap: str = "allow",
        start_within_s: float | None = None,
        deadline_s: float | None = None,
    ) -> Schedule:
        """A checked schedule; `ValueError` naming the schedule and what is wrong."""
        try:
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise ValueError(
                    "a name is 1-100 letters, digits and _ . : - (a letter or digit first)"
                )
            if not isinstance(task, str) or not task:
                raise ValueError("task must be a task name")
            if not is_queue_name(queue):
                raise ValueError("queue must be a queue name (letters, digits, '_', '.', '-')")
            if catch_up not in CATCH_UP:
                raise ValueError(f"catch_up must be one of {', '.join(CATCH_UP)}, not {catch_up!r}")
            if overlap not in OVERLAP:
                raise ValueError(f"overlap must be one of {', '.join(OVERLAP)}, not {overlap!r}")
            zone(tz)
            for option, seconds in (("start_within_s", start_within_s), ("deadline_s", deadline_s)):
                check_seconds(option, seconds)
            return cls(
                name=name,
                cron=parse_cron(cron),
                task=task,
                payload=_check_payload(payload),
                queue=queue,
                tz=tz,
                catch_up=catch_up,
                overlap=overlap,
                start_within_s=start_within_s,
                deadline_s=deadline_s,
            )
        except ValueError as exc:
            raise ValueError(f"schedule {name!r}: {exc}") from None

    def next_tick(self, after: datetime) -> datetime:
        return next_tick(self.cron, self.tz, after)

    def latest_tick(self, at: datetime) -> datetime | None:
        return latest_tick(self.cron, self.tz, at)

    def key(self, tick: datetime) -> str:
        return tick_key(self.name, tick)

    def definition(self) -> Doc:
        """The fields a dispatcher writes into the schedule's document when it starts."""
        return {
            "cron": self.cron,
            "task": self.task,
            "payload": self.payload,
            "queue": self.queue,
            "tz": self.tz,
            "catch_up": self.catch_up,
            "overlap": self.overlap,
        }


@dataclass(frozen=True, kw_only=True)
class ScheduleState:
    """A schedule's document in `brook_schedules`: its definition as last declared by a
    dispatcher, and the state every dispatcher shares."""

    name: str
    cron: str
    task: str
    payload: dict[str, Any]
    queue: str
    tz: str
    catch_up: str
    paused: bool
    last_tick: datetime | None
    last_job_id: str | None
    resumed_at: datetime | None
    declared_at: datetime | None
    overlap: str = "allow"
    # The tick of the newest run (the newest tick decided to make a job), and how many ticks
    # were skipped by `overlap`: kept for schedules whose `overlap` is not `allow`.
    run_tick: datetime | None = None
    skipped: int = 0

    @classmethod
    def from_doc(cls, doc: Doc) -> ScheduleState:
        return cls(
            name=str(doc["_id"]),
            cron=doc.get("cron", ""),
            task=doc.get("task", ""),
            payload=doc.get("payload") or {},
            queue=doc.get("queue", "default"),
            tz=doc.get("tz", "UTC"),
            catch_up=doc.get("catch_up", "latest"),
            paused=bool(doc.get("paused", False)),
            last_tick=as_date(doc.get("last_tick")),
            last_job_id=doc.get("last_job_id"),
            resumed_at=as_date(doc.get("resumed_at")),
            declared_at=as_date(doc.get("declared_at")),
            overlap=str(doc.get("overlap", "allow")),
            run_tick=as_date(doc.get("run_tick")),
            skipped=as_count(doc.get("skipped")),
        )

    def next_run(self, now: datetime) -> datetime | None:
        """When the next tick comes, or None while paused."""
        if self.paused:
            return None
        try:
            return next_tick(self.cron, self.tz, now)
        except ValueError:  # a definition this version cannot read (croniter's errors too)
            return None

    def to_api(self, now: datetime) -> dict[str, Any]:
        return {
            "name": self.name,
            "cron": self.cron,
            "task": self.task,
            "tz": self.tz,
            "paused": self.paused,
            "next_run": self.next_run(now),
            "last_job_id": self.last_job_id,
            "last_tick": self.last_tick,
            "payload": self.payload,
            "queue": self.queue,
            "catch_up": self.catch_up,
            "overlap": self.overlap,
            "skipped": self.skipped,
            "declared_at": self.declared_at,
        }
