"""Speakers of a live session: each finished item (a turn of the stream) diarized on its own, its
speakers labelled across the whole session by the session's `SpeakerBook`, its words grouped into
runs of one speaker.

`LiveSpeakers.item` is blocking (the speaker models run: call it on a worker thread) and must be
called in the order the items ended, one at a time: the book it updates is the session's memory
of who is who. The audio comes from the tape the session's audio is heard onto (`hear`; the last
`TAPE_S` seconds, by stream seconds).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from app.engine.words import Word
from app.runtime.contract import SAMPLE_RATE
from app.service.diarize.activity import Turn, speech_seconds
from app.service.diarize.attribution import SpeakerSegment, word_runs
from app.service.diarize.book import SpeakerBook
from app.service.diarize.clustering import SpeakerHints
from app.service.diarize.job import LazyDiarizer

TAPE_S = 120.0  # audio kept for the speakers: an item longer than this is judged on its end
# after an item's end (where the VAD heard speech stop): its last word's tail, as REST hears it
TAIL_S = 0.3


class AudioTape:
    """The last `keep_s` seconds of a stream's 16 kHz audio, addressed by stream seconds
    (appended on the event loop, read on a worker thread)."""

    def __init__(self, keep_s: float = TAPE_S) -> None:
        self._keep = round(keep_s * SAMPLE_RATE)
        self._chunks: deque[np.ndarray] = deque()
        self._start = 0  # stream sample of the first kept one
        self._end = 0
        self._lock = threading.Lock()

    def append(self, samples: np.ndarray) -> None:
        with self._lock:
            self._chunks.append(samples)
            self._end += len(samples)
            while self._chunks and self._end - self._start - len(self._chunks[0]) >= self._keep:
                self._start += len(self._chunks.popleft())

    def between(self, start_s: float, end_s: float) -> tuple[np.ndarray, float]:
        """The kept audio in [start_s, end_s) and the stream second it starts at."""
        with self._lock:
            first = max(round(start_s * SAMPLE_RATE), self._start)
            last = min(round(end_s * SAMPLE_RATE), self._end)
            if last <= first:
                return np.zeros(0, np.float32), start_s
            pieces, at = [], self._start  # only the chunks that overlap [first, last)
            for chunk in self._chunks:
                if at + len(chunk) > first and at < last:
                    pieces.append(chunk[max(first - at, 0) : last - at])
                at += len(chunk)
            return np.concatenate(pieces), first / SAMPLE_RATE


Known = Callable[[], Sequence[tuple[str, np.ndarray]]]


class LiveSpeakers:
    """One session's speakers; `known` gives the enrolled voices (name, embedding) it may name,
    read once, by the first item (blocking)."""

    def __init__(self, diarizer: LazyDiarizer, known: Known = tuple) -> None:
        self._diarizer = diarizer
        self._known = known
        self._voices: tuple[tuple[str, np.ndarray], ...] | None = None
        self._tape = AudioTape()
        self.book = SpeakerBook()

    def hear(self, samples: np.ndarray) -> None:
        """The stream's next 16 kHz samples (on the event loop)."""
        self._tape.append(samples)

    def new_stream(self) -> None:
        """The stream's seconds start again (a new runner): the tape does, the book stays."""
        self._tape = AudioTape()

    def item(self, start_s: float, end_s: float, words: Sequence[Word]) -> list[SpeakerSegment]:
        """The runs of one speaker in the item's words (stream seconds), labelled for the
        session; none for an item without words."""
        if not words:
            return []
        turns, labels = self.turns(start_s, end_s)
        return word_runs(words, turns, labels)  # no turn found: `A`, as for an upload

    def turns(self, start_s: float, end_s: float) -> tuple[list[Turn], dict[int, str]]:
        """The speaker turns of the stream's audio from `start_s` to `end_s` (stream seconds,
        with `TAIL_S` after) and the session label of each turn's speaker; the book learns
        them."""
        audio, offset = self._tape.between(start_s, end_s + TAIL_S)
        turns, labels, _ = self._heard(audio, offset)
        return turns, labels

    def speaker(self, audio: np.ndarray) -> str | None:
        """Who said a whole utterance (16 kHz; a voice command): the session label, or the
        enrolled name, of whoever speaks longest in it; None when no speech is found. The book
        learns its speakers."""
        _, labels, seconds = self._heard(audio, 0.0)
        return labels[max(labels, key=lambda k: seconds[k])] if labels else None

    def _heard(
        self, audio: np.ndarray, offset: float
    ) -> tuple[list[Turn], dict[int, str], list[float]]:
        """`audio`'s speaker turns (shifted by `offset` seconds), each speaker's session label
        and seconds of speech; the book learns them."""
        diarizer = self._diarizer.get()
        if self._voices is None:
            self._voices = tuple(self._known())
        found = diarizer(audio, SpeakerHints()) if len(audio) else None
        if found is None or not found.turns:
            return [], {}, []
        turns = [Turn(t.start + offset, t.end + offset, t.speaker) for t in found.turns]
        seconds = speech_seconds(found.turns, len(found.centroids))
        self.book, labels = self.book.assigned(found.centroids, seconds, self._voices)
        return turns, dict(enumerate(labels)), seconds
