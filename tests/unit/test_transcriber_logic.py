"""Model-free parts of the transcriber and decoding options: segment splitting, seeking,
option validation, output formats."""

from __future__ import annotations

import json

import pytest

from app.engine.decoding_types import DecodingOptions, compression_ratio
from app.service.transcription import formats
from app.service.transcription.results import Segment, TranscriptionInfo
from app.service.transcription.transcriber import TranscriptionOptions
from app.service.transcription.windows import file_segments

TS = 50363  # <|0.00|> of the English-only models
WINDOW = 3000  # mel frames


def ts(seconds: float) -> int:
    return TS + round(seconds / 0.02)


def test_pairs_split_segments_and_seek_to_the_last_pair():
    tokens = [ts(0), 1, 2, ts(2.5), ts(2.5), 3, 4, ts(5.0), ts(5.0), 5, 6]  # unfinished tail
    pieces, seek = file_segments(tokens, TS, WINDOW, 30.0)
    assert [(p.start, p.end) for p in pieces] == [(0.0, 2.5), (2.5, 5.0)]
    assert pieces[0].decoded == (ts(0), 1, 2, ts(2.5))
    assert seek == 500  # 5.0 s = 500 mel frames: the tail is decoded again from there


def test_single_timestamp_ending_consumes_the_window():
    tokens = [ts(0), 1, 2, ts(2.5), ts(2.5), 3, ts(4.0)]
    pieces, seek = file_segments(tokens, TS, WINDOW, 30.0)
    assert [(p.start, p.end) for p in pieces] == [(0.0, 2.5), (2.5, 4.0)]
    assert seek == WINDOW


def test_no_pair_is_one_segment_up_to_the_last_timestamp():
    pieces, seek = file_segments([ts(0), 1, 2, ts(7.0)], TS, WINDOW, 30.0)
    assert [(p.start, p.end) for p in pieces] == [(0.0, 7.0)]
    assert seek == WINDOW
    # no timestamps at all (without_timestamps): the whole (short) window
    pieces, seek = file_segments([1, 2, 3], TS, 1200, 12.0)
    assert [(p.start, p.end, p.decoded) for p in pieces] == [(0.0, 12.0, (1, 2, 3))]
    assert seek == 1200
    pieces, seek = file_segments([], TS, 1200, 12.0)
    assert pieces == [] and seek == 1200


def test_seek_always_advances():
    for tokens in ([ts(0), ts(0)], [ts(0), 1, ts(0.02), ts(0.02)]):
        _, seek = file_segments(tokens, TS, WINDOW, 30.0)
        assert seek >= 1


def test_compression_ratio():
    assert compression_ratio("") == 0.0
    assert compression_ratio("Thank you. " * 30) > 2.4
    assert compression_ratio("And so my fellow Americans, ask not what your country can do") < 2


def test_decoding_options_validation():
    DecodingOptions(beam_size=5, patience=2.0)
    DecodingOptions(temperature=0.6, best_of=5)
    with pytest.raises(ValueError, match="best_of"):
        DecodingOptions(beam_size=5, best_of=5)
    with pytest.raises(ValueError, match="temperature 0"):
        DecodingOptions(temperature=0.0, best_of=3)
    with pytest.raises(ValueError, match="patience"):
        DecodingOptions(patience=2.0)
    with pytest.raises(ValueError, match="kv_cache"):
        DecodingOptions(kv_cache="paged")
    with pytest.raises(ValueError, match="task"):
        DecodingOptions(task="summarise")
    with pytest.raises(ValueError, match="length_penalty"):
        DecodingOptions(length_penalty=2.0)
    assert DecodingOptions(suppress_tokens="-1, 220").suppress_tokens == (-1, 220)
    assert DecodingOptions(prompt=[1, 2]).prompt == (1, 2)
    assert DecodingOptions(beam_size=4).n_group == 4
    assert DecodingOptions(temperature=0.5, best_of=3).n_group == 3


def test_transcription_options_validation():
    o = TranscriptionOptions(temperature=0.4, beam_size=1)
    assert o.temperature == (0.4,) and o.beam_size is None
    d = TranscriptionOptions().decoding_options(0.0, language="en", prompt=[1, 2])
    assert d.beam_size == 5 and d.best_of is None and d.prompt == (1, 2)
    d = TranscriptionOptions().decoding_options(0.4)
    assert d.beam_size is None and d.best_of == 5 and d.patience is None
    with pytest.raises(ValueError):
        TranscriptionOptions(kv_cache="nope")
    with pytest.raises(ValueError):
        TranscriptionOptions(temperature=())
    with pytest.raises(ValueError):
        TranscriptionOptions(beam_size=0)


def segment(i: int, start: float, end: float, text: str) -> Segment:
    return Segment(i, 0, start, end, text, (1, 2), 0.0, -0.2, 1.3, 0.01)


SEGMENTS = [segment(0, 0.0, 7.74, " And so my fellow Americans,"), segment(1, 7.74, 3725.5, " go.")]


def test_srt_and_vtt():
    assert formats.to_srt(SEGMENTS) == (
        "1\n00:00:00,000 --> 00:00:07,740\nAnd so my fellow Americans,\n\n"
        "2\n00:00:07,740 --> 01:02:05,500\ngo.\n"
    )
    assert formats.to_vtt(SEGMENTS) == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:07.740\nAnd so my fellow Americans,\n\n"
        "00:00:07.740 --> 01:02:05.500\ngo.\n"
    )
    assert formats.format_timestamp(-1) == "00:00:00.000"


def test_text_and_json():
    assert formats.to_text(SEGMENTS) == "And so my fellow Americans, go."
    assert json.loads(formats.to_json(SEGMENTS)) == {"text": "And so my fellow Americans, go."}
    info = TranscriptionInfo("en", 1.0, 3726.0, 3726.0, None)
    data = json.loads(formats.to_verbose_json(SEGMENTS, info))
    assert data["language"] == "en" and data["duration"] == 3726.0
    assert [s["end"] for s in data["segments"]] == [7.74, 3725.5]
    assert data["segments"][0]["tokens"] == [1, 2]
