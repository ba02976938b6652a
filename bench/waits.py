"""The `waits` scenario: jobs that only wait, Brook's shared jobs side by side with arq and
Celery, in one run (issue 43).

    python -m bench.run --scenario waits [--jobs 1000] [--seconds 2] [--burst 10000 [--burst-kill]]

Two workloads, each on the three systems one after another (`bench/waits_work.py`):
`sleep` (each job awaits `--seconds` of `asyncio.sleep`; Celery's threads `time.sleep`) and
`stream` (each job streams a chat completion from the model API stand-in,
`brook.testing.model_api`, a child process: ~50 tokens over `--seconds`, read with httpx).

* Brook: one `brook dispatcher` (fresh database, `BROOK_TASKS=bench.waits_tasks`: a task
  declared `shared=1000`, the defaults otherwise: one shared worker process,
  `BROOK_SHARED_MAX` 1,000). The jobs go in with one `AsyncClient.submit_many`; wall is
  from just before that call to the last `finished_at` (the server's stamp, same host clock).
* arq (one worker process, `max_jobs=1000`) and Celery (thread pool `-c 200`, Redis broker
  on 6390): `bench/peers_waits.py` under the peers' virtualenvs (`$PEERS_HOME`, default
  `/tmp/brook-peers`, made by `../shared/bench-peers/setup.sh`); wall from the first enqueue
  to the last finish each job records.

For each: wall against the ideal (`--seconds`), the peak PSS of the worker side (the
dispatcher and all its descendants; the arq or Celery worker process) sampled every 100 ms,
its PSS at idle after a warm-up job, and its CPU-ms per job (utime + stime of that tree
over the measured window / jobs). `--burst N` (0: skip) adds N `sleep` jobs across two
dispatchers (at most 2,000 in flight: 1,000 each) and checks that none is lost and each
completed once, by status, `attempts` and its history. With `--burst-kill`, the primary is
SIGKILLed once half of the burst has started (the embedded set only; the member is started
again after), and the checks are: none lost, none completed twice (a job whose attempt the
failover cut runs again: the attempts are reported).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.failover import primary_pid
from bench.harness import (
    ROOT,
    BenchError,
    RoleProcess,
    embedded_set,
    free_port,
    role,
    role_env,
    wait_settled,
)
from bench.procmeter import TreeMeter, per_job
from bench.scenarios import Context
from bench.stats import JobTimes, dist, max_overlap, ms
from bench.waits_tasks import SHARED
from brook import AsyncClient
from brook.testing.model_api import ModelAPI

PEERS_HOME = Path(os.environ.get("PEERS_HOME", "/tmp/brook-peers"))
PEER_VENVS = {"arq": "venv-arq", "celery": "venv"}
TARGET_WALL_VS_ARQ = 1.2
TARGET_PSS_MIB = 512.0
NOFILE = 65536
PROJECTION = {"status": 1, "attempts": 1, "created_at": 1, "started_at": 1, "finished_at": 1}


def raise_nofile() -> int:
    """Raise this process's open-files limit (the roles inherit it): the soft limit as far as
    the hard one, which root may raise too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _payload(mode: str, seconds: float, url: str) -> dict[str, Any]:
    return {"task": "bench_wait", "payload": {"mode": mode, "seconds": seconds, "url": url}}


async def _submit(uri: str, db: str, specs: list[dict[str, Any]]) -> None:
    async with AsyncClient(uri, db) as client:
        for first in range(0, len(specs), 1000):
            await client.submit_many(specs[first : first + 1000])


@contextlib.contextmanager
def _dispatchers(ctx: Context, db: str, label: str, n: int) -> Iterator[list[RoleProcess]]:
    env = role_env(ctx.deployment.uri, db, ctx.concurrency, free_port(), ctx.log_level)
    env["BROOK_TASKS"] = "bench.waits_tasks"
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                role(
                    "dispatcher",
                    # metrics on, as by default, each on a port of its own
                    {**env, "BROOK_METRICS_PORT": str(free_port())},
                    ctx.log_dir / f"{label}-{i}.log",
                )
            )
            for i in range(n)
        ]


