"""Schedules: tick keys, declarations checked, a paused schedule."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from bson import DatetimeMS

from brook.common.domain.schedules import Schedule, ScheduleState, tick_key

PARIS = "Europe/Paris"


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def test_a_tick_key_names_the_schedule_and_the_instant_in_utc() -> None:
    paris = utc(2025, 3, 30, 1).astimezone(ZoneInfo(PARIS))
    assert tick_key("nightly", paris) == "schedule:nightly:2025-03-30T01:00:00+00:00"


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"tz": "Mars/Olympus"}, "unknown time zone"),
        ({"catch_up": "all"}, "catch_up must be one of latest, none"),
        ({"name": "has space"}, "a name is"),
        ({"payload": {"$where": 1}}, "must be strings that do not start with"),
        ({"payload": [1]}, "payload must be a dict"),
        ({"cron": "* * *"}, "3 fields"),
    ],
)
def test_a_bad_declaration_fails_naming_the_schedule(
    kwargs: dict[str, object], reason: str
) -> None:
    args: dict[str, object] = {"name": "s1", "cron": "* * * * *", "task": "noop"} | kwargs
    name, cron = args.pop("name"), args.pop("cron")
    with pytest.raises(ValueError, match=reason) as info:
        Schedule.declare(name, cron, **args)  # type: ignore[arg-type]
    assert str(info.value).startswith(f"schedule {name!r}: ")


def test_a_paused_schedule_has_no_next_run() -> None:
    doc = {"_id": "s", "cron": "* * * * * *", "task": "noop", "tz": "UTC", "paused": False}
    now = utc(2025, 1, 1)
    assert ScheduleState.from_doc(doc).to_api(now)["next_run"] == utc(2025, 1, 1, 0, 0, 1)
    assert ScheduleState.from_doc(doc | {"paused": True}).to_api(now)["next_run"] is None


def test_a_schedule_document_with_a_date_past_year_9999_reads_it_as_unknown() -> None:
    far = DatetimeMS(253402300800000)  # what a client reads for 10000-01-01
    state = ScheduleState.from_doc({"_id": "nightly", "last_tick": far, "resumed_at": "x"})
    assert state.last_tick is None and state.resumed_at is None
