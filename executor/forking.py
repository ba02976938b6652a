"""How worker processes are started: from a fork server, where the platform has one.

A fork server is a process started once, as a fresh interpreter (never a fork of the
dispatcher, so it holds no MongoDB client, socket or thread), that imports the heavy
modules once; each worker is then a fork of it, ready in milliseconds rather than a new
interpreter importing everything again (32 workers: ~2 s instead of ~7 s on a quiet
2-core host). Task modules (`BROOK_TASKS`) are still imported by each worker itself, as
with `spawn`, so their import-time code runs in the process that runs their tasks. Each
worker still creates its own MongoDB client, in its own process, when it needs one.

Lifetimes: the fork server exits when the process that started it dies (the end of its
"alive" pipe closes, even on SIGKILL), and each worker dies with the fork server, its
parent (`PR_SET_PDEATHSIG`, set by the worker itself).

This module imports nothing heavy, so the server can be started first thing and boot
while the dispatcher imports its own modules.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import tempfile
import time

# What the fork server imports once: the program's main module (so a worker does not run
# it again, as `spawn` would) and the worker's own code, with pymongo, pydantic, structlog
# and the demo tasks behind it.
PRELOAD = ("__main__", "brook.executor.worker", "brook.executor.demo")


# The fork server listens on a Unix socket at `<temp dir>/pymp-XXXXXXXX/listener-XXXXXXXX`,
# and a socket's path holds at most 107 bytes on Linux: under a deeper temp dir (`TMPDIR`)
# its bind fails, and the dispatcher with it.
SOCKET_PATH_MAX = 107
LISTENER_PATH = len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def start_method() -> str:
    """`forkserver` (preloading `PRELOAD`) where the platform has it and the temp dir is
    short enough for its socket, else `spawn` (slower worker starts, same behaviour)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    if len(os.fsencode(tempfile.gettempdir())) + LISTENER_PATH > SOCKET_PATH_MAX:
        return "spawn"
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD))
    return "forkserver"


def start_server() -> None:
    """Start the fork server now (it boots in the background); later worker starts use it."""
    if start_method() == "forkserver":
        multiprocessing.forkserver.ensure_running()


def stop_server(timeout: float = 2.0) -> None:
    """Stop this process's fork server, if it started one, and wait (at most `timeout`) for
    it to exit: a stopping dispatcher leaves no process behind it, even for the moment the
    server would otherwise take to notice its pipe closed after the dispatcher's exit."""
    server = multiprocessing.forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    alive = getattr(server, "_forkserver_alive_fd", None)
    if pid is None or alive is None:
        return
    with contextlib.suppress(OSError):
        os.close(alive)  # the server's "alive" pipe ends: it exits, and its workers with it
    server._forkserver_alive_fd = None  # type: ignore[attr-defined]
    ends = time.monotonic() + timeout
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < ends:
            time.sleep(0.01)
    server._forkserver_pid = None  # type: ignore[attr-defined]
