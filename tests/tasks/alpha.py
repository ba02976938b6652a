"""A task only some test dispatchers register (routing tests)."""

from __future__ import annotations

from typing import Any

from brook import task


@task("alpha")
def alpha(payload: dict[str, Any]) -> str:
    return "alpha"
