"""How much work a dispatcher holds ahead of its workers."""

from __future__ import annotations


def test_a_dispatcher_holds_about_a_fifth_of_a_second_of_work_ahead_and_none_of_long_tasks() -> None:
    from dispatcher.held_jobs import Holdings

    holdings = Holdings()
    assert holdings.ahead(2, 32) == 0  # no task has ended yet: it does not know its tasks
    for _ in range(20):
        holdings.record_run(0.001)
    assert holdings.ahead(2, 32) == 32  # 1 ms tasks: capped by the prefetch
    for _ in range(50):
        holdings.record_run(0.05)
    assert holdings.ahead(2, 32) == 8  # 2 workers x 0.2 s / 50 ms
    for _ in range(50):
        holdings.record_run(2.0)
    assert holdings.ahead(2, 32) == 0  # long tasks: nothing held where another could run it
