"""Tasks for tests/e2e/test_deadlines.py: one whose jobs get a default deadline from its
declaration."""

from __future__ import annotations

import asyncio
from typing import Any

from brook import task


@task("slow_by_default", deadline_s=2)
async def slow_by_default(payload: dict[str, Any]) -> None:
    """Waits `seconds`: past its task's default deadline, unless its submit gave one."""
    await asyncio.sleep(float(payload.get("seconds", 60)))
