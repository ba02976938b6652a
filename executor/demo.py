"""The demo tasks of the contract: noop, echo, sleep, fail, crash, cpu."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from brook.executor.registry import task


@task("noop")
def noop(payload: dict[str, Any]) -> None:
    return None


@task("echo")
def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


@task("sleep")
async def sleep(payload: dict[str, Any]) -> None:
    seconds = float(payload.get("seconds", 1.0))
    if seconds < 0:
        raise ValueError("seconds must be >= 0")
    await asyncio.sleep(seconds)


class DemoFailure(Exception):
    """What the `fail` demo task raises."""


@task("fail")
def fail(payload: dict[str, Any]) -> None:
    raise DemoFailure(str(payload.get("message", "failed on purpose")))


@task("crash")
def crash(payload: dict[str, Any]) -> None:
    os._exit(int(payload.get("exit_code", 70)))


@task("cpu")
def cpu(payload: dict[str, Any]) -> int:
    ms = float(payload.get("ms", 10))
    deadline = time.perf_counter() + ms / 1000.0
    spins = 0
    while time.perf_counter() < deadline:
        spins += 1
    return spins
