"""What a live session tells its client adapter: typed events (stream seconds for times)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.engine.words import Word


@dataclass(frozen=True)
class PartialText:
    """The unstable tail after the committed text; replaces the previous partial."""

    text: str


@dataclass(frozen=True)
class CommittedText:
    """Committed text (append-only; starts with a space between words) and its time span;
    its words (their tokens, with log-probs when the passes are aligned) and the language they
    were read in."""

    text: str
    start: float
    end: float
    words: tuple[Word, ...] = ()
    language: str | None = None


@dataclass(frozen=True)
class StreamSegment:
    """A closed stretch of committed text, and its words."""

    id: int
    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()


@dataclass(frozen=True)
class SpeechStarted:
    """The VAD heard speech begin at `at` (with VAD only)."""

    at: float


@dataclass(frozen=True)
class SpeechStopped:
    """The VAD found the speech over at `at` (a pause of the VAD's `min_silence_s` followed)."""

    at: float


@dataclass(frozen=True)
class VoiceActivity:
    """The VAD as it hears the audio, before the session acts on it (while a pass decodes when
    the runner hears at once, `LiveRunner(hear_at_once=True)`; else at admission):
    speech began ("start"), a silence of the session's `pause_s` ("pause") or `min_silence_s`
    ("end") began, or speech came back after a pause ("resume") at `at`. What reacts to speech
    at once listens to these (a Wyoming utterance's early pass); turns are
    `SpeechStarted`/`SpeechStopped`."""

    kind: Literal["start", "pause", "resume", "end"]
    at: float


@dataclass(frozen=True)
class Finalized:
    """Everything before the pause (`reason` "pause") or the client's commit ("flush") is
    committed: the CommittedText events before this one hold all of it, up to `at` (stream
    seconds). A session behind real time finalizes the pauses it hears in audio received
    before a client's commit, and that commit only when it reaches it."""

    reason: Literal["pause", "flush"]
    at: float


@dataclass(frozen=True)
class BufferCleared:
    """`clear()` took effect: what was not committed is gone (text committed before this event
    came from audio received before the clear)."""


StreamEvent = (
    PartialText
    | CommittedText
    | StreamSegment
    | SpeechStarted
    | SpeechStopped
    | VoiceActivity
    | Finalized
    | BufferCleared
)


@dataclass(frozen=True)
class StreamStats:
    """Counters of one session (seconds)."""

    received_s: float
    committed_words: int
    passes: int
    skipped_passes: int  # passes dropped as silence or as a repetition loop
    decode_s: float
    buffer_s: float
    inbox_s: float
