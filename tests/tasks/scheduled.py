"""Schedules for tests (`BROOK_TASKS=tests.tasks.basic,tests.tasks.scheduled`): every second, one of
each catch-up policy. Seconds are the sixth field."""

from __future__ import annotations

from brook import schedule

schedule("tick-latest", "* * * * * *", task="echo", payload={"policy": "latest"})
schedule("tick-none", "* * * * * *", task="echo", payload={"policy": "none"}, catch_up="none")
