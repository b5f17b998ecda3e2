"""Speaker segments on the Realtime protocol (`gpt-4o-transcribe-diarize`, or the extension
`transcription.speakers: true`): each completed item's runs of one speaker, sent as
`conversation.item.input_audio_transcription.segment` once found, in the order the items
completed; labels hold for the whole session (`app.service.diarize.live`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel

from app.api.live.connection import LiveDeps
from app.api.live.realtime_config import MODEL_PARAM
from app.api.live.realtime_events import TranscriptionSegment
from app.config import Settings
from app.service.diarize.job import LazyDiarizer
from app.service.diarize.live import LiveSpeakers
from app.service.errors import Rejected
from app.service.transcription.results import Word

log = logging.getLogger(__name__)


class SegmentSender:
    """One session's speaker segments: `hear` the stream's audio, `item` each completed item,
    `drain` before the close."""

    def __init__(
        self,
        speakers: LiveSpeakers,
        put: Callable[[BaseModel], None],
        error_event: Callable[[Rejected], BaseModel],
    ) -> None:
        self.speakers = speakers
        self._put = put
        self._error_event = error_event
        self._work: asyncio.Future[None] | None = None  # the items' speakers, in order

    def hear(self, samples: np.ndarray) -> None:
        self.speakers.hear(samples)

    def new_stream(self) -> None:
        self.speakers.new_stream()

    def item(self, item_id: str, start_s: float, end_s: float, words: Sequence[Word]) -> None:
        """Find the item's speakers after the previous item's (on the event loop)."""
        previous = self._work
        words = tuple(words)

        async def segments() -> None:
            if previous is not None:
                await previous
            try:
                runs = await asyncio.to_thread(self.speakers.item, start_s, end_s, words)
            except Rejected as e:  # the speaker models are not built: said for the item
                self._put(self._error_event(e))
                return
            except Exception:  # the transcript stands: its speakers are missing, logged
                log.exception("the speakers of item %s failed", item_id)
                return
            for n, run in enumerate(runs):
                self._put(TranscriptionSegment(
                    item_id=item_id, id=f"{item_id}_seg_{n}", speaker=run.speaker,
                    start=run.start, end=run.end, text=run.text,
                ))  # fmt: skip

        self._work = asyncio.ensure_future(segments())

    async def drain(self) -> None:
        """Returns once every item's segments were sent."""
        if self._work is not None:
            await self._work


def diarization_refusal(settings: Settings, diarizer: LazyDiarizer | None) -> Rejected | None:
    """Why a session cannot have speakers on this server, if it cannot."""
    if settings.diarization and diarizer is not None:
        return None
    return Rejected(
        "diarization_disabled",
        "Speaker diarization is off on this server (STT_DIARIZATION=false): the model "
        "gpt-4o-transcribe-diarize and transcription.speakers are not served",
        param=MODEL_PARAM,
        kind="forbidden",
    )


def segment_sender(
    deps: LiveDeps,
    put: Callable[[BaseModel], None],
    error_event: Callable[[Rejected], BaseModel],
) -> SegmentSender:
    """A new session's speakers, naming the enrolled voices when the registry is on."""
    assert deps.diarizer is not None  # diarization_refusal said so
    voices = deps.voices if deps.settings.voices else None
    known = voices.enrolled if voices is not None else tuple
    return SegmentSender(LiveSpeakers(deps.diarizer, known), put, error_event)
