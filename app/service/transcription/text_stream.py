"""Text deltas while a transcription decodes (`Transcriber.transcribe(on_delta=...)`): whole
UTF-8 characters only, and only text that belongs to the final segments (the policy is in
`app.service.transcription.transcriber`'s docstring)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from app.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class TextStream:
    """Turns tokens into text deltas without splitting a UTF-8 character: pending tokens are
    decoded together and sent once their text no longer ends in U+FFFD (an incomplete byte
    sequence). `sent` is all the text sent so far."""

    MAX_PENDING = 8  # give up waiting for a character to complete after this many tokens

    def __init__(self, tokenizer: Tokenizer, on_delta: Callable[[str], None]) -> None:
        self.tokenizer = tokenizer
        self.on_delta = on_delta
        self.pending: list[int] = []
        self.sent = ""

    def push(self, token: int) -> None:
        if token >= self.tokenizer.eot:
            return
        self.pending.append(token)
        text = self.tokenizer.decode(self.pending)
        if text.endswith("\ufffd") and len(self.pending) < self.MAX_PENDING:
            return
        self.pending.clear()
        self.send(text)

    def send(self, text: str) -> None:
        if text:
            self.sent += text
            self.on_delta(text)

    def drop_pending(self) -> None:
        self.pending.clear()


@dataclass
class WindowStream:
    """Streams one window's text (see the module docstring for the policy)."""

    stream: TextStream
    timestamps: bool
    live: bool = True
    start: int = 0  # len(stream.sent) when the window began
    held: list[int] = field(default_factory=list)  # text tokens of the open segment

    def on_token(self, token: int) -> None:
        if not self.live:
            return
        if token < self.stream.tokenizer.eot:
            if self.timestamps:
                self.held.append(token)
            else:
                self.stream.push(token)
        elif token >= self.stream.tokenizer.timestamp_begin and self.held:
            for t in self.held:
                self.stream.push(t)
            self.held.clear()

    def new_attempt(self, live: bool) -> None:
        self.held.clear()
        self.stream.drop_pending()
        self.live = live and len(self.stream.sent) == self.start

    @property
    def sent(self) -> str:
        return self.stream.sent[self.start :]

    def finish(self, text: str) -> None:
        """The window's accepted text: send what has not been sent yet."""
        self.held.clear()
        self.stream.drop_pending()
        sent = self.sent
        if not text.startswith(sent):
            log.warning(
                "streamed text of a rejected attempt differs from the accepted one: %r vs %r",
                sent[-40:],
                text[: len(sent)][-40:],
            )
        self.stream.send(text[len(sent) :])
