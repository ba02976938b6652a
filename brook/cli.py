"""`brook`: run the roles (up, api, dispatcher), the embedded replica set, and talk to the API."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from brook.terminal import safe
from common.domain.errors import BrookError
from common.domain.status import TERMINAL, JobStatus
from common.domain.validation import MAX_BATCH
from common.runtime.backoff import exponential
from common.runtime.log_events import Event, emit
from common.runtime.settings import Settings, load_settings

if TYPE_CHECKING:
    from brook.replset import ReplicaSet

JsonObject = dict[str, Any]  # a JSON object as the API sends it


def die(message: str, code: int = 1) -> NoReturn:
    print(f"brook: error: {safe(message)}", file=sys.stderr)
    sys.exit(code)


# -- roles -------------------------------------------------------------------------------------


def cmd_api(settings: Settings, _: argparse.Namespace) -> int:
    import uvicorn

    from common.runtime.log import configure_logging
    from executor.registry import load_tasks
    from ingest.app import create_app

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:  # a second SIGTERM / Ctrl-C: stop now, whatever is pending
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                os._exit(130)
            super().handle_exit(sig, frame)

    configure_logging(settings.log_level, role="api")
    app = create_app(settings, set(load_tasks(settings)))
    config = uvicorn.Config(
        app,
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,
        access_log=False,
        lifespan="on",
        # Requests still waiting on MongoDB when the grace period ends are cancelled.
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
        # Connections (and requests) at once: beyond it uvicorn answers 503 at once.
        limit_concurrency=settings.max_connections,
    )
    _raise_open_files(settings.max_connections)
    server = Server(config)
    server.run()
    crashed = getattr(app.state, "crashed", False)  # a background task died: see its log
    return 0 if server.started and not crashed else 1


def _raise_open_files(connections: int) -> None:
    """Let the process hold its connections, MongoDB's and its own files: the soft limit
    on open files up to what they need (at most the hard limit)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


def cmd_dispatcher(settings: Settings, _: argparse.Namespace) -> int:
    from executor.forking import start_server

    start_server()  # it imports the worker's modules while this process imports its own
    from brook.roles import run_dispatcher

    return run_dispatcher(settings)


def cmd_up(settings: Settings, _: argparse.Namespace) -> int:
    """Replica set (unless BROOK_MONGO_URI is set) + API + dispatcher, in the foreground.

    Ctrl-C / SIGTERM at any moment stops everything this command started, in order:
    the dispatcher first (it hands running jobs back), then the API, then the replica set,
    within the grace period + 5 s whatever the state of MongoDB. A second signal stops at
    once. The roles die with this process even when it is SIGKILLed (PR_SET_PDEATHSIG).
    """
    from brook.replset import ReplicaSet
    from common.runtime.log import configure_logging
    from common.runtime.settings import check_exposure

    check_exposure(settings)  # before anything starts: the API would refuse anyway
    configure_logging(settings.log_level, role="up")
    # Handlers first: the children run in their own sessions, so Ctrl-C reaches only this
    # process, which then stops them in a safe order.
    signals = _Signals()
    signals.install()
    env = dict(os.environ)
    started_rs: ReplicaSet | None = None
    children: dict[str, subprocess.Popen[bytes]] = {}
    code = 0
    try:
        with signals.interruptible():  # start-up can wait on mongod for a minute
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

            def spawn(role: str) -> subprocess.Popen[bytes]:
                return _spawn_role(role, env)

            for role in ("dispatcher", "api"):
                children[role] = spawn(role)
            emit(
                Event.UP_STARTED,
                api=f"http://{settings.api_host}:{settings.api_port}",
                pids={r: p.pid for r, p in children.items()},
            )
        code = _supervise(children, spawn, signals)
    except _Interrupted:
        pass
    finally:
        emit(Event.UP_STOPPING, signal=signals.first_name)
        grace_ends = (signals.first_at or time.monotonic()) + settings.shutdown_grace_seconds
        _stop_children(children, signals, grace_ends + ROLE_MARGIN_S)
        if started_rs is not None:
            _stop_replset(started_rs, signals, grace_ends + MONGO_MARGIN_S)
            emit(Event.MONGO_DOWN)
        emit(Event.UP_STOPPED)
    return 130 if signals.count > 1 else code


