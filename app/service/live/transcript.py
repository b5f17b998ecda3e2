"""What a live session has told its client: committed text, closed segments, the partial.

Committed text is append-only; each commit becomes a `CommittedText` event, each closed stretch
a `StreamSegment`, and the unstable tail a `PartialText` (sent only when it changed): token by
token while a pass decodes (`token_feed`), then the pass's words that were not committed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.engine.tokenizer import Tokenizer
from app.service.live.events import CommittedText, PartialText, StreamEvent, StreamSegment
from app.service.live.units import LiveWord, is_cjk, split_units


class Transcript:
    def __init__(self, on_event: Callable[[StreamEvent], None]) -> None:
        self.on_event = on_event
        self._end = 0.0  # stream seconds where the committed text ends (event times)
        self.n_words = 0
        self._text: list[str] = []
        self._segment_words: list[LiveWord] = []  # committed since the last StreamSegment
        self._segment_id = 0
        self._partial = ""

    @property
    def text(self) -> str:
        """All committed text."""
        return "".join(self._text).strip()

    @property
    def empty(self) -> bool:
        return not self._text

    def tail(self, chars: int) -> str:
        return "".join(self._text)[-chars:]

    def commit(self, words: Sequence[LiveWord]) -> None:
        if not words:
            return
        text = "".join(w.text for w in words)
        if not self._text:
            text = text.lstrip()
        elif not text[:1].isspace() and not is_cjk(text[:1]):
            text = " " + text
        start = max(words[0].start, self._end)
        end = max(words[-1].end, start)
        self._end = end
        self._text.append(text)
        self.n_words += len(words)
        self._segment_words.extend(words)
        self.on_event(CommittedText(text, round(start, 3), round(end, 3)))

    def close_segment(self) -> None:
        if not self._segment_words:
            return
        words = self._segment_words
        text = "".join(w.text for w in words).strip()
        start = round(words[0].start, 3)
        end = round(max(words[-1].end, words[0].start), 3)
        self.on_event(StreamSegment(self._segment_id, start, end, text))
        self._segment_id += 1
        self._segment_words = []

    def partial(self, text: str) -> None:
        if text != self._partial:
            self._partial = text
            self.on_event(PartialText(text))

    def partial_words(self, words: Sequence[LiveWord]) -> None:
        self.partial("".join(w.text for w in words))

    def token_feed(self, tokenizer: Tokenizer, skip: int) -> Callable[[int], None]:
        """on_token for a pass: the partial is the text decoded so far, minus its first `skip`
        words (committed already)."""
        tokens: list[int] = []

        def on_token(token: int) -> None:
            if token >= tokenizer.eot:
                return
            tokens.append(token)
            text = tokenizer.decode(tokens)
            if text.endswith("\ufffd"):
                return
            units = split_units(text)
            if len(units) > skip:
                self.partial("".join(units[skip:]))

        return on_token
