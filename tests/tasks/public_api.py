"""A task module written as a user's would be: everything it needs comes from `brook`
(`BROOK_TASKS=tests.tasks.public_api`). A task submits a follow-up through the public
`Client`, from inside its worker; a schedule runs `public_add` every second (seconds are
the sixth field)."""

from __future__ import annotations

from typing import Any

from brook import Client, schedule, task


@task("public_add")
def add(payload: dict[str, Any]) -> int:
    return int(payload["a"]) + int(payload["b"])


@task("public_relay")
def relay(payload: dict[str, Any]) -> str:
    """Submits `public_add` with a `Client` of its own (settings from the environment) and
    returns the new job's id."""
    with Client() as client:
        return client.submit("public_add", {"a": payload["a"], "b": 1}).id


schedule("public-every-second", "* * * * * *", task="public_add", payload={"a": 1, "b": 2})
