"""Cron ticks: `croniter` reads the expression, `zoneinfo` the time zone; ticks come out in UTC.

An expression has 5 fields (minute hour day-of-month month day-of-week) or 6, the sixth
(last) being seconds, as `croniter` reads them by default: `* * * * * */10` is every ten
seconds, `0 * * * * 30` is at second 30 of every hour's first minute (and `*/10 * * * * *`
is every second of every tenth minute, not every ten seconds).

Ticks are wall-clock times in the schedule's zone, so DST changes follow the zone:
- a *fixed-time* expression (neither its minute nor its hour field starts with `*`, as
  Vixie cron defines it) runs once per matching wall-clock time: a time skipped by a
  spring-forward jump (02:30 in Europe/Paris on the last Sunday of March) runs at the
  first moment after the gap (03:00), and a time that happens twice on a fall-back day
  runs the first time only (`croniter` alone would run it twice);
- a *wildcard* expression (`*/15 * * * *`, `0 * * * *`, `* * * * * *`) follows real time:
  every hour that really happens gets its tick, and none is made up for the gap.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

FIELD_COUNTS = (5, 6)
_EPSILON = timedelta(microseconds=1)
# A fixed time repeated on a fall-back day is skipped; no expression needs more steps.
_MAX_SKIPS = 8


def parse_cron(expr: str) -> str:
    """The expression, normalised (single spaces); `ValueError` with a readable reason."""
    if not isinstance(expr, str):
        raise ValueError(f"cron must be a string, not {type(expr).__name__}")
    fields = expr.split()
    if len(fields) not in FIELD_COUNTS:
        raise ValueError(
            f"cron {expr!r} has {len(fields)} fields; it needs 5 (minute hour day month "
            "weekday) or 6 (the same, then seconds)"
        )
    normalised = " ".join(fields)
    if not croniter.is_valid(normalised):
        raise ValueError(f"cron {expr!r} is not a valid expression")
    try:
        next_tick(normalised, "UTC", datetime.now(UTC))
    except CroniterBadDateError:
        raise ValueError(f"cron {expr!r} never fires") from None
    return normalised


def zone(tz: str) -> ZoneInfo:
    """The IANA time zone `tz`; `ValueError` if there is none by that name."""
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(
            f"unknown time zone {tz!r} (use an IANA name like 'Europe/Paris')"
        ) from None


def _fixed_time(expr: str) -> bool:
    minute, hour = expr.split()[:2]
    return not (minute.startswith("*") or hour.startswith("*"))


def _repeat(t: datetime, tz: ZoneInfo) -> bool:
    """`t` is the second occurrence of a wall-clock time (the repeated hour of a fall-back)."""
    local = t.astimezone(tz)
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


def _canonical(expr: str, tz: ZoneInfo, t: datetime) -> bool:
    return not (_fixed_time(expr) and _repeat(t, tz))


def next_tick(expr: str, tz: str, after: datetime) -> datetime:
    """The first tick strictly after `after` (UTC)."""
    where = zone(tz)
    it = croniter(expr, after.astimezone(where))
    for _ in range(_MAX_SKIPS):
        t = it.get_next(datetime).astimezone(UTC)
        if _canonical(expr, where, t):
            return t
    raise CroniterBadDateError(f"no tick of {expr!r} after {after.isoformat()}")


def latest_tick(expr: str, tz: str, at: datetime) -> datetime | None:
    """The last tick at or before `at` (UTC), or None if there is none: one of the very
    instants `next_tick` yields, so both agree on every tick's identity."""
    where = zone(tz)
    it = croniter(expr, (at + _EPSILON).astimezone(where))  # get_prev is strict
    try:
        t = it.get_prev(datetime).astimezone(UTC)
        for _ in range(_MAX_SKIPS):
            if _canonical(expr, where, t):
                break
            t = it.get_prev(datetime).astimezone(UTC)
    except CroniterBadDateError:
        return None
    # Walking backwards across a DST change may land before a tick `next_tick` knows of.
    while (later := next_tick(expr, tz, t)) <= at:
        t = later
    return t
