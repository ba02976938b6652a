"""Backoff: per attempt with jitter, and a loop's backoff that resets after a success."""

from __future__ import annotations

from brook.common.runtime.backoff import Backoff, backoff_delay


def test_backoff_doubles_per_attempt_within_jitter_and_stops_at_the_cap() -> None:
    assert backoff_delay(1, 1.0, 300, rand=1.0) == 1.0
    assert backoff_delay(1, 1.0, 300, rand=0.0) == 0.5
    assert backoff_delay(4, 1.0, 300, rand=1.0) == 8.0
    assert backoff_delay(30, 1.0, 300, rand=1.0) == 300.0
    for _ in range(100):
        assert 2.0 <= backoff_delay(3, 1.0, 300) <= 4.0


def test_a_loop_backoff_doubles_to_its_cap_and_resets_after_a_success() -> None:
    b = Backoff(0.1, 0.5)
    assert [b.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    b.reset()
    assert b.next() == 0.1
