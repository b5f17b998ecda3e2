"""Subtitles with speakers: SRT names the speaker before the text, WebVTT as a voice span."""

from __future__ import annotations

from app.service.diarize.attribution import SpeakerSegment
from app.service.transcription.formats import to_srt, to_vtt

SEGMENTS = (
    SpeakerSegment(0.0, 1.5, "A", "Hello there.", ()),
    SpeakerSegment(1.7, 3.0, "Dr <Who> & co", "Hi back.", ()),
)


def test_srt_cues_start_with_the_speaker() -> None:
    assert to_srt(SEGMENTS, [s.speaker for s in SEGMENTS]) == (
        "1\n00:00:00,000 --> 00:00:01,500\nA: Hello there.\n\n"
        "2\n00:00:01,700 --> 00:00:03,000\nDr Who and co: Hi back.\n"
    )


def test_vtt_cues_are_voice_spans() -> None:
    assert to_vtt(SEGMENTS, [s.speaker for s in SEGMENTS]) == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\n<v A>Hello there.\n\n"
        "00:00:01.700 --> 00:00:03.000\n<v Dr Who and co>Hi back.\n"
    )


def test_without_speakers_cues_are_plain() -> None:
    assert "<v" not in to_vtt(SEGMENTS) and "A:" not in to_srt(SEGMENTS)