RESTART_LIMIT = 5  # restarts of one role within RESTART_WINDOW_S before `up` gives up
RESTART_WINDOW_S = 60.0
# After a signal, `up` is done within the grace period + 5 s whatever MongoDB does: a role
# still running ROLE_MARGIN_S after the grace period is killed (a dispatcher that cannot
# reach MongoDB to hand its jobs back leaves them to lease expiry), and the replica set
# `up` started is down MONGO_MARGIN_S after it.
ROLE_MARGIN_S = 3.0
MONGO_MARGIN_S = 4.0
HURRY_S = 1.0  # after a second signal: how long the roles get to exit before SIGKILL
PR_SET_PDEATHSIG = 1


class _Interrupted(Exception):
    """A signal arrived while `up` was starting."""


class _Signals:
    """SIGINT/SIGTERM for `up`. The handler only records them (the loops poll), except while
    `interruptible()`, where the first one raises `_Interrupted` to abort start-up."""

    def __init__(self) -> None:
        self.received: list[tuple[int, float]] = []
        self._raise = False

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, _: Any) -> None:
        self.received.append((signum, time.monotonic()))
        if self._raise:
            self._raise = False
            raise _Interrupted

    @property
    def count(self) -> int:
        return len(self.received)

    @property
    def first_at(self) -> float | None:
        return self.received[0][1] if self.received else None

    @property
    def first_name(self) -> str | None:
        return signal.Signals(self.received[0][0]).name if self.received else None

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        if self.received:
            raise _Interrupted
        self._raise = True
        try:
            yield
        finally:
            self._raise = False


