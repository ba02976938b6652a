"""A task only some test dispatchers register (routing tests)."""

from __future__ import annotations

from typing import Any

from brook import task


@task("beta")
def beta(payload: dict[str, Any]) -> str:
    return "beta"
