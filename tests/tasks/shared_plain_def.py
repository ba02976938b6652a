"""A plain `def` task that asks to share a process: its import fails."""

from __future__ import annotations

from typing import Any

from brook import task


@task("shared_plain", shared=4)
def shared_plain(payload: dict[str, Any]) -> None:
    return None
