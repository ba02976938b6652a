"""`jobcost`: the CPU one job costs each process of a deployment, at a steady arrival rate.

    python -m bench.run --scenario jobcost [--rate 50] [--jobs 500] [--via http,client]
                        [--checkout PATH] [--warmup 100] [--mongo-port 26417] [--window-s 30]

For each way in (`--via`), on a fresh embedded three-node set of its own (ports
`--mongo-port` to +2, data under `.brook/bench-jobcost-<stamp>-<via>`, stopped and deleted at the
end; `BROOK_MONGO_URI` is not used): one `brook api` and one `brook dispatcher`, every
setting at its checkout's default (concurrency, prefetch, the demo tasks; only the
addresses, the database, a token, the metrics port and the log level, `--log-level`, WARNING
as in the other scenarios, are set), `--warmup` `noop` jobs not counted, `IDLE_S` seconds
with nothing submitted (the cost of an idle deployment, per second), then `--jobs` `noop`
jobs at `--rate` jobs/s, open loop (job i is sent at t0 + i/rate whatever earlier submits
do), until all completed.
`http` posts them to `POST /jobs` from this process; `client` submits them with
`brook.Client.submit` from a submitter process of their own (`bench/jobcost_submit.py`)
run by the measured checkout's Python. Neither submitter is counted in the total.

CPU is utime + stime from `/proc/<pid>/stat` (clock ticks), read just before the first
measured submit and just after the last measured job completed, of: the API; the dispatcher
and every descendant (its fork server and worker processes, found by walking `/proc` at
both reads); the three `mongod`. A process alive at both reads counts its difference, one
born in between all it used; one that ended in between loses what it used after the first
read (its parent's reaped-children time, which takes it in once it is waited for, is
reported beside). The counts
are in the output. Latency is the job documents' `finished_at - created_at` (the server's
`$$NOW`, millisecond stamps).

The measured jobs are also cut into windows of `--window-s` seconds from the first measured
submit: each window's jobs (by `created_at`), their e2e p50/p99 and the CPU-ms per job of
each role in it (a reading of every group at each window's end), with the seconds since the
set was made. `--warmup 0 --jobs 9000` thus shows whether the first minute after a fresh
start is slower than the minutes after it.

`--checkout PATH` runs the roles and the submitter from another checkout of Brook
(`PATH/.venv/bin/brook`, `PATH/.venv/bin/python`), for an A/B against an older commit;
the set, the clock and the `/proc` reads stay this checkout's. A checkout without
`brook.Client` (from before the Python API) skips `client`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import httpx
from pymongo import MongoClient

from bench.harness import (
    OUT,
    ROOT,
    TICK,
    Api,
    BenchError,
    Doc,
    RoleProcess,
    children,
    free_port,
    role,
    stat_fields,
    sync_client,
    system_ticks,
    wait_api,
    wait_dispatcher,
    wait_settled,
)
from bench.jobcost_submit import open_loop
from bench.stats import JobTimes, anomalies, dist, ms
from brook.errors import EmbeddedMongoError
from brook.replset import ReplicaSet

DB = "bench_jobcost"
TASK = "noop"
IDLE_S = 5.0
BASE_PORT = 26417
ROLES = ("api", "dispatcher", "mongod")  # what the total adds up
SUBMITTER = Path(__file__).with_name("jobcost_submit.py")
PROJECTION = {"status": 1, "attempts": 1, "created_at": 1, "started_at": 1, "finished_at": 1}

Submit = Callable[[str, int], dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class Options:
    """The scenario's knobs, from `python -m bench.run`'s arguments."""

    rate: float
    jobs: int
    warmup: int
    vias: tuple[str, ...]
    port: int
    log_level: str
    window_s: float

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        vias = tuple(v.strip() for v in args.via.split(",") if v.strip())
        if not vias or any(v not in ("http", "client") for v in vias):
            raise BenchError(f"--via takes http, client or both, not {args.via!r}")
        port = args.mongo_port or BASE_PORT
        return cls(
            rate=args.rate,
            jobs=args.jobs,
            warmup=args.warmup,
            vias=vias,
            port=port,
            log_level=args.log_level,
            window_s=args.window_s,
        )


@dataclass(frozen=True, kw_only=True)
class Checkout:
    """Where the measured roles and the client submitter come from."""

    root: Path
    brook: str | None  # None: this checkout's `python -m brook.cli`, as the other scenarios
    python: str
    commit: str

    @classmethod
    def at(cls, path: str | None) -> Checkout:
        if path is None:
            return cls(root=ROOT, brook=None, python=sys.executable, commit=_commit(ROOT))
        root = Path(path).resolve()
        brook, python = root / ".venv" / "bin" / "brook", root / ".venv" / "bin" / "python"
        for exe in (brook, python):
            if not os.access(exe, os.X_OK):
                raise BenchError(f"--checkout {path}: no {exe} (make a venv there, pip install)")
        return cls(root=root, brook=str(brook), python=str(python), commit=_commit(root))

    def no_client(self) -> str | None:
        """Why `--via client` cannot run on this checkout (no `brook.Client`), or None."""
        probe = subprocess.run(
            [self.python, "-P", "-c", "from brook import Client"],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if probe.returncode == 0:
            return None
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"skipped: this checkout has no brook.Client ({last})"


def _commit(root: Path) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return out.stdout.strip() or "?"
    return "?"


# -- CPU of process trees ----------------------------------------------------------------------

Key = tuple[int, int]  # (pid, start time): a pid the kernel reuses is another process


@dataclass(frozen=True)
class Reading:
    """The CPU ticks of some processes at one moment, and what their roots have reaped."""

    ticks: dict[Key, int]
    reaped: int  # cutime + cstime of the roots: children they waited for, whole lives


def read(roots: Sequence[int], *, descendants: bool) -> Reading:
    ticks: dict[Key, int] = {}
    reaped = 0
    for root in roots:
        for pid in [root, *(children(root) if descendants else [])]:
            fields = stat_fields(pid)
            if fields is None:
                continue
            ticks[(pid, int(fields[19]))] = int(fields[11]) + int(fields[12])
            if pid == root:
                reaped += int(fields[13]) + int(fields[14])
    return Reading(ticks, reaped)


def used(before: Reading, after: Reading) -> dict[str, Any]:
    """CPU-ms between two readings, and which processes each counted."""
    both = before.ticks.keys() & after.ticks.keys()
    born = after.ticks.keys() - before.ticks.keys()
    ticks = sum(after.ticks[k] - before.ticks[k] for k in both) + sum(after.ticks[k] for k in born)
    return {
        "cpu_ms": round(ticks * 1000 / TICK, 1),
        "alive_at_both": len(both),
        "born_between": len(born),
        "ended_between": len(before.ticks.keys() - after.ticks.keys()),
        "reaped_children_cpu_ms": round((after.reaped - before.reaped) * 1000 / TICK, 1),
    }


Groups = Mapping[str, tuple[Sequence[int], bool]]  # label -> (roots, with descendants)


@dataclass(frozen=True)
class Snapshot:
    """Every group's reading, the monotonic clock and the machine's busy ticks, at once."""

    at: float
    system: tuple[int, int]
    groups: dict[str, Reading]

    @classmethod
    def take(cls, groups: Groups) -> Snapshot:
        readings = {k: read(roots, descendants=d) for k, (roots, d) in groups.items()}
        return cls(time.monotonic(), system_ticks(), readings)

    def since(self, earlier: Snapshot) -> dict[str, Any]:
        wall = self.at - earlier.at
        busy = (self.system[0] - earlier.system[0]) / max(self.system[1] - earlier.system[1], 1)
        groups = {k: used(earlier.groups[k], r) for k, r in self.groups.items()}
        ours = sum(g["cpu_ms"] for g in groups.values()) / 1000
        return {
            "wall_s": round(wall, 3),
            "machine_busy_share": round(busy, 3),
            # Cores busy with anything else: this harness, other sessions' tests, the kernel.
            "other_cores": round(max(busy * (os.cpu_count() or 1) - ours / max(wall, 1e-9), 0), 2),
            "groups": groups,
        }


class Marks(threading.Thread):
    """A snapshot of every group each `every` seconds after `first`, and one when finished:
    the edges of the measured windows."""

    def __init__(self, groups: Groups, first: Snapshot, every: float) -> None:
        super().__init__(name="jobcost-windows", daemon=True)
        self.groups, self.every = groups, every
        self.readings = [first]
        self._done = threading.Event()

    def run(self) -> None:
        start = self.readings[0].at
        k = 1
        while not self._done.wait(max(start + k * self.every - time.monotonic(), 0.0)):
            self.readings.append(Snapshot.take(self.groups))
            k += 1

    def finish(self) -> list[Snapshot]:
        self._done.set()
        self.join()
        self.readings.append(Snapshot.take(self.groups))
        return self.readings


# -- submitting --------------------------------------------------------------------------------


class HttpSubmitter:
    """`submit(task, payload)` as one `POST /jobs`: what `open_loop` calls for `--via http`
    (a thread-safe connection pool, kept across the warm-up and the measured jobs)."""

    def __init__(self, api: Api) -> None:
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        self.http = httpx.Client(
            base_url=api.base_url, headers=api.headers, timeout=30.0, limits=limits
        )

    def submit(self, task: str, payload: Doc) -> None:
        resp = self.http.post("/jobs", json={"task": task, "payload": payload})
        if resp.status_code != 202:
            raise BenchError(f"POST /jobs answered {resp.status_code}")


@dataclass(frozen=True, kw_only=True)
class Way:
    """How the jobs go in: `send(phase, n)`, and the submitter process to meter if it is one
    of its own; or why this checkout cannot submit this way."""

    send: Submit | None = None
    pid: int | None = None
    skipped: str | None = None


@contextlib.contextmanager
def http_submit(api: Api, rate: float) -> Iterator[Way]:
    submitter = HttpSubmitter(api)
    try:
        yield Way(send=lambda phase, n: open_loop(submitter, TASK, phase, n, rate))
    finally:
        submitter.http.close()


class ClientSubmitter:
    """`bench/jobcost_submit.py` run by the measured checkout's Python: one command a line
    on its stdin, one JSON answer a line on its stdout."""

    def __init__(self, checkout: Checkout, env: Mapping[str, str], rate: float, log: Path):
        log.parent.mkdir(parents=True, exist_ok=True)
        self._err: IO[bytes] = open(log, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [checkout.python, "-P", str(SUBMITTER), "--rate", str(rate), "--task", TASK],
            env=dict(env),
            cwd=checkout.root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            start_new_session=True,
        )
        self.log = log

    def answer(self, timeout: float) -> Doc:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            tail = self.log.read_text(errors="replace")[-2000:]
            code = self.proc.poll()
            raise BenchError(f"the client submitter gave no answer (exit {code}):\n{tail}")
        answer: Doc = json.loads(line)
        return answer

    def submit(self, phase: str, n: int, rate: float) -> Doc:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{phase} {n}\n")
        self.proc.stdin.flush()
        return self.answer(timeout=120 + 2 * n / rate)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self._err):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()


@contextlib.contextmanager
def client_submit(
    checkout: Checkout, env: Mapping[str, str], rate: float, log: Path
) -> Iterator[Way]:
    sub = ClientSubmitter(checkout, env, rate, log)
    try:
        hello = sub.answer(timeout=60)
        if "error" in hello:
            yield Way(skipped=f"skipped: {hello['error']}")
        else:
            yield Way(send=lambda phase, n: sub.submit(phase, n, rate), pid=sub.proc.pid)
    finally:
        sub.close()


# -- one way in, on a set of its own -----------------------------------------------------------


def role_env(opts: Options, checkout: Checkout, uri: str) -> dict[str, str]:
    """The roles' environment: this one less every `BROOK_*` (each setting at the measured
    checkout's default), plus what old and new checkouts read to find the set and each
    other. A superset: a checkout ignores the variables it does not know."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROOK_")}
    if checkout.brook is not None:
        env.pop("PYTHONPATH", None)  # this checkout's packages must not shadow the other's
    token = os.environ.get("BROOK_API_TOKEN", "").strip() or secrets.token_urlsafe(24)
    env.update(
        BROOK_MONGO_URI=uri,
        BROOK_DB=DB,
        BROOK_API_HOST="127.0.0.1",
        BROOK_API_PORT=str(free_port()),
        BROOK_API_TOKEN=token,  # both old and new check it: the same work per request
        BROOK_METRICS_PORT=str(free_port()),  # on, as by default, on a port nobody else holds
        BROOK_LOG_LEVEL=opts.log_level,
        PYTHONUNBUFFERED="1",
    )
    return env


