"""`brook api`, `brook dispatcher` and `brook mongo`: a role, or the embedded replica set,
run by this process (`brook up` starts the roles as children of its own)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

from brook.common.runtime.settings import Settings

BACKLOG = 2048  # uvicorn's default: connections the kernel completes before the API accepts


def cmd_api(settings: Settings, _: argparse.Namespace) -> int:
    import uvicorn

    from brook.common.runtime.log import configure_logging
    from brook.executor.registry import load_tasks
    from brook.ingest.app import create_app
    from brook.ingest.connection_guard import ConnectionGuard, guarded_http

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:  # a second SIGTERM / Ctrl-C: stop now, whatever is pending
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                os._exit(130)
            super().handle_exit(sig, frame)

    configure_logging(settings.log_level, role="api")
    from brook.common.runtime import tracing

    tracing.configure("api")
    app = create_app(settings, set(load_tasks(settings)))
    # Connections held, and how long one may sit idle (`brook.ingest.connection_guard`):
    # uvicorn's own limit counts idle connections too, so it is not set.
    guard = ConnectionGuard(
        max_connections=settings.max_connections,
        header_timeout_s=settings.header_timeout_seconds,
    )
    config = uvicorn.Config(
        app,
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,
        access_log=False,
        lifespan="on",
        # Requests still waiting on MongoDB when the grace period ends are cancelled.
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
        http=guarded_http(guard),
        ws="none",  # no WebSocket routes: an upgrade is a plain request
        backlog=BACKLOG,
    )
    # Accepted connections wait in the backlog, and one burst of them is accepted before
    # the guard closes the idle ones it replaces.
    _raise_open_files(settings.max_connections + BACKLOG)
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
    from brook.executor.forking import start_server

    start_server()  # it imports the worker's modules while this process imports its own
    from brook.roles import run_dispatcher

    return run_dispatcher(settings)


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
