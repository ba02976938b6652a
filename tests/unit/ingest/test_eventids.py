"""Event ids: they round-trip, and ids the API did not hand out are refused."""

from __future__ import annotations

import pytest

from ingest.eventids import InvalidEventId, decode_id, encode_id
from ingest.live import Position

TOKEN = "826B0D3468000000032B022C0100296E5A1004FD"


def test_event_ids_round_trip_and_refuse_what_the_api_did_not_hand_out() -> None:
    at = Position(token={"_data": TOKEN}, wall_ms=1_700_000_000_000)
    for final in (False, True):
        decoded = decode_id(encode_id(at, final=final))
        assert decoded.at == at and decoded.final is final
    assert len(encode_id(at)) < 80  # short enough for a header and a log line
    for junk in ("", "x" * 2000, "not base64!", "AAAA", encode_id(at)[:5]):
        with pytest.raises(InvalidEventId):
            decode_id(junk)
