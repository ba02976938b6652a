"""`python -m bench.run`: Brook's latency and throughput benchmark on real processes.

    python -m bench.run [--scenario latency|throughput|batch|probe|events|limits|all] [--jobs 5000]
                        [--rate 20] [--duration 30] [--concurrency N] [--limit N]
                        [--keep-mongo] [--py-spy PATH]
    python -m bench.run --scenario enqueue|startup|drain|backlog [--sizes 0,100000,1000000]
    python -m bench.run --scenario e2e [--jobs 5000]
    python -m bench.run --scenario failover [--jobs 50000] [--clients 32]
    python -m bench.run --scenario costs
    python -m bench.run --scenario fairness [--jobs 10000]
    python -m bench.run --scenario bulkplans [--jobs 100000]
    python -m bench.run --scenario keyscale [--jobs 1000000] [--rounds 2]
    python -m bench.run --scenario waits [--jobs 1000] [--seconds 2] [--burst 10000 [--burst-kill]]
    python -m bench.run --scenario output [--jobs 100] [--chunks-per-s 25] [--stream-s 10]
                        [--drain 5000]
    python -m bench.run --scenario jobcost [--rate 50] [--jobs 500] [--via http,client]
                        [--checkout PATH] [--warmup 100] [--mongo-port 26417] [--window-s 30]

`fairness` (`bench/fairness.py`) and the seven before it (`bench/scale.py`,
`bench/failover.py`, `bench/costs.py`) are not part of
`all`: `backlog` at a million jobs takes a while and a few GB of disk; `failover` kills a
member of the embedded set; `costs` measures MongoDB alone (raw PyMongo, no Brook role).
`output` (`bench/output.py`) is not either: jobs that stream their output to SSE readers,
and a drain beside them. `waits` (`bench/waits.py`) is not either: jobs that only wait
(shared jobs), Brook beside arq and Celery run from the peer harness's virtualenvs.
`jobcost` (`bench/jobcost.py`) is not either: the CPU-ms per job of the API, the
dispatcher with its workers and the three `mongod`, at a steady rate, each way in
(`--via`) on a fresh set of its own (not the one below), the roles optionally from
another checkout (`--checkout`, for an A/B against an older commit).

Each scenario gets a fresh database (`bench_<stamp>_<scenario>`, dropped at the end) and
fresh `brook api` / `brook dispatcher` processes (SIGTERM at the end, never left behind).
Times are the server's own stamps (`created_at`, `started_at`, `finished_at`, BSON dates:
millisecond resolution); HTTP round trips are measured here. Raw figures go to
`bench/out/<stamp>.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import costs, failover, fairness, jobcost, limits, output, scale, waits
from bench.events import enable_post_images, events_fanout
from bench.harness import OUT, ROOT, BenchError, Profiler, replica_set
from bench.harness import sync_client as make_sync_client
from bench.scenarios import (
    Context,
    batch_submit,
    latency,
    probe,
    throughput_backlog,
    throughput_http,
)

TARGET_P50_MS = 15.0
TARGET_P99_MS = 50.0
TARGET_JOBS_PER_S = 500.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument(
        "--scenario",
        choices=[
            "latency", "throughput", "batch", "probe", "events", "limits", "all",
            "enqueue", "startup", "drain", "backlog", "failover", "costs", "e2e", "fairness",
            "bulkplans", "keyscale", "jobcost", "waits", "output",
        ],
        default="all",
    )
    p.add_argument("--sizes", default="0,100000,1000000", help="backlog: pending jobs, each run")
    p.add_argument(
        "--jobs", type=int, default=None,
        help="throughput, batch: jobs per variant (default 5000); jobcost: measured (500)",
    )
    p.add_argument("--sse-clients", type=int, default=200, help="events: SSE clients")
    p.add_argument(
        "--rate", type=float, default=None,
        help="latency: submissions per second (default 20); jobcost: jobs per second (50)",
    )
    p.add_argument("--duration", type=float, default=30.0, help="latency: seconds of submitting")
    p.add_argument(
        "--concurrency",
        type=int,
        default=os.cpu_count() or 2,
        help="BROOK_CONCURRENCY of the dispatcher (default: the CPU count)",
    )
    p.add_argument(
        "--clients", type=int, default=None,
        help="throughput/http: HTTP connections (default 4); failover: 32",
    )
    p.add_argument("--per-client", type=int, default=4, help="throughput/http: requests each")
    p.add_argument("--preload-in-flight", type=int, default=32, help="throughput/backlog")
    p.add_argument("--limit", type=int, default=4, help="limits: the queue's concurrency")
    p.add_argument(
        "--rounds", type=int, default=2,
        help="keyscale: plain and keyed drains, alternated this many times (default 2)",
    )
    p.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="BROOK_LOG_LEVEL of the role processes (default WARNING: logging does not dominate)",
    )
    p.add_argument("--keep-mongo", action="store_true", help="leave the embedded set running")
    p.add_argument("--py-spy", dest="py_spy", help="py-spy binary: profile the role processes")
    p.add_argument("--seconds", type=float, default=2.0, help="waits: each job's wait (2)")
    p.add_argument(
        "--burst", type=int, default=0,
        help="waits: also this many jobs across two dispatchers (default 0: not run)",
    )
    p.add_argument(
        "--burst-kill", dest="burst_kill", action="store_true",
        help="waits: SIGKILL the primary once half of the burst has started",
    )
    p.add_argument(
        "--chunks-per-s", dest="chunks_per_s", type=float, default=25.0,
        help="output: chunks each job emits a second (25)",
    )
    p.add_argument(
        "--stream-s", dest="stream_s", type=float, default=10.0,
        help="output: how long each job emits (10)",
    )
    p.add_argument(
        "--drain", type=int, default=5000,
        help="output: noop jobs drained alone, then beside the streams (5000; 0: skip)",
    )
    _jobcost_args(p)
    args = p.parse_args(argv)
    jobcost = args.scenario == "jobcost"
    if args.jobs is None:
        defaults = {"waits": 1000, "output": 100}
        args.jobs = 500 if jobcost else defaults.get(args.scenario, 5000)
    if args.rate is None:
        args.rate = 50.0 if jobcost else 20.0
    if args.jobs < 1 or args.rate <= 0 or args.duration <= 0 or args.concurrency < 1:
        p.error("--jobs, --rate, --duration and --concurrency must be positive")
    if args.warmup < 0:
        p.error("--warmup must not be negative")
    if args.window_s <= 0:
        p.error("--window-s must be positive")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    return args


def _jobcost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--via", default="http,client", help="jobcost: http, client or both")
    p.add_argument("--checkout", help="jobcost: run the roles from this checkout's .venv")
    p.add_argument("--warmup", type=int, default=100, help="jobcost: jobs not counted, first")
    p.add_argument(
        "--mongo-port", type=int, default=None,
        help="jobcost: first of the three ports of its fresh set (default 26417)",
    )
    p.add_argument(
        "--window-s", type=float, default=30.0,
        help="jobcost: cut the measured jobs into windows this long (default 30 s)",
    )


def environment(uri_origin: str, client: Any, concurrency: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "host_cores": os.cpu_count(),
        "host_mem_gib": _mem_gib(),
        "os": _os_name(),
        "python": platform.python_version(),
        "mongo": uri_origin,
        "write_concern": "majority",
        "read_concern": "majority",
        "concurrency": concurrency,
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "loadavg_before": os.getloadavg(),
    }
    with contextlib.suppress(Exception):
        info["mongodb_version"] = client.server_info()["version"]
    with contextlib.suppress(Exception):
        status = client.admin.command("replSetGetStatus")
        info["members"] = [m["stateStr"] for m in status["members"]]
    return info


def _mem_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    return None


def _os_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    return platform.platform()


def _git(*args: str) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        )
        return out.stdout.strip()
    return ""


# -- the summary -------------------------------------------------------------------------------


def _d(figs: dict[str, float], keys: Sequence[str] = ("p50", "p95", "p99", "max")) -> str:
    return "  ".join(f"{k} {figs.get(k, float('nan')):7.1f}" for k in keys)


def _met(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def _anoms(figs: dict[str, Any]) -> str:
    bad = figs["anomalies"]
    if not bad["count"]:
        return "all completed, attempts == 1"
    return f"{bad['count']} NOT completed-at-first-attempt: {bad['kinds']}"


def _cpu_note(cpu: dict[str, Any], jobs: int) -> str:
    if not cpu:
        return "  CPU: not measured"
    ops = cpu.get("primary_counters", {})
    per_job = ", ".join(
        f"{k} {ops[k] / max(jobs, 1):.2f}"
        for k in ("findAndModify", "update", "getmore", "write_conflicts", "keys_scanned")
        if k in ops
    )
    parts = ", ".join(
        f"{label} {g['share_of_one_core']:.2f}"
        for label, g in cpu["groups"].items()
        if g["processes"] and g["share_of_one_core"] is not None
    )
    return (
        f"  CPU over {cpu['wall_s']:.1f} s: machine {cpu['machine_busy_share'] * 100:.0f}% busy; "
        f"cores used by {parts}; everything else {cpu.get('other_cores', 0):.2f}"
        f"\n  primary ops per job: {per_job}"
    )


def _log_note(logs: dict[str, dict[str, int]]) -> str:
    noisy = {f"{r}:{k}": v for r, counts in logs.items() for k, v in counts.items()}
    return f"  log lines at WARNING+: {noisy}" if noisy else "  log lines at WARNING+: none"


def _scale_summary(results: dict[str, Any]) -> list[str]:
    return [
        f"{name}: {json.dumps(results[name], default=str)}"
        for name in ("enqueue", "startup", "drain", "backlog", "failover", "costs", "e2e")
        if name in results
    ] + [
        f"failover: PROBLEM: {problem}"
        for problem in (failover.problems(results["failover"]) if "failover" in results else [])
    ]


def _module_summaries(results: dict[str, Any]) -> list[str]:
    """The summaries the scenarios of a module of their own write."""
    lines: list[str] = []
    for name, module in (("limits", limits), ("waits", waits), ("output", output)):
        if name in results:
            lines += module.summary(results[name])
    return lines


def summarize(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        f"Brook bench {results['stamp']}  commit {env['git_commit']}"
        f"{' (dirty)' if env['git_dirty'] else ''}",
        f"  {env['host_cores']} cores, {env['host_mem_gib']} GiB, {env['os']}, "
        f"Python {env['python']}, MongoDB {env.get('mongodb_version', '?')} "
        f"{len(env.get('members', []))}-member set ({env['mongo']}), w=majority, "
        f"BROOK_CONCURRENCY={env['concurrency']}, BROOK_LOG_LEVEL={results['args']['log_level']}",
    ]
    if "probe" in results:
        p = results["probe"]
        lines += [
            "probe (sequential, ms)",
            f"  insert w:majority        {_d(p['insert_majority_ms'])}",
            f"  insert w:1               {_d(p['insert_w1_ms'])}",
            f"  findOneAndUpdate w:maj   {_d(p['find_one_and_update_majority_ms'])}",
            f"  find by _id (maj read)   {_d(p['read_by_id_ms'])}",
            f"  insert → change event    {_d(p['insert_to_event_ms'])}",
            f"  JobStore on a backlog: {p['store_ceiling']['serial_claims_per_s']:.0f} claims/s "
            f"one at a time; {p['store_ceiling']['claim_complete_x8_jobs_per_s']:.0f} jobs/s "
            "with 8 concurrent claim+complete loops",
        ]
    if "latency" in results:
        lat = results["latency"]
        s2s = lat["submit_to_start_ms"]
        ok = s2s.get("p50", 1e9) <= TARGET_P50_MS and s2s.get("p99", 1e9) <= TARGET_P99_MS
        lines += [
            f"latency: {lat['rate']:g} jobs/s open loop for {lat['duration_s']:g} s = "
            f"{lat['jobs']} noop jobs; {_anoms(lat)}",
            f"  submit→start  ms  {_d(s2s)}   target p50≤{TARGET_P50_MS:g} p99≤"
            f"{TARGET_P99_MS:g}: {_met(ok)}",
            f"  submit→finish ms  {_d(lat['submit_to_finish_ms'])}",
            f"  start→finish  ms  {_d(lat['start_to_finish_ms'])}",
            f"  HTTP POST RTT ms  {_d(lat['submit']['rtt_ms'])}   "
            f"(non-202: {lat['submit']['errors'] or 0}; send lag max "
            f"{lat['submit']['schedule_lag_ms'].get('max', 0):.1f} ms)",
            _cpu_note(lat.get("resources", {}), lat["jobs"]),
            _log_note(lat["logs"]),
        ]
    if "throughput_http" in results:
        th = results["throughput_http"]
        lines += [
            f"throughput/http: {th['jobs']} noop jobs, {th['in_flight']} POSTs in flight; "
            f"{_anoms(th)}",
            f"  submitted {th['submit']['jobs_per_s']:.0f} jobs/s (RTT p50 "
            f"{th['submit']['rtt_ms']['p50']:.1f} ms, p99 {th['submit']['rtt_ms']['p99']:.1f}); "
            f"non-202: {th['submit']['errors'] or 0}",
            f"  end-to-end {th['end_to_end_jobs_per_s']:.0f} jobs/s (first created → last "
            f"finished {th['end_to_end_s']:.2f} s)   target ≥{TARGET_JOBS_PER_S:g}: "
            f"{_met(th['end_to_end_jobs_per_s'] >= TARGET_JOBS_PER_S)}",
            f"  drain {th['drain_jobs_per_s']:.0f} jobs/s; gap between claims ms "
            f"{_d(th['claim_gap_ms'], ('p50', 'p99'))}; run ms {_d(th['run_ms'], ('p50', 'p99'))}"
            f"; max running {th['max_running_at_once']}/{th['concurrency']}",
            _cpu_note(th.get("resources", {}), th["jobs"]),
            _log_note(th["logs"]),
        ]
    for key, note in (
        ("throughput_backlog", ""),
        ("throughput_backlog_post_images", " with post-images on (as an API turns them on)"),
    ):
        if key not in results:
            continue
        tb = results[key]
        lines += [
            f"throughput/backlog{note}: {tb['jobs']} noop jobs pre-inserted "
            f"({tb['preload']['jobs_per_s']:.0f} jobs/s via JobStore.submit); {_anoms(tb)}",
            f"  {tb['jobs_per_s']:.0f} jobs/s (first claim → last finished "
            f"{tb['first_claim_to_last_finish_s']:.2f} s)   target ≥{TARGET_JOBS_PER_S:g}: "
            f"{_met(tb['jobs_per_s'] >= TARGET_JOBS_PER_S)}",
            f"  gap between claims ms {_d(tb['claim_gap_ms'], ('p50', 'p99'))}; run ms "
            f"{_d(tb['run_ms'], ('p50', 'p99'))}; max running "
            f"{tb['max_running_at_once']}/{tb['concurrency']}",
            _cpu_note(tb.get("resources", {}), tb["jobs"]),
            _log_note(tb["logs"]),
        ]
    if "events_fanout" in results:
        ev = results["events_fanout"]
        api_cpu = ev.get("resources", {}).get("groups", {}).get("api", {})
        lines += [
            f"events: {ev['clients']} SSE clients on one API, {ev['rate']:g} jobs/s for "
            f"{ev['duration_s']:g} s = {ev['jobs']} noop jobs; events missing "
            f"{ev['events_missing']} of {ev['events_expected']}",
            f"  submit ack → pending event at every client ms  "
            f"{_d(ev['insert_ack_to_pending_event_ms'])}",
            f"  submit ack → completed event ms                "
            f"{_d(ev['insert_ack_to_completed_event_ms'])}",
            f"  API CPU {api_cpu.get('share_of_one_core', 0) * 100:.0f}% of one core",
        ]
    if "batch_submit" in results:
        bs = results["batch_submit"]
        lines += [
            f"batch submit: {bs['jobs']} jobs each way, {bs['batch_size']} per call, one call "
            "at a time",
            f"  POST /jobs/batch           {bs['http']['jobs_per_s']:.0f} jobs/s; request ms "
            f"{_d(bs['http']['request_ms'], ('p50', 'p99', 'max'))}",
            f"  AsyncClient.submit_many    {bs['python']['jobs_per_s']:.0f} jobs/s; call ms "
            f"{_d(bs['python']['call_ms'], ('p50', 'p99', 'max'))}",
            _cpu_note(bs.get("resources", {}), 2 * bs["jobs"]),
            _log_note(bs["logs"]),
        ]
    lines += _module_summaries(results)
    lines += fairness.summaries(results)
    lines += _scale_summary(results)
    for label, prof in results.get("profiles", {}).items():
        if prof.get("samples"):
            top = ", ".join(f"{name} {pct}%" for name, pct in prof["top_self"][:6])
            lines.append(
                f"profile {label}: busy {prof['busy_share_of_wall'] * 100:.0f}% of wall; "
                f"top self: {top}"
            )
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    log_dir = OUT / stamp
    profiler = Profiler(args.py_spy, log_dir)
    results: dict[str, Any] = {"stamp": stamp, "args": vars(args), "log_dir": str(log_dir)}
    with replica_set(keep=args.keep_mongo) as deployment:
        client = make_sync_client(deployment.uri)
        ctx = Context(
            deployment=deployment,
            stamp=stamp,
            concurrency=args.concurrency,
            client=client,
            profiler=profiler,
            log_dir=log_dir,
            log_level=args.log_level,
        )
        try:
            results["environment"] = environment(deployment.origin, client, args.concurrency)
            plan: list[tuple[str, Callable[[], dict[str, Any]]]] = []
            if args.scenario in ("probe", "all"):
                plan.append(("probe", lambda: probe(ctx)))
            if args.scenario in ("latency", "all"):
                plan.append(("latency", lambda: latency(ctx, args.rate, args.duration)))
            if args.scenario in ("throughput", "all"):
                plan.append(
                    (
                        "throughput_http",
                        lambda: throughput_http(ctx, args.jobs, args.clients or 4, args.per_client),
                    )
                )
                plan.append(
                    (
                        "throughput_backlog",
                        lambda: throughput_backlog(ctx, args.jobs, args.preload_in_flight),
                    )
                )
                plan.append(
                    (
                        "throughput_backlog_post_images",
                        lambda: throughput_backlog(
                            ctx, args.jobs, args.preload_in_flight, prepare=enable_post_images
                        ),
                    )
                )
            if args.scenario in ("events", "all"):
                plan.append(
                    (
                        "events_fanout",
                        lambda: events_fanout(ctx, args.sse_clients, args.rate, args.duration),
                    )
                )
            if args.scenario in ("batch", "all"):
                plan.append(("batch_submit", lambda: batch_submit(ctx, args.jobs)))
            if args.scenario in ("limits", "all"):
                plan.append(("limits", lambda: limits.limits(ctx, args.jobs, args.limit)))
            plan += _scale_plan(args, ctx)
            for name, scenario in plan:
                print(f"[bench] {name} ...", file=sys.stderr, flush=True)
                t = time.monotonic()
                try:
                    results[name] = scenario()
                except BenchError as exc:
                    results["error"] = f"{name}: {exc}"
                    break
                print(
                    f"[bench] {name} done in {time.monotonic() - t:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            for db in ctx.databases:
                with contextlib.suppress(Exception):
                    client.drop_database(db)
            client.close()
    results["profiles"] = profiler.summaries()
    return results


def _scale_plan(
    args: argparse.Namespace, ctx: Context
) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    sizes = tuple(int(x) for x in args.sizes.split(",") if x.strip())
    return {
        "enqueue": [("enqueue", lambda: scale.enqueue(ctx, min(args.jobs, 2000)))],
        "startup": [("startup", lambda: scale.startup(ctx))],
        "drain": [("drain", lambda: scale.drain(ctx, args.jobs))],
        "e2e": [("e2e", lambda: scale.e2e(ctx, args.jobs))],
        "backlog": [("backlog", lambda: scale.backlog(ctx, sizes))],
        "costs": [("costs", lambda: costs.costs(ctx))],
        "fairness": [("fairness", lambda: fairness.fairness(ctx, args.jobs))],
        "bulkplans": [("bulkplans", lambda: fairness.bulk_plans(ctx, args.jobs))],
        "keyscale": [
            ("keyscale", lambda: fairness.keyscale(ctx, args.jobs, rounds=args.rounds))
        ],
        "failover": [
            ("failover", lambda: failover.failover(ctx, args.jobs, args.clients or 32))
        ],
        "output": [
            (
                "output",
                lambda: output.output(
                    ctx, args.jobs, args.chunks_per_s, args.stream_s, args.drain
                ),
            )
        ],
        "waits": [
            (
                "waits",
                lambda: waits.waits(ctx, args.jobs, args.seconds, args.burst, args.burst_kill),
            )
        ],
    }.get(args.scenario, [])


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # a SIGTERM stops the run as Ctrl-C does: its roles and set too


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        if args.scenario == "jobcost":  # roles on sets of its own: not the shared one of run()
            return jobcost.main(args)
        results = run(args)
    except BenchError as exc:  # before any scenario ran (e.g. the replica set)
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{results['stamp']}.json"
    path.write_text(json.dumps(results, indent=1, default=str))
    print(summarize(results))
    print(f"raw figures: {path.relative_to(ROOT)}")
    if "error" in results:
        print(f"bench: error: {results['error']}", file=sys.stderr)
        return 1
    if "failover" in results and failover.problems(results["failover"]):
        return 1  # the checks found a job lost, or run or completed twice
    return 0


if __name__ == "__main__":
    sys.exit(main())