def _spawn_role(role: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start a role in its own session (Ctrl-C reaches only `up`, which stops the roles in
    order) that dies with `up`, even when `up` is SIGKILLed: no orphan keeps the API port."""
    return subprocess.Popen(
        [sys.executable, "-m", "brook.cli", role],
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent_hook(),
    )


def _die_with_parent_hook() -> Callable[[], None] | None:
    """The child side of PR_SET_PDEATHSIG, prepared in the parent (the child between fork
    and exec should only make the system call). The signal fires when the *thread* that
    forked exits: `up` forks from its main thread only."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # `up` died before the call: do not outlive it
            os._exit(1)

    return hook


def _supervise(
    children: dict[str, subprocess.Popen[bytes]],
    spawn: Callable[[str], subprocess.Popen[bytes]],
    signals: _Signals,
) -> int:
    """Restart a role that dies (a killed dispatcher's jobs come back after lease expiry);
    give up, stopping everything, if one keeps dying."""
    restarts: dict[str, list[float]] = {role: [] for role in children}
    while not signals.count:
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
            while time.monotonic() < deadline and not signals.count:
                time.sleep(0.1)
            if signals.count:
                break
            restarts[role] = [*recent, time.monotonic()]
            children[role] = spawn(role)
            emit(Event.UP_CHILD_RESTARTED, role=role, pid=children[role].pid)
        time.sleep(0.2)
    return 0


def _stop_children(
    children: dict[str, subprocess.Popen[bytes]], signals: _Signals, deadline: float
) -> None:
    """SIGTERM every role and wait for them; a role still running at `deadline` is killed.
    A second signal is passed on (a role's second signal stops it at once), and what is
    still running HURRY_S later is killed."""
    # Stopping because a role kept dying (no signal yet): the first signal is the second.
    hurry_at = 2 if signals.count else 1
    hurried = False
    for proc in children.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    while True:
        alive = {role: proc for role, proc in children.items() if proc.poll() is None}
        if not alive:
            return
        if not hurried and signals.count >= hurry_at:
            hurried = True
            for proc in alive.values():
                proc.send_signal(signal.SIGTERM)
            deadline = min(deadline, time.monotonic() + HURRY_S)
        if time.monotonic() >= deadline:
            for role, proc in alive.items():
                emit(Event.UP_KILL, level="error", role=role, pid=proc.pid)
                proc.kill()
            for proc in alive.values():
                proc.wait()
            return
        time.sleep(0.05)


def _stop_replset(rs: ReplicaSet, signals: _Signals, deadline: float) -> None:
    """Stop the members of the replica set `up` started, all at once (each shuts down
    cleanly on SIGTERM within a second or so); one still running at `deadline` (frozen,
    say) is killed. After a second signal they are only told to stop."""
    from brook.replset import pid_alive

    pids = [pid for pid in (rs.pid(i) for i in range(rs.members)) if pid is not None]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    while any(pid_alive(pid) for pid in pids):
        if signals.count > 1:
            return
        if time.monotonic() >= deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            while any(pid_alive(pid) for pid in pids):
                time.sleep(0.05)
            return
        time.sleep(0.05)


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
    for key in ("run_at", "timeout_s", "idempotency_key", "depends_on"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.run_on_parent_failure:
        body["run_on_parent_failure"] = True
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
    """Follow the job's event stream (no polling) until it is terminal, showing its status
    and progress on stderr; a cut stream is resumed with Last-Event-ID."""
    from brook.job_view import job_view
    from brook.watching import StreamFailed, follow

    view = job_view()
    latest = job

    def on_event(kind: str, data: JsonObject) -> bool:
        nonlocal latest
        if kind == "job":
            latest = data
            view.update(data)
        return str(latest["status"]) in TERMINAL

    try:
        view.update(job)
        done = follow(
            settings, f"/jobs/{job['id']}/events", on_event, deadline=time.monotonic() + timeout
        )
    except StreamFailed as exc:
        die(str(exc))
    finally:
        view.close()
    if not done or latest["status"] not in TERMINAL:
        die(f"job {job['id']} still {latest['status']} after {timeout}s")
    return latest


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


def cmd_watch(settings: Settings, args: argparse.Namespace) -> int:
    """Print each event as it happens: one job's until it ends, or every matching job's."""
    from brook.watching import StreamFailed, event_line, follow

    def on_event(kind: str, data: JsonObject) -> bool:
        if kind == "reset":
            print(safe(f"# reset: {data.get('reason')}"), file=sys.stderr, flush=True)
            return False
        print(json.dumps(data) if args.json else event_line(data), flush=True)
        return args.id is not None and str(data["status"]) in TERMINAL

    given = {"status": args.status, "task": args.task, "queue": args.queue}
    params = {k: v for k, v in given.items() if v is not None}
    path = f"/jobs/{args.id}/events" if args.id else "/events"
    try:
        follow(settings, path, on_event, params=params or None)
    except StreamFailed as exc:
        die(str(exc))
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
            safe(
                f"{job['id']}  {job['status']:<9}  {job['task']:<12}  {job.get('queue', '-'):<10}  "
                f"attempts={job['attempts']}/{job['max_attempts']}  created={job['created_at']}"
            )
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
            safe(
                f"{s['name']:<20}  {s['cron']:<16}  {s['tz']:<16}  {s['task']:<12}  "
                f"{'paused' if s['paused'] else 'active':<6}  next={s['next_run'] or '-'}  "
                f"last_job={s['last_job_id'] or '-'}"
            )
        )
    return 0


def cmd_retry(settings: Settings, args: argparse.Namespace) -> int:
    _print(_api(settings, "POST", f"/jobs/{args.id}/retry"))
    return 0


def _limits(q: JsonObject) -> str:
    """`concurrency=3 (2 in use) rate=20/2s (7 in window) paused`, or `-` for none."""
    parts = []
    if q.get("concurrency") is not None:
        parts.append(f"concurrency={q['concurrency']} ({q.get('slots_in_use', 0)} in use)")
    if q.get("rate"):
        rate = q["rate"]
        window = f" ({q['starts_in_window']} in window)" if q.get("starts_in_window") else ""
        parts.append(f"rate={rate['limit']}/{rate['per_seconds']:g}s{window}")
    if q.get("paused"):
        parts.append("paused")
    return " ".join(parts) or "-"


def cmd_queue_ls(settings: Settings, _: argparse.Namespace) -> int:
    queues = _api(settings, "GET", "/queues")["queues"]
    statuses = [s.value for s in JobStatus]
    print("  ".join([f"{'queue':<20}", *(f"{s:>9}" for s in statuses), "limits"]))
    for q in queues:
        counts = [f"{q['counts'].get(s, 0):>9}" for s in statuses]
        print("  ".join([f"{q['name']:<20}", *counts, _limits(q)]))
    return 0


def parse_concurrency(text: str) -> int | None:
    """`--concurrency N`, or `none` to clear the limit."""
    if text.strip().lower() == "none":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number >= 1, or none")
    return int(text)


def parse_rate(text: str) -> JsonObject | None:
    """`--rate N/S` (N starts per S seconds: `20/2`, `100/60s`), or `none` to clear it."""
    if text.strip().lower() == "none":
        return None
    limit, sep, per = text.strip().partition("/")
    per = per.removesuffix("s")
    try:
        if not sep or not limit.isdigit():
            raise ValueError
        return {"limit": int(limit), "per_seconds": float(per)}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write N/S, e.g. 20/2 (20 per 2 s), or none"
        ) from None


