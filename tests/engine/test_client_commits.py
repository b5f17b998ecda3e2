"""A session whose client commits at every short pause (`flush()`), fed without pacing (every due
pass runs at once, as the API's processing task does): deterministic, so what each item's text
was read after can be checked. The same client over the Realtime protocol at real-time pace:
`tests/api/test_realtime_turns.py`."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.vad import SileroVad
from app.runtime.contract import SAMPLE_RATE
from app.service.live import (
    CommittedText,
    Finalized,
    StreamEvent,
    StreamingOptions,
    StreamingSession,
)
from app.service.transcriber import Transcriber
from tests.api.test_realtime_turns import client_commit_points, word_errors
from tests.engine.conftest import EARNINGS, REFERENCES, clip

ELLIPSES = ("...", "…")


def items_committed_at_pauses(session_events: list[StreamEvent]) -> list[str]:
    items: list[list[str]] = [[]]
    for event in session_events:
        if isinstance(event, CommittedText):
            items[-1].append(event.text)
        elif isinstance(event, Finalized) and event.reason == "flush":
            items.append([])
    return ["".join(item).strip() for item in items[:-1]]


def run_with_client_commits(session: StreamingSession, audio: np.ndarray) -> None:
    """0.1 s pieces; a `flush()` as soon as the client has heard each pause."""
    chunk = SAMPLE_RATE // 10
    points = client_commit_points(audio, SAMPLE_RATE)
    for i in range(0, len(audio), chunk):
        session.append(audio[i : i + chunk])
        while points and points[0] <= (i + chunk) / SAMPLE_RATE + 1e-9:
            points.pop(0)
            session.flush()
        while session.advance():
            session.decode()
    session.flush()
    while session.advance():
        session.decode()


@pytest.fixture(scope="module")
def earnings_items(tiny_tr: Transcriber, vad: SileroVad) -> list[str]:
    """The 60 s clip committed at every client pause: ~25 items (one session for the module)."""
    events: list[StreamEvent] = []
    session = StreamingSession(tiny_tr, StreamingOptions(language="en"), vad, events.append)
    run_with_client_commits(session, clip(EARNINGS))
    return items_committed_at_pauses(events)


def test_an_item_that_trails_off_is_read_on_by_the_next(earnings_items: list[str]) -> None:
    """An item Whisper ends with "..." (the audio stopped mid-sentence) is read again, not
    forced, by the next item's passes; forced, the next items opened with "..." and misread
    words ("...pound damage" for "pandemic")."""
    items = earnings_items
    assert len(items) >= 20, items
    assert sum(item.endswith(ELLIPSES) for item in items) >= 3, items  # the case arises
    assert not [item for item in items if item.startswith(ELLIPSES)], items


def test_the_items_of_the_60_s_clip_read_within_one_wer_point_of_rest(
    tiny_tr: Transcriber, earnings_items: list[str]
) -> None:
    """Joined, the items score within +1 WER point of the REST transcript against the clip's
    reference. The first item ends inside "are" ("We, uh,"); the session's own pause finalizes
    again in the same silence and must re-read it as the client's commit did (forced, the next
    items never read "are")."""
    segments, _ = tiny_tr.transcribe(clip(EARNINGS))
    rest = "".join(segment.text for segment in segments)
    reference = REFERENCES[EARNINGS]
    rest_errors, n = word_errors(reference, rest)
    errors, _ = word_errors(reference, " ".join(earnings_items))
    assert errors / n <= rest_errors / n + 0.01, (earnings_items, rest)
