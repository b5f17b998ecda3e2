"""A live session's speakers (`app.service.diarize.book.SpeakerBook`) on synthetic embeddings, and
the audio tape they are read from (`app.service.diarize.live.AudioTape`): no audio model."""

from __future__ import annotations

import numpy as np

from app.service.diarize.book import SpeakerBook
from app.service.diarize.live import AudioTape


def _voice(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(192)
    return v / np.linalg.norm(v)


def _near(voice: np.ndarray, seed: int, spread: float = 0.15) -> np.ndarray:
    """Another embedding of the same voice (cosine ~0.98)."""
    v = voice + spread * _voice(1000 + seed) / np.sqrt(2)
    return v / np.linalg.norm(v)


def test_labels_hold_for_the_whole_session() -> None:
    ann, bob, cid = _voice(1), _voice(2), _voice(3)
    book, labels = SpeakerBook().assigned(np.stack([ann, bob]), [3.0, 2.0])
    assert labels == ["A", "B"]
    book, labels = book.assigned(np.stack([_near(bob, 1)]), [4.0])
    assert labels == ["B"]
    book, labels = book.assigned(np.stack([cid, _near(ann, 2)]), [2.5, 5.0])
    assert labels == ["C", "A"] and book.labels == ("A", "B", "C")
    assert book.seconds == (8.0, 6.0, 2.5)


def test_two_item_speakers_never_share_a_session_speaker() -> None:
    ann = _voice(1)
    book, _ = SpeakerBook().assigned(np.stack([ann]), [3.0])
    _, labels = book.assigned(np.stack([_near(ann, 1), _near(ann, 2, 0.6)]), [2.0, 2.0])
    assert labels == ["A", "B"]  # the nearer is Ann; the other is someone else


def test_a_centroid_follows_the_voice_by_its_share_of_speech() -> None:
    ann = _voice(1)
    book, _ = SpeakerBook().assigned(np.stack([ann]), [3.0])
    heard = _near(ann, 5, 0.5)
    after, _ = book.assigned(np.stack([heard]), [1.0])
    expected = 0.75 * ann + 0.25 * heard
    assert np.allclose(after.centroids[0], expected / np.linalg.norm(expected))
    assert np.array_equal(book.centroids[0], ann)  # frozen: the old book is unchanged


def _like(voice: np.ndarray, cosine: float, seed: int) -> np.ndarray:
    """A unit vector at exactly `cosine` to `voice`."""
    other = _voice(seed)
    other -= (other @ voice) * voice
    return cosine * voice + np.sqrt(1 - cosine**2) * other / np.linalg.norm(other)


def test_an_enrolled_voice_names_a_new_speaker_once() -> None:
    ann, bob = _voice(1), _voice(2)
    known = [("bob", _near(bob, 7)), ("ann", ann)]
    # a session that asks 0.9 of the same speaker (the default is 0.45)
    book, labels = SpeakerBook(similarity=0.9).assigned(
        np.stack([_voice(9), _near(bob, 1)]), [2.0, 2.0], known
    )
    assert labels == ["A", "bob"]
    # like the enrolled Bob (cosine 0.65 >= 0.5) but not enough to be the session's Bob: a new
    # speaker, and Bob's name is given already
    book, labels = book.assigned(np.stack([_like(bob, 0.65, 3)]), [2.0], known)
    assert labels == ["B"]
    _, labels = book.assigned(np.stack([_near(ann, 4)]), [2.0], known)
    assert labels == ["ann"]


def test_past_the_most_speakers_a_voice_goes_to_its_nearest() -> None:
    ann, bob = _voice(1), _voice(2)
    book, _ = SpeakerBook(max_speakers=2).assigned(np.stack([ann, bob]), [2.0, 2.0])
    third = _near(bob, 3, 1.2)
    _, labels = book.assigned(np.stack([third]), [1.0])
    assert labels == ["AB"[int(np.argmax([ann @ third, bob @ third]))]]


def test_the_tape_keeps_the_last_seconds_by_stream_time() -> None:
    tape = AudioTape(keep_s=2.0)
    for second in range(5):
        tape.append(np.full(16000, second, np.float32))
    audio, start = tape.between(3.5, 4.25)
    assert start == 3.5 and len(audio) == 12000 and set(audio[:8000]) == {3.0}
    older, start = tape.between(0.0, 3.5)  # before the kept audio: what is left of it
    assert start == 3.0 and len(older) == 8000
    assert len(tape.between(6.0, 7.0)[0]) == 0
    across, start = tape.between(3.75, 4.5)  # across chunks: the end of one, the next's start
    assert start == 3.75 and list(np.unique(across, return_counts=True)[1]) == [4000, 8000]


def test_too_little_speech_is_no_new_speaker() -> None:
    """Under `min_new_s` an unmatched voice goes to the most similar speaker, unmoved."""
    ann, bob = _voice(1), _voice(2)
    book, _ = SpeakerBook().assigned(np.stack([ann, bob]), [3.0, 3.0])
    short = _like(ann, 0.4, 5)  # under the 0.45 a match needs
    after, labels = book.assigned(np.stack([short]), [1.5])
    assert labels == ["A"] and after.labels == ("A", "B")
    assert np.array_equal(after.centroids, book.centroids) and after.seconds == book.seconds
    _, labels = book.assigned(np.stack([short]), [2.5])
    assert labels == ["C"]
