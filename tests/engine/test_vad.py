"""Silero VAD (models/silero_vad.onnx, from the silero-vad wheel) on the testdata clips."""

from __future__ import annotations

import itertools
import shutil

import numpy as np
import onnx
import pytest
from onnx import helper as oh

from app.engine import vad_sequence
from app.engine.audio import resample
from app.engine.vad import (
    CHUNK_SAMPLES,
    SileroVad,
    VadEvent,
    VadModelError,
    VadOptions,
    VadStream,
    block_gains,
)
from app.engine.vad_spans import (
    collect_speech,
    restore_time,
    spans_from_probs,
    speech_time_map,
    speech_timestamps,
)
from app.export.errors import BuildError
from app.export.sources import sha256_of
from app.export.vad import VAD_SHA256, ensure_sequence_graphs
from tests.conftest import MODELS_DIR
from tests.engine.conftest import EARNINGS, EMPTY, JFK, clip
from tests.media import telephone

VAD_PATH = MODELS_DIR / "silero_vad.onnx"


def test_model_file_is_the_checked_one(vad: SileroVad) -> None:
    assert sha256_of(VAD_PATH) == VAD_SHA256
    assert set(vad.graph.input_names) == {"input", "state", "sr"}
    probs, state = vad.run(np.zeros((3, 64 + 512), np.float32), np.zeros((2, 3, 128), np.float32))
    assert probs.shape == (3,) and state.shape == (2, 3, 128)


def test_missing_model_has_a_clear_error(tmp_path) -> None:
    with pytest.raises(VadModelError, match="make models"):
        SileroVad.load(tmp_path / "silero_vad.onnx")


def test_a_folder_made_before_the_sequence_graphs_gets_them_and_the_same_probabilities(
    tmp_path, vad: SileroVad
) -> None:
    """A models folder from before `make models` built the sequence graphs: the VAD refuses to
    load with the way out named, and once the server's start has written them (as
    `ensure_sequence_graphs` does) it reads a clip exactly as the built folder's VAD."""
    shutil.copyfile(VAD_PATH, tmp_path / VAD_PATH.name)
    with pytest.raises(VadModelError, match=r"sequence-16000\.front\.onnx not found.*make models"):
        SileroVad.load(tmp_path / VAD_PATH.name)
    written = ensure_sequence_graphs(tmp_path)
    assert sorted(p.name for p in written) == [
        "silero_vad.sequence-16000.front.onnx", "silero_vad.sequence-16000.lstm.onnx",
        "silero_vad.sequence-8000.front.onnx", "silero_vad.sequence-8000.lstm.onnx",
    ]  # fmt: skip
    assert ensure_sequence_graphs(tmp_path) == []  # nothing left to write
    again = SileroVad.load(tmp_path / VAD_PATH.name)
    audio = clip(JFK)
    np.testing.assert_array_equal(again.probs(audio), vad.probs(audio))


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


def _chunk_by_chunk(vad: SileroVad, chunks: np.ndarray, rate: int) -> np.ndarray:
    """The reference: one model call per chunk, the state and the context carried along."""
    context = 64 * rate // 16000
    state, tail, probs = np.zeros((2, 1, 128), np.float32), np.zeros((1, context)), []
    for chunk in chunks:
        x = np.concatenate([tail, chunk[None]], axis=1).astype(np.float32)
        prob, state = vad.run(x, state, rate)
        probs.append(prob[0])
        tail = x[:, -context:]
    return np.array(probs, np.float32)


def _gained_chunks(audio: np.ndarray, size: int) -> np.ndarray:
    n = -(-audio.shape[0] // size)
    chunks = np.zeros((n, size), np.float32)
    chunks.reshape(-1)[: audio.shape[0]] = audio
    return chunks * block_gains(chunks)[:, None]


def test_a_whole_clip_gives_the_chunk_by_chunk_probabilities(vad: SileroVad) -> None:
    """The sequence graph (all chunks per call, the LSTM over the sequence) is the recurrent
    pass itself, not an approximation of it: 60 s of speech, chunk for chunk."""
    audio = clip(EARNINGS)
    expected = _chunk_by_chunk(vad, _gained_chunks(audio, CHUNK_SAMPLES), 16000)
    probs = vad.probs(audio)
    assert probs.shape == expected.shape
    np.testing.assert_allclose(probs, expected, atol=1e-5)
    assert 0.2 < float(np.mean(probs > 0.5)) < 0.98  # speech and pauses both present


def test_the_narrowband_branch_gives_the_chunk_by_chunk_probabilities(vad: SileroVad) -> None:
    """Telephone audio runs the graph's 8 kHz branch (256-sample chunks, 32 of context)."""
    audio = telephone(clip(JFK))
    n = -(-audio.shape[0] // CHUNK_SAMPLES)
    padded = np.zeros(n * CHUNK_SAMPLES, np.float32)
    padded[: audio.shape[0]] = audio
    chunks = resample(padded, 16000, 8000).reshape(n, CHUNK_SAMPLES // 2)
    expected = _chunk_by_chunk(vad, chunks * block_gains(chunks)[:, None], 8000)
    np.testing.assert_allclose(vad.probs(audio), expected, atol=1e-5)


def test_blocks_of_a_long_clip_carry_the_state(
    vad: SileroVad, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clip longer than a block runs as several calls of each graph (the fronts of later
    blocks beside the LSTM of an earlier one); the LSTM state and the context samples go from
    one to the next, so the probabilities do not change at the seams."""
    audio = clip(EARNINGS)[: 20 * 16000]
    whole = vad.probs(audio)
    runs: dict[str, list[int]] = {"x": [], "features": []}

    class Counted:
        def __init__(self, graph, fed: str) -> None:
            self.graph, self.fed = graph, fed

        def run(self, names, feeds):
            runs[self.fed].append(feeds[self.fed].shape[0])
            return self.graph.run(names, feeds)

    front, lstm = vad.sequence.sessions[16000]
    monkeypatch.setattr(vad_sequence, "BLOCK_CHUNKS", 100)
    monkeypatch.setitem(
        vad.sequence.sessions, 16000, (Counted(front, "x"), Counted(lstm, "features"))
    )
    blocked = vad.probs(audio)
    assert sorted(runs["x"], reverse=True) == runs["features"] == [100] * 6 + [25]
    np.testing.assert_allclose(blocked, whole, atol=1e-6)


def test_a_graph_that_is_not_silero_is_rejected(tmp_path) -> None:
    """A graph with Silero's inputs but not its layers: a clear error at load, not a VAD that
    answers wrongly."""
    nodes = [
        oh.make_node("ReduceMean", ["input"], ["m"], axes=[1]),
        oh.make_node("Identity", ["state"], ["stateN"]),
        oh.make_node("Identity", ["m"], ["output"]),
        oh.make_node("Identity", ["sr"], ["sr_out"]),
    ]
    f32, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    graph = oh.make_graph(
        nodes, "not_silero",
        [oh.make_tensor_value_info("input", f32, ["b", "n"]),
         oh.make_tensor_value_info("state", f32, [2, "b", 128]),
         oh.make_tensor_value_info("sr", i64, [])],
        [oh.make_tensor_value_info("output", f32, ["b", 1]),
         oh.make_tensor_value_info("stateN", f32, [2, "b", 128]),
         oh.make_tensor_value_info("sr_out", i64, [])],
    )  # fmt: skip
    path = tmp_path / "silero_vad.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8), path)
    with pytest.raises(BuildError, match="not a Silero VAD"):
        ensure_sequence_graphs(tmp_path)
