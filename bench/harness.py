"""Plumbing for the benchmark: the replica set, real `brook` role processes, the API, py-spy."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
from pymongo import MongoClient

from brook.replset import ReplicaSet

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
BENCH_HOME = Path(".brook/bench")
BENCH_PORT = 27917
ACTIVE = ["pending", "running"]

Doc = dict[str, Any]


class BenchError(RuntimeError):
    """The benchmark could not run (a process died, a wait timed out)."""


# -- the replica set ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Deployment:
    uri: str
    origin: str
    mongod_pids: list[int]  # known only for the embedded set


@contextlib.contextmanager
def replica_set(*, keep: bool) -> Iterator[Deployment]:
    """`BROOK_MONGO_URI` if set, else the embedded set on 27917-27919 under `.brook/bench`
    (`BROOK_BENCH_MONGO_PORT` / `BROOK_BENCH_HOME` move it, e.g. on a host shared with
    other benchmarks).

    An embedded set this run started is stopped at the end unless `keep`; one that was
    already running is left as it was found.
    """
    external = os.environ.get("BROOK_MONGO_URI", "").strip()
    if external:
        yield Deployment(external, "BROOK_MONGO_URI", [])
        return
    rs = embedded_set()
    was_running = rs.running()
    try:
        uri = rs.up()
        pids = [pid for i in range(rs.members) if (pid := rs.pid(i)) is not None]
        ports = f"{rs.base_port}-{rs.base_port + rs.members - 1}"
        yield Deployment(uri, f"embedded {rs.home}, ports {ports}", pids)
    finally:
        if not keep and not was_running:
            rs.down()


def embedded_set() -> ReplicaSet:
    """The bench's embedded set (see `replica_set`)."""
    home = Path(os.environ.get("BROOK_BENCH_HOME") or ROOT / BENCH_HOME)
    port = int(os.environ.get("BROOK_BENCH_MONGO_PORT") or BENCH_PORT)
    return ReplicaSet(home=home, base_port=port)


def sync_client(uri: str) -> MongoClient[Doc]:
    """The bench's own reader: majority reads and writes, tz-aware UTC datetimes."""
    return MongoClient(
        uri,
        tz_aware=True,
        w="majority",
        readConcernLevel="majority",
        appname="brook-bench",
        serverSelectionTimeoutMS=10_000,
    )


def wait_settled(
    client: MongoClient[Doc], db: str, procs: Sequence[RoleProcess], timeout: float
) -> float:
    """Poll until no job is pending or running; the seconds it took. Each poll is an
    existence check (one index key), so the polling itself loads the primary very little."""
    jobs = client[db]["jobs"]
    start = time.monotonic()
    while jobs.find_one({"status": {"$in": ACTIVE}}, {"_id": 1}) is not None:
        for proc in procs:
            proc.check_alive()
        if time.monotonic() - start > timeout:
            active = jobs.count_documents({"status": {"$in": ACTIVE}})
            raise BenchError(f"{active} jobs still pending/running in {db} after {timeout:.0f}s")
        time.sleep(0.1)
    return time.monotonic() - start


def server_counters(client: MongoClient[Doc]) -> dict[str, int]:
    """A few cumulative counters of the primary (serverStatus), to diff around a window."""
    st = client.admin.command("serverStatus")
    metrics = st.get("metrics", {})
    fam = metrics.get("commands", {}).get("findAndModify", {})
    return {
        "findAndModify": int(fam.get("total", 0)),
        "update": int(st["opcounters"]["update"]),
        "query": int(st["opcounters"]["query"]),
        "getmore": int(st["opcounters"]["getmore"]),
        "command": int(st["opcounters"]["command"]),
        "write_conflicts": int(metrics.get("operation", {}).get("writeConflicts", 0)),
        "docs_updated": int(metrics.get("document", {}).get("updated", 0)),
        "docs_inserted": int(metrics.get("document", {}).get("inserted", 0)),
        "keys_scanned": int(metrics.get("queryExecutor", {}).get("scanned", 0)),
        "docs_scanned": int(metrics.get("queryExecutor", {}).get("scannedObjects", 0)),
    }


