"""How worker processes start: from a fork server, unless the temp dir is too deep for the
socket it listens on (then `spawn`, rather than a dispatcher that cannot start)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from brook.executor.forking import LISTENER_PATH, SOCKET_PATH_MAX, start_method


def test_workers_start_from_a_fork_server_under_a_short_temp_dir(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert start_method() == "forkserver"


def test_a_temp_dir_too_deep_for_the_fork_servers_socket_starts_workers_by_spawn(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fits = "/" + "d" * (SOCKET_PATH_MAX - LISTENER_PATH - 1)
    monkeypatch.setattr(tempfile, "tempdir", fits)
    assert start_method() == "forkserver"
    monkeypatch.setattr(tempfile, "tempdir", fits + "d")
    assert start_method() == "spawn"