def run_via(opts: Options, checkout: Checkout, via: str, stamp: str, log_dir: Path) -> Doc:
    """One way in, on a fresh set that is stopped and deleted at the end."""
    home = ROOT / ".brook" / f"bench-jobcost-{stamp}-{via}"
    rs = ReplicaSet(home=home, base_port=opts.port)
    try:
        try:
            uri = rs.up()
        except EmbeddedMongoError as exc:
            raise BenchError(f"the set on ports {opts.port}-{opts.port + 2}: {exc}") from exc
        made = time.monotonic()
        mongods = [pid for i in range(rs.members) if (pid := rs.pid(i)) is not None]
        return measure(opts, checkout, via, uri, mongods, log_dir, made)
    finally:
        rs.down()
        shutil.rmtree(home, ignore_errors=True)


def measure(
    opts: Options,
    checkout: Checkout,
    via: str,
    uri: str,
    mongods: list[int],
    log_dir: Path,
    made: float,
) -> Doc:
    """Start the roles, warm up, sit idle, then the measured jobs between two CPU readings."""
    env = role_env(opts, checkout, uri)
    api = Api(
        base_url=f"http://127.0.0.1:{env['BROOK_API_PORT']}",
        headers={"Authorization": f"Bearer {env['BROOK_API_TOKEN']}"},
    )
    db = sync_client(uri)
    with contextlib.ExitStack() as stack:
        stack.callback(db.close)
        procs = [
            stack.enter_context(
                role(
                    name,
                    env,
                    log_dir / f"{via}-{name}.log",
                    brook=checkout.brook,
                    cwd=checkout.root,
                )
            )
            for name in ("dispatcher", "api")
        ]
        wait_api(api, procs[1])
        wait_dispatcher(api, procs)
        way = stack.enter_context(
            http_submit(api, opts.rate)
            if via == "http"
            else client_submit(checkout, env, opts.rate, log_dir / f"{via}-submitter.log")
        )
        if way.send is None:
            return {
                "scenario": "jobcost",
                "via": via,
                "commit": checkout.commit,
                "skipped": way.skipped,
            }
        sent, idle, window, readings = phases(opts, db, procs, way.send, way.pid, mongods)
        docs = db[DB]["jobs"].find({"payload.bench": "measured"}, PROJECTION)
        jobs = [JobTimes.from_doc(d) for d in docs]
        logs = {p.role: p.log_events() for p in procs}
    return figures(opts, checkout, via, sent, idle, window, jobs) | {
        "windows": by_window(readings, jobs, opts.window_s, readings[0].at - made),
        "logs": logs,
    }


