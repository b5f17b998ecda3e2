"""Silero VAD (models/silero_vad.onnx, from the silero-vad wheel) on the testdata clips."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from app.engine.vad import (
    CHUNK_SAMPLES,
    SileroVad,
    VadEvent,
    VadModelError,
    VadOptions,
    VadStream,
    block_gains,
)
from app.engine.vad_lanes import LANE_CHUNKS, WARMUP_CHUNKS
from app.engine.vad_spans import (
    collect_speech,
    restore_time,
    spans_from_probs,
    speech_time_map,
    speech_timestamps,
)
from app.export.sources import sha256_of
from app.export.vad import VAD_SHA256
from tests.conftest import MODELS_DIR
from tests.engine.conftest import EARNINGS, EMPTY, JFK, clip
from tests.media import telephone

VAD_PATH = MODELS_DIR / "silero_vad.onnx"


def test_model_file_is_the_checked_one(vad: SileroVad) -> None:
    assert sha256_of(VAD_PATH) == VAD_SHA256
    names = {i.name: i.shape for i in vad.session.get_inputs()}
    assert names["state"] == [2, None, 128] and names["input"] == [None, None]


def test_missing_model_has_a_clear_error(tmp_path) -> None:
    with pytest.raises(VadModelError, match="make models"):
        SileroVad.load(tmp_path / "silero_vad.onnx")


def test_jfk_speech_regions(vad: SileroVad) -> None:
    spans = speech_timestamps(vad, clip(JFK))
    # four phrases separated by pauses: "And so my fellow Americans" / "ask not" / ...
    assert len(spans) == 4
    starts = [s.start_s for s in spans]
    assert starts[0] < 0.4 and 2.8 < starts[1] < 3.4 and 4.9 < starts[2] < 5.5
    assert spans[-1].end_s == pytest.approx(11.0, abs=0.05)
    assert all(a.end <= b.start for a, b in itertools.pairwise(spans))


@pytest.mark.parametrize("source", ["empty", "zeros", "noise"])
def test_no_speech_in_silence(vad: SileroVad, source: str) -> None:
    rng = np.random.default_rng(0)
    audio = {
        "empty": lambda: clip(EMPTY),
        "zeros": lambda: np.zeros(16000 * 5, np.float32),
        "noise": lambda: (rng.standard_normal(16000 * 5) * 0.01).astype(np.float32),
    }[source]()
    assert speech_timestamps(vad, audio) == []
    assert vad.probs(audio).max() < 0.5


@pytest.mark.parametrize("gain_db", [-20, -40, -50, -60])
def test_quiet_speech_is_found_as_at_its_own_level(vad: SileroVad, gain_db: int) -> None:
    """Silero alone misses jfk at -50 dB (0 s of speech); lifted, it finds the same phrases."""
    loud = speech_timestamps(vad, clip(JFK))
    quiet = speech_timestamps(vad, clip(JFK) * np.float32(10 ** (gain_db / 20)))
    assert len(quiet) == len(loud)
    for a, b in zip(loud, quiet, strict=True):
        assert abs(a.start_s - b.start_s) < 0.2 and abs(a.end_s - b.end_s) < 0.3, (a, b)


def test_telephone_band_speech_is_found(vad: SileroVad) -> None:
    """At 16 kHz Silero misses most of a 300-3400 Hz line; the 8 kHz branch finds it."""
    audio = clip(EARNINGS)  # full band (jfk.wav is a narrowband broadcast already)
    phone = telephone(audio)
    found = sum(s.end - s.start for s in speech_timestamps(vad, phone))
    full = sum(s.end - s.start for s in speech_timestamps(vad, audio))
    assert found > 0.85 * full, (found, full)


@pytest.mark.parametrize("level_db", [0, -20, -60])
def test_lifted_noise_is_still_not_speech(vad: SileroVad, level_db: int) -> None:
    rng = np.random.default_rng(3)
    noise = (rng.standard_normal(16000 * 10) * 10 ** (level_db / 20) * 0.3).astype(np.float32)
    assert speech_timestamps(vad, noise) == []
    stream = VadStream(vad)
    assert not any(e.kind == "start" for e in stream.feed(noise))


def test_stream_matches_whole_clip_for_any_chunking(vad: SileroVad) -> None:
    audio = clip(JFK)
    options = VadOptions(min_silence_s=0.5)
    probs = vad.probs(audio, follow=True)  # chunk after chunk, with a stream's gain
    rng = np.random.default_rng(1)
    stream = VadStream(vad, options)
    events = []
    pos = 0
    while pos < len(audio):
        size = int(rng.integers(1, 3000))
        events += stream.feed(audio[pos : pos + size])
        pos += size
    assert stream.position == len(audio) // CHUNK_SAMPLES * CHUNK_SAMPLES
    starts = [e.sample for e in events if e.kind == "start"]
    ends = [e.sample for e in events if e.kind == "end"]
    spans = spans_from_probs(probs, len(audio), VadOptions(min_silence_s=0.5, speech_pad_s=0))
    assert starts == [s.start for s in spans]
    assert ends == [s.end for s in spans[:-1]]  # the last phrase runs to the end of the clip
    assert stream.in_speech


def test_stream_reports_each_pause_once_before_the_end(vad: SileroVad) -> None:
    """With pause_s, every silence of pause_s inside speech is a pause at its start (the ends a
    stream with min_silence_s = pause_s would give), once, and a turn's end comes after one."""
    audio = clip(JFK)
    probs = vad.probs(audio, follow=True)
    stream = VadStream(vad, VadOptions(min_silence_s=0.5), pause_s=0.2)
    events = []
    for pos in range(0, len(audio), 1000):
        events += stream.feed(audio[pos : pos + 1000])
    pauses = [e.sample for e in events if e.kind == "pause"]
    spans = spans_from_probs(probs, len(audio), VadOptions(min_silence_s=0.2, speech_pad_s=0))
    assert len(spans) > 3
    assert pauses == [s.end for s in spans if s.end < len(audio) - CHUNK_SAMPLES]
    for i, event in enumerate(events):
        if event.kind == "end":
            assert events[i - 1] == VadEvent("pause", event.sample)
    with pytest.raises(ValueError):
        VadStream(vad, pause_s=0)


