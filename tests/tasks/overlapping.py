"""Schedules whose runs outlast their period (`BROOK_TASKS=tests.tasks.basic,
tests.tasks.overlapping`): a 3 s task every second with `overlap="skip"`, the same with
`overlap="buffer_one"`, and a task that would run a minute every two seconds with
`overlap="cancel_other"`."""

from __future__ import annotations

import asyncio
from typing import Any

from brook import schedule, task


@task("overlap_slow")
async def overlap_slow(payload: dict[str, Any]) -> None:
    await asyncio.sleep(float(payload["seconds"]))


schedule(
    "slow-skip", "* * * * * *", task="overlap_slow", payload={"seconds": 3}, overlap="skip"
)
schedule(
    "slow-replace",
    "* * * * * */2",
    task="overlap_slow",
    payload={"seconds": 60},
    overlap="cancel_other",
)
schedule(
    "slow-buffer",
    "* * * * * *",
    task="overlap_slow",
    payload={"seconds": 3},
    overlap="buffer_one",
)
