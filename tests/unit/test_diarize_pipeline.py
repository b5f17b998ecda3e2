"""The diarization pipeline on the built speaker models and real speech (LibriSpeech speakers
1089 and 2412 taking turns)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from app.engine.audio import decode_audio
from app.engine.speakers import SpeakerModels, load_speaker_models
from app.engine.speakers.fbank import fbank
from app.engine.speakers.segmentation import FRAME_STEP_S, FRAMES_PER_WINDOW, WINDOW_SAMPLES
from app.runtime.placement import RuntimeOptions
from app.service.diarize.activity import clean_frames
from app.service.diarize.clustering import SpeakerHints
from app.service.diarize.job import LazyDiarizer
from app.service.diarize.pipeline import Diarization, DiarizationOptions, Diarizer
from app.service.errors import Rejected
from tests.conftest import AUDIO, MODELS_DIR

RATE = 16000
PARTS = ("1089-134686-0001.flac", "2412-153948-0000.flac", "1089-134691-0000.flac")


@pytest.fixture(scope="module")
def diarizer() -> Diarizer:
    options = DiarizationOptions()
    models = load_speaker_models(MODELS_DIR, RuntimeOptions(ep="cpu"), step_s=options.step_s)
    return Diarizer(models, options)


@pytest.fixture(scope="module")
def talk() -> tuple[np.ndarray, list[tuple[float, float]]]:
    pieces, spans, t = [], [], 0.0
    for name in PARTS:
        audio = decode_audio((AUDIO / name).read_bytes(), RATE)
        pieces += [audio, np.zeros(int(0.6 * RATE), np.float32)]
        spans.append((t, t + len(audio) / RATE))
        t += len(audio) / RATE + 0.6
    return np.concatenate(pieces), spans


@pytest.fixture(scope="module")
def found(diarizer: Diarizer, talk) -> Diarization:
    return diarizer(talk[0], SpeakerHints())


def test_turns_follow_the_speakers(found: Diarization, talk) -> None:
    _, spans = talk
    assert len(found.centroids) == 2
    speakers = []
    for a, b in spans:  # each clip: one speaker over most of it (clips have quiet edges)
        inside = [t for t in found.turns if t.end > a and t.start < b]
        assert len({t.speaker for t in inside}) == 1, (a, b, found.turns)
        assert inside[0].start > a - 0.3 and inside[-1].end < b + 0.3, (a, b, found.turns)
        assert sum(t.end - t.start for t in inside) > b - a - 1.2, (a, b, found.turns)
        speakers.append(inside[0].speaker)
    assert speakers[0] == speakers[2] != speakers[1]


def test_one_fbank_per_window_gives_each_speakers_embedding_unchanged(
    diarizer: Diarizer, talk
) -> None:
    """The pipeline computes a window's fbank once for all its local speakers: each speaker's
    embedding is exactly the one of the window and its mask."""
    audio, _ = talk
    activity = diarizer.segmentation(audio)
    clean = clean_frames(activity)
    compared = 0
    for c, start in enumerate(diarizer.segmentation.window_starts(len(audio))):
        first = round(float(start) * RATE)
        window = np.pad(audio[first : first + WINDOW_SAMPLES], (0, WINDOW_SAMPLES))
        window = window[:WINDOW_SAMPLES]
        rows = fbank(window)
        for s in range(activity.shape[2]):
            for mask in (activity[c, :, s], clean[c, :, s].astype(np.float32)):
                if mask.sum() < 30:
                    continue
                once = diarizer.embedding.of_fbank(rows, WINDOW_SAMPLES, mask)
                np.testing.assert_array_equal(once, diarizer.embedding(window, mask))
                compared += 1
    assert compared >= 6


def test_a_reference_clip_matches_its_speakers_cluster(
    diarizer: Diarizer, found: Diarization
) -> None:
    other = decode_audio((AUDIO / "1089-134686-0000.flac").read_bytes(), RATE)[: 8 * RATE]
    labels = found.labels([("stephen", diarizer.reference(other))], 0.5)
    first = found.turns[0].speaker
    assert labels == {first: "stephen", 1 - first: "A"}


def test_a_hint_of_one_speaker_gives_one(diarizer: Diarizer, talk) -> None:
    audio, _ = talk
    found = diarizer(audio, SpeakerHints(num_speakers=1))
    assert {t.speaker for t in found.turns} == {0}


def test_one_speakers_call_is_one_speaker(diarizer: Diarizer) -> None:
    """The 60 s earnings call has one speaker (issue 33 item 5); a second cluster that hardly
    talks alone (it found 2 before the quiet-speaker rule) joins the first."""
    audio = decode_audio((AUDIO / "earnings22_1_4482311_3_62.wav").read_bytes(), RATE)
    found = diarizer(audio, SpeakerHints())
    assert {t.speaker for t in found.turns} == {0}, found.turns
    assert len(found.centroids) == 1
    assert sum(t.end - t.start for t in found.turns) > 40.0, found.turns


def test_silence_has_no_turns(diarizer: Diarizer) -> None:
    found = diarizer(np.zeros(5 * RATE, np.float32), SpeakerHints())
    assert found.turns == ()


def test_without_the_models_diarization_is_refused_as_unavailable(tmp_path: Path) -> None:
    with pytest.raises(Rejected) as refused:
        LazyDiarizer(tmp_path, RuntimeOptions(ep="cpu")).get()
    assert refused.value.kind == "unavailable"  # REST: 503
    assert "the diarization models are not built" in refused.value.message
    assert "python -m app.export speakers" in refused.value.message


def test_a_device_this_machine_lacks_is_refused_as_unavailable_naming_it() -> None:
    with pytest.raises(Rejected) as refused:  # STT_DIARIZATION_DEVICE=NPU on a machine without
        LazyDiarizer(MODELS_DIR, RuntimeOptions(ep="openvino", device="NPU")).get()
    assert refused.value.kind == "unavailable"
    assert "NPU was asked for" in refused.value.message
    assert "CPU" in refused.value.message  # the devices found


def test_concurrent_first_requests_load_the_speaker_models_once() -> None:
    lazy = LazyDiarizer(MODELS_DIR, RuntimeOptions(ep="cpu"))
    with ThreadPoolExecutor(2) as threads:
        first, second = threads.map(lambda _: lazy.get(), range(2))
    assert isinstance(first, Diarizer)
    assert first is second is lazy.get()


class _Recording:
    """The real embedding model, noting each mask a window's speaker is embedded with."""

    def __init__(self, model) -> None:
        self.model = model
        self.masks: list[np.ndarray] = []

    def of_fbank(self, rows: np.ndarray, n_samples: int, mask: np.ndarray) -> np.ndarray:
        self.masks.append(mask.astype(bool))
        return self.model.of_fbank(rows, n_samples, mask)

    def __call__(self, audio: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        return self.model(audio, mask)  # a run of one speaker, checked against its cluster


def test_each_speaker_of_a_window_is_embedded_from_at_most_the_cap_nearest_the_middle(
    diarizer: Diarizer, talk
) -> None:
    """Each (window, speaker) of the talk (10 s windows, 5 s apart) is embedded from at most
    `max_embed_s` of its frames, those around the window's middle, so the windows' middles tile
    the audio instead of every second being embedded twice."""
    audio, _ = talk
    recording = _Recording(diarizer.embedding)
    models = SpeakerModels(diarizer.segmentation, recording, "CPU", "CPUExecutionProvider")
    Diarizer(models, diarizer.options)(audio, SpeakerHints())
    cap = round(diarizer.options.max_embed_s / FRAME_STEP_S)
    assert len(recording.masks) >= 5  # the talk's ~20 s: 5 (window, speaker) pairs
    assert max(int(m.sum()) for m in recording.masks) <= cap  # uncapped: 337 and 589 frames
    full = [m for m in recording.masks if m.sum() == cap]
    assert len(full) >= 2  # windows where one speaker talks more than the cap: exactly it
    middle = FRAMES_PER_WINDOW // 2
    for m in full:  # the kept frames lie around the middle (its quarter either side)
        kept = np.flatnonzero(m)
        assert abs(float(np.median(kept)) - middle) < FRAMES_PER_WINDOW / 4, kept
