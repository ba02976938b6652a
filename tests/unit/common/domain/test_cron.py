"""Cron ticks: field counts, seconds, time zones and DST."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from brook.common.domain.cron import latest_tick, next_tick, parse_cron

PARIS = "Europe/Paris"


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def ticks(expr: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    out, t = [], start
    while (t := next_tick(expr, tz, t)) <= end:
        out.append(t)
    return out


def test_five_fields_are_minute_hour_day_month_weekday() -> None:
    assert next_tick("30 2 * * *", "UTC", utc(2025, 1, 1)) == utc(2025, 1, 1, 2, 30)


def test_a_sixth_field_is_seconds_and_comes_last() -> None:
    assert ticks("* * * * * */10", "UTC", utc(2025, 1, 1), utc(2025, 1, 1, 0, 0, 30)) == [
        utc(2025, 1, 1, 0, 0, 10),
        utc(2025, 1, 1, 0, 0, 20),
        utc(2025, 1, 1, 0, 0, 30),
    ]
    assert next_tick("0 * * * * 30", "UTC", utc(2025, 1, 1)) == utc(2025, 1, 1, 0, 0, 30)
    # Seconds first would read this as every 10 seconds; seconds last, it is every second
    # of every tenth minute.
    assert next_tick("*/10 * * * * *", "UTC", utc(2025, 1, 1, 0, 1)) == utc(2025, 1, 1, 0, 10)


def test_the_next_tick_is_strictly_after_and_the_latest_at_or_before() -> None:
    t = utc(2025, 1, 1, 0, 0, 5)
    assert next_tick("* * * * * *", "UTC", t) == t + timedelta(seconds=1)
    assert next_tick("* * * * * *", "UTC", t + timedelta(microseconds=500)) == t + timedelta(
        seconds=1
    )
    assert latest_tick("* * * * * *", "UTC", t) == t
    assert latest_tick("* * * * * *", "UTC", t + timedelta(milliseconds=999)) == t


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("* * * *", "4 fields"),
        ("* * * * * * *", "7 fields"),
        ("61 * * * *", "not a valid expression"),
        ("0 0 30 2 *", "never fires"),
        ("@hourly", "1 fields"),
    ],
)
def test_a_bad_expression_is_refused_with_its_reason(expr: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_cron(expr)


def test_an_expression_is_normalised() -> None:
    assert parse_cron("  */5   * * * * ") == "*/5 * * * *"


def test_a_fixed_time_skipped_by_spring_forward_runs_once_right_after_the_gap() -> None:
    got = ticks("30 2 * * *", PARIS, utc(2025, 3, 28, 12), utc(2025, 4, 1, 12))
    assert got == [
        utc(2025, 3, 29, 1, 30),  # 02:30 CET
        utc(2025, 3, 30, 1, 0),  # 02:30 does not exist: 03:00 CEST
        utc(2025, 3, 31, 0, 30),  # 02:30 CEST
        utc(2025, 4, 1, 0, 30),
    ]


def test_a_fixed_time_repeated_by_fall_back_runs_once() -> None:
    got = ticks("30 2 * * *", PARIS, utc(2025, 10, 25, 12), utc(2025, 10, 27, 12))
    assert got == [utc(2025, 10, 26, 0, 30), utc(2025, 10, 27, 1, 30)]  # CEST first, then CET
    assert ticks("30 1-3 * * *", PARIS, utc(2025, 10, 25, 22), utc(2025, 10, 26, 23)) == [
        utc(2025, 10, 25, 23, 30),  # 01:30 CEST
        utc(2025, 10, 26, 0, 30),  # 02:30 CEST (and not again at 02:30 CET)
        utc(2025, 10, 26, 2, 30),  # 03:30 CET
    ]


def test_a_daily_job_keeps_its_local_time_across_both_changes() -> None:
    spring = ticks("0 9 * * *", PARIS, utc(2025, 3, 29), utc(2025, 3, 31))
    fall = ticks("0 9 * * *", PARIS, utc(2025, 10, 25), utc(2025, 10, 27))
    assert spring == [utc(2025, 3, 29, 8), utc(2025, 3, 30, 7)]  # 09:00 CET, then CEST
    assert fall == [utc(2025, 10, 25, 7), utc(2025, 10, 26, 8)]


def test_a_wildcard_hour_follows_real_time_23_hours_in_spring_25_in_fall() -> None:
    spring_day = ticks("0 * * * *", PARIS, utc(2025, 3, 29, 22, 59), utc(2025, 3, 30, 21, 59))
    fall_day = ticks("0 * * * *", PARIS, utc(2025, 10, 25, 21, 59), utc(2025, 10, 26, 22, 59))
    assert len(spring_day) == 23 and len(fall_day) == 25
    for day in (spring_day, fall_day):
        assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(day))


@pytest.mark.parametrize("expr", ["30 2 * * *", "0 * * * *", "*/20 1-3 * * *", "30 2 * * * 15"])
def test_latest_tick_names_the_same_instants_as_next_tick_across_dst(expr: str) -> None:
    for start, end in [
        (utc(2025, 3, 29, 20), utc(2025, 3, 30, 6)),
        (utc(2025, 10, 25, 20), utc(2025, 10, 26, 6)),
    ]:
        for t in ticks(expr, PARIS, start, end):
            assert latest_tick(expr, PARIS, t) == t
            following = next_tick(expr, PARIS, t)
            assert latest_tick(expr, PARIS, following - timedelta(seconds=1)) == t