def test_stream_reports_speech_coming_back_after_a_pause(vad: SileroVad) -> None:
    """A pause that does not become an end is followed by a resume at the next speech chunk
    (1089-134691-0001 pauses 0.2-0.5 s after "waiting" and goes on)."""
    audio = clip("1089-134691-0001.flac")
    probs = vad.probs(audio, follow=True)
    stream = VadStream(vad, VadOptions(min_silence_s=0.5), pause_s=0.2)
    events = stream.feed(audio)
    assert [e.kind for e in events] == ["start", "pause", "resume", "pause"], events
    _, pause, resume, _ = events
    first_speech = (
        pause.sample // CHUNK_SAMPLES
        + 1
        + int(np.argmax(probs[pause.sample // CHUNK_SAMPLES + 1 :] >= 0.5))
    )
    assert resume.sample == first_speech * CHUNK_SAMPLES


def test_collect_speech_and_restore_times(vad: SileroVad) -> None:
    audio = clip(JFK)
    spans = speech_timestamps(vad, audio)
    speech = collect_speech(audio, spans)
    assert len(speech) == sum(s.end - s.start for s in spans)
    time_map = speech_time_map(spans)
    second = spans[1]
    collected_start = spans[0].end_s - spans[0].start_s
    assert restore_time(collected_start + 0.1, time_map) == pytest.approx(second.start_s + 0.1)
    assert restore_time(0.0, time_map) == pytest.approx(spans[0].start_s)


def test_options_are_checked() -> None:
    assert VadOptions(threshold=0.6).exit_threshold == pytest.approx(0.45)
    with pytest.raises(ValueError):
        VadOptions(threshold=1.5)
    with pytest.raises(ValueError):
        VadOptions(threshold=0.5, neg_threshold=0.7)
    with pytest.raises(ValueError):
        VadOptions(min_silence_s=-1)


def _counting(vad: SileroVad, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make `vad` record the rows of every model call it makes (a list, appended to)."""
    calls: list[int] = []
    run = vad.run

    def counted(x: np.ndarray, state: np.ndarray, rate: int = 16000):
        calls.append(x.shape[0])
        return run(x, state, rate)

    monkeypatch.setattr(vad, "run", counted)
    return calls


def test_a_clip_shorter_than_a_lane_is_one_sequential_pass(
    vad: SileroVad, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short clip (a voice command) costs one model call per 32 ms chunk, no warm-up and no
    padding to a whole lane, and gives the sequential pass's probabilities."""
    audio = clip("1089-134686-0000.flac")[: 3 * 16000]  # full band: the 16 kHz branch
    n = -(-audio.shape[0] // CHUNK_SAMPLES)
    chunks = np.zeros((n, CHUNK_SAMPLES), np.float32)
    chunks.reshape(-1)[: audio.shape[0]] = audio
    chunks *= block_gains(chunks)[:, None]
    state, tail, expected = np.zeros((2, 1, 128), np.float32), np.zeros((1, 64), np.float32), []
    for chunk in chunks:
        x = np.concatenate([tail, chunk[None]], axis=1)
        prob, state = vad.run(x, state)
        expected.append(prob[0])
        tail = x[:, -64:]
    calls = _counting(vad, monkeypatch)
    probs = vad.probs(audio)
    assert len(calls) == n
    np.testing.assert_array_equal(probs, np.array(expected, np.float32))


def test_lanes_run_only_where_they_hold_audio(
    vad: SileroVad, monkeypatch: pytest.MonkeyPatch
) -> None:
    """25 s = three lanes in two threads: the first lane alone (no warm-up), the second and
    third as one batch for as long as the second (full) lane runs."""
    audio = np.tile(clip("1089-134686-0000.flac"), 3)[: 25 * 16000]
    n = -(-audio.shape[0] // CHUNK_SAMPLES)
    assert -(-n // LANE_CHUNKS) == 3
    calls = _counting(vad, monkeypatch)
    vad.probs(audio)
    assert sorted(calls).count(1) == LANE_CHUNKS  # the first lane, from its first chunk
    assert calls.count(2) == WARMUP_CHUNKS + LANE_CHUNKS  # lanes 2 and 3 together
    assert len(calls) == LANE_CHUNKS + WARMUP_CHUNKS + LANE_CHUNKS
