"""A transcription with speakers (`transcribe_speakers`) on tiny.en and the built speaker models:
the speaker pass runs beside the transcription; the streamed segments are the result's, each
once and in order; cancelling or a failure on either side ends both and is raised."""

from __future__ import annotations

import threading

import pytest

from app.runtime.placement import RuntimeOptions
from app.service.diarize.attribution import SpeakerSegment
from app.service.diarize.job import LazyDiarizer, SpeakerJob, transcribe_speakers
from app.service.diarize.pipeline import Diarizer
from app.service.models.loaded import LoadedModel
from app.service.models.opening import OpenOptions, open_model
from app.service.transcription.jobs import TranscriptionJob
from app.service.transcription.transcriber import TranscriptionCancelled
from tests.conftest import MODELS_DIR, model_dir
from tests.conversation import two_speakers

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    folder = model_dir("tiny.en")
    return open_model("tiny.en", folder, OpenOptions(RuntimeOptions(ep="cpu")), None)


@pytest.fixture(scope="module")
def diarizer() -> Diarizer:
    return LazyDiarizer(MODELS_DIR, RuntimeOptions(ep="cpu")).get()


@pytest.fixture(scope="module")
def job(model: LoadedModel) -> TranscriptionJob:
    return TranscriptionJob(two_speakers().wav, model.base_options, "transcribe")


def _speaker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "speakers"]


def test_streamed_segments_are_the_results_once_each_in_order(model, diarizer, job) -> None:
    sent: list[SpeakerSegment] = []
    result = transcribe_speakers(model, diarizer, job, SpeakerJob(), on_segments=sent.extend)
    assert sent == list(result.segments)
    assert {s.speaker for s in sent} == {"A", "B"}
    starts = [s.start for s in sent]
    assert starts == sorted(starts)
    assert not _speaker_threads()


def test_cancel_stops_both_and_no_thread_is_left(model, diarizer, job) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(TranscriptionCancelled):
        transcribe_speakers(model, diarizer, job, SpeakerJob(), cancel)
    assert not _speaker_threads()


def test_a_failing_listener_is_raised_not_swallowed(model, diarizer, job) -> None:
    def refuse(_runs: tuple[SpeakerSegment, ...]) -> None:
        raise OSError("the client went away")

    with pytest.raises(OSError, match="went away"):
        transcribe_speakers(model, diarizer, job, SpeakerJob(), on_segments=refuse)
    assert not _speaker_threads()
