"""The DB factory's timeouts, against the real replica set: a reply that never comes fails
after the socket timeout (and counts as transient, so the caller retries on whichever member
is primary then) instead of waiting for ever; an index build may take longer. A member that
holds the command (`failCommand` with `blockConnection`) stands in for one gone silent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from pymongo import AsyncMongoClient, IndexModel
from pymongo.errors import NetworkTimeout

from brook.common.domain.models import Doc
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, ensure_indexes, is_transient, make_client
from tests.support.failpoints import fail_commands, fail_nothing

APP = "client-timeouts"
SOCKET_TIMEOUT_MS = 1_000
HELD_MS = 3_000  # longer than the socket timeout


@pytest.fixture
async def control(settings: Settings) -> AsyncIterator[AsyncMongoClient[Doc]]:
    """Sets the fail points, with the default timeouts: turning one off waits for the
    commands it holds to be let go."""
    client = make_client(settings, appname="failpoints")
    yield client
    await fail_nothing(client)
    await client.close()


@pytest.fixture
async def client(
    settings: Settings, control: AsyncMongoClient[Doc]
) -> AsyncIterator[AsyncMongoClient[Doc]]:
    """A client of the DB factory with a short socket timeout."""
    short = settings.model_copy(update={"mongo_socket_timeout_ms": SOCKET_TIMEOUT_MS})
    client = make_client(short, appname=APP)
    yield client
    await client.close()


async def test_a_reply_that_never_comes_fails_after_the_socket_timeout(
    client: AsyncMongoClient[Doc], control: AsyncMongoClient[Doc], settings: Settings
) -> None:
    jobs = database(client, settings)["timeouts_scratch"]
    await jobs.insert_one({"x": 1})
    # Both the read and its one retry are held longer than the socket timeout.
    await fail_commands(
        control, APP, ["find"], {"times": 2}, blockConnection=True, blockTimeMS=HELD_MS
    )
    with pytest.raises(NetworkTimeout) as caught:
        await asyncio.wait_for(jobs.find_one({"x": 1}), timeout=HELD_MS * 4 / 1000)
    assert is_transient(caught.value)
    # The client goes on: the next read is answered.
    assert (await jobs.find_one({"x": 1}) or {}).get("x") == 1


async def test_an_index_build_may_take_longer_than_the_socket_timeout(
    client: AsyncMongoClient[Doc], control: AsyncMongoClient[Doc], settings: Settings
) -> None:
    scratch = database(client, settings)["timeouts_indexed"]
    await fail_commands(
        control, APP, ["createIndexes"], {"times": 1}, blockConnection=True, blockTimeMS=HELD_MS
    )
    await ensure_indexes(scratch, [IndexModel("x", name="x_1")])
    assert "x_1" in await scratch.index_information()
