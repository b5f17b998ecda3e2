"""Live speakers, on every live protocol: a session's speakers labelled for the whole session
(`app.service.diarize.live`), or named where an enrolled voice matches.

- Realtime (`gpt-4o-transcribe-diarize`, or the extension `transcription.speakers: true`): each
  completed item's runs of one speaker, as `conversation.item.input_audio_transcription.segment`;
- the own WebSocket (`session.update {"speakers": true}`): each closed segment's runs, as
  `transcript.speakers`;
- Wyoming (`STT_WYOMING_SPEAKERS`): who said the command, in the `transcript`'s context.

Each piece is diarized on a worker thread once its words are final, after the previous piece's
(the book of who is who learns them in order); its events follow its transcript.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel

from app.api.live.connection import LiveDeps
from app.api.live.realtime_events import TranscriptionSegment
from app.config import Settings
from app.service.diarize.attribution import SpeakerSegment
from app.service.diarize.job import LazyDiarizer
from app.service.diarize.live import LiveSpeakers
from app.service.errors import Rejected
from app.service.transcription.results import Word

log = logging.getLogger(__name__)
T = TypeVar("T")

Events = Callable[[str, list[SpeakerSegment]], list[BaseModel]]  # a piece's key, its runs


class SessionSpeakers:
    """One session's speakers: `hear` the stream's audio, ask who said each piece in order,
    `drain` before the close."""

    def __init__(self, speakers: LiveSpeakers, error: Callable[[Rejected], None]) -> None:
        self.speakers = speakers
        self._error = error
        self._work: asyncio.Future[Any] | None = None  # the pieces' speakers, in order

    def hear(self, samples: np.ndarray) -> None:
        self.speakers.hear(samples)

    def new_stream(self) -> None:
        self.speakers.new_stream()

    async def speaker(self, audio: np.ndarray) -> str | None:
        """Who said a whole utterance (`LiveSpeakers.speaker`), after the pieces before it;
        None when nobody is found or the models failed (said, or logged)."""
        find = partial(self.speakers.speaker, audio)
        found = asyncio.ensure_future(self._found(self._work, find, "utterance"))
        self._work = found
        return await found

    async def _found(
        self, previous: asyncio.Future[Any] | None, find: Callable[[], T], key: str
    ) -> T | None:
        """`find()` on a worker thread once `previous` (the pieces before it) is done; its
        failure is the client's `error` (the speaker models are not built) or logged (the
        transcript stands, its speakers are missing)."""
        if previous is not None:
            await previous
        try:
            return await asyncio.to_thread(find)
        except Rejected as e:
            self._error(e)
        except Exception:
            log.exception("the speakers of %s failed", key)
        return None

    async def drain(self) -> None:
        """Returns once every piece's speakers were found (and sent)."""
        if self._work is not None:
            await self._work


class SpeakerSender(SessionSpeakers):
    """A session's speakers sent as events: `item` each finished piece, its `events` put in
    order."""

    def __init__(
        self,
        speakers: LiveSpeakers,
        events: Events,
        put: Callable[[BaseModel], None],
        error: Callable[[Rejected], None],
    ) -> None:
        super().__init__(speakers, error)
        self._events = events
        self._put = put

    def item(self, key: str, start_s: float, end_s: float, words: Sequence[Word]) -> None:
        """Find the piece's speakers after the previous piece's (on the event loop)."""
        words = tuple(words)
        found = self._found(self._work, lambda: self.speakers.item(start_s, end_s, words), key)

        async def send() -> None:
            for event in self._events(key, await found or []):
                self._put(event)

        self._work = asyncio.ensure_future(send())


def diarization_refusal(
    settings: Settings, diarizer: LazyDiarizer | None, param: str
) -> Rejected | None:
    """Why a session cannot have speakers on this server, if it cannot."""
    if settings.diarization and diarizer is not None:
        return None
    return Rejected(
        "diarization_disabled",
        "Speaker diarization is off on this server (STT_DIARIZATION=false): live speakers "
        "are not served",
        param=param,
        kind="forbidden",
    )


def realtime_segments(item_id: str, runs: list[SpeakerSegment]) -> list[BaseModel]:
    """A Realtime item's runs as its `...segment` events."""
    return [
        TranscriptionSegment(
            item_id=item_id,
            id=f"{item_id}_seg_{n}",
            speaker=run.speaker,
            start=run.start,
            end=run.end,
            text=run.text,
        )
        for n, run in enumerate(runs)
    ]


def live_speakers(deps: LiveDeps) -> LiveSpeakers:
    """A new session's speakers, naming the enrolled voices when the registry is on."""
    assert deps.diarizer is not None  # diarization_refusal said so
    voices = deps.voices if deps.settings.voices else None
    return LiveSpeakers(deps.diarizer, voices.enrolled if voices is not None else tuple)


def speaker_sender(
    deps: LiveDeps,
    events: Events,
    put: Callable[[BaseModel], None],
    error: Callable[[Rejected], None],
) -> SpeakerSender:
    """A new session's speakers, each piece's sent as `events`."""
    return SpeakerSender(live_speakers(deps), events, put, error)
