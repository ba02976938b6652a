"""A schedule whose task nobody registers: a dispatcher loading it must refuse to start."""

from __future__ import annotations

from brook import schedule

schedule("orphan", "*/5 * * * *", task="no-such-task")
