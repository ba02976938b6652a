"""The commands that talk to a running API over HTTP: submit, status, ls, watch, cancel,
retry, rerun, signal, schedules, triggers and queue. Any failure exits with one line on stderr
(`die`)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from brook.cli.printing import JsonObject, die, print_json
from brook.common.domain.status import TERMINAL, JobStatus
from brook.common.runtime.settings import Settings
from brook.terminal import safe

# `brook queue set`: an option that was not given (None is a value: it clears a limit).
UNSET: Any = object()
# Once a job has ended, how long `--wait` and `watch ID` wait for the end of its output
# stream (it comes right after the job's last chunks) before they show the job's end.
OUTPUT_END_WAIT_S = 10.0


def call_api(
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
    for key in (
        "run_at",
        "timeout_s",
        "idempotency_key",
        "depends_on",
        "key",
        "start_by",
        "start_within_s",
        "deadline",
        "deadline_s",
    ):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.run_on_parent_failure:
        body["run_on_parent_failure"] = True
    if args.quotas:
        body["quotas"] = _quotas(args.quotas)
    return body


def _quotas(given: list[str]) -> JsonObject:
    """`--quota NAME=COST`, each: the job's `quotas` (the API checks names and costs)."""
    out: JsonObject = {}
    for item in given:
        name, sep, cost = item.rpartition("=")
        if not sep or not name:
            die(f"--quota {item!r}: expected NAME=COST", 2)
        try:
            out[name] = int(cost)
        except ValueError:
            die(f"--quota {item!r}: COST must be a whole number of units", 2)
    return out


def cmd_submit(settings: Settings, args: argparse.Namespace) -> int:
    if args.count < 1:
        die("--count must be at least 1", 2)
    if args.count > 1 and (args.wait or args.idempotency_key is not None):
        die("--count submits many jobs: it cannot go with --wait or --idempotency-key", 2)
    spec = _spec(args)
    if args.count > 1:
        return _submit_count(settings, spec, args.count)
    job = call_api(settings, "POST", "/jobs", spec)
    if not args.wait:
        print_json(job)
        return 0
    job = _wait(settings, job, args.wait_timeout)
    if job["status"] != JobStatus.COMPLETED:
        err = job.get("error") or {}
        die(f"job {job['id']} {job['status']}: {err.get('type', '')}: {err.get('message', '')}")
    print(json.dumps(job["result"]))
    return 0


def _wait(settings: Settings, job: JsonObject, timeout: float) -> JsonObject:
    """Follow the job's event stream (no polling) until it is terminal, showing its status
    and progress on stderr, and beside it its output stream, the text its task emits as it
    comes; a cut stream is resumed with Last-Event-ID."""
    from brook.job_view import job_view
    from brook.output_follow import OutputFollower, chunk_text
    from brook.watching import StreamFailed, follow

    view = job_view()
    latest = job
    lock = threading.Lock()  # the view is fed from both streams' threads

    def on_output(kind: str, data: JsonObject) -> None:
        if kind == "output":
            with lock:
                view.output(chunk_text(data))

    deadline = time.monotonic() + timeout
    output = OutputFollower(settings, job["id"], on_output, deadline=deadline).start()

    def on_event(kind: str, data: JsonObject) -> bool:
        nonlocal latest
        if kind == "job":
            latest = data
            if str(data["status"]) in TERMINAL:
                output.finish(OUTPUT_END_WAIT_S)  # its last chunks, shown before its end
            with lock:
                view.update(data)
        return str(latest["status"]) in TERMINAL

    try:
        with lock:
            view.update(job)
        done = follow(
            settings,
            f"/jobs/{job['id']}/events",
            on_event,
            params={"include": "result"},  # events leave it out unless asked for
            deadline=deadline,
        )
    except StreamFailed as exc:
        die(str(exc))
    finally:
        with lock:
            view.close()
    if not done or latest["status"] not in TERMINAL:
        die(f"job {job['id']} still {latest['status']} after {timeout}s")
    return latest