def wait_first_claim(
    client: MongoClient[Doc], db: str, procs: Sequence[RoleProcess], timeout: float = 90.0
) -> None:
    """Poll until some job has left `pending` (the dispatcher made its first claim)."""
    jobs = client[db]["jobs"]
    deadline = time.monotonic() + timeout
    while jobs.find_one({"status": {"$ne": "pending"}}, {"_id": 1}) is None:
        for proc in procs:
            proc.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"no job claimed in {db} after {timeout:.0f}s")
        time.sleep(0.005)


# -- role processes ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def role_env(
    uri: str, db: str, concurrency: int, api_port: int, log_level: str = "WARNING"
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        BROOK_MONGO_URI=uri,
        BROOK_DB=db,
        BROOK_API_HOST="127.0.0.1",
        BROOK_API_PORT=str(api_port),
        BROOK_CONCURRENCY=str(concurrency),
        BROOK_LOG_LEVEL=log_level,
        PYTHONUNBUFFERED="1",
    )
    return env


class RoleProcess:
    """One `python -m brook.cli ROLE` child in its own session, its output in a log file.
    `brook` (else `BROOK_BENCH_BROOK`) names another `brook` executable to run instead, in
    `cwd`: an A/B against another checkout, its own venv."""

    def __init__(
        self,
        role: str,
        env: Mapping[str, str],
        log_path: Path,
        *,
        brook: str | None = None,
        cwd: Path = ROOT,
    ) -> None:
        self.role = role
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        other = brook or os.environ.get("BROOK_BENCH_BROOK")
        self.proc = subprocess.Popen(
            [other, role] if other else [sys.executable, "-m", "brook.cli", role],
            env=dict(env),
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            code = self.proc.returncode
            why = " (a clean exit: it was sent SIGTERM/SIGINT)" if code == 0 else ""
            raise BenchError(f"`brook {self.role}` exited with {code}{why}:\n{self.tail()}")

    def stop(self, timeout: float = 45.0) -> int:
        """SIGTERM, wait; SIGKILL its process group (its workers) if it will not stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        self.returncode = self.proc.returncode
        return self.proc.returncode

    def log_events(self, min_level: str = "warning") -> dict[str, int]:
        """`level:event` counts of its JSON log lines at `min_level` or above, plus
        `non_json` for any other line."""
        rank = {"debug": 0, "info": 1, "warning": 2, "error": 3, "critical": 4}
        counts: Counter[str] = Counter()
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return {}
        for line in lines:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                counts["non_json"] += 1
                continue
            level = str(rec.get("level", "?"))
            if rank.get(level, 9) >= rank[min_level]:
                counts[f"{level}:{rec.get('event', '?')}"] += 1
        return dict(counts)


@contextlib.contextmanager
def role(
    name: str, env: Mapping[str, str], log_path: Path, *, brook: str | None = None, cwd: Path = ROOT
) -> Iterator[RoleProcess]:
    proc = RoleProcess(name, env, log_path, brook=brook, cwd=cwd)
    try:
        yield proc
    finally:
        proc.stop()


# -- the HTTP API ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Api:
    base_url: str
    headers: dict[str, str]


def api_for(port: int) -> Api:
    token = os.environ.get("BROOK_API_TOKEN", "").strip()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Api(base_url=f"http://127.0.0.1:{port}", headers=headers)


def wait_api(api: Api, proc: RoleProcess, timeout: float = 60.0) -> None:
    """`/healthz` answers (the process is up), then `/readyz` (it reaches a primary)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=api.base_url, timeout=2.0) as http:
        for path in ("/healthz", "/readyz"):
            while True:
                proc.check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(path).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise BenchError(f"API {path} not 200 after {timeout:.0f}s:\n{proc.tail()}")
                time.sleep(0.1)


