"""The server's `failCommand` fail point, aimed at one test client by its app name."""

from __future__ import annotations

import os
from typing import Any

from pymongo import AsyncMongoClient

from common.domain.models import Doc


async def fail_commands(
    client: AsyncMongoClient[Doc], app: str, commands: list[str], mode: Any, **data: Any
) -> None:
    """Fail (or hold, or answer with a write-concern error: `data`) these commands of the
    client made by `make_client(settings, appname=app)` in this process; `mode` as the
    server takes it (`{"times": n}`, `{"skip": n}`, "alwaysOn")."""
    await client.admin.command(
        "configureFailPoint",
        "failCommand",
        mode=mode,
        data={"failCommands": commands, "appName": f"{app}:{os.getpid()}", **data},
    )


async def fail_nothing(client: AsyncMongoClient[Doc]) -> None:
    await client.admin.command("configureFailPoint", "failCommand", mode="off")