def _warm_up(ctx: Context, db: str, procs: list[RoleProcess]) -> None:
    """One shared job per dispatcher, completed: each is up with its shared process."""
    asyncio.run(_submit(ctx.deployment.uri, db, [_payload("sleep", 0.0, "")] * len(procs)))
    wait_settled(ctx.client, db, procs, 120)
    ctx.client[db]["jobs"].delete_many({})


def brook(
    ctx: Context,
    mode: str,
    jobs: int,
    seconds: float,
    url: str,
    dispatchers: int = 1,
    kill_primary: bool = False,
) -> dict[str, Any]:
    """`jobs` shared jobs on `dispatchers` dispatchers: wall, PSS, CPU, and the checks;
    `kill_primary`: the primary SIGKILLed once half of them have started."""
    label = f"waits_{mode}_{jobs}x{dispatchers}"
    db = ctx.new_db(label)
    with _dispatchers(ctx, db, label, dispatchers) as procs:
        meters = [TreeMeter(p.pid).start() for p in procs]
        _warm_up(ctx, db, procs)
        time.sleep(1.0)  # idle PSS after the warm-up
        for m in meters:
            m.mark()
        t0 = time.time()
        killer = PrimaryKiller(ctx, db, jobs // 2).start() if kill_primary else None
        asyncio.run(_submit(ctx.deployment.uri, db, [_payload(mode, seconds, url)] * jobs))
        submitted = time.time() - t0
        wait_settled(ctx.client, db, procs, 120 + 4 * seconds * jobs / 1000)
        figs = [m.stop() for m in meters]
        for p in procs:
            p.check_alive()
        logs = {f"dispatcher-{i}": p.log_events() for i, p in enumerate(procs)}
    return {
        "system": "brook",
        "mode": mode,
        "jobs": jobs,
        "seconds": seconds,
        "dispatchers": dispatchers,
        "submit_s": round(submitted, 3),
        **_checks(ctx, db, jobs, t0),
        **per_job(_sum(figs), jobs),
        "per_dispatcher": figs,
        "logs": logs,
        **({"killed": killer.stop(t0)} if killer is not None else {}),
    }


class PrimaryKiller:
    """SIGKILLs the embedded set's primary once `after` jobs of `db` have started (a
    thread: the submit and the wait go on meanwhile); the member is started again at
    `stop`."""

    def __init__(self, ctx: Context, db: str, after: int) -> None:
        if not ctx.deployment.mongod_pids:
            raise BenchError("--burst-kill needs the embedded set (no BROOK_MONGO_URI)")
        self.ctx, self.db, self.after = ctx, db, after
        self.killed: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PrimaryKiller:
        self._thread.start()
        return self

    def _run(self) -> None:
        jobs = self.ctx.client[self.db]["jobs"]
        while (n := jobs.count_documents({"started_at": {"$ne": None}})) < self.after:
            time.sleep(0.05)
        member, pid = primary_pid(self.ctx.client, self.ctx.deployment.mongod_pids)
        os.kill(pid, signal.SIGKILL)
        self.killed = {"member": member, "at": time.time(), "started_before": n}

    def stop(self, t0: float) -> dict[str, Any]:
        self._thread.join(timeout=600)
        embedded_set().up()  # the killed member back
        at = self.killed.pop("at", None)
        return {**self.killed, "after_s": round(at - t0, 2) if at else None}


def _sum(figs: list[dict[str, Any]]) -> dict[str, Any]:
    """One tree's figures, or several's added up (their peaks may fall at other moments:
    the sum is an upper bound of the peak of the whole)."""
    keys = ("idle_pss_mib", "peak_pss_mib", "cpu_s", "max_processes")
    return {k: round(sum(f[k] for f in figs), 2) for k in keys}


def _checks(ctx: Context, db: str, jobs: int, t0: float) -> dict[str, Any]:
    coll = ctx.client[db]["jobs"]
    docs = list(coll.find({}, {**PROJECTION, "history": 1, "result": 1}))
    if not docs:
        raise BenchError(f"no jobs in {db}")
    times = [JobTimes.from_doc(d) for d in docs]
    done = [j for j in times if j.status == "completed" and j.finished is not None]
    last = max(j.finished for j in done if j.finished is not None)
    first = min(j.created for j in times)
    # `history` has an entry per state change: one `running` and one `completed` a job run once
    runs = [_entries(d, "running") for d in docs]
    ends = [_entries(d, "completed") for d in docs]
    return {
        "finished": len(done),
        "lost": jobs - len(done),
        "completed_twice": sum(1 for e in ends if e > 1),
        "by_attempts": dict(Counter(j.attempts for j in times)),
        "not_once": sum(
            1 for j, r, e in zip(times, runs, ends, strict=True)
            if j.attempts != 1 or r != 1 or e != 1
        ),
        "ran_shared": sum(
            1 for d in docs
            if any(h.get("shared") is True for h in d["history"])  # on the attempt's end
        ),
        "tokens_min": min(int((d.get("result") or {}).get("tokens", 0)) for d in docs),
        "wall_s": round(last.timestamp() - t0, 3),
        "server_wall_s": round((last - first).total_seconds(), 3),
        "max_running": max_overlap(times),
        **_starts(times),
    }


def _starts(times: list[JobTimes]) -> dict[str, Any]:
    """How fast the jobs got started: starts/s from the first start to the last, and the
    wait from `created_at` to `started_at` (server stamps)."""
    starts = sorted(j.started for j in times if j.started is not None)
    if len(starts) < 2:
        return {}
    span = (starts[-1] - starts[0]).total_seconds()
    waits = [ms(j.started, j.created) for j in times if j.started is not None]
    return {
        "starts_per_s": round((len(starts) - 1) / span, 1) if span else None,
        "created_to_started_ms": dist(waits),
    }


def _entries(doc: dict[str, Any], status: str) -> int:
    return sum(1 for h in doc.get("history", []) if h.get("status") == status)


def peer(system: str, mode: str, jobs: int, seconds: float, url: str, log: Path) -> dict[str, Any]:
    """arq or Celery on the same workload, through its own virtualenv."""
    python = PEERS_HOME / PEER_VENVS[system] / "bin" / "python"
    if not python.exists():
        raise BenchError(f"{python} is missing: run ../shared/bench-peers/setup.sh first")
    cmd = [
        str(python), "-m", "bench.peers_waits", system, "--jobs", str(jobs),
        "--seconds", str(seconds), "--mode", mode, "--url", url, "--log", str(log),
    ]
    out = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900,
    )
    if out.returncode != 0:
        raise BenchError(f"{system} {mode}: exit {out.returncode}: {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def waits(
    ctx: Context, jobs: int, seconds: float, burst: int, burst_kill: bool = False
) -> dict[str, Any]:
    if jobs > SHARED:
        raise BenchError(f"--jobs {jobs}: at most {SHARED} (the task's shared= seats)")
    out: dict[str, Any] = {"nofile": raise_nofile(), "jobs": jobs, "seconds": seconds, "runs": []}
    ctx.log_dir.mkdir(parents=True, exist_ok=True)
    with ModelAPI(tokens=50, seconds=seconds).process() as api:
        for mode in ("sleep", "stream"):
            for system in ("brook", "arq", "celery"):
                print(f"[bench] waits {mode} {system} ...", flush=True)
                try:
                    if system == "brook":
                        run = brook(ctx, mode, jobs, seconds, api.url)
                    else:
                        log = ctx.log_dir / f"waits_{mode}_{system}.log"
                        run = peer(system, mode, jobs, seconds, api.url, log)
                except BenchError as exc:  # the others still run; the summary says so
                    run = {"system": system, "mode": mode, "error": str(exc)}
                out["runs"].append(run)
        if burst:
            print(f"[bench] waits burst {burst} on two dispatchers ...", flush=True)
            out["burst"] = brook(
                ctx, "sleep", burst, seconds, api.url, dispatchers=2, kill_primary=burst_kill
            )
    return out


