"""The embedded replica set is real: three members, majority writes, failover, clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.read_concern import ReadConcern

from brook.replset import PREIMAGE_EXPIRY_S, ReplicaSet
from tests.conftest import ROOT, SPARE_ONE_MEMBER_PORT, TEST_PORT, Mongo, extra_port
from tests.support.procs import pid_alive, wait_until


@pytest.fixture(scope="module")
def embedded(mongo: Mongo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaSet]:
    """The shared set when it is the embedded one. Under another backend (a container with
    BROOK_TEST_DOCKER=1, or BROOK_TEST_MONGO_URI) these tests, which are about the embedded
    set itself, start one of their own on TEST_PORT + 3..5 (the shared set's neighbours,
    free when the shared set is elsewhere)."""
    if mongo.replset is not None:
        yield mongo.replset
        return
    rs = ReplicaSet(
        home=tmp_path_factory.mktemp("embedded"), base_port=TEST_PORT + 3, test_commands=True
    )
    rs.up()
    try:
        yield rs
    finally:
        rs.down()


def test_the_set_has_one_primary_and_two_secondaries(embedded: ReplicaSet) -> None:
    states = sorted(state for _, state in embedded.member_states())
    assert states == ["PRIMARY", "SECONDARY", "SECONDARY"]


def test_the_set_keeps_a_pre_image_an_hour_not_as_long_as_the_oplog(embedded: ReplicaSet) -> None:
    client: MongoClient[dict[str, Any]] = MongoClient(embedded.uri)
    try:
        got = client.admin.command("getClusterParameter", "changeStreamOptions")
    finally:
        client.close()
    images = got["clusterParameters"][0]["preAndPostImages"]
    assert images == {"expireAfterSeconds": PREIMAGE_EXPIRY_S} and PREIMAGE_EXPIRY_S == 3600


def test_pre_images_older_than_the_expiry_are_removed(tmp_path: Path) -> None:
    """What the hour above relies on: MongoDB removes expired pre-images (here after 1 s,
    its remover woken every second instead of every 10)."""
    rs = ReplicaSet(
        home=tmp_path,
        base_port=SPARE_ONE_MEMBER_PORT,
        members=1,
        preimage_expiry_s=1,
        extra_args=("--setParameter", "expiredChangeStreamPreImageRemovalJobSleepSecs=1"),
    )
    rs.up()
    client: MongoClient[dict[str, Any]] = MongoClient(rs.uri, w="majority")
    try:
        db = client["t_preimages"]
        db.create_collection("jobs", changeStreamPreAndPostImages={"enabled": True})
        db.jobs.insert_many([{"_id": i, "n": 0} for i in range(50)])
        db.jobs.update_many({}, {"$inc": {"n": 1}})
        images = client["config"]["system.preimages"]
        assert images.count_documents({}) == 50
        wait_until(lambda: images.count_documents({}) == 0, timeout=30)
    finally:
        client.close()
        rs.down()


def test_a_majority_write_is_readable_from_a_secondary(embedded: ReplicaSet, db_name: str) -> None:
    rs = embedded
    client: MongoClient[dict[str, Any]] = MongoClient(rs.uri, w="majority")
    secondaries: list[MongoClient[dict[str, Any]]] = [
        MongoClient(
            f"mongodb://127.0.0.1:{rs.ports[i]}/?directConnection=true",
            readPreference="secondary",
        )
        for i in range(rs.members)
        if i != rs.primary_index()
    ]
    try:
        assert len(secondaries) == 2
        for c in secondaries:
            assert c.admin.command("hello")["secondary"]
        client[db_name]["probe"].insert_one({"_id": "x", "v": 1})
        # Acknowledged by a majority (two of three) means applied on at least one secondary
        # already: read each one directly, with no session to carry causal consistency.
        found = [c[db_name]["probe"].find_one({"_id": "x"}) for c in secondaries]
        assert {"_id": "x", "v": 1} in found, found
        # And in every secondary's majority-committed view, once it learns the commit point.
        for c in secondaries:
            majority = c[db_name].get_collection("probe", read_concern=ReadConcern("majority"))
            wait_until(partial(majority.find_one, {"_id": "x"}), timeout=10)
    finally:
        for c in secondaries:
            c.close()
        client.drop_database(db_name)
        client.close()


def test_killing_the_primary_elects_a_new_one_and_the_client_keeps_working(
    embedded: ReplicaSet, db_name: str
) -> None:
    rs = embedded
    client: MongoClient[dict[str, Any]] = MongoClient(
        rs.uri, w="majority", serverSelectionTimeoutMS=30000
    )
    try:
        coll = client[db_name]["probe"]
        coll.insert_one({"n": 1})
        old = rs.primary_index()
        assert old is not None
        rs.stop_member(old, signal.SIGKILL)
        new = wait_until(lambda: rs.primary_index() not in (None, old), timeout=60, interval=0.25)
        new = rs.primary_index()
        assert new != old
        coll.insert_one({"n": 2})  # the same client finds the new primary by itself
        assert coll.count_documents({}) == 2
    finally:
        rs.up()  # restart the killed member; wait for PRIMARY + 2 SECONDARY again
        client.drop_database(db_name)
        client.close()


@pytest.mark.timeout(330)  # five `brook mongo` calls of up to 60 s
def test_mongo_up_is_idempotent_and_down_leaves_no_process_behind(tmp_path: Path) -> None:
    port = extra_port("mongo_cli")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROOK_")}
    env.update(
        {"BROOK_HOME": str(tmp_path), "BROOK_MONGO_PORT": str(port), "PYTHONPATH": str(ROOT)}
    )

    def brook(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "brook.cli", "mongo", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    up = brook("up")
    assert up.returncode == 0, up.stderr
    hosts = ",".join(f"127.0.0.1:{port + i}" for i in range(3))
    assert up.stdout.strip() == f"mongodb://{hosts}/?replicaSet=brook"
    rs = ReplicaSet(home=tmp_path, base_port=port)
    pids = [rs.pid(i) for i in range(3)]
    assert all(pids)
    again = brook("up")
    assert again.returncode == 0 and [rs.pid(i) for i in range(3)] == pids
    status = brook("status")
    assert status.returncode == 0
    assert sorted(line.split()[-1] for line in status.stdout.splitlines()[1:]) == [
        "PRIMARY",
        "SECONDARY",
        "SECONDARY",
    ]
    down = brook("down")
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(p) for p in pids if p)
    after = brook("status")
    assert after.returncode == 1 and "not running" in after.stdout
    # Its data cannot come up on other ports (its members know one another by these): one
    # line says which ports it was made on, and nothing starts.
    env["BROOK_MONGO_PORT"] = str(port + 10)
    moved = brook("up")
    assert moved.returncode != 0
    assert f"made on ports {port}-{port + 2}" in moved.stderr, moved.stderr
    assert f"BROOK_MONGO_PORT={port}" in moved.stderr
    assert not ReplicaSet(home=tmp_path, base_port=port + 10).running()


def test_mongo_up_reports_a_taken_port_in_one_line(tmp_path: Path) -> None:
    import socket

    port = extra_port("taken_port")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROOK_")}
    env.update(
        {"BROOK_HOME": str(tmp_path), "BROOK_MONGO_PORT": str(port), "PYTHONPATH": str(ROOT)}
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        proc = subprocess.run(
            [sys.executable, "-m", "brook.cli", "mongo", "up"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port} is already in use" in lines[0]


def test_mongo_up_after_a_crash_reuses_the_data(tmp_path: Path) -> None:
    rs = ReplicaSet(home=tmp_path, base_port=extra_port("crash_reuse"))
    rs.up()
    try:
        client: MongoClient[dict[str, Any]] = MongoClient(rs.uri, w="majority")
        client.keep["k"].insert_one({"_id": 1})
        client.close()
        for i in range(3):
            rs.stop_member(i, signal.SIGKILL)
        assert not rs.running()
        started = time.monotonic()
        rs.up()
        client = MongoClient(rs.uri, w="majority")
        assert client.keep["k"].find_one({"_id": 1}) == {"_id": 1}
        client.close()
        assert time.monotonic() - started < 90
    finally:
        rs.down()
