"""`Announced`: of the two announcements of one insert (an oplog hint, the change stream),
only the first is news, whichever comes first; without hints every event is news."""

from __future__ import annotations

from brook.dispatcher.claiming.insert_hints import Announced


def test_without_hints_every_announcement_is_news() -> None:
    announced = Announced()
    assert announced.first("a") and announced.first("a") and announced.first("a")
    assert len(announced) == 0


def test_the_second_announcement_of_an_insert_is_not_news_whichever_source_is_first() -> None:
    announced = Announced()
    announced.active = True
    assert announced.first("a")  # the hint
    assert announced.first("b")  # the stream first, this time
    assert not announced.first("b")  # ... then the hint
    assert not announced.first("a")  # the stream
    assert len(announced) == 0
    assert announced.first("a")  # a third announcement (a requeue is not one) is news again


def test_what_one_source_never_announces_is_forgotten_in_order_within_the_cap() -> None:
    announced = Announced(cap=3)
    announced.active = True
    for job_id in "abcd":  # inserts the hints never see (a transaction's), say
        assert announced.first(job_id)
    assert len(announced) == 3
    assert announced.first("a")  # forgotten: news again, which costs one look, never a job
    assert not announced.first("d")


def test_hints_stopping_forget_everything_and_make_every_event_news() -> None:
    announced = Announced()
    announced.active = True
    assert announced.first("a")
    announced.stop()
    assert len(announced) == 0 and announced.first("a") and announced.first("a")
