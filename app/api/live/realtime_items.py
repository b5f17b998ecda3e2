"""A Realtime session's items: the one its audio goes into, and those committed and waiting for
their final text, in order. State only; the connection sends the events."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from app.api.live.realtime_events import new_item_id
from app.service.transcription.results import Word

END_TOLERANCE_S = 0.01  # an item's end and the finalization at it: the same sample, as seconds


@dataclass
class Item:
    """One turn's audio and its transcript so far."""

    id: str
    start_s: float  # stream seconds
    end_s: float | None = None
    text: list[str] = field(default_factory=list)
    words: list[Word] = field(default_factory=list)
    language: str | None = None  # the one its words were read in

    @property
    def seconds(self) -> float:
        return round(max((self.end_s or self.start_s) - self.start_s, 0.0), 3)


@dataclass
class Items:
    open: Item | None = None  # the item audio is going into
    ended: deque[Item] = field(default_factory=deque)  # committed, waiting for their final text
    last_id: str | None = None
    mark_s: float = 0.0  # stream seconds of the last commit or clear: where an item begins

    def in_flight(self) -> bool:
        return self.open is not None or bool(self.ended)

    def start(self, start_s: float | None = None) -> Item:
        self.open = Item(new_item_id(), self.mark_s if start_s is None else start_s)
        return self.open

    def end(self, item: Item, end_s: float) -> str | None:
        """The item's audio is complete; returns the item before it (its id)."""
        item.end_s = end_s
        self.mark_s = max(self.mark_s, end_s)
        self.open = None
        self.ended.append(item)
        previous, self.last_id = self.last_id, item.id
        return previous

    def clear(self, now_s: float) -> None:
        """The audio not committed is dropped: the next item begins here."""
        self.open = None
        self.mark_s = now_s

    def for_text(self) -> Item | None:
        """The item text goes to: the oldest one waiting for its final text, else the open one
        (None: there is none)."""
        return self.ended[0] if self.ended else self.open

    def done_by(self, at: float) -> list[Item]:
        """The committed items whose audio ends by `at` (stream seconds), taken off the queue."""
        done = []
        while self.ended and (self.ended[0].end_s or 0.0) <= at + END_TOLERANCE_S:
            done.append(self.ended.popleft())
        return done

    def waiting(self) -> list[Item]:
        """Every item a client still waits for (committed, or open with text sent), taken off."""
        found = [*self.ended, *([self.open] if self.open is not None and self.open.text else [])]
        self.ended.clear()
        self.open = None
        return found
