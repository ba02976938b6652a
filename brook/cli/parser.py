"""The `brook` command line: its arguments, and `main`, which runs the chosen command with
the settings and turns Brook's errors into exit codes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from importlib import metadata

from brook.cli.api_commands import (
    UNSET,
    cmd_cancel,
    cmd_ls,
    cmd_queue_ls,
    cmd_queue_set,
    cmd_rerun,
    cmd_retry,
    cmd_schedules,
    cmd_signal,
    cmd_status,
    cmd_submit,
    cmd_triggers,
    cmd_watch,
)
from brook.cli.output_commands import cmd_output
from brook.cli.printing import JsonObject, die
from brook.cli.quota_commands import cmd_quota_ls, cmd_quota_rm, cmd_quota_set, cmd_quota_show
from brook.cli.serve import cmd_api, cmd_dispatcher, cmd_mongo
from brook.cli.up import cmd_up
from brook.common.domain.errors import BrookError
from brook.common.domain.status import JobStatus
from brook.common.runtime.settings import load_settings


def parse_iso(text: str) -> str:
    """A bulk filter's time bound: an ISO 8601 date or date and time, checked here so a typo
    is named by its option, not by the API field it becomes. Passed on as written."""
    try:
        datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: an ISO 8601 date or time, e.g. 2026-12-03 or 2026-12-03T10:00:00Z"
        ) from None
    return text.strip()


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


def _add_queue_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`brook queue ls|set|pause|resume`."""
    q = sub.add_parser("queue", help="the queues")
    qs = q.add_subparsers(dest="queue_command", required=True)
    qs.add_parser(
        "ls", help="each queue: its jobs by status, limits and slots in use"
    ).set_defaults(fn=cmd_queue_ls)
    qset = qs.add_parser(
        "set",
        help="set a queue's cluster-wide limits",
        usage="brook queue set NAME [--concurrency N] [--rate N/S] [--key-concurrency N]"
        " [--key-rate N/S] [--fair | --no-fair]",
    )
    qset.add_argument("name", metavar="NAME")
    qset.add_argument(
        "--concurrency",
        type=parse_concurrency,
        default=UNSET,
        metavar="N",
        help="running jobs at most, cluster-wide (none: no limit)",
    )
    qset.add_argument(
        "--rate",
        type=parse_rate,
        default=UNSET,
        metavar="N/S",
        help="starts per window of S seconds at most, e.g. 20/2 (none: no limit)",
    )
    qset.add_argument(
        "--key-concurrency",
        dest="key_concurrency",
        type=parse_concurrency,
        default=UNSET,
        metavar="N",
        help="running jobs per key (a job's key) at most, cluster-wide (none: no limit)",
    )
    qset.add_argument(
        "--key-rate",
        dest="key_rate",
        type=parse_rate,
        default=UNSET,
        metavar="N/S",
        help="starts per key per window of S seconds at most (none: no limit)",
    )
    qset.add_argument(
        "--fair",
        dest="fair",
        action=argparse.BooleanOptionalAction,
        default=UNSET,
        help="claims take turns across keys (implied by a key limit)",
    )
    qset.set_defaults(fn=cmd_queue_set, action="set")
    for action, text in (("pause", "start nothing new"), ("resume", "start jobs again")):
        qp = qs.add_parser(action, help=f"{text} in a queue, cluster-wide")
        qp.add_argument("name", metavar="NAME")
        qp.set_defaults(fn=cmd_queue_set, action=action)


