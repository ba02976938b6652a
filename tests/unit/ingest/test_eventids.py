"""Event ids: they round-trip, and ids the API did not hand out are refused."""

from __future__ import annotations

import base64

import pytest

from brook.ingest.eventids import MAC_BYTES, EventIds, InvalidEventId
from brook.ingest.live import Position

TOKEN = "826B0D3468000000032B022C0100296E5A1004FD"


def test_event_ids_round_trip_and_refuse_what_the_api_did_not_hand_out() -> None:
    at = Position(token={"_data": TOKEN}, wall_ms=1_700_000_000_000)
    for final in (False, True):
        decoded = IDS.decode(IDS.encode(at, final=final))
        assert decoded.at == at and decoded.final is final
    assert len(IDS.encode(at)) < 100  # short enough for a header and a log line
    for junk in ("", "x" * 2000, "not base64!", "AAAA", IDS.encode(at)[:5]):
        with pytest.raises(InvalidEventId):
            IDS.decode(junk)


IDS = EventIds(b"k" * 32)


def _forge(ids: EventIds, at: Position, flip: int) -> str:
    raw = bytearray(base64.urlsafe_b64decode(ids.encode(at) + "=="))
    raw[flip] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def test_an_event_id_altered_or_signed_by_another_deployment_is_refused() -> None:
    at = Position(token={"_data": TOKEN}, wall_ms=1_700_000_000_000)
    other = EventIds(b"o" * 32)
    with pytest.raises(InvalidEventId):
        IDS.decode(other.encode(at))
    # Any byte changed (the wall time, the token, the MAC itself) breaks the MAC.
    for flip in (3, 12, -MAC_BYTES, -1):
        with pytest.raises(InvalidEventId):
            IDS.decode(_forge(IDS, at, flip))


def test_an_event_ids_wall_time_is_range_checked() -> None:
    for wall_ms in (2**62, 0):  # far in the future (fromtimestamp would raise), before 2010
        with pytest.raises(InvalidEventId, match="out of range"):
            IDS.decode(IDS.encode(Position(token={"_data": TOKEN}, wall_ms=wall_ms)))