def cmd_queue_set(settings: Settings, args: argparse.Namespace) -> int:
    from urllib.parse import quote

    body: JsonObject = {}
    if args.action == "set":
        if args.concurrency is _UNSET and args.rate is _UNSET:
            die("brook queue set needs --concurrency and/or --rate", 2)
        for key in ("concurrency", "rate"):
            if getattr(args, key) is not _UNSET:
                body[key] = getattr(args, key)
    else:
        body["paused"] = args.action == "pause"
    _print(_api(settings, "PUT", f"/queues/{quote(args.name, safe='')}", body))
    return 0


_UNSET: Any = object()


def _add_queue_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`brook queue ls|set|pause|resume`."""
    q = sub.add_parser("queue", help="the queues")
    qs = q.add_subparsers(dest="queue_command", required=True)
    qs.add_parser(
        "ls", help="each queue: its jobs by status, limits and slots in use"
    ).set_defaults(fn=cmd_queue_ls)
    qset = qs.add_parser("set", help="set a queue's cluster-wide limits")
    qset.add_argument("name", metavar="NAME")
    qset.add_argument(
        "--concurrency",
        type=parse_concurrency,
        default=_UNSET,
        metavar="N",
        help="running jobs at most, cluster-wide (none: no limit)",
    )
    qset.add_argument(
        "--rate",
        type=parse_rate,
        default=_UNSET,
        metavar="N/S",
        help="starts per window of S seconds at most, e.g. 20/2 (none: no limit)",
    )
    qset.set_defaults(fn=cmd_queue_set, action="set")
    for action, text in (("pause", "start nothing new"), ("resume", "start jobs again")):
        qp = qs.add_parser(action, help=f"{text} in a queue, cluster-wide")
        qp.add_argument("name", metavar="NAME")
        qp.set_defaults(fn=cmd_queue_set, action=action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="brook", description="Event-driven job engine on MongoDB.")
    sub = p.add_subparsers(dest="command", required=True)
    _role_commands(sub)
    _submit_command(sub)
    _job_commands(sub)
    return p


def _role_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _submit_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        "--depends-on",
        dest="depends_on",
        action="append",
        metavar="ID",
        help="a parent job: this one waits until it completed (repeat for several)",
    )
    s.add_argument(
        "--run-on-parent-failure",
        dest="run_on_parent_failure",
        action="store_true",
        help="with --depends-on: run once every parent ended, even if one failed",
    )
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


def _job_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    w = sub.add_parser("watch", help="stream job events as they happen (one job, or all)")
    w.add_argument("id", nargs="?", help="one job: its events until it ends")
    w.add_argument("--status", choices=sorted(s.value for s in JobStatus))
    w.add_argument("--task")
    w.add_argument("--queue")
    w.add_argument("--json", action="store_true", help="print each job as one JSON line")
    w.set_defaults(fn=cmd_watch)
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
    _add_queue_commands(sub)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
        code: int = args.fn(settings, args)
    except BrookError as exc:
        die(str(exc), 2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Read by `head` or the like, which stopped reading: not an error of ours. Point
        # stdout at /dev/null so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code


if __name__ == "__main__":
    sys.exit(main())
