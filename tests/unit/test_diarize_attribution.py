"""Words -> speakers -> speaker segments and their labels (pure)."""

from __future__ import annotations

import numpy as np

from app.service.diarize.activity import Turn
from app.service.diarize.attribution import (
    speaker_labels,
    speaker_segments,
    word_speaker,
)
from app.service.transcription.results import Segment, Word

TURNS = (Turn(0.0, 4.0, 1), Turn(3.5, 8.0, 0), Turn(9.0, 12.0, 1))


def _segment(i: int, words: list[tuple[float, float, str]]) -> Segment:
    timed = tuple(Word(a, b, w, 0.9) for a, b, w in words)
    return Segment(i, 0, timed[0].start, timed[-1].end, "".join(w.word for w in timed), (),
                   0.0, -0.1, 1.0, 0.01, timed)  # fmt: skip


def test_a_word_takes_the_speaker_covering_most_of_it() -> None:
    assert word_speaker(3.4, 3.8, TURNS) == 1  # 0.4 s with 1, 0.3 s with 0
    assert word_speaker(3.6, 4.2, TURNS) == 0  # 0.4 s with 1, 0.6 s with 0
    assert word_speaker(8.2, 8.4, TURNS) == 0  # in the gap: the nearest turn
    assert word_speaker(8.7, 8.9, TURNS) == 1
    assert word_speaker(1.0, 2.0, ()) == -1


def test_segments_split_where_the_speaker_changes() -> None:
    segments = [
        _segment(0, [(0.5, 1.0, " Hello"), (1.0, 1.5, " there."), (5.0, 5.5, " Hi"),
                     (5.5, 6.0, " back.")]),
        _segment(1, [(6.2, 6.8, " Fine."), (9.5, 10.0, " Good.")]),
    ]  # fmt: skip
    found = speaker_segments(segments, TURNS, {1: "A", 0: "B"})
    assert [(s.speaker, s.text, s.start, s.end) for s in found] == [
        ("A", "Hello there.", 0.5, 1.5),
        ("B", "Hi back.", 5.0, 6.0),
        ("B", "Fine.", 6.2, 6.8),  # a transcript segment's end also ends a speaker segment
        ("A", "Good.", 9.5, 10.0),
    ]
    assert [w.word for w in found[1].words] == [" Hi", " back."]


def test_without_turns_every_word_is_one_speakers() -> None:
    found = speaker_segments([_segment(0, [(0.0, 1.0, " Music?")])], (), {})
    assert [(s.speaker, s.text) for s in found] == [("A", "Music?")]


def test_letters_follow_the_order_of_appearance() -> None:
    centroids = np.eye(3)
    turns = (Turn(0.0, 1.0, 2), Turn(1.0, 2.0, 0), Turn(2.0, 3.0, 2), Turn(3.0, 4.0, 1))
    assert speaker_labels(turns, centroids, [], 0.5) == {2: "A", 0: "B", 1: "C"}


def test_known_speakers_name_the_clusters_they_match() -> None:
    centroids = np.eye(3)
    turns = (Turn(0.0, 1.0, 2), Turn(1.0, 2.0, 0), Turn(3.0, 4.0, 1))
    agent = np.array([0.1, 0.0, 0.9])  # cluster 2
    customer = np.array([0.2, 0.9, 0.0])  # cluster 1
    stranger = np.array([-1.0, 0.0, 0.0])  # nobody
    labels = speaker_labels(
        turns, centroids, [("agent", agent), ("customer", customer), ("x", stranger)], 0.5
    )
    assert labels == {2: "agent", 0: "A", 1: "customer"}


def test_one_name_per_cluster_and_the_best_match_wins() -> None:
    centroids = np.eye(2)
    turns = (Turn(0.0, 1.0, 0), Turn(1.0, 2.0, 1))
    close, closer = np.array([0.8, 0.2]), np.array([0.95, 0.05])
    labels = speaker_labels(turns, centroids, [("close", close), ("closer", closer)], 0.5)
    assert labels == {0: "closer", 1: "A"}