def summary(res: dict[str, Any]) -> list[str]:
    lines = [
        f"waits: {res['jobs']} jobs x {res['seconds']:g} s each, ideal {res['seconds']:g} s; "
        f"peak/idle PSS of the worker side, CPU-ms per job of its process tree",
        f"  {'mode':6} {'system':7} {'wall s':>7} {'xideal':>6} {'peak MiB':>9} {'idle MiB':>9}"
        f" {'CPU-ms/job':>10}  notes",
    ]
    by: dict[tuple[str, str], dict[str, Any]] = {}
    for r in res["runs"]:
        if "error" in r:
            lines.append(f"  {r['mode']:6} {r['system']:7} ERROR: {r['error'][:300]}")
            continue
        by[(r["mode"], r["system"])] = r
        note = f"finished {r['finished']}/{r['jobs']}; min tokens {r['tokens_min']}"
        if r.get("failed"):
            note += f"; FAILED {r['failed']}"
        if r["system"] == "brook":
            note += (
                f"; not-once {r['not_once']}; ran shared {r['ran_shared']}; "
                f"max running {r['max_running']}; {r.get('starts_per_s')} starts/s"
            )
        lines.append(
            f"  {r['mode']:6} {r['system']:7} {r['wall_s']:7.2f} "
            f"{r['wall_s'] / res['seconds']:6.2f} {r['peak_pss_mib']:9.1f} "
            f"{r['idle_pss_mib']:9.1f} {r['cpu_ms_per_job']:10.2f}  {note}"
        )
    b, a = by.get(("sleep", "brook")), by.get(("sleep", "arq"))
    if b and a:
        ratio = b["wall_s"] / a["wall_s"]
        lines.append(
            f"  target wall ≤ {TARGET_WALL_VS_ARQ}x arq: {ratio:.2f}x "
            f"{'MET' if ratio <= TARGET_WALL_VS_ARQ else 'NOT MET'}; target peak PSS ≤ "
            f"{TARGET_PSS_MIB:g} MiB: {b['peak_pss_mib']:.0f} MiB "
            f"{'MET' if b['peak_pss_mib'] <= TARGET_PSS_MIB else 'NOT MET'}"
        )
    if "burst" in res and "killed" in res["burst"]:
        r = res["burst"]
        ok = r["lost"] == 0 and r["completed_twice"] == 0 and r["max_running"] <= 2 * SHARED
        lines.append(
            f"  burst with the primary ({r['killed'].get('member')}) SIGKILLed at "
            f"{r['killed'].get('after_s')} s ({r['killed'].get('started_before')} started): "
            f"{r['jobs']} jobs on 2 dispatchers: wall {r['wall_s']:.2f} s, finished "
            f"{r['finished']}, lost {r['lost']}, completed twice {r['completed_twice']}, "
            f"by attempts {r['by_attempts']}, max running {r['max_running']}: "
            f"{'MET' if ok else 'NOT MET'}"
        )
    elif "burst" in res:
        r = res["burst"]
        ok = r["lost"] == 0 and r["not_once"] == 0 and r["max_running"] <= 2 * SHARED
        lines.append(
            f"  burst: {r['jobs']} sleep jobs on 2 dispatchers: wall {r['wall_s']:.2f} s, "
            f"finished {r['finished']}, lost {r['lost']}, not-once {r['not_once']}, "
            f"max running {r['max_running']} (≤ {2 * SHARED}), "
            f"{r.get('starts_per_s')} starts/s, peak PSS (sum of both) "
            f"{r['peak_pss_mib']:.0f} MiB, CPU-ms/job {r['cpu_ms_per_job']:.2f}: "
            f"{'MET' if ok else 'NOT MET'}"
        )
    return lines
