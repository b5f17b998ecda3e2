"""What a live session has told its client: committed text, closed segments, the partial.

Committed text is append-only; each commit becomes a `CommittedText` event, each closed stretch
a `StreamSegment`, and the unstable tail a `PartialText` (sent only when it changed): token by
token while a pass decodes (`token_feed`), then the pass's words that were not committed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.engine.tokenizer import Tokenizer
from app.engine.words import Word, split_words
from app.service.live.events import CommittedText, PartialText, StreamEvent, StreamSegment
from app.service.live.word_match import is_cjk


class Transcript:
    def __init__(self, on_event: Callable[[StreamEvent], None]) -> None:
        self.on_event = on_event
        self._end = 0.0  # stream seconds where the committed text ends (event times)
        self.n_words = 0
        self._text: list[str] = []
        self._segment_words: list[Word] = []  # committed since the last StreamSegment
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

    def commit(self, words: Sequence[Word], language: str | None) -> None:
        if not words:
            return
        text = "".join(w.word for w in words)
        if not self._text:
            text = text.lstrip()
        elif text[:1].isalnum() and not is_cjk(text[:1]):  # a word without its space
            text = " " + text  # (one led by punctuation goes on the last: "fat" "-mutton")
        start = max(words[0].start, self._end)
        end = max(words[-1].end, start)
        self._end = end
        self._text.append(text)
        self.n_words += len(words)
        self._segment_words.extend(words)
        self.on_event(CommittedText(text, round(start, 3), round(end, 3), tuple(words), language))

    def close_segment(self) -> None:
        if not self._segment_words:
            return
        words = self._segment_words
        text = "".join(w.word for w in words).strip()
        start = round(words[0].start, 3)
        end = round(max(words[-1].end, words[0].start), 3)
        self.on_event(StreamSegment(self._segment_id, start, end, text, tuple(words)))
        self._segment_id += 1
        self._segment_words = []

    def partial(self, text: str) -> None:
        if text != self._partial:
            self._partial = text
            self.on_event(PartialText(text))

    def partial_words(self, words: Sequence[Word]) -> None:
        self.partial("".join(w.word for w in words))

    def token_feed(
        self, tokenizer: Tokenizer, skip: int, language: str | None
    ) -> Callable[[int], None]:
        """on_token for a pass: the partial is the text decoded so far, minus its first `skip`
        words (committed already; the stream's word split, `language`'s)."""
        tokens: list[int] = []
        shown_from: int | None = None if skip else 0  # where the shown text starts (characters)

        def on_token(token: int) -> None:
            nonlocal shown_from
            if token >= tokenizer.eot:
                return
            tokens.append(token)
            text = tokenizer.decode(tokens)
            if text.endswith("\ufffd"):
                return
            if shown_from is None:  # split until the words to skip are behind (then it stays)
                words = split_words(tokenizer, tokens, language)
                if len(words) <= skip:
                    return
                shown_from = sum(len(w.word) for w in words[:skip])
            shown = text[shown_from:].rstrip()
            if shown.strip():
                self.partial(shown)

        return on_token
