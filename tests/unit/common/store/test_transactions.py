"""The pure parts of `brook.common.store.transactions`: session checks, and a key taken after the
snapshot."""

from __future__ import annotations

import pytest
from pymongo.errors import BulkWriteError, DuplicateKeyError

from brook.common.domain.errors import InvalidSession
from brook.common.store.transactions import _key_taken, check_session


class FakeSession:
    def __init__(self, client: object, in_transaction: bool) -> None:
        self.client = client
        self.in_transaction = in_transaction


def test_a_session_is_checked_for_its_kind_its_client_and_its_transaction() -> None:
    mine, theirs = object(), object()
    good = FakeSession(mine, True)
    assert check_session(good, mine, FakeSession) is good
    with pytest.raises(InvalidSession, match="must be a pymongo FakeSession"):
        check_session("not a session", mine, FakeSession)
    with pytest.raises(InvalidSession, match=r"session\.client is not the client"):
        check_session(FakeSession(theirs, True), mine, FakeSession)
    with pytest.raises(InvalidSession, match="in_transaction is False"):
        check_session(FakeSession(mine, False), mine, FakeSession)


def test_a_key_taken_after_the_snapshot_says_so_with_the_label_drivers_retry_on() -> None:
    taken = _key_taken(BulkWriteError({"writeErrors": [{"index": 0, "code": 11000}]}))
    assert isinstance(taken, DuplicateKeyError)
    assert taken.has_error_label("TransientTransactionError") and "run it again" in str(taken)
    other = BulkWriteError({"writeErrors": [{"index": 0, "code": 2}]})
    assert _key_taken(other) is other
