"""Transcript output formats: plain text, SubRip (srt), WebVTT (vtt) and JSON.

One function per format, each taking the segments (seconds); shared by the CLI and the HTTP API.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from app.service.transcription.results import Segment, TranscriptionInfo

FORMATS = ("text", "json", "verbose_json", "srt", "vtt")


def format_timestamp(
    seconds: float, *, decimal_marker: str = ".", always_hours: bool = True
) -> str:
    """HH:MM:SS.mmm (srt uses "," as the decimal marker); negative values clamp to 0."""
    milliseconds = max(0, round(seconds * 1000.0))
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1000)
    hours_marker = f"{hours:02d}:" if always_hours or hours > 0 else ""
    return f"{hours_marker}{minutes:02d}:{secs:02d}{decimal_marker}{milliseconds:03d}"


def to_text(segments: Iterable[Segment]) -> str:
    """The transcript as one line of text (segments joined, outer whitespace stripped)."""
    return "".join(s.text for s in segments).strip()


class Cue(Protocol):
    """A subtitle's span (seconds) and text: a transcript segment or a speaker's segment."""

    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def text(self) -> str: ...


def to_srt(segments: Iterable[Cue], speakers: Sequence[str] | None = None) -> str:
    """SubRip subtitles: numbered cues, "HH:MM:SS,mmm --> HH:MM:SS,mmm"; with `speakers` (one
    per cue) each cue's text starts with "<speaker>: "."""
    cues = []
    for index, s in enumerate(segments, start=1):
        start = format_timestamp(s.start, decimal_marker=",")
        end = format_timestamp(s.end, decimal_marker=",")
        who = f"{_voice(speakers[index - 1])}: " if speakers is not None else ""
        cues.append(f"{index}\n{start} --> {end}\n{who}{s.text.strip().replace('-->', '->')}\n")
    return "\n".join(cues)


def to_vtt(segments: Iterable[Cue], speakers: Sequence[str] | None = None) -> str:
    """WebVTT subtitles: a "WEBVTT" header, then "HH:MM:SS.mmm --> HH:MM:SS.mmm" cues; with
    `speakers` (one per cue) each cue is a voice span, "<v speaker>text"."""
    cues = ["WEBVTT\n"]
    for index, s in enumerate(segments):
        start, end = format_timestamp(s.start), format_timestamp(s.end)
        who = f"<v {_voice(speakers[index])}>" if speakers is not None else ""
        cues.append(f"{start} --> {end}\n{who}{s.text.strip().replace('-->', '->')}\n")
    return "\n".join(cues)


def _voice(speaker: str) -> str:
    """A speaker's name as a cue can carry it (no markup characters, one line)."""
    return " ".join(speaker.replace("<", "").replace(">", "").replace("&", "and").split())


def words_list(segments: Iterable[Segment]) -> list[dict[str, Any]] | None:
    """OpenAI's top-level `words` ({word, start, end}, plus probability), or None when the
    segments were transcribed without word timestamps."""
    segments = list(segments)
    if not segments or any(s.words is None for s in segments):
        return None
    return [
        {"word": w.word.strip(), "start": w.start, "end": w.end, "probability": w.probability}
        for s in segments
        for w in s.words or ()
    ]


def to_json(segments: Iterable[Segment]) -> str:
    """OpenAI's `json` response: {"text": ...}, with `words` when they were timed."""
    segments = list(segments)
    data: dict[str, Any] = {"text": to_text(segments)}
    words = words_list(segments)
    if words is not None:
        data["words"] = words
    return json.dumps(data, ensure_ascii=False)


def verbose_json_dict(
    segments: Iterable[Segment], info: TranscriptionInfo, *, task: str = "transcribe"
) -> dict[str, Any]:
    """OpenAI's `verbose_json` response as a dict: task, language, duration, text, segments."""
    segments = list(segments)
    return {
        "task": task,
        "language": info.language,
        "duration": round(info.duration, 3),
        "text": to_text(segments),
        "segments": [s.to_dict() for s in segments],
        **({"words": words} if (words := words_list(segments)) is not None else {}),
    }


def to_verbose_json(
    segments: Iterable[Segment], info: TranscriptionInfo, *, task: str = "transcribe"
) -> str:
    return json.dumps(verbose_json_dict(segments, info, task=task), ensure_ascii=False)
