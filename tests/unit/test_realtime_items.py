"""A Realtime session's items: opened, committed in order, completed once the session has read to
their end, and the ones a failing session still owes its client."""

from __future__ import annotations

from app.api.live.realtime_items import END_TOLERANCE_S, Items


def test_items_complete_in_order_once_the_session_read_to_their_end() -> None:
    items = Items()
    first = items.start(0.5)
    assert items.end(first, 2.0) is None  # the first item follows nothing
    second = items.start()
    assert second.start_s == 2.0  # an item begins where the last one ended
    assert items.end(second, 3.5) == first.id
    assert items.for_text() is first  # text goes to the oldest one still waiting
    assert items.done_by(2.0 - END_TOLERANCE_S / 2) == [first]  # the same sample
    assert items.done_by(3.0) == []
    assert items.done_by(3.5) == [second]
    assert not items.in_flight()
    assert first.seconds == 1.5


def test_a_clear_moves_the_next_items_start_and_drops_the_open_one() -> None:
    items = Items()
    items.start(0.0)
    items.clear(4.2)
    assert items.open is None and not items.in_flight()
    assert items.start().start_s == 4.2


def test_a_failing_session_owes_the_committed_items_and_the_open_one_with_text() -> None:
    items = Items()
    committed = items.start(0.0)
    items.end(committed, 1.0)
    speaking = items.start()
    assert items.waiting() == [committed]  # the open one sent nothing yet
    assert not items.in_flight()
    items.open = speaking
    speaking.text.append(" hello")
    assert items.waiting() == [speaking]
