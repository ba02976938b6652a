"""`brook up`: the replica set (unless `BROOK_MONGO_URI` is set), the API and a dispatcher,
each role a child process that this one supervises and stops in order."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from brook.common.runtime.backoff import exponential
from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.settings import Settings

if TYPE_CHECKING:
    from brook.replset import ReplicaSet


def cmd_up(settings: Settings, _: argparse.Namespace) -> int:
    """Replica set (unless BROOK_MONGO_URI is set) + API + dispatcher, in the foreground.

    Ctrl-C / SIGTERM at any moment stops everything this command started, in order:
    the dispatcher first (it hands running jobs back), then the API, then the replica set,
    within the grace period + 5 s whatever the state of MongoDB. A second signal stops at
    once. The roles die with this process even when it is SIGKILLed (PR_SET_PDEATHSIG).
    """
    from brook.common.runtime.log import configure_logging
    from brook.common.runtime.settings import check_exposure
    from brook.replset import ReplicaSet

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
                log_event(
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
            log_event(
                Event.UP_STARTED,
                api=f"http://{settings.api_host}:{settings.api_port}",
                pids={r: p.pid for r, p in children.items()},
            )
        code = _supervise(children, spawn, signals)
    except _Interrupted:
        pass
    finally:
        log_event(Event.UP_STOPPING, signal=signals.first_name)
        grace_ends = (signals.first_at or time.monotonic()) + settings.shutdown_grace_seconds
        _stop_children(children, signals, grace_ends + ROLE_MARGIN_S)
        if started_rs is not None:
            _stop_replset(started_rs, signals, grace_ends + MONGO_MARGIN_S)
            log_event(Event.MONGO_DOWN)
        log_event(Event.UP_STOPPED)
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
                log_event(
                    Event.UP_GIVING_UP,
                    level="error",
                    role=role,
                    exitcode=proc.returncode,
                    restarts=len(recent),
                    window_s=RESTART_WINDOW_S,
                )
                return 1
            delay = exponential(len(recent), 0.5, 10.0)
            log_event(
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
            log_event(Event.UP_CHILD_RESTARTED, role=role, pid=children[role].pid)
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
                log_event(Event.UP_KILL, level="error", role=role, pid=proc.pid)
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
