"""The embedded replica set's bookkeeping, without starting a `mongod`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from brook.replset import ReplicaSet


def test_a_pid_file_naming_a_live_process_that_is_not_the_member_counts_as_not_running(
    tmp_path: Path,
) -> None:
    # A member SIGKILLed long ago left its pid file; the kernel gave the pid to someone else
    # (here: this very test process). That process is neither counted nor ever signalled.
    rs = ReplicaSet(home=tmp_path, base_port=1)
    rs.node_dir(0).mkdir(parents=True)
    rs.pidfile(0).write_text(str(os.getpid()))
    assert rs.pid(0) is None
    assert not rs.running()
    rs.down()  # must not signal this process (it would die of SIGTERM here)


def test_a_set_made_on_some_ports_is_not_started_on_others(tmp_path: Path) -> None:
    import pytest

    from brook.common.domain.errors import EmbeddedMongoError

    made = ReplicaSet(home=tmp_path, base_port=27917)
    made.ports_file.parent.mkdir(parents=True)
    made.ports_file.write_text("27917\n")
    with pytest.raises(EmbeddedMongoError, match="made on ports 27917-27919, not 28000"):
        ReplicaSet(home=tmp_path, base_port=28000).up()
    assert not (tmp_path / "mongo" / "node0").exists()  # nothing was started


def test_a_taken_port_stops_the_start_before_any_member_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The third member's port is taken: the error comes before the first two start (a
    member started first would be left running behind the error)."""
    import socket

    from brook.common.domain.errors import EmbeddedMongoError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rs = ReplicaSet(home=tmp_path, base_port=port - 2)
        monkeypatch.setattr("brook.replset.PORT_FREE_WAIT_S", 0.0)
        with pytest.raises(EmbeddedMongoError, match="is already in use"):
            rs.up()
    assert [rs.pid(i) for i in range(3)] == [None, None, None]
    assert not rs.node_dir(0).exists()
