"""`brook`: run the roles (up, api, dispatcher), the embedded replica set, and talk to the API."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from common.backoff import exponential
from common.errors import BrookError
from common.events import Event, emit
from common.settings import Settings, load_settings
from common.status import TERMINAL, JobStatus
from common.validation import MAX_BATCH

JsonObject = dict[str, Any]  # a JSON object as the API sends it


def die(message: str, code: int = 1) -> NoReturn:
    print(f"brook: error: {message}", file=sys.stderr)
    sys.exit(code)


# -- roles -------------------------------------------------------------------------------------


def cmd_api(settings: Settings, _: argparse.Namespace) -> int:
    import uvicorn

    from common.log import configure_logging
    from executor.registry import load_tasks
    from ingest.app import create_app

    configure_logging(settings.log_level, role="api")
    app = create_app(settings, set(load_tasks(settings)))
    config = uvicorn.Config(
        app,
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,
        access_log=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1


def cmd_dispatcher(settings: Settings, _: argparse.Namespace) -> int:
    from executor.forking import start_server

    start_server()  # it imports the worker's modules while this process imports its own
    from brook.roles import run_dispatcher

    return run_dispatcher(settings)


def cmd_up(settings: Settings, _: argparse.Namespace) -> int:
    """Replica set (unless BROOK_MONGO_URI is set) + API + dispatcher, in the foreground.

    Ctrl-C / SIGTERM at any moment stops everything this command started, in order:
    the dispatcher first (it hands running jobs back), then the API, then the replica set.
    """
    from brook.replset import ReplicaSet
    from common.log import configure_logging

    configure_logging(settings.log_level, role="up")
    stop = {"signal": 0}

    def on_signal(signum: int, _: Any) -> None:
        stop["signal"] = signum

    # Handlers first: the children run in their own sessions, so Ctrl-C reaches only this
    # process, which then stops them in a safe order.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    env = dict(os.environ)
    started_rs: ReplicaSet | None = None
    children: dict[str, subprocess.Popen[bytes]] = {}
    code = 0
    try:
        if settings.mongo_uri is None:
            rs = ReplicaSet(home=settings.home, base_port=settings.mongo_port)
            if not rs.running():
                started_rs = rs
            t0 = time.monotonic()
            uri = rs.up()
            emit(
                Event.MONGO_UP,
                uri=uri,
                seconds=round(time.monotonic() - t0, 2),
                members=rs.member_states(),
            )
            env["BROOK_MONGO_URI"] = uri
        cmd = [sys.executable, "-m", "brook.cli"]

        def spawn(role: str) -> subprocess.Popen[bytes]:
            return subprocess.Popen([*cmd, role], env=env, start_new_session=True)

        for role in ("dispatcher", "api"):
            if stop["signal"]:
                break
            children[role] = spawn(role)
        if not stop["signal"]:
            emit(
                Event.UP_STARTED,
                api=f"http://{settings.api_host}:{settings.api_port}",
                pids={r: p.pid for r, p in children.items()},
            )
            code = _supervise(children, spawn, stop)
    finally:
        emit(Event.UP_STOPPING, signal=stop["signal"] or None)
        _stop_children(children, settings.shutdown_grace_seconds + 30)
        if started_rs is not None:
            started_rs.down()
            emit(Event.MONGO_DOWN)
        emit(Event.UP_STOPPED)
    return code


RESTART_LIMIT = 5  # restarts of one role within RESTART_WINDOW_S before `up` gives up
RESTART_WINDOW_S = 60.0


def _supervise(
    children: dict[str, subprocess.Popen[bytes]],
    spawn: Any,
    stop: dict[str, int],
) -> int:
    """Restart a role that dies (a killed dispatcher's jobs come back after lease expiry);
    give up, stopping everything, if one keeps dying."""
    restarts: dict[str, list[float]] = {role: [] for role in children}
    while not stop["signal"]:
        for role, proc in list(children.items()):
            if proc.poll() is None:
                continue
            now = time.monotonic()
            recent = [t for t in restarts[role] if now - t < RESTART_WINDOW_S]
            if len(recent) >= RESTART_LIMIT:
                emit(
                    Event.UP_GIVING_UP,
                    level="error",
                    role=role,
                    exitcode=proc.returncode,
                    restarts=len(recent),
                    window_s=RESTART_WINDOW_S,
                )
                return 1
            delay = exponential(len(recent), 0.5, 10.0)
            emit(
                Event.UP_CHILD_EXITED,
                level="warning",
                role=role,
                pid=proc.pid,
                exitcode=proc.returncode,
                restart_in_s=delay,
            )
            deadline = now + delay
            while time.monotonic() < deadline and not stop["signal"]:
                time.sleep(0.1)
            if stop["signal"]:
                break
            restarts[role] = [*recent, time.monotonic()]
            children[role] = spawn(role)
            emit(Event.UP_CHILD_RESTARTED, role=role, pid=children[role].pid)
        time.sleep(0.2)
    return 0


def _stop_children(children: dict[str, subprocess.Popen[bytes]], timeout: float) -> None:
    for proc in children.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for role, proc in children.items():
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            emit(Event.UP_KILL, level="error", role=role, pid=proc.pid)
            proc.kill()
            proc.wait()


def cmd_mongo(settings: Settings, args: argparse.Namespace) -> int:
    from brook.replset import ReplicaSet

    rs = ReplicaSet(home=settings.home, base_port=settings.mongo_port)
    if args.action == "up":
        print(rs.up())
        return 0
    if args.action == "down":
        rs.down()
        print("stopped")
        return 0
    if not rs.running():
        print(f"not running ({rs.uri})")
        return 1
    print(rs.uri)
    for host, state in rs.member_states():
        print(f"{host} {state}")
    return 0


# -- client commands ---------------------------------------------------------------------------


def _api(
    settings: Settings,
    method: str,
    path: str,
    body: JsonObject | None = None,
    params: dict[str, str | int] | None = None,
) -> JsonObject:
    """One API call; any failure exits with one line on stderr."""
    import httpx

    host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::") else settings.api_host
    url = f"http://{host}:{settings.api_port}{path}"
    headers = {}
    if settings.api_token is not None:
        headers["Authorization"] = f"Bearer {settings.api_token.get_secret_value()}"
    try:
        resp = httpx.request(method, url, json=body, params=params, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        die(f"cannot reach the API at {url} ({exc.__class__.__name__}); is `brook up` running?")
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail")
        except ValueError:
            detail = resp.text
        if not isinstance(detail, str):
            detail = json.dumps(detail)
        die(f"{resp.status_code} {detail}")
    try:
        doc = resp.json()
    except ValueError:
        die(f"the API at {url} did not answer with JSON")
    if not isinstance(doc, dict):
        die(f"the API at {url} answered {type(doc).__name__}, not a JSON object")
    return doc


def _print(doc: JsonObject) -> None:
    print(json.dumps(doc, indent=2, sort_keys=False))


def _spec(args: argparse.Namespace) -> JsonObject:
    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        die(f"--payload is not valid JSON: {exc}", 2)
    body: JsonObject = {
        "task": args.task,
        "payload": payload,
        "queue": args.queue,
        "priority": args.priority,
        "max_attempts": args.max_attempts,
    }
    for key in ("run_at", "timeout_s", "idempotency_key"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    return body


def cmd_submit(settings: Settings, args: argparse.Namespace) -> int:
    if args.count < 1:
        die("--count must be at least 1", 2)
    if args.count > 1 and (args.wait or args.idempotency_key is not None):
        die("--count submits many jobs: it cannot go with --wait or --idempotency-key", 2)
    spec = _spec(args)
    if args.count > 1:
        return _submit_count(settings, spec, args.count)
    job = _api(settings, "POST", "/jobs", spec)
    if not args.wait:
        _print(job)
        return 0
    job = _wait(settings, job, args.wait_timeout)
    if job["status"] != JobStatus.COMPLETED:
        err = job.get("error") or {}
        die(f"job {job['id']} {job['status']}: {err.get('type', '')}: {err.get('message', '')}")
    print(json.dumps(job["result"]))
    return 0


def _wait(settings: Settings, job: JsonObject, timeout: float) -> JsonObject:
    """Follow the job until it is terminal, showing its status and progress on stderr."""
    from brook.job_view import job_view

    deadline = time.monotonic() + timeout
    delay = 0.01
    view = job_view()
    try:
        view.update(job)
        while job["status"] not in TERMINAL:
            if time.monotonic() > deadline:
                die(f"job {job['id']} still {job['status']} after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)  # progress is written up to ~4 times a second
            job = _api(settings, "GET", f"/jobs/{job['id']}")
            view.update(job)
    finally:
        view.close()
    return job


def _submit_count(settings: Settings, spec: JsonObject, count: int) -> int:
    """`count` copies of `spec` through `POST /jobs/batch`, as few requests as the batch
    size and the body limit allow; prints the new ids, one per line."""
    per_spec = len(json.dumps(spec)) + 2
    room = max((settings.max_body_bytes - 64) // per_spec, 1)
    size = min(MAX_BATCH, room)
    left = count
    while left:
        n = min(size, left)
        out = _api(settings, "POST", "/jobs/batch", {"jobs": [spec] * n})
        print("\n".join(job["id"] for job in out["jobs"]))
        left -= n
    return 0


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    _print(_api(settings, "GET", f"/jobs/{args.id}"))
    return 0


def cmd_ls(settings: Settings, args: argparse.Namespace) -> int:
    given = {
        "status": args.status,
        "task": args.task,
        "queue": args.queue,
        "limit": args.limit,
        "after": args.after,
    }
    params: dict[str, str | int] = {k: v for k, v in given.items() if v is not None}
    page = _api(settings, "GET", "/jobs", params=params)
    for job in page["jobs"]:
        print(
            f"{job['id']}  {job['status']:<9}  {job['task']:<12}  {job.get('queue', '-'):<10}  "
            f"attempts={job['attempts']}/{job['max_attempts']}  created={job['created_at']}"
        )
    if page.get("next"):
        print(f"# more: --after {page['next']}", file=sys.stderr)
    return 0


def cmd_cancel(settings: Settings, args: argparse.Namespace) -> int:
    _print(_api(settings, "POST", f"/jobs/{args.id}/cancel"))
    return 0


def cmd_schedules(settings: Settings, args: argparse.Namespace) -> int:
    from urllib.parse import quote

    if args.action != "ls":
        if not args.name:
            die(f"brook schedules {args.action} needs a schedule NAME", 2)
        _print(_api(settings, "POST", f"/schedules/{quote(args.name, safe='')}/{args.action}"))
        return 0
    schedules = _api(settings, "GET", "/schedules")["schedules"]
    if not schedules:
        print("# no schedules (a dispatcher declares them when it starts)", file=sys.stderr)
    for s in schedules:
        print(
            f"{s['name']:<20}  {s['cron']:<16}  {s['tz']:<16}  {s['task']:<12}  "
            f"{'paused' if s['paused'] else 'active':<6}  next={s['next_run'] or '-'}  "
            f"last_job={s['last_job_id'] or '-'}"
        )
    return 0


def cmd_retry(settings: Settings, args: argparse.Namespace) -> int:
    _print(_api(settings, "POST", f"/jobs/{args.id}/retry"))
    return 0


def cmd_queue_ls(settings: Settings, _: argparse.Namespace) -> int:
    queues = _api(settings, "GET", "/queues")["queues"]
    statuses = [s.value for s in JobStatus]
    print("  ".join([f"{'queue':<20}", *(f"{s:>9}" for s in statuses), "limits"]))
    for q in queues:
        limits = [
            f"concurrency={q['concurrency']}" if q.get("concurrency") is not None else "",
            f"rate={q['rate']['limit']}/{q['rate']['per_seconds']}s" if q.get("rate") else "",
            "paused" if q.get("paused") else "",
        ]
        counts = [f"{q['counts'].get(s, 0):>9}" for s in statuses]
        print("  ".join([f"{q['name']:<20}", *counts, " ".join(x for x in limits if x) or "-"]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="brook", description="Event-driven job engine on MongoDB.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="replica set + API + dispatcher in the foreground").set_defaults(
        fn=cmd_up
    )
    sub.add_parser("api", help="run the HTTP API").set_defaults(fn=cmd_api)
    sub.add_parser("dispatcher", help="run a dispatcher and its workers").set_defaults(
        fn=cmd_dispatcher
    )
    m = sub.add_parser("mongo", help="the embedded local replica set")
    m.add_argument("action", choices=["up", "down", "status"])
    m.set_defaults(fn=cmd_mongo)
    s = sub.add_parser("submit", help="submit a job")
    s.add_argument("task")
    s.add_argument("--payload", default="{}", help="JSON object")
    s.add_argument("--queue", default="default")
    s.add_argument("--priority", type=int, default=0)
    s.add_argument("--max-attempts", dest="max_attempts", type=int, default=3)
    s.add_argument("--run-at", dest="run_at", help="ISO-8601 datetime")
    s.add_argument("--timeout", dest="timeout_s", type=float)
    s.add_argument("--idempotency-key", dest="idempotency_key")
    s.add_argument(
        "--wait",
        action="store_true",
        help="wait and print the result (status and progress on stderr: a bar on a terminal)",
    )
    s.add_argument("--wait-timeout", dest="wait_timeout", type=float, default=300.0)
    s.add_argument(
        "--count", type=int, default=1, help="submit N copies through the batch endpoint"
    )
    s.set_defaults(fn=cmd_submit)
    st = sub.add_parser("status", help="show a job")
    st.add_argument("id")
    st.set_defaults(fn=cmd_status)
    ls = sub.add_parser("ls", help="list jobs, newest first")
    ls.add_argument("--status", choices=sorted(s.value for s in JobStatus))
    ls.add_argument("--task")
    ls.add_argument("--queue")
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--after", metavar="ID", help="the page after this job (the `# more:` hint)")
    ls.set_defaults(fn=cmd_ls)
    c = sub.add_parser("cancel", help="cancel a job")
    c.add_argument("id")
    c.set_defaults(fn=cmd_cancel)
    sc = sub.add_parser("schedules", help="list cron schedules, or pause / resume one")
    sc.add_argument("action", nargs="?", choices=["ls", "pause", "resume"], default="ls")
    sc.add_argument("name", nargs="?", metavar="NAME")
    sc.set_defaults(fn=cmd_schedules)
    r = sub.add_parser("retry", help="retry a failed or cancelled job")
    r.add_argument("id")
    r.set_defaults(fn=cmd_retry)
    q = sub.add_parser("queue", help="the queues")
    qs = q.add_subparsers(dest="queue_command", required=True)
    qs.add_parser("ls", help="each queue with its jobs by status").set_defaults(fn=cmd_queue_ls)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
        code: int = args.fn(settings, args)
    except BrookError as exc:
        die(str(exc), 2)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
