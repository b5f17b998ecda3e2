"""The model-free parts of live streaming: segment split, agreement alignment, PCM
input, the audio buffer and option checks."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.audio import AudioDecodeError
from app.service.live import PcmInput, StreamingOptions
from app.service.live.admission import AudioBuffer
from app.service.live.word_match import align_committed
from app.service.transcription.windows import split_window

TS = 50363  # timestamp_begin of the English-only vocabulary


def ts(seconds: float) -> int:
    return TS + round(seconds / 0.02)


def test_a_window_splits_into_closed_segments_and_an_open_tail() -> None:
    tokens = [ts(0.0), 1, 2, ts(1.5), ts(1.5), 3, ts(2.4), ts(2.6), 4, 5]
    segments = split_window(tokens, TS, duration=3.0)
    assert [(s.start, s.end, s.tokens, s.closed) for s in segments] == [
        (0.0, 1.5, (1, 2), True),
        (1.5, 2.4, (3,), True),
        (2.6, 3.0, (4, 5), False),
    ]
    # a timestamp past the audio is clamped to its duration
    assert segments[0].decoded == (ts(0.0), 1, 2, ts(1.5))  # as decoded, timestamps included
    assert segments[2].decoded == (ts(2.6), 4, 5)
    late = split_window([ts(0.0), 7, ts(29.0)], TS, duration=4.0)
    assert late[0].end == 4.0
    assert split_window([], TS, 1.0) == []
    assert split_window([7, 8], TS, 2.0)[0].start == 0.0  # no timestamps at all


@pytest.mark.parametrize(
    ("committed", "hyp", "expected"),
    [
        ([], ["a", "b"], 0),
        (["a", "b"], ["a", "b", "c"], 2),
        (["we", "are", "gathered"], ["gathered", "to", "review"], 1),  # the pass lost words
        (["gathered", "to"], ["we", "are", "gathered", "to", "review"], 4),  # found more
        (["so", "my", "fellow"], ["and", "so", "my", "fellow", "americans"], 4),
        (["x", "y"], ["p", "q", "r"], 2),  # nothing in common: by position
    ],
)
def test_align_finds_where_uncommitted_words_start(
    committed: list[str], hyp: list[str], expected: int
) -> None:
    assert align_committed(committed, hyp) == expected


def test_pcm_input_s16_and_resampling() -> None:
    pcm = PcmInput("pcm_s16le", 16000)
    samples = np.array([0, 16384, -32768, 32767], dtype="<i2")
    out = pcm.convert(samples.tobytes())
    np.testing.assert_allclose(out, [0.0, 0.5, -1.0, 32767 / 32768], atol=1e-6)
    assert out.dtype == np.float32

    # 48 kHz f32 in odd-sized chunks: the stream resampler keeps state between chunks
    rate = 48000
    t = np.arange(rate * 2) / rate
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype("<f4")
    pcm = PcmInput("pcm_f32le", rate)
    pieces, pos = [], 0
    for size in [1, 479, 4800, 333, 12000] * 20:
        if pos >= len(tone):
            break
        pieces.append(pcm.convert(tone[pos : pos + size].tobytes()))
        pos += size
    if pos < len(tone):
        pieces.append(pcm.convert(tone[pos:].tobytes()))
    pieces.append(pcm.finish())
    out = np.concatenate(pieces)
    assert abs(len(out) - 32000) <= 2
    expected = 0.5 * np.sin(2 * np.pi * 440 * np.arange(len(out)) / 16000)
    middle = slice(1000, len(out) - 1000)
    assert np.max(np.abs(out[middle] - expected[middle])) < 0.01


def test_pcm_input_rejects_bad_frames_and_settings() -> None:
    with pytest.raises(AudioDecodeError, match="whole number"):
        PcmInput("pcm_s16le", 16000).convert(b"\x00\x01\x02")
    with pytest.raises(AudioDecodeError):
        PcmInput("pcm_f32le", 16000).convert(np.array([np.nan], "<f4").tobytes())
    with pytest.raises(ValueError, match="encoding"):
        PcmInput("mp3", 16000)
    with pytest.raises(ValueError, match="sample_rate"):
        PcmInput("pcm_s16le", 100)


def test_audio_buffer_append_drop_view() -> None:
    buf = AudioBuffer(10)
    buf.append(np.arange(6, dtype=np.float32))
    buf.drop_before(2)
    assert (buf.start, buf.length, buf.end) == (2, 4, 6)
    np.testing.assert_array_equal(buf.view(), [2, 3, 4, 5])
    np.testing.assert_array_equal(buf.view(until=4), [2, 3])
    buf.append(np.arange(6, 12, dtype=np.float32))
    np.testing.assert_array_equal(buf.view(), np.arange(2, 12))
    with pytest.raises(OverflowError):
        buf.append(np.zeros(1, np.float32))
    buf.drop_before(100)
    assert buf.length == 0 and buf.start == 12


def test_streaming_options_are_checked() -> None:
    StreamingOptions()
    with pytest.raises(ValueError, match="step_s"):
        StreamingOptions(step_s=0.0)
    with pytest.raises(ValueError, match="max_buffer_s"):
        StreamingOptions(max_buffer_s=40.0)
    with pytest.raises(ValueError, match="task"):
        StreamingOptions(task="summarise")


def test_align_does_not_skip_new_words_when_a_committed_word_is_missing() -> None:
    # committed "... can see in"; the new pass lost "in" and goes on with "2021 we achieved"
    committed = ["as", "you", "can", "see", "in"]
    hyp = ["as", "you", "can", "see", "2021", "we", "achieved"]
    mids = [10.1, 10.3, 10.5, 10.8, 11.6, 12.0, 12.4]
    assert align_committed(committed, hyp, mids, committed_end_s=11.1) == 4
    # ... but a re-spelled committed word (same time) is skipped
    respelled = ["as", "you", "can", "see", "inn", "2021"]
    assert align_committed(committed, respelled, [10.1, 10.3, 10.5, 10.8, 10.95, 11.6], 11.1) == 5


def test_align_treats_a_respelled_committed_word_as_committed() -> None:
    committed = ["the", "year", "2021", "i", "apologize"]
    hyp = ["the", "year", "2021", "i", "apologise", "for", "being"]
    mids = [13.0, 13.5, 14.0, 14.2, 15.3, 15.9, 16.3]  # later than the committed end (14.9)
    assert align_committed(committed, hyp, mids, committed_end_s=14.9) == 5
