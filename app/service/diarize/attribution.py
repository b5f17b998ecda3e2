"""Who said each word: turns + timed words -> speaker segments with names or letters.

A word takes the speaker whose turns cover most of it (a word in a gap: the nearest turn);
segments split where the speaker changes and where a transcript segment ends. Speakers are named
by the known speakers whose reference embedding matches a cluster's centroid (each name at most
one cluster, best matches first), the others `A`, `B`, ... in order of first appearance.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from app.service.diarize.activity import Turn
from app.service.transcription.results import Segment, Word

NO_SPEAKER = -1  # no turn at all (silence, music)
FIRST = "A"  # the label of the only speaker when no turn was found


@dataclass(frozen=True)
class SpeakerSegment:
    """A run of one speaker's words (times in seconds); `speaker` is the label sent."""

    start: float
    end: float
    speaker: str
    text: str
    words: tuple[Word, ...]


def word_speaker(start: float, end: float, turns: Sequence[Turn]) -> int:
    """The cluster whose turns overlap [start, end] the most; the nearest turn's when none
    overlaps; NO_SPEAKER without turns."""
    if not turns:
        return NO_SPEAKER
    overlap: dict[int, float] = {}
    for t in turns:
        shared = min(end, t.end) - max(start, t.start)
        if shared > 0:
            overlap[t.speaker] = overlap.get(t.speaker, 0.0) + shared
    if overlap:
        return max(overlap, key=lambda k: (overlap[k], -k))
    middle = 0.5 * (start + end)
    return min(turns, key=lambda t: (max(t.start - middle, middle - t.end), t.speaker)).speaker


def speaker_labels(
    turns: Sequence[Turn], centroids: np.ndarray, known: Sequence[tuple[str, np.ndarray]],
    threshold: float,
) -> dict[int, str]:  # fmt: skip
    """Cluster -> label: a known speaker's name when its reference matches the centroid (cosine
    similarity >= threshold, best pairs first, one name per cluster), else the next letter in
    order of first appearance."""
    order = list(dict.fromkeys(t.speaker for t in sorted(turns, key=lambda t: t.start)))
    names: dict[int, str] = {}
    if known and order:
        refs = np.stack([v / max(np.linalg.norm(v), 1e-12) for _, v in known])
        similarity = refs @ centroids[order].T  # [names, clusters in order]
        for flat in np.argsort(-similarity, axis=None, kind="stable"):
            r, c = divmod(int(flat), len(order))
            if similarity[r, c] < threshold:
                break
            if order[c] not in names and known[r][0] not in names.values():
                names[order[c]] = known[r][0]
    free = iter(letter for letter in letters() if letter not in names.values())
    return {k: names[k] if k in names else next(free) for k in order}


def letters() -> Iterable[str]:
    """A, B, ..., Z, AA, AB, ..."""
    yield from string.ascii_uppercase
    for first in string.ascii_uppercase:
        for second in string.ascii_uppercase:
            yield first + second


def speaker_segments(
    segments: Iterable[Segment], turns: Sequence[Turn], labels: dict[int, str]
) -> tuple[SpeakerSegment, ...]:
    """The transcript's words grouped into runs of one speaker within each segment (a segment
    without timed words is one run, its speaker taken over its span). Without any turn (no
    speech found) the words are one speaker's, `A`."""
    found: list[SpeakerSegment] = []
    for segment in segments:
        words = segment.words or ()
        if not words:
            if segment.text.strip():
                who = labels.get(word_speaker(segment.start, segment.end, turns), FIRST)
                found.append(SpeakerSegment(segment.start, segment.end, who,
                                            segment.text.strip(), ()))  # fmt: skip
            continue
        found += word_runs(words, turns, labels)
    return tuple(found)


def word_runs(
    words: Sequence[Word], turns: Sequence[Turn], labels: dict[int, str]
) -> list[SpeakerSegment]:
    """Timed words grouped into runs of one speaker (each word's: `word_speaker`)."""
    said = [labels.get(word_speaker(w.start, w.end, turns), FIRST) for w in words]
    runs, first = [], 0
    for i in range(1, len(words) + 1):
        if i == len(words) or said[i] != said[first]:
            runs.append(_run(words[first:i], said[first]))
            first = i
    return runs


def _run(words: Sequence[Word], speaker: str) -> SpeakerSegment:
    return SpeakerSegment(
        start=words[0].start,
        end=words[-1].end,
        speaker=speaker,
        text="".join(w.word for w in words).strip(),
        words=tuple(words),
    )
