"""The voice registry's SQLite file (`app.service.voices.store`) and the enrolment checks of
`app.service.voices.registry`: real SQLite, no audio, no model."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from app.service.diarize.activity import Turn, speech_seconds
from app.service.errors import Rejected
from app.service.voices.registry import (
    _part,
    check_one_speaker,
    voice_name,
)
from app.service.voices.store import VoiceStore, _failure


def _vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(192).astype(np.float32)
    return v / np.linalg.norm(v)


def test_a_voice_is_kept_whole_and_read_back(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "deep" / "voices.sqlite3")  # its folder is made
    voice = store.add("ann", "m1", _vector(0), 7.25, audio=b"RIFF....")
    again = VoiceStore(store.path)  # another process's view of the same file
    got = again.get(voice.id)
    assert (got.name, got.model, got.speech_s, got.has_audio) == ("ann", "m1", 7.25, True)
    assert np.array_equal(got.embedding, voice.embedding)
    assert again.named("ann").id == got.id and again.named("bob") is None
    assert again.audio(voice.id) == b"RIFF...."
    other = again.add("bob", "m1", _vector(1), 3.0)
    assert [v.name for v in store.all()] == ["ann", "bob"] and store.audio(other.id) is None
    store.remade(voice.id, "m2", _vector(2))
    assert again.get(voice.id).model == "m2"
    assert np.array_equal(again.get(voice.id).embedding, _vector(2))


def test_a_taken_name_is_a_conflict_and_adds_nothing(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "v.sqlite3")
    store.add("ann", "m1", _vector(0), 5.0)
    with pytest.raises(Rejected) as caught:
        store.add("ann", "m1", _vector(1), 5.0)
    assert (caught.value.kind, caught.value.param) == ("conflict", "name")
    assert len(store.all()) == 1


def test_unknown_ids_are_not_found(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "v.sqlite3")
    for call in (store.get, store.delete, store.audio):
        with pytest.raises(Rejected) as caught:
            call("voice_x")
        assert caught.value.kind == "not_found"


def test_a_locked_file_is_unavailable_with_a_retry(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("app.service.voices.store.BUSY_TIMEOUT_S", 0.2)
    store = VoiceStore(tmp_path / "v.sqlite3")
    store.add("ann", "m1", _vector(0), 5.0)
    holder = sqlite3.connect(store.path)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(Rejected) as caught:
            store.add("bob", "m1", _vector(1), 5.0)
        assert caught.value.kind == "unavailable" and caught.value.retry_after_s
    finally:
        holder.rollback()
        holder.close()
    assert [v.name for v in store.all()] == ["ann"]


def test_a_damaged_file_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "v.sqlite3"
    path.write_bytes(b"garbage" * 1000)
    with pytest.raises(Rejected) as caught:
        VoiceStore(path).all()
    assert caught.value.kind == "failed" and str(path) in caught.value.message


def test_a_full_disk_is_said_as_such(tmp_path: Path) -> None:
    """SQLite's own "database or disk is full" (a page limit stands in for the disk)."""
    db = sqlite3.connect(tmp_path / "full.sqlite3")
    db.execute("CREATE TABLE t (b BLOB)")
    db.execute("PRAGMA max_page_count = 3")
    with pytest.raises(sqlite3.OperationalError) as raised:
        db.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))
    refusal = _failure(tmp_path / "full.sqlite3", raised.value)
    assert refusal.kind == "storage" and "disk" in refusal.message


@pytest.mark.parametrize(
    ("speech", "refused"),
    [([7.5], None), ([], "no speech"), ([6.0, 2.5], "2 speakers")],
)
def test_an_enrolment_holds_one_speaker(speech: list[float], refused: str | None) -> None:
    if refused is None:
        check_one_speaker(speech)
        return
    with pytest.raises(Rejected) as caught:
        check_one_speaker(speech)
    assert refused in caught.value.message and caught.value.param == "file"


def test_speech_is_summed_per_speaker() -> None:
    turns = [Turn(0.0, 1.0, 1), Turn(1.0, 4.0, 0), Turn(4.5, 5.0, 1)]
    assert speech_seconds(turns, 3) == [3.0, 1.5, 0.0]


def test_a_segment_of_the_clip_is_taken_and_outside_it_refused() -> None:
    clip = np.arange(16000 * 10, dtype=np.float32)
    assert len(_part(clip, 2.0, 4.5)) == 40000 and _part(clip, 2.0, 4.5)[0] == 32000
    assert len(_part(clip, None, None)) == len(clip)
    for start, end, param in [(9.0, 12.0, "end"), (11.0, None, "start"), (5.0, 4.0, "end")]:
        with pytest.raises(Rejected) as caught:
            _part(clip, start, end)
        assert caught.value.param == param


def test_a_name_is_trimmed_and_bounded() -> None:
    assert voice_name("  Ann ") == "Ann"
    for bad in ("", "   ", "x" * 65):
        with pytest.raises(Rejected):
            voice_name(bad)
