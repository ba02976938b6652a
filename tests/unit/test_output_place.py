"""Where a batch of an attempt's chunks goes in its job's stream (`place`): next after the
chunk before it, never twice, never over another attempt's chunks."""

from __future__ import annotations

from brook.common.domain.output import NOT_NEXT, Placed, place


def test_a_batch_goes_right_after_the_chunk_before_it() -> None:
    assert place(1, 1, 3, []) == Placed(kept=True, first_seq=1)
    assert place(2, 4, 2, [(3, 1, 5)]) == Placed(kept=True, first_seq=4)


def test_a_batch_whose_chunk_before_is_missing_is_not_the_next() -> None:
    assert place(1, 5, 1, [(3, 1, 5)]) == NOT_NEXT
    assert place(1, 2, 1, []) == NOT_NEXT


def test_a_batch_written_before_is_skipped_as_far_as_it_was_written() -> None:
    near = [(2, 1, 1), (3, 1, 1), (4, 1, 1)]
    assert place(1, 3, 4, near) == Placed(kept=True, first_seq=5, skip=2)
    assert place(1, 3, 1, near) == NOT_NEXT  # more of it written than it holds


def test_an_earlier_attempts_chunks_past_the_count_go_first() -> None:
    near = [(2, 1, 1), (3, 1, 4), (4, 1, 6)]
    assert place(2, 3, 2, near) == Placed(kept=True, first_seq=5, moved=2, moved_bytes=10)


def test_never_over_a_later_attempts_chunks_nor_a_mix_nor_a_gap() -> None:
    assert place(1, 3, 2, [(2, 1, 1), (3, 2, 1)]) == NOT_NEXT  # a later attempt's
    assert place(2, 3, 2, [(2, 1, 1), (3, 1, 1), (4, 2, 1)]) == NOT_NEXT  # a mix
    assert place(2, 3, 2, [(2, 1, 1), (4, 1, 1)]) == NOT_NEXT  # a gap
