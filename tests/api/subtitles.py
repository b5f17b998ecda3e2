"""Strict little SRT / WebVTT parsers for the tests: a malformed file raises AssertionError."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SRT_TIME = r"(\d{2}):(\d{2}):(\d{2}),(\d{3})"
_VTT_TIME = r"(?:(\d{2,}):)?(\d{2}):(\d{2})\.(\d{3})"


@dataclass(frozen=True)
class Cue:
    start: float  # seconds
    end: float
    text: str


def _seconds(h: str | None, m: str, s: str, ms: str) -> float:
    assert int(m) < 60 and int(s) < 60, (m, s)
    return int(h or 0) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def _check_order(cues: list[Cue]) -> None:
    previous_start = previous_end = 0.0
    for cue in cues:
        assert cue.start < cue.end or cue.start == cue.end == previous_end, cue
        assert cue.start >= previous_start, (previous_start, cue)
        assert cue.start >= previous_end - 1e-3, f"cue overlaps the previous one: {cue}"
        assert cue.text.strip(), cue
        previous_start, previous_end = cue.start, cue.end


def parse_srt(text: str) -> list[Cue]:
    """Numbered blocks `n`, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, text lines; blank-line separated."""
    blocks = [b for b in re.split(r"\n\s*\n", text.strip()) if b.strip()]
    assert blocks, "empty SRT"
    cues = []
    for number, block in enumerate(blocks, start=1):
        lines = block.splitlines()
        assert lines[0].strip() == str(number), f"bad cue number in {block!r}"
        m = re.fullmatch(rf"{_SRT_TIME} --> {_SRT_TIME}", lines[1].strip())
        assert m, f"bad SRT timing line {lines[1]!r}"
        g = m.groups()
        cues.append(Cue(_seconds(*g[:4]), _seconds(*g[4:]), "\n".join(lines[2:])))
    _check_order(cues)
    return cues


def parse_vtt(text: str) -> list[Cue]:
    """`WEBVTT` header, then cues `[id]`, `[HH:]MM:SS.mmm --> [HH:]MM:SS.mmm`, text lines."""
    assert text.startswith("WEBVTT"), text[:40]
    blocks = [b for b in re.split(r"\n\s*\n", text.strip()) if b.strip()]
    header, cue_blocks = blocks[0], blocks[1:]
    assert header.splitlines()[0].startswith("WEBVTT"), header
    assert "-->" not in header, "the first cue must follow a blank line after WEBVTT"
    cues = []
    for block in cue_blocks:
        lines = block.splitlines()
        if lines[0].startswith("NOTE"):
            continue
        if "-->" not in lines[0]:
            lines = lines[1:]  # cue identifier
        m = re.match(rf"{_VTT_TIME} --> {_VTT_TIME}", lines[0].strip())
        assert m, f"bad VTT timing line {lines[0]!r}"
        g = m.groups()
        cues.append(Cue(_seconds(*g[:4]), _seconds(*g[4:]), "\n".join(lines[1:])))
    assert cues, "no cues"
    _check_order(cues)
    return cues
