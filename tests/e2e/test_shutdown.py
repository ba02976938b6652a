"""Shutdown always ends: SIGTERM stops every role (`brook dispatcher`, `brook api`, `brook up`)
within the grace period + 5 s whatever MongoDB does, a second signal stops it at once, and
the roles die with `brook up` even when it is SIGKILLed.

MongoDB is made unreachable on a dedicated one-member replica set (the shared test set is
never disturbed) in two ways: *down* (the `mongod` is killed: connections are refused, as
after `brook mongo down`) before the signal, and *frozen* (SIGSTOP: connections hang, as in
a network partition) during the grace period. A second signal's test freezes it only once
the server has said (`waitForFailPoint`) that the role is inside a command it holds: the
second signal then surely finds the first shutdown waiting on MongoDB.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from brook.common.domain.models import Doc, JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore
from brook.replset import ReplicaSet
from tests.conftest import extra_port
from tests.e2e.conftest import Cluster, free_port
from tests.support.failpoints import hold_commands, wait_until_hit
from tests.support.metrics import value
from tests.support.procs import BrookProcess, pid_alive, wait_until

GRACE_S = 2.0
LIMIT_S = GRACE_S + 5.0  # the contract: every role is gone by then
AT_ONCE_S = 2.0  # "at once", with room for a loaded two-core machine
# What a role sends MongoDB during a shutdown (renewals, releases, the change stream,
# submits). Held long enough for the freeze that follows at once to catch the command on
# the server; a held command sleeps on after the thaw, holding up the test's clean-up.
HELD_COMMANDS = ["find", "aggregate", "getMore", "insert", "update", "findAndModify", "delete"]
HOLD_MS = 5_000
SECOND_SIGNALS = pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name
)


class Mongo1:
    """A one-member replica set the tests may kill or freeze."""

    def __init__(self, home: Path) -> None:
        self.rs = ReplicaSet(
            home=home, base_port=extra_port("shutdown"), members=1, test_commands=True
        )
        self.frozen: int | None = None

    def down(self) -> None:
        self.rs.stop_member(0, signal.SIGKILL)

    def freeze(self) -> None:
        pid = self.rs.pid(0)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        self.frozen = pid

    def hang(self, count: int) -> None:
        """Once a command is held by the fail point `hold` set (the test fails if none is
        within 15 s), freeze the member: that command never returns."""
        with self.direct() as client:
            wait_until_hit(client, count, timeout=15)
        self.freeze()

    def hold(self, app_name: str) -> int:
        """Hold every command of `app_name` (a role's client, `brook-api:PID`) that reads or
        writes; returns the fail point's count for `hang`."""
        with self.direct() as client:
            return hold_commands(client, app_name, HELD_COMMANDS, HOLD_MS, mode="alwaysOn")

    def direct(self) -> MongoClient[Doc]:
        return MongoClient(
            f"mongodb://127.0.0.1:{self.rs.ports[0]}/?directConnection=true",
            serverSelectionTimeoutMS=10000,
        )

    def restore(self) -> None:
        if self.frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.frozen, signal.SIGCONT)
            self.frozen = None
        self.rs.up()
        with self.direct() as client:  # a fail point outlives a freeze, not a kill
            client.admin.command("configureFailPoint", "failCommand", mode="off")


@pytest.fixture(scope="module")
def mongo1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mongo1]:
    m = Mongo1(tmp_path_factory.mktemp("mongo1"))
    m.rs.up()
    try:
        yield m
    finally:
        m.restore()
        m.rs.down()


@pytest.fixture
def settings(mongo1: Mongo1, db_name: str, tmp_path: Path) -> Settings:
    return Settings(
        mongo_uri=mongo1.rs.uri,
        db=db_name,
        concurrency=2,
        lease_seconds=5.0,
        sweep_seconds=1.0,
        retry_base_seconds=0.05,
        retry_cap_seconds=0.5,
        shutdown_grace_seconds=GRACE_S,
        home=tmp_path / "home",
    )


@pytest.fixture
async def outage(mongo1: Mongo1, store: JobStore, cluster: Cluster) -> AsyncIterator[Mongo1]:
    """MongoDB back before the processes are stopped and the database dropped."""
    yield mongo1
    await back(mongo1, store)


async def back(mongo1: Mongo1, store: JobStore) -> None:
    """Restore MongoDB; the test's client drops the connections the outage broke."""
    mongo1.restore()
    for _ in range(20):
        try:
            await store.db.command("ping")
            return
        except PyMongoError:
            await asyncio.sleep(0.1)


