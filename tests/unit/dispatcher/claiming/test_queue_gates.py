"""The gates that keep a waiting queue from busy-looping."""

from __future__ import annotations

import asyncio

from brook.dispatcher.claiming.queue_gates import QueueGates


async def test_a_closed_queue_opens_on_news_and_a_claim_that_raced_news_does_not_close_it() -> None:
    class Clock:
        def now(self) -> float:
            return 1000.0

    opened: list[str] = []
    gates = QueueGates(Clock(), opened.append)
    gen = gates.generation("q")
    gates.open("q")  # a slot freed while the claim was looking
    assert not gates.close("q", "full", None, gen) and gates.is_open("q")
    assert gates.close("q", "full", None, gates.generation("q")) and not gates.is_open("q")
    gates.open_waiting(("rate",))
    assert not gates.is_open("q")  # only full queues were asked to try again
    gates.open_waiting()
    assert gates.is_open("q") and opened == ["q"]
    assert gates.close("q", "rate", 1000.05, gates.generation("q"))
    assert gates.closed() == {"q"}
    await asyncio.sleep(0.2)  # the window moved: the timer opened it
    assert gates.is_open("q") and opened == ["q", "q"]
