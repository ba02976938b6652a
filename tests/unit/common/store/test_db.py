"""`brook.common.store.db`: failures classified transient or permanent in one place."""

from __future__ import annotations


def test_failures_are_classified_transient_or_permanent_in_one_place() -> None:
    from pymongo.errors import (
        AutoReconnect,
        DocumentTooLarge,
        DuplicateKeyError,
        NotPrimaryError,
        OperationFailure,
        ServerSelectionTimeoutError,
    )

    from brook.common.store.db import is_transient

    assert is_transient(ServerSelectionTimeoutError("no primary"))
    assert is_transient(AutoReconnect("connection reset"))
    assert is_transient(NotPrimaryError("not primary"))
    assert is_transient(OperationFailure("stepped down", code=189))
    assert is_transient(
        OperationFailure("x", code=1, details={"errorLabels": ["RetryableWriteError"]})
    )
    assert not is_transient(DuplicateKeyError("dup", code=11000))
    assert not is_transient(DocumentTooLarge("too big"))
    assert not is_transient(OperationFailure("bad query", code=2))
