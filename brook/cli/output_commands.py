"""`brook output ID`: a job's output (`ctx.emit`), what it has so far or, with `--follow`,
as it comes until the job has ended. Any failure exits with one line on stderr."""

from __future__ import annotations

import argparse
import json
import sys

from brook.cli.printing import die
from brook.common.runtime.settings import Settings


def cmd_output(settings: Settings, args: argparse.Namespace) -> int:
    if args.follow:
        return _follow(settings, args)
    if args.json or args.after is not None:
        die("--json and --after go with --follow", 2)
    return _so_far(settings, args)


def _so_far(settings: Settings, args: argparse.Namespace) -> int:
    """`GET /jobs/{id}/output?format=text`: text chunks as they are, JSON ones a line each."""
    import httpx

    from brook.output_follow import TextSink
    from brook.watching import auth_headers, base_url

    url = f"{base_url(settings)}/jobs/{args.id}/output"
    params: dict[str, str | int] = {"format": "text"}
    if args.attempt is not None:
        params["attempt"] = args.attempt
    try:
        resp = httpx.get(url, params=params, headers=auth_headers(settings), timeout=60)
    except httpx.HTTPError as exc:
        die(f"cannot reach the API at {url} ({exc.__class__.__name__}); is `brook up` running?")
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail")
        except ValueError:
            detail = resp.text
        die(f"{resp.status_code} {detail if isinstance(detail, str) else json.dumps(detail)}")
    TextSink(sys.stdout).write(resp.text)
    return 0


def _follow(settings: Settings, args: argparse.Namespace) -> int:
    """The output stream's events: chunks on stdout as they come (or as JSON lines), a note
    on stderr when a later attempt's output begins; done at the stream's `end`."""
    from brook.output_follow import OutputPrinter, follow_output
    from brook.watching import StreamFailed

    printer = OutputPrinter(sys.stdout, sys.stderr, as_json=args.json)

    def on_event(kind: str, data: dict[str, object]) -> None:
        if kind == "attempt":
            printer.attempt(int(str(data["attempt"])))
        else:
            printer.chunk(data)

    params = None if args.attempt is None else {"attempt": str(args.attempt)}
    try:
        follow_output(settings, args.id, on_event, params=params, after=args.after)
    except StreamFailed as exc:
        die(str(exc))
    return 0