def _add_quota_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`brook quota ls|set|show|rm`."""
    q = sub.add_parser("quota", help="the quotas: named limits shared across queues and tasks")
    qs = q.add_subparsers(dest="quota_command", required=True)
    qs.add_parser("ls", help="each quota: its limits and state").set_defaults(fn=cmd_quota_ls)
    show = qs.add_parser("show", help="one quota: limits, state and its cost ledger")
    show.add_argument("name", metavar="NAME")
    show.set_defaults(fn=cmd_quota_show)
    rm = qs.add_parser("rm", help="remove a quota (jobs that name it wait)")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(fn=cmd_quota_rm)
    qset = qs.add_parser(
        "set",
        help="set a quota's cluster-wide limits",
        usage="brook quota set NAME [--units N/S] [--requests N/S] [--concurrency N]",
    )
    qset.add_argument("name", metavar="NAME")
    for flag, text in (
        ("--units", "units (each job's cost) per window of S seconds, e.g. 90000/60"),
        ("--requests", "starts per window of S seconds, e.g. 500/60"),
    ):
        qset.add_argument(
            flag, type=parse_rate, default=UNSET, metavar="N/S", help=f"{text} (none: clear)"
        )
    qset.add_argument(
        "--concurrency",
        type=parse_concurrency,
        default=UNSET,
        metavar="N",
        help="jobs running at once (none: clear)",
    )
    qset.set_defaults(fn=cmd_quota_set)


def _version() -> str:
    try:
        return metadata.version("brook")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _tasks_from_the_working_directory() -> None:
    """Put the folder `brook` starts in first on `sys.path`, as `celery -A`, `rq worker` and
    `arq` do, so a `BROOK_TASKS=tasks` beside the user is found. The worker processes and
    their fork server get the same path from the process that starts them."""
    cwd = os.getcwd()
    if not sys.path or sys.path[0] not in ("", cwd):
        sys.path.insert(0, cwd)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="brook", description="Event-driven job engine on MongoDB.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    _role_commands(sub)
    _submit_command(sub)
    _output_command(sub)
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
    s.add_argument("--start-by", dest="start_by", help="ISO-8601: not started by then, cancelled")
    s.add_argument(
        "--start-within-s", dest="start_within_s", type=float, help="start_by, seconds from now"
    )
    s.add_argument("--deadline", help="ISO-8601: unfinished then, failed (never retried)")
    s.add_argument("--deadline-s", dest="deadline_s", type=float, help="deadline, seconds from now")
    s.add_argument("--idempotency-key", dest="idempotency_key")
    s.add_argument("--key", help="whose job it is (per-key limits, fair claiming)")
    s.add_argument(
        "--quota",
        dest="quotas",
        action="append",
        metavar="NAME=COST",
        help="a quota the job draws on, and its cost in units (repeat for several)",
    )
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


def _add_bulk_filters(p: argparse.ArgumentParser) -> None:
    """The filter of `brook retry` / `brook cancel` without an ID (`POST /jobs/retry|cancel`)."""
    statuses = sorted(s.value for s in JobStatus)
    p.add_argument("--status", action="append", choices=statuses, help="repeat for several")
    p.add_argument("--task")
    p.add_argument("--queue")
    p.add_argument("--key", help="the jobs of this key")
    p.add_argument("--error-type", dest="error_type", help="the error.type they ended with")
    p.add_argument(
        "--since", dest="finished_since", type=parse_iso, metavar="ISO", help="finished at or after"
    )
    p.add_argument(
        "--until", dest="finished_until", type=parse_iso, metavar="ISO", help="finished before"
    )
    p.add_argument("--created-since", dest="created_since", type=parse_iso, metavar="ISO")
    p.add_argument("--created-until", dest="created_until", type=parse_iso, metavar="ISO")
    p.add_argument(
        "--dry-run", dest="dry_run", action="store_true", help="only count the jobs it would change"
    )


def _output_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    o = sub.add_parser("output", help="a job's output (what its task emits): so far, or followed")
    o.add_argument("id")
    o.add_argument(
        "--follow", "-f", action="store_true", help="stream it as it comes until the job ends"
    )
    o.add_argument("--attempt", type=int, metavar="N", help="only attempt N's output")
    o.add_argument(
        "--after", metavar="POSITION", help="with --follow: resume after this ATTEMPT-SEQ"
    )
    o.add_argument(
        "--json", action="store_true", help="with --follow: print each chunk as one JSON line"
    )
    o.set_defaults(fn=cmd_output)


def _add_watch_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = sub.add_parser("watch", help="stream job events as they happen (one job, or all)")
    w.add_argument("id", nargs="?", help="one job: its events until it ends")
    w.add_argument("--status", choices=sorted(s.value for s in JobStatus))
    w.add_argument("--task")
    w.add_argument("--queue")
    w.add_argument("--json", action="store_true", help="print each job as one JSON line")
    w.add_argument(
        "--include",
        metavar="FIELDS",
        help="`payload`, `result` or both (comma-separated): add them to each event's job, "
        "which leaves them out otherwise",
    )
    w.add_argument(
        "--no-output",
        dest="output",
        action="store_false",
        help="with ID: leave out the output its task emits (shown as it comes otherwise)",
    )
    w.set_defaults(fn=cmd_watch)


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
    _add_watch_command(sub)
    c = sub.add_parser("cancel", help="cancel a job, or every job a filter names")
    c.add_argument("id", nargs="?", help="one job (or give filters instead)")
    _add_bulk_filters(c)
    c.set_defaults(fn=cmd_cancel)
    sc = sub.add_parser("schedules", help="list cron schedules, or pause / resume one")
    sc.add_argument("action", nargs="?", choices=["ls", "pause", "resume"], default="ls")
    sc.add_argument("name", nargs="?", metavar="NAME")
    sc.set_defaults(fn=cmd_schedules)
    sg = sub.add_parser("signal", help="send a signal: wake the jobs waiting on KEY")
    sg.add_argument("key", metavar="KEY")
    sg.add_argument("--payload", default="null", help="any JSON value (default: null)")
    sg.set_defaults(fn=cmd_signal)
    tr = sub.add_parser("triggers", help="list change-stream triggers, or pause / resume one")
    tr.add_argument("action", nargs="?", choices=["ls", "pause", "resume"], default="ls")
    tr.add_argument("name", nargs="?", metavar="NAME")
    tr.set_defaults(fn=cmd_triggers)
    r = sub.add_parser("retry", help="retry a failed or cancelled job, or every one a filter names")
    r.add_argument("id", nargs="?", help="one job (or give filters instead)")
    _add_bulk_filters(r)
    r.set_defaults(fn=cmd_retry)
    rr = sub.add_parser(
        "rerun", help="rerun a finished job from one of its steps, keeping the steps before it"
    )
    rr.add_argument("id", metavar="ID")
    rr.add_argument(
        "--from-step", dest="from_step", required=True, metavar="NAME", help="the step to run again"
    )
    rr.add_argument("--payload", help="a new payload, as JSON (default: the job's own)")
    rr.set_defaults(fn=cmd_rerun)
    _add_queue_commands(sub)
    _add_quota_commands(sub)


def main(argv: Sequence[str] | None = None) -> int:
    _tasks_from_the_working_directory()
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