def phases(
    opts: Options,
    db: MongoClient[Doc],
    procs: list[RoleProcess],
    send: Submit,
    submitter: int | None,
    mongods: list[int],
) -> tuple[Doc, Doc, Doc, list[Snapshot]]:
    """The warm-up (not counted), `IDLE_S` seconds with nothing sent, then the measured
    jobs: what the submitter saw, and the CPU used while idle and while measured."""
    dispatcher, api = procs
    send("warmup", opts.warmup)
    wait_settled(db, DB, procs, timeout=120 + 2 * opts.warmup / opts.rate)
    groups: dict[str, tuple[Sequence[int], bool]] = {
        "api": ([api.pid], True),
        "dispatcher": ([dispatcher.pid], True),
        "mongod": (mongods, False),
    }
    if submitter is not None:
        groups["client_submitter"] = ([submitter], False)
    idle_start = Snapshot.take(groups)
    time.sleep(IDLE_S)
    idle = Snapshot.take(groups).since(idle_start)
    before = Snapshot.take(groups)
    marks = Marks(groups, before, opts.window_s)
    marks.start()
    try:
        sent = send("measured", opts.jobs)
        wait_settled(db, DB, procs, timeout=120 + 2 * opts.jobs / opts.rate)
    finally:
        readings = marks.finish()
    return sent, idle, readings[-1].since(before), readings