def wait_dispatcher(api: Api, procs: Sequence[RoleProcess], timeout: float = 90.0) -> str:
    """Submit one `noop` and wait for it to complete: the dispatcher is then up. Its job id."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=api.base_url, headers=api.headers, timeout=10.0) as http:
        resp = http.post("/jobs", json={"task": "noop", "payload": {"bench": "warmup"}})
        if resp.status_code != 202:
            raise BenchError(f"warm-up submit failed: {resp.status_code} {resp.text[:300]}")
        job_id: str = resp.json()["id"]
        while time.monotonic() < deadline:
            for proc in procs:
                proc.check_alive()
            job = http.get(f"/jobs/{job_id}").json()
            if job["status"] == "completed":
                return job_id
            if job["status"] in ("failed", "cancelled"):
                raise BenchError(f"warm-up job {job_id} ended {job['status']}: {job['error']}")
            time.sleep(0.05)
    raise BenchError(f"warm-up job not completed after {timeout:.0f}s")


# -- CPU accounting ----------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name: field N (1-based, as
    `man proc` numbers them) is index N - 3; None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads); 0 if it is gone."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / TICK if fields else 0.0


def children(pid: int) -> list[int]:
    """Every descendant of `pid` (a dispatcher's workers are forks of its fork server)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields:
                parents.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    todo = list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo += parents.get(child, [])
    return out


def system_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return total - idle, total


@contextlib.contextmanager
def cpu_meter(groups: Mapping[str, Sequence[int]]) -> Iterator[dict[str, Any]]:
    """CPU used during the block: the whole machine (share of all cores) and per process group
    (CPU seconds and share of one core). The dict it yields is filled in at the end."""
    report: dict[str, Any] = {}
    t0 = time.monotonic()
    sys0 = system_ticks()
    before = {label: sum(proc_cpu_s(p) for p in pids) for label, pids in groups.items()}
    try:
        yield report
    finally:
        wall = time.monotonic() - t0
        sys1 = system_ticks()
        report["wall_s"] = round(wall, 3)
        report["machine_busy_share"] = round((sys1[0] - sys0[0]) / max(sys1[1] - sys0[1], 1), 3)
        report["groups"] = {}
        ours = 0.0
        for label, pids in groups.items():
            used = sum(proc_cpu_s(p) for p in pids) - before[label]
            ours += used
            report["groups"][label] = {
                "processes": len(pids),
                "cpu_s": round(used, 2),
                "share_of_one_core": round(used / wall, 3) if wall else None,
            }
        # Whatever else ran on the machine meanwhile (other sessions' tests, the kernel): noise.
        cores = os.cpu_count() or 1
        report["other_cores"] = round(
            max(report["machine_busy_share"] * cores - ours / max(wall, 1e-9), 0.0), 2
        )


# -- py-spy (optional) -------------------------------------------------------------------------


class Profiler:
    """`py-spy record --nonblocking` on a role process while a block runs (if py-spy given)."""

    def __init__(self, exe: str | None, out_dir: Path, rate: int = 250) -> None:
        self.exe = exe
        self.out_dir = out_dir
        self.rate = rate
        self.recorded: dict[str, tuple[Path, float]] = {}  # label -> (file, seconds)

    @contextlib.contextmanager
    def record(self, label: str, pid: int) -> Iterator[None]:
        if self.exe is None:
            yield
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{label}.collapsed.txt"
        err = self.out_dir / f"{label}.py-spy.log"
        with open(err, "wb") as errf:
            proc = subprocess.Popen(
                [
                    self.exe,
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    str(self.rate),
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--output",
                    str(path),
                ],
                stdout=errf,
                stderr=subprocess.STDOUT,
            )
            started = time.monotonic()
            try:
                yield
            finally:
                elapsed = time.monotonic() - started
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.recorded[label] = (path, elapsed)

    def summaries(self) -> dict[str, dict[str, Any]]:
        return {
            label: summarize_profile(path, seconds, self.rate)
            for label, (path, seconds) in self.recorded.items()
        }


def summarize_profile(path: Path, seconds: float, rate: int, top: int = 12) -> dict[str, Any]:
    """Samples of a collapsed-stack file: busy share of wall time, top self and inclusive frames."""
    selfc: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        selfc[_short(frames[-1])] += n
        for name in {_short(f) for f in frames}:
            incl[name] += n
    if total == 0:
        return {"samples": 0}
    return {
        "samples": total,
        "busy_share_of_wall": round(total / max(seconds * rate, 1), 3),
        "top_self": [(k, round(100 * v / total, 1)) for k, v in selfc.most_common(top)],
        "top_inclusive": [(k, round(100 * v / total, 1)) for k, v in incl.most_common(top * 2)],
    }


def _short(frame: str) -> str:
    """`func (path/to/file.py:123)` → `func (file.py)`; keeps the function and its module."""
    name, _, where = frame.partition(" (")
    file = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(file).parts
    short = "/".join(parts[-2:]) if parts else file
    return f"{name} ({short})"
