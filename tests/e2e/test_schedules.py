"""Cron schedules end to end: real dispatchers (several at once), a real replica set.

`tests.tasks.scheduled` declares two every-second schedules, `tick-latest` and `tick-none`
(catch_up "none"). Every tick must give exactly one job across all dispatchers.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import httpx

from brook.common.domain.schedules import tick_key
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore
from tests.conftest import brook_env
from tests.e2e.conftest import Cluster
from tests.support.procs import BrookProcess, brook_cli, wait_until

SCHEDULED = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.scheduled"}
SECOND = timedelta(seconds=1)


async def ticks_of(store: JobStore, name: str) -> list[datetime]:
    """The ticks of `name` that have a job, in order; each job checked against its tick."""
    jobs = await store.jobs.find({"schedule.name": name}).to_list()
    for job in jobs:
        tick = job["schedule"]["tick"]
        assert job["idempotency_key"] == tick_key(name, tick)
        # Due at its tick; a job handed back by a stopping dispatcher is due again at once,
        # and one a killed dispatcher held is due again after its lease expired (a backoff).
        again = any(
            h.get("reason") == "released" or h.get("error") == "LeaseExpired"
            for h in job["history"]
        )
        assert (job["run_at"] == tick or again) and job["task"] == "echo"
    return sorted(job["schedule"]["tick"] for job in jobs)


async def wait_ticks(store: JobStore, name: str, n: int, timeout: float = 60) -> list[datetime]:
    deadline = time.monotonic() + timeout
    while len(got := await ticks_of(store, name)) < n:
        assert time.monotonic() < deadline, f"{name}: {len(got)} ticks of {n} in {timeout}s"
        await asyncio.sleep(0.2)
    return got


def assert_one_per_second(ticks: list[datetime]) -> None:
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert all(gap == SECOND for gap in gaps), f"ticks missing or repeated: {gaps}"


def submitted(procs: list[BrookProcess], name: str) -> Counter[str]:
    """How many `job.submitted` lines each tick of `name` got, across these processes."""
    return Counter(
        e["tick"] for p in procs for e in p.events("job.submitted") if e.get("schedule") == name
    )


def brook(settings: Settings, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return brook_cli(*args, env=brook_env(settings, BROOK_API_PORT=str(port)), timeout=30)


async def test_a_one_second_schedule_on_three_dispatchers_gives_exactly_one_job_per_tick(
    cluster: Cluster, store: JobStore
) -> None:
    procs = [cluster.dispatcher(**SCHEDULED) for _ in range(3)]
    # From here on all three race for every tick.
    for name in ("tick-latest", "tick-none"):
        ticks = await wait_ticks(store, name, 22)
        assert_one_per_second(ticks)
        # Each tick was created once, by one of the three; the others found it there.
        expected = {t.isoformat() for t in ticks}

        def all_logged(n: str = name, want: set[str] = expected) -> bool:
            return set(submitted(procs, n)) >= want

        wait_until(all_logged)
        assert set(submitted(procs, name).values()) == {1}


async def test_killing_the_dispatcher_that_submitted_the_last_tick_loses_no_tick(
    cluster: Cluster, store: JobStore
) -> None:
    procs = [cluster.dispatcher(**SCHEDULED) for _ in range(2)]
    ticks = await wait_ticks(store, "tick-latest", 5)
    last = ticks[-1].isoformat()
    victim = wait_until(
        lambda: next((p for p in procs if last in submitted([p], "tick-latest")), None)
    )
    victim.kill()  # SIGKILL, right after it submitted the latest tick
    [survivor] = [p for p in procs if p is not victim]
    ticks = await wait_ticks(store, "tick-latest", len(ticks) + 6)
    assert_one_per_second(ticks)
    # The survivor submitted the latest ticks: its log says so (the line follows the insert,
    # a moment after the tick's job is in the store).
    latest = {t.isoformat() for t in ticks[-3:]}
    try:
        wait_until(lambda: latest <= set(submitted([survivor], "tick-latest")), timeout=10)
    except AssertionError:
        raise AssertionError(
            f"ticks {sorted(latest)} not all submitted by the survivor, whose log names "
            f"{sorted(submitted([survivor], 'tick-latest'))[-5:]}"
        ) from None


async def test_after_ten_seconds_down_latest_runs_one_missed_tick_and_none_runs_none(
    cluster: Cluster, store: JobStore
) -> None:
    first = cluster.dispatcher(**SCHEDULED)
    await wait_ticks(store, "tick-latest", 3)
    await wait_ticks(store, "tick-none", 3)
    assert first.stop() == 0
    before = {n: (await ticks_of(store, n))[-1] for n in ("tick-latest", "tick-none")}
    await asyncio.sleep(10)
    second = cluster.dispatcher(**SCHEDULED)
    for name in before:
        await wait_ticks(store, name, len(await ticks_of(store, name)) + 3)
    live = {
        n: min(
            datetime.fromisoformat(e["tick"])
            for e in second.events("job.submitted")
            if e.get("schedule") == n and not e["catch_up"]
        )
        for n in before
    }
    for name, last in before.items():
        assert live[name] - last > timedelta(seconds=10)
        gap = [t for t in await ticks_of(store, name) if last < t < live[name]]
        caught = [
            e for e in second.events("job.submitted") if e.get("schedule") == name and e["catch_up"]
        ]
        if name == "tick-latest":
            # One job, for the most recent tick missed by the time the dispatcher started.
            assert len(gap) == 1 and [e["tick"] for e in caught] == [gap[0].isoformat()]
            assert live[name] - gap[0] == SECOND
        else:
            assert gap == [] and caught == []
            [missed] = second.events("schedule.missed")
            assert missed["schedule"] == "tick-none"


async def test_pause_and_resume_apply_to_every_dispatcher_and_skipped_ticks_never_run(
    cluster: Cluster, store: JobStore, settings: Settings, http: httpx.Client
) -> None:
    cluster.api()
    cluster.dispatcher(**SCHEDULED)
    cluster.dispatcher(**SCHEDULED)
    await wait_ticks(store, "tick-latest", 2)

    def listing() -> dict[str, dict[str, Any]]:
        return {s["name"]: s for s in http.get("/schedules").json()["schedules"]}

    s = wait_until(lambda: listing()["tick-latest"]["last_job_id"] and listing()["tick-latest"])
    assert set(listing()) == {"tick-latest", "tick-none"}
    assert (s["cron"], s["task"], s["tz"], s["paused"]) == ("* * * * * *", "echo", "UTC", False)
    assert s["next_run"] and s["last_job_id"]
    assert (await store.get(s["last_job_id"])).schedule is not None

    out = brook(settings, cluster.port, "schedules", "pause", "tick-latest")
    assert out.returncode == 0, out.stderr
    assert '"paused": true' in out.stdout
    paused_at = await ticks_of(store, "tick-latest")
    await asyncio.sleep(3.5)
    during = await ticks_of(store, "tick-latest")
    assert len(during) <= len(paused_at) + 1  # at most a tick already on its way
    listed = listing()
    assert listed["tick-latest"]["paused"] is True and listed["tick-latest"]["next_run"] is None
    assert listed["tick-none"]["paused"] is False  # pausing is per schedule
    table = brook(settings, cluster.port, "schedules")
    assert table.returncode == 0 and "tick-latest" in table.stdout and "paused" in table.stdout

    resumed = http.post("/schedules/tick-latest/resume")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    after = await wait_ticks(store, "tick-latest", len(during) + 3)
    new = after[len(during) :]
    assert new[0] - during[-1] >= timedelta(seconds=3)  # the paused ticks never ran
    assert_one_per_second(new)

    assert http.post("/schedules/nope/pause").status_code == 404
    missing = brook(settings, cluster.port, "schedules", "resume", "nope")
    assert missing.returncode != 0
    assert missing.stderr.strip() == "brook: error: 404 no schedule 'nope'"


def test_a_schedule_naming_an_unknown_task_stops_the_dispatcher_with_one_line(
    settings: Settings,
) -> None:
    env = brook_env(settings, BROOK_TASKS="tests.tasks.basic,tests.tasks.scheduled_unknown")
    proc = brook_cli("dispatcher", env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        "brook: error: schedule 'orphan' names unknown task 'no-such-task'; known tasks: "
    )
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""