# -- figures -----------------------------------------------------------------------------------


def figures(
    opts: Options,
    checkout: Checkout,
    via: str,
    sent: Doc,
    idle: Doc,
    window: Doc,
    jobs: list[JobTimes],
) -> Doc:
    """The JSON object of one way in: CPU-ms per job of each role and their total (the
    client submitter's beside, not in it), latency, the achieved rate, the idle cost."""
    groups = window["groups"]
    n = max(len(jobs), 1)
    per_job = {label: round(g["cpu_ms"] / n, 3) for label, g in groups.items()}
    per_job["total"] = round(sum(per_job[label] for label in ROLES), 3)
    e2e = dist([ms(j.finished, j.created) for j in jobs if j.finished is not None])
    rtt = dist(sent["rtt_ms"])
    idle_rate = {
        label: round(g["cpu_ms"] / max(idle["wall_s"], 1e-9), 2)
        for label, g in idle["groups"].items()
    }
    span = sent["send_span_s"]
    return {
        "scenario": "jobcost",
        "via": via,
        "checkout": str(checkout.root),
        "commit": checkout.commit,
        "task": TASK,
        "rate": opts.rate,
        "achieved_rate": round((sent["sent"] - 1) / span, 2) if span > 0 else None,
        "jobs": len(jobs),
        "warmup": opts.warmup,
        "cpu_ms_per_job": per_job,
        "e2e_ms": {k: e2e.get(k) for k in ("p50", "p99", "max")}
        | {"source": "job documents: finished_at - created_at (server stamps, ms)"},
        "submit": {
            "ok": sent["ok"],
            "errors": sent["errors"],
            "rtt_ms": {k: rtt.get(k) for k in ("p50", "p99")},
            "schedule_lag_ms_max": round(max(sent["lag_ms"], default=0.0), 1),
        },
        "anomalies": anomalies(jobs),
        "idle_cpu_ms_per_s": idle_rate,
        # Of the figures per job, what the same processes used in as long a time idle.
        "idle_part_ms_per_job": {
            label: round(ms_s * window["wall_s"] / n, 3) for label, ms_s in idle_rate.items()
        },
        "window": {k: window[k] for k in ("wall_s", "machine_busy_share", "other_cores")}
        | {"loadavg": [round(x, 2) for x in os.getloadavg()]},
        "processes": {
            label: {k: v for k, v in g.items() if k != "cpu_ms"}
            for label, g in groups.items()
            if label != "mongod"
        },
        "log_level": opts.log_level,
    }