def exits_within(proc: BrookProcess, since: float, limit: float) -> float:
    """Seconds from `since` until `proc` exited; fails (with its log) past `limit`."""
    try:
        proc.proc.wait(max(since + limit - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        where = stuck_where(proc.proc.pid)
        try:
            proc.proc.wait(10)
            then = f"it exited {time.monotonic() - since:.2f} s after the signal"
        except subprocess.TimeoutExpired:
            then = "it was still running 10 s later"
        log = proc.raw_log()[-3000:]
        proc.kill()  # its workers and roles die with it (PR_SET_PDEATHSIG)
        raise AssertionError(
            f"{proc.role} still running {limit}s after the signal ({then}); it was at:\n"
            f"{where}\n{log}"
        ) from None
    return time.monotonic() - since


def stuck_where(pid: int) -> str:
    """Where a process is: its kernel state and wait channel, and its Python stacks."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as exc:
        return f"(no /proc entry: {exc})"
    spy = Path(sys.executable).with_name("py-spy")
    try:
        stacks = subprocess.run(
            [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        stacks = f"(no stacks: {exc})"
    return f"state {stat}, wchan {wchan}\n{stacks}"


def assert_gone(pids: list[int]) -> None:
    assert pids, "no process to check"
    wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=3)


def worker_pids(proc: BrookProcess) -> list[int]:
    return [int(e["pid"]) for e in proc.events("worker.started")]


async def running(store: JobStore, proc: BrookProcess, task: str, **payload: Any) -> str:
    """Submit a job and wait until a worker of `proc` runs it."""
    job_id = (await store.submit(JobSpec(task=task, payload=payload))).job.id
    proc.wait_for_event("task.started", timeout=20, where=lambda e: e.get("job_id") == job_id)
    return job_id


async def assert_nothing_left_leased_silently(store: JobStore, proc: BrookProcess) -> None:
    """A job the dispatcher could not hand back stays leased (it returns at lease expiry),
    and the log says so."""
    said = {
        e.get("job_id")
        for e in proc.logs()
        if e.get("event") in ("job.release_failed", "job.result_discarded")
    }
    async for doc in store.jobs.find({"status": "running"}):
        assert doc["_id"] in said, f"{doc['_id']} left running without a word in the log"


def post_in_background(url: str) -> threading.Thread:
    """A submit that is still waiting on MongoDB when the API is told to stop."""

    def post() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{url}/jobs", json={"task": "noop"}, timeout=60)

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


# -- a dispatcher cut off from MongoDB ----------------------------------------------------------


async def test_a_dispatcher_cut_off_longer_than_its_lease_stops_the_task_before_the_lease_ends(
    cluster: Cluster, store: JobStore, outage: Mongo1
) -> None:
    """No attempt runs on where another dispatcher may already run the job: a lease that
    could not be renewed has its worker stopped before it runs out (5 s here) by the
    dispatcher's own clock (self-fencing, logged and counted), and the job runs again,
    once, after MongoDB is back."""
    port = free_port()
    disp = cluster.dispatcher(BROOK_METRICS_PORT=str(port))
    job_id = await running(store, disp, "sleep", seconds=6)
    # Every lease the server grants the attempt is a write of `lease_expires_at`: followed
    # from before the freeze, read after it (the one that landed last is the lease).
    leases = await store.jobs.watch(
        [{"$match": {"documentKey._id": job_id, "operationType": "update"}}]
    )
    claimed = await store.jobs.find_one({"_id": job_id})
    assert claimed is not None and claimed["attempts"] == 1
    outage.freeze()
    fenced = disp.wait_for_event(
        "lease.self_fenced", timeout=15, where=lambda e: e.get("job_id") == job_id
    )
    assert "not renewed in time" in fenced["reason"] and fenced["attempt"] == 1
    killed = disp.wait_for_event(
        "worker.killed", timeout=5, where=lambda e: e.get("job_id") == job_id
    )
    assert killed["reason"] == "lease_lost"
    assert_gone([int(killed["pid"])])
    assert not disp.events("lease.lost")  # fenced itself; nothing told it the lease was gone
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert value(metrics, "brook_leases_self_fenced_total") == 1
    await back(outage, store)
    granted = [claimed["lease_expires_at"]]
    async with leases:
        while (change := await leases.try_next()) is not None:
            fields = change["updateDescription"]["updatedFields"]
            if fields.get("status") == "pending":
                break  # the watchdog's requeue, at expiry: attempt 1's leases are all read
            if isinstance(fields.get("lease_expires_at"), datetime):
                granted.append(fields["lease_expires_at"])
    killed_at = datetime.fromisoformat(killed["timestamp"])
    # The lease in force when the worker was stopped: the latest granted before then (a
    # renewal sent into the freeze lands when the server wakes, after the stop: not that
    # one). Each grant is its write's time on the server plus the lease.
    lease = timedelta(seconds=cluster.settings.lease_seconds)
    in_force = max(g for g in granted if g - lease < killed_at)
    assert killed_at < in_force, f"stopped at {killed_at}, after its lease ended ({in_force})"
    # Requeued at expiry by the watchdog, run again, completed once.
    deadline = time.monotonic() + 40
    while (doc := await store.get(job_id)).status.value != "completed":
        assert time.monotonic() < deadline, f"job still {doc.status.value}"
        await asyncio.sleep(0.2)
    assert doc.attempts == 2
    starts = [e for e in disp.events("task.started") if e.get("job_id") == job_id]
    assert [e["attempt"] for e in starts] == [1, 2]
    # Its log line follows the acknowledged write: waited for, not read at once.
    disp.wait_for_event("job.completed", timeout=10, where=lambda e: e.get("job_id") == job_id)
    done = [e for e in disp.events("job.completed") if e.get("job_id") == job_id]
    assert [e["attempt"] for e in done] == [2]


# -- brook dispatcher ---------------------------------------------------------------------------


async def test_a_dispatcher_whose_mongodb_is_down_exits_on_sigterm_in_time_and_says_what_it_kept(
    cluster: Cluster, store: JobStore, outage: Mongo1
) -> None:
    disp = cluster.dispatcher()
    job_id = await running(store, disp, "sleep", seconds=60)
    workers = worker_pids(disp)
    outage.down()
    t0 = time.monotonic()
    disp.signal(signal.SIGTERM)
    assert exits_within(disp, t0, LIMIT_S) <= LIMIT_S
    assert_gone(workers)
    failed = disp.events("job.release_failed")
    assert [e["job_id"] for e in failed] == [job_id], failed
    await back(outage, store)
    job = await store.get(job_id)
    # Still leased by the stopped dispatcher: the watchdog of another requeues it at expiry.
    assert job.status == "running" and job.attempts == 1
    assert job.owner == disp.events("dispatcher.started")[0]["owner"]


async def test_a_dispatcher_whose_mongodb_goes_down_during_the_grace_period_exits_in_time(
    cluster: Cluster, store: JobStore, outage: Mongo1
) -> None:
    disp = cluster.dispatcher()
    await running(store, disp, "sleep", seconds=GRACE_S / 2 + 0.5)  # ends mid-grace
    long = await running(store, disp, "sleep", seconds=60)  # stopped at the end of the grace
    t0 = time.monotonic()
    disp.signal(signal.SIGTERM)
    disp.wait_for_event("dispatcher.stopping", timeout=5)
    outage.freeze()  # the short job's completion and the long one's release hang
    assert exits_within(disp, t0, LIMIT_S) <= LIMIT_S
    assert_gone(worker_pids(disp))
    await back(outage, store)
    await assert_nothing_left_leased_silently(store, disp)
    assert {e["job_id"] for e in disp.events("job.release_failed")} >= {long}


@SECOND_SIGNALS
async def test_a_second_signal_stops_a_dispatcher_at_once(
    cluster: Cluster, store: JobStore, outage: Mongo1, sig: signal.Signals
) -> None:
    disp = cluster.dispatcher(BROOK_SHUTDOWN_GRACE_SECONDS="60")
    await running(store, disp, "sleep", seconds=60)
    workers = worker_pids(disp)
    disp.signal(sig)
    disp.wait_for_event("dispatcher.stopping", timeout=5)
    app = f"brook-dispatcher:{disp.pid}"
    outage.hang(outage.hold(app))  # its lease renewals wait on MongoDB now
    t0 = time.monotonic()
    disp.signal(sig)
    assert exits_within(disp, t0, AT_ONCE_S) <= AT_ONCE_S
    assert_gone(workers)


# -- brook api -----------------------------------------------------------------------------------


def test_an_api_whose_mongodb_is_down_exits_on_sigterm_in_time(
    cluster: Cluster, outage: Mongo1
) -> None:
    api = cluster.api()
    outage.down()
    request = post_in_background(cluster.api_url)  # waits for a primary that never comes
    time.sleep(0.3)
    t0 = time.monotonic()
    api.signal(signal.SIGTERM)
    assert exits_within(api, t0, LIMIT_S) <= LIMIT_S
    request.join(10)
    assert port_is_free(cluster.port)


def test_an_api_whose_mongodb_goes_down_during_the_grace_period_exits_in_time(
    cluster: Cluster, outage: Mongo1
) -> None:
    api = cluster.api()
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=cluster.api_url, timeout=60) as client:
            while not stop.is_set():
                try:
                    client.post("/jobs", json={"task": "noop"})
                except httpx.HTTPError:
                    return

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        api.signal(signal.SIGTERM)
        outage.freeze()  # requests in flight, and the client's goodbye, now hang
        assert exits_within(api, t0, LIMIT_S) <= LIMIT_S
    finally:
        stop.set()
        outage.restore()
        for thread in threads:
            thread.join(10)
    assert port_is_free(cluster.port)


@SECOND_SIGNALS
def test_a_second_signal_stops_an_api_at_once(
    cluster: Cluster, outage: Mongo1, sig: signal.Signals
) -> None:
    api = cluster.api(BROOK_SHUTDOWN_GRACE_SECONDS="60")
    app = f"brook-api:{api.pid}"
    held = outage.hold(app)
    request = post_in_background(cluster.api_url)  # keeps the first shutdown waiting
    outage.hang(held)  # the request is inside MongoDB now
    api.signal(sig)
    api.wait_for_event("Shutting down", timeout=5)
    time.sleep(0.3)
    t0 = time.monotonic()
    api.signal(sig)
    assert exits_within(api, t0, AT_ONCE_S) <= AT_ONCE_S
    outage.restore()
    request.join(10)
    assert port_is_free(cluster.port)


def port_is_free(port: int) -> bool:
    """Free for the next API: nothing listens on it (as uvicorn does, ignore TIME_WAIT)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
    return True


# -- brook up ------------------------------------------------------------------------------------


def start_up(cluster: Cluster, **env: str) -> BrookProcess:
    """`brook up` on the dedicated set (BROOK_MONGO_URI: it starts no mongod of its own)."""
    up = cluster.start("up", **env)
    up.wait_for_event("up.started", timeout=30)
    up.wait_for_event("dispatcher.ready", timeout=60)
    up.wait_for_event("api.started", timeout=30)
    wait_until(cluster._healthy, timeout=30)
    return up


def up_processes(up: BrookProcess) -> list[int]:
    """`up` itself, its roles (restarted ones too) and the dispatchers' workers."""
    roles = [int(p) for p in up.events("up.started")[0]["pids"].values()]
    roles += [int(e["pid"]) for e in up.events("up.child_restarted")]
    return [up.pid, *roles, *worker_pids(up)]


async def test_brook_up_whose_mongodb_is_down_exits_on_sigterm_in_time(
    cluster: Cluster, store: JobStore, outage: Mongo1
) -> None:
    up = start_up(cluster)
    await running(store, up, "sleep", seconds=60)
    everything = up_processes(up)
    outage.down()
    t0 = time.monotonic()
    up.signal(signal.SIGTERM)
    assert exits_within(up, t0, LIMIT_S) <= LIMIT_S
    assert up.proc.returncode == 0
    assert_gone(everything)
    assert port_is_free(cluster.port)


async def test_brook_up_whose_mongodb_goes_down_during_the_grace_period_exits_in_time(
    cluster: Cluster, store: JobStore, outage: Mongo1
) -> None:
    up = start_up(cluster)
    await running(store, up, "sleep", seconds=60)
    everything = up_processes(up)
    t0 = time.monotonic()
    up.signal(signal.SIGTERM)
    up.wait_for_event("dispatcher.stopping", timeout=5)
    outage.freeze()
    assert exits_within(up, t0, LIMIT_S) <= LIMIT_S
    assert_gone(everything)
    assert port_is_free(cluster.port)


@SECOND_SIGNALS
async def test_a_second_signal_stops_brook_up_and_its_roles_at_once(
    cluster: Cluster, store: JobStore, outage: Mongo1, sig: signal.Signals
) -> None:
    up = start_up(cluster, BROOK_SHUTDOWN_GRACE_SECONDS="60")
    await running(store, up, "sleep", seconds=60)
    everything = up_processes(up)
    up.signal(sig)
    up.wait_for_event("up.stopping", timeout=5)
    up.wait_for_event("dispatcher.stopping", timeout=5)
    app = f"brook-dispatcher:{up.events('up.started')[0]['pids']['dispatcher']}"
    outage.hang(outage.hold(app))  # its dispatcher's renewals wait on MongoDB now
    t0 = time.monotonic()
    up.signal(sig)
    assert exits_within(up, t0, AT_ONCE_S) <= AT_ONCE_S
    assert up.proc.returncode == 130
    assert_gone(everything)


async def test_the_roles_die_with_a_sigkilled_brook_up_and_free_the_api_port(
    cluster: Cluster, store: JobStore
) -> None:
    up = start_up(cluster)
    await running(store, up, "sleep", seconds=60)
    everything = up_processes(up)
    up.kill()  # SIGKILL: `up` cannot stop anything itself
    assert_gone(everything)  # PR_SET_PDEATHSIG: the roles, and with the dispatcher its workers
    assert port_is_free(cluster.port)


# A test run that starts a dispatcher, then is SIGKILLed (as CI does to a run past its time).
_KILLED_RUN = """
import os, sys, time
from pathlib import Path
from tests.support.procs import BrookProcess
proc = BrookProcess("dispatcher", dict(os.environ), Path(sys.argv[1]))
proc.wait_for_event("dispatcher.ready", timeout=60)
Path(sys.argv[2]).write_text(" ".join(map(str, [proc.pid, *proc.children()])))
time.sleep(600)
"""


def test_the_roles_a_test_run_started_die_with_it_when_it_is_sigkilled(
    cluster: Cluster, tmp_path: Path
) -> None:
    """No orphan dispatcher goes on claiming jobs (or an API holding its port) after pytest."""
    from tests.conftest import ROOT

    pids_file = tmp_path / "pids"
    run = subprocess.Popen(
        [sys.executable, "-c", _KILLED_RUN, str(tmp_path / "dispatcher.log"), str(pids_file)],
        env=cluster.env(),
        cwd=ROOT,
    )
    try:
        wait_until(lambda: pids_file.exists() and pids_file.read_text(), timeout=60)
        pids = [int(pid) for pid in pids_file.read_text().split()]
        assert len(pids) > 1, "the dispatcher and its workers"
        run.kill()
        run.wait()
        assert_gone(pids)  # the dispatcher by its death signal; its workers by their own
    finally:
        run.kill()
        run.wait()
        for pid in [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []:
            with contextlib.suppress(OSError):  # gone (or never ours: a reused pid is spared)
                if b"brook.cli" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)


def test_brook_up_stops_its_own_frozen_replica_set_in_time(tmp_path: Path) -> None:
    from tests.conftest import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("BROOK_")}
    port = extra_port("up_shutdown")
    env.update(
        {
            "BROOK_HOME": str(tmp_path / "home"),
            "BROOK_MONGO_PORT": str(port),
            "BROOK_API_PORT": str(free_api_port()),
            "BROOK_CONCURRENCY": "1",
            "BROOK_SHUTDOWN_GRACE_SECONDS": str(GRACE_S),
            "PYTHONPATH": str(ROOT),
        }
    )
    rs = ReplicaSet(home=tmp_path / "home", base_port=port)
    up = BrookProcess("up", env, tmp_path / "up.log")
    mongods: list[int] = []
    try:
        up.wait_for_event("up.started", timeout=120)
        up.wait_for_event("dispatcher.ready", timeout=60)
        mongods = [p for p in (rs.pid(i) for i in range(3)) if p is not None]
        assert len(mongods) == 3
        everything = up_processes(up)
        t0 = time.monotonic()
        up.signal(signal.SIGTERM)
        up.wait_for_event("dispatcher.stopping", timeout=5)
        for pid in mongods:
            os.kill(pid, signal.SIGSTOP)
        # `up` also takes down three frozen mongods (each signalled, waited for, then
        # SIGKILLed): bounded, but on two cores shared with the suite's other workers it has
        # run past the roles' own limit; the bound proves it never waits on MongoDB.
        assert exits_within(up, t0, LIMIT_S + 5.0) <= LIMIT_S + 5.0
        assert up.events("mongo.down") and up.events("up.stopped")
        assert_gone([*everything, *mongods])
    finally:
        up.kill()
        for pid in mongods:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        rs.down()


def free_api_port() -> int:
    from tests.e2e.conftest import free_port

    return free_port()
