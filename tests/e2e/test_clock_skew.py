"""Dispatchers whose clocks are an hour off keep time by the server: a due time, a retry's
delay, a lease and its expiry all come from MongoDB's clock (`$$NOW`, and the dispatcher's
estimate of it), never from the host's. The clocks are skewed from outside, as a
misconfigured host would be: Debian's libfaketime, preloaded into each dispatcher (and so
into its workers), moves what the process reads as the time of day; its monotonic clock
is left alone, as NTP leaves it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster
from tests.e2e.test_faults import assert_clean, submit, wait_all_terminal
from tests.e2e.test_limits import owner_of
from tests.support.procs import BrookProcess

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
LEASE_S = 5.0  # the suite's settings (tests/conftest.py), sweeps every second


def skewed(offset: str) -> dict[str, str]:
    """The environment of a process whose wall clock is `offset` off (e.g. "+1h")."""
    assert LIBFAKETIME.exists(), f"{LIBFAKETIME} missing: `make test` installs Debian's faketime"
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "BROOK_CONCURRENCY": "4",
    }


def clock_offset(proc: BrookProcess) -> float:
    """How far the process's clock is from this one's, read off its `dispatcher.ready` line."""
    ready = proc.wait_for_event("dispatcher.ready")
    stamped = datetime.fromisoformat(ready["timestamp"].replace("Z", "+00:00"))
    return (stamped - datetime.now(UTC)).total_seconds()


def at(doc: dict[str, Any], status: str, nth: int = 0) -> datetime:
    return [h["at"] for h in doc["history"] if h["status"] == status][nth]  # type: ignore[no-any-return]


async def test_dispatchers_an_hour_ahead_and_behind_keep_due_times_leases_and_expiry_by_the_server(
    cluster: Cluster, store: JobStore
) -> None:
    ahead = cluster.dispatcher(**skewed("+1h"))
    behind = cluster.dispatcher(**skewed("-1h"))
    assert 3540 < clock_offset(ahead) < 3660 and -3660 < clock_offset(behind) < -3540
    long = await submit(store, "sleep", 4, payload={"seconds": 2 * LEASE_S})  # renewed leases
    delayed = await submit(store, "noop", 6, delay_s=2.0)
    [retried] = await submit(store, "retry_once", payload={"delay": 1.0})
    # The dispatcher an hour ahead runs a long job, then dies with it (SIGKILL).
    ahead.wait_for_event("task.started", where=lambda e: e.get("job_id") in long)
    await asyncio.sleep(1.0)
    ahead.kill()
    killed_at = datetime.now(UTC)
    await wait_all_terminal(store, 11, timeout=60)

    docs = {d["_id"]: d for d in await store.jobs.find({}).to_list()}
    assert all(d["status"] == "completed" for d in docs.values()), docs
    for job_id in delayed:  # due 2 s after its submit by the server's clock: not at once,
        doc = docs[job_id]  # and not an hour late
        wait = (doc["started_at"] - doc["created_at"]).total_seconds()
        assert at(doc, "running") >= doc["run_at"] and 2.0 <= wait < 5.0, (wait, doc["history"])
    doc = docs[retried]  # its retry's timer fired at the new run_at, on the server's clock
    assert doc["attempts"] == 2
    lag = (at(doc, "running", 1) - doc["run_at"]).total_seconds()
    assert 0 <= lag < 2.0, lag  # (an hour off is what it guards against)
    # The ahead dispatcher's attempts were requeued once their lease ran out on the server's
    # clock (renewed every third of it, so at least two thirds of it after the kill) by the
    # dispatcher an hour behind, whose own clock would never have seen it expire. No other
    # attempt expired: the ahead dispatcher's sweeps, while it lived, requeued nothing early.
    gone = owner_of(ahead)
    expired = [
        d for d in docs.values() if any(h.get("error") == "LeaseExpired" for h in d["history"])
    ]
    assert expired
    for doc in expired:
        assert next(h.get("owner") for h in doc["history"] if h["status"] == "running") == gone
        requeued = next(h["at"] for h in doc["history"] if h.get("error") == "LeaseExpired")
        after_kill = (requeued.replace(tzinfo=UTC) - killed_at).total_seconds()
        assert LEASE_S * 2 / 3 - 0.5 <= after_kill <= LEASE_S + 6.0, after_kill
    for doc in docs.values():
        if doc not in expired:
            assert doc["attempts"] == (2 if doc["_id"] == retried else 1), doc["history"]
    await assert_clean(store, [*long, *delayed, retried], ahead, behind)
