"""The demo tasks of the contract: noop, echo, sleep, fail, crash, cpu.

They are on wherever `BROOK_DEMO_TASKS` is not `0` (compose turns them off), so anyone who
may submit may run them: their arguments are bounded, so none holds a worker for long.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import Any

from brook.executor.registry import task

MAX_SLEEP_S = 3600.0
MAX_CPU_MS = 60_000.0


def _bounded(payload: dict[str, Any], name: str, default: float, most: float) -> float:
    """`payload[name]` as a number from 0 to `most`; `ValueError` otherwise (the job fails,
    and its retries with it)."""
    value = payload.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, not {type(value).__name__}")
    if not (math.isfinite(value) and 0 <= value <= most):
        raise ValueError(f"{name} must be from 0 to {most:g}, not {value!r}")
    return float(value)


@task("noop")
def noop(payload: dict[str, Any]) -> None:
    return None


@task("echo")
def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


@task("sleep")
async def sleep(payload: dict[str, Any]) -> None:
    await asyncio.sleep(_bounded(payload, "seconds", 1.0, MAX_SLEEP_S))


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
    ms = _bounded(payload, "ms", 10, MAX_CPU_MS)
    deadline = time.perf_counter() + ms / 1000.0
    spins = 0
    while time.perf_counter() < deadline:
        spins += 1
    return spins
