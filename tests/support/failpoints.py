"""The server's `failCommand` fail point, aimed at one client by its app name, and the
server's `waitForFailPoint`, which proves a command was caught by it."""

from __future__ import annotations

import os
from typing import Any

from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import OperationFailure

from brook.common.domain.models import Doc


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


def hold_commands(
    client: MongoClient[Doc], app_name: str, commands: list[str], block_ms: int, mode: Any
) -> int:
    """Hold (block on the server for `block_ms`) these commands of the client whose full app
    name is `app_name` (`make_client` names a process's client `ROLE:PID`), on the member
    `client` talks to. Returns the fail point's count so far, for `wait_until_hit`."""
    reply = client.admin.command(
        "configureFailPoint",
        "failCommand",
        mode=mode,
        data={
            "failCommands": commands,
            "appName": app_name,
            "blockConnection": True,
            "blockTimeMS": block_ms,
        },
    )
    return int(reply["count"])


def wait_until_hit(client: MongoClient[Doc], count: int, timeout: float) -> None:
    """Return once `failCommand` has fired again since it had fired `count` times (the
    server's `waitForFailPoint`): proof that a command is in the fault window now. Fails the
    test if it has not within `timeout` seconds."""
    try:
        client.admin.command(
            "waitForFailPoint",
            "failCommand",
            timesEntered=count + 1,
            maxTimeMS=int(timeout * 1000),
        )
    except OperationFailure as exc:
        raise AssertionError(f"no command hit the fail point within {timeout}s: {exc}") from exc
