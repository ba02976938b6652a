"""A schedule for tests/e2e/test_deadlines.py: every second, each tick's job with its
deadlines (counted from its submit)."""

from __future__ import annotations

from brook import schedule

schedule("tick-bounded", "* * * * * *", task="noop", start_within_s=30, deadline_s=600)
