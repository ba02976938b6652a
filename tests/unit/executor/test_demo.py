"""The demo tasks' arguments are bounded: a submit cannot pin a worker (`cpu`) or hold one
(`sleep`) for longer than the bound, whatever it asks."""

from __future__ import annotations

from typing import Any

import pytest

from brook.executor.demo import MAX_CPU_MS, MAX_SLEEP_S, cpu, sleep

TOO_MUCH: list[Any] = [1e12, float("inf"), float("nan"), -1, True, "5", None]


@pytest.mark.parametrize("ms", [*TOO_MUCH, MAX_CPU_MS + 1])
def test_cpu_refuses_a_burn_beyond_its_bound_at_once(ms: Any) -> None:
    with pytest.raises(ValueError, match="ms must be"):
        cpu({"ms": ms})


@pytest.mark.parametrize("seconds", [*TOO_MUCH, MAX_SLEEP_S + 1])
async def test_sleep_refuses_a_sleep_beyond_its_bound_at_once(seconds: Any) -> None:
    with pytest.raises(ValueError, match="seconds must be"):
        await sleep({"seconds": seconds})


async def test_within_their_bounds_they_run() -> None:
    assert cpu({"ms": 1}) >= 1 and cpu({}) >= 1
    await sleep({"seconds": 0})
    await sleep({"seconds": 0.001})