def _submit_count(settings: Settings, spec: JsonObject, count: int) -> int:
    """`count` copies of `spec` through `POST /jobs/batch`, as few requests as the batch
    size and the body limit allow; prints the new ids, one per line."""
    from brook.common.domain.validation import MAX_BATCH  # here: the other commands never load it

    per_spec = len(json.dumps(spec)) + 2
    room = max((settings.max_body_bytes - 64) // per_spec, 1)
    size = min(MAX_BATCH, room)
    left = count
    while left:
        n = min(size, left)
        out = call_api(settings, "POST", "/jobs/batch", {"jobs": [spec] * n})
        print("\n".join(job["id"] for job in out["jobs"]))
        left -= n
    return 0


def cmd_watch(settings: Settings, args: argparse.Namespace) -> int:
    """Print each event as it happens: one job's until it ends (and between them its output
    as it comes, unless `--no-output`), or every matching job's."""
    from brook.output_follow import OutputFollower, WatchPrinter
    from brook.watching import StreamFailed, event_line, follow

    printer = WatchPrinter(sys.stdout, as_json=args.json)
    output = None
    if args.id is not None and args.output:
        output = OutputFollower(settings, args.id, printer.output).start()

    def on_event(kind: str, data: JsonObject) -> bool:
        if kind == "reset":
            print(safe(f"# reset: {data.get('reason')}"), file=sys.stderr, flush=True)
            return False
        ended = args.id is not None and str(data["status"]) in TERMINAL
        if ended and output is not None:
            output.finish(OUTPUT_END_WAIT_S)  # the job's last output, before its end
        printer.event(json.dumps(data) if args.json else event_line(data))
        return ended

    given = {"status": args.status, "task": args.task, "queue": args.queue}
    given["include"] = args.include
    params = {k: v for k, v in given.items() if v is not None}
    path = f"/jobs/{args.id}/events" if args.id else "/events"
    try:
        follow(settings, path, on_event, params=params or None)
    except StreamFailed as exc:
        die(str(exc))
    return 0


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    print_json(call_api(settings, "GET", f"/jobs/{args.id}"))
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
    page = call_api(settings, "GET", "/jobs", params=params)
    for job in page["jobs"]:
        bounds = "".join(
            f"  {name}={job[name]}" for name in ("start_by", "deadline") if job.get(name)
        )
        print(
            safe(
                f"{job['id']}  {job['status']:<9}  {job['task']:<12}  {job.get('queue', '-'):<10}  "
                f"attempts={job['attempts']}/{job['max_attempts']}  created={job['created_at']}"
                f"{bounds}"
            )
        )
    if page.get("next"):
        print(f"# more: --after {page['next']}", file=sys.stderr)
    return 0


def _bulk(settings: Settings, args: argparse.Namespace, action: str) -> int:
    """`brook retry|cancel` with filters: `POST /jobs/retry|cancel`, prints `{"count": n}`
    (a cancel adds `spawned_cancelled`).
    The options are the fields of `JobFilter`, sent as written: the API checks them."""
    from dataclasses import fields

    from brook.common.domain.bulk import JobFilter

    body: JsonObject = {
        f.name: getattr(args, f.name) for f in fields(JobFilter) if getattr(args, f.name)
    }
    if args.id is not None:
        if body or (args.dry_run and action != "cancel"):
            die(f"brook {action} takes a job ID or filters, not both", 2)
        # A cancel's answer is the job with `spawned_cancelled`: the jobs it spawned, and
        # theirs, that the cancel reached (with --dry-run, would).
        query = "?dry_run=true" if args.dry_run else ""
        print_json(call_api(settings, "POST", f"/jobs/{args.id}/{action}{query}"))
        return 0
    if not body:
        die(f"brook {action} needs a job ID or at least one filter (--status, --task, ...)", 2)
    body["dry_run"] = bool(args.dry_run)
    print_json(call_api(settings, "POST", f"/jobs/{action}", body))
    return 0


def cmd_signal(settings: Settings, args: argparse.Namespace) -> int:
    """Send a signal: prints `{"woken": N}`, the jobs it woke."""
    from urllib.parse import quote

    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        die(f"--payload is not valid JSON: {exc}", 2)
    key = quote(args.key, safe="")
    print_json(call_api(settings, "POST", f"/signals/{key}", {"payload": payload}))
    return 0


def cmd_cancel(settings: Settings, args: argparse.Namespace) -> int:
    return _bulk(settings, args, "cancel")


def cmd_schedules(settings: Settings, args: argparse.Namespace) -> int:
    from urllib.parse import quote

    if args.action != "ls":
        if not args.name:
            die(f"brook schedules {args.action} needs a schedule NAME", 2)
        path = f"/schedules/{quote(args.name, safe='')}/{args.action}"
        print_json(call_api(settings, "POST", path))
        return 0
    schedules = call_api(settings, "GET", "/schedules")["schedules"]
    if not schedules:
        print("# no schedules (a dispatcher declares them when it starts)", file=sys.stderr)
    for s in schedules:
        print(
            safe(
                f"{s['name']:<20}  {s['cron']:<16}  {s['tz']:<16}  {s['task']:<12}  "
                f"{'paused' if s['paused'] else 'active':<6}  next={s['next_run'] or '-'}  "
                f"last_job={s['last_job_id'] or '-'}  overlap={s.get('overlap', 'allow')}"
            )
        )
    return 0


def cmd_triggers(settings: Settings, args: argparse.Namespace) -> int:
    from urllib.parse import quote

    if args.action != "ls":
        if not args.name:
            die(f"brook triggers {args.action} needs a trigger NAME", 2)
        path = f"/triggers/{quote(args.name, safe='')}/{args.action}"
        print_json(call_api(settings, "POST", path))
        return 0
    triggers = call_api(settings, "GET", "/triggers")["triggers"]
    if not triggers:
        print("# no triggers (a dispatcher declares them when it starts)", file=sys.stderr)
    for t in triggers:
        lag = "-" if t["lag_s"] is None else f"{t['lag_s']:.1f}s"
        lost = f"  history_lost={t['history_lost']}" if t["history_lost"] else ""
        skipped = f"  skipped={t['skipped']}" if t.get("skipped") else ""
        print(
            safe(
                f"{t['name']:<20}  {t['collection']:<16}  {t['task']:<12}  "
                f"{'paused' if t['paused'] else 'active':<6}  follower={t['follower'] or '-'}  "
                f"lag={lag}  jobs={t['jobs_made']}{skipped}{lost}"
            )
        )
    return 0


def cmd_retry(settings: Settings, args: argparse.Namespace) -> int:
    return _bulk(settings, args, "retry")


def cmd_rerun(settings: Settings, args: argparse.Namespace) -> int:
    """Rerun a finished job from one of its steps: prints the new job."""
    from urllib.parse import quote

    body: JsonObject = {"from_step": args.from_step}
    if args.payload is not None:
        try:
            body["payload"] = json.loads(args.payload)
        except ValueError as exc:
            die(f"--payload is not valid JSON: {exc}", 2)
    print_json(call_api(settings, "POST", f"/jobs/{quote(args.id, safe='')}/rerun", body))
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
    if q.get("key_concurrency") is not None:
        parts.append(f"key_concurrency={q['key_concurrency']}")
    if q.get("key_rate"):
        rate = q["key_rate"]
        parts.append(f"key_rate={rate['limit']}/{rate['per_seconds']:g}s")
    elif q.get("fair") and q.get("key_concurrency") is None:
        parts.append("fair")
    if q.get("paused"):
        parts.append("paused")
    return " ".join(parts) or "-"


def cmd_queue_ls(settings: Settings, _: argparse.Namespace) -> int:
    queues = call_api(settings, "GET", "/queues")["queues"]
    statuses = [s.value for s in JobStatus]
    print("  ".join([f"{'queue':<20}", *(f"{s:>9}" for s in statuses), "limits"]))
    for q in queues:
        counts = [f"{q['counts'].get(s, 0):>9}" for s in statuses]
        print("  ".join([f"{q['name']:<20}", *counts, _limits(q)]))
    return 0


def cmd_queue_set(settings: Settings, args: argparse.Namespace) -> int:
    from urllib.parse import quote

    body: JsonObject = {}
    if args.action == "set":
        names = ("concurrency", "rate", "key_concurrency", "key_rate", "fair")
        if all(getattr(args, key) is UNSET for key in names):
            die(
                "brook queue set needs --concurrency, --rate, --key-concurrency,"
                " --key-rate and/or --fair",
                2,
            )
        for key in names:
            if getattr(args, key) is not UNSET:
                body[key] = getattr(args, key)
    else:
        body["paused"] = args.action == "pause"
    print_json(call_api(settings, "PUT", f"/queues/{quote(args.name, safe='')}", body))
    return 0