def by_window(
    readings: list[Snapshot], jobs: list[JobTimes], every: float, offset: float
) -> list[Doc]:
    """The measured jobs cut at the readings' edges (by `created_at`, from the first job's):
    each window's jobs, e2e and CPU-ms per job; `from_s` counts from the set's start."""
    if not jobs:
        return []
    origin = min(j.created for j in jobs)
    span = (max(j.created for j in jobs) - origin).total_seconds()
    # The settling after the last submit belongs to the last window that has jobs.
    readings = [*readings[: min(int(span / every) + 1, len(readings) - 1)], readings[-1]]
    last = len(readings) - 2
    buckets: list[list[JobTimes]] = [[] for _ in range(last + 1)]
    for j in jobs:
        buckets[min(int((j.created - origin).total_seconds() / every), last)].append(j)
    out: list[Doc] = []
    for k, window in enumerate(buckets):
        spent = readings[k + 1].since(readings[k])
        n = max(len(window), 1)
        per_job = {g: round(v["cpu_ms"] / n, 2) for g, v in spent["groups"].items()}
        per_job["total"] = round(sum(per_job[label] for label in ROLES), 2)
        e2e = dist([ms(j.finished, j.created) for j in window if j.finished is not None])
        out.append(
            {
                "from_s": round(offset + k * every, 1),
                "wall_s": spent["wall_s"],
                "jobs": len(window),
                "e2e_ms": {p: e2e.get(p) for p in ("p50", "p99", "max")},
                "cpu_ms_per_job": per_job,
            }
        )
    return out


def table(checkout: Checkout, opts: Options, results: list[Doc]) -> str:
    """The short human summary: one row per way in."""
    lines = [
        f"jobcost: {checkout.root} @ {checkout.commit}; {TASK}, {opts.jobs} jobs at "
        f"{opts.rate:g}/s after {opts.warmup} not counted; CPU-ms per job",
        f"  {'via':<7}{'api':>7}{'disp+workers':>14}{'mongod x3':>11}{'total':>8}"
        f"{'client':>8}   e2e p50/p99 ms   achieved/s   idle ms/s api/disp/mongod",
    ]
    for r in results:
        if "cpu_ms_per_job" not in r:
            lines.append(f"  {r['via']:<7}{r.get('skipped') or 'ERROR: ' + str(r.get('error'))}")
            continue
        c, e, idle = r["cpu_ms_per_job"], r["e2e_ms"], r["idle_cpu_ms_per_s"]
        client = f"{c['client_submitter']:8.2f}" if "client_submitter" in c else f"{'-':>8}"
        lines.append(
            f"  {r['via']:<7}{c['api']:7.2f}{c['dispatcher']:14.2f}{c['mongod']:11.2f}"
            f"{c['total']:8.2f}{client}   {e['p50']:6.1f} / {e['p99']:<6.1f}"
            f"   {r['achieved_rate']:10.1f}   {idle['api']:.1f}/{idle['dispatcher']:.1f}/"
            f"{idle['mongod']:.1f}"
        )
        for w in r["windows"] if len(r["windows"]) > 1 else []:
            lines.append(
                f"  {'':<7}from {w['from_s']:5.0f} s: {w['jobs']:5d} jobs, total "
                f"{w['cpu_ms_per_job']['total']:6.2f} CPU-ms/job, e2e p50/p99 "
                f"{w['e2e_ms']['p50']} / {w['e2e_ms']['p99']} ms"
            )
        if r["anomalies"]["count"] or r["submit"]["errors"]:
            lines.append(
                f"  {'':<7}anomalies {r['anomalies']}; submit errors {r['submit']['errors']}"
            )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Each way in, one after the other, each on its own fresh set; a JSON line for each, the
    table, and the raw figures in `bench/out/<stamp>-jobcost.json`."""
    opts = Options.from_args(args)
    checkout = Checkout.at(args.checkout)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    log_dir = OUT / f"{stamp}-jobcost"
    results: list[Doc] = []
    for via in opts.vias:
        print(f"[bench] jobcost/{via} ...", file=sys.stderr, flush=True)
        why = checkout.no_client() if via == "client" else None
        try:
            result = (
                {"scenario": "jobcost", "via": via, "commit": checkout.commit, "skipped": why}
                if why
                else run_via(opts, checkout, via, stamp, log_dir)
            )
        except BenchError as exc:
            result = {
                "scenario": "jobcost",
                "via": via,
                "commit": checkout.commit,
                "error": str(exc),
            }
        results.append(result)
        print(json.dumps(result, default=str), flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{stamp}-jobcost.json"
    raw = {"stamp": stamp, "args": vars(args), "log_dir": str(log_dir), "results": results}
    path.write_text(json.dumps(raw, indent=1, default=str))
    print(table(checkout, opts, results))
    print(f"raw figures: {path.relative_to(ROOT)}; role logs: {log_dir.relative_to(ROOT)}")
    return 1 if any("error" in r for r in results) else 0
