"""Voices enrolled once and named everywhere: enrolment, listing, deletion, and the embeddings
of named voices for diarization (blocking calls: run them on a worker thread).

Enrolment takes 2-30 s of one person talking: the clip (or the part of it between `start` and
`end`, such as a segment of a diarized result) is diarized first; no speech, or a second speaker
the diarizer keeps (over `min_alone_s` of speech alone), is refused with the reason. The voice's
embedding is the reference embedding of the clip, as for a `known_speaker_references[]` clip, so
one similarity threshold names both.

A voice is made by one speaker model (`model`: the digest of its embedding graph). When the
speaker models change, a voice whose audio was kept is made again by the new model the first
time it is used; one without is `stale`: listed as such and refused by name until enrolled again.
"""

from __future__ import annotations

import hashlib
import io
import wave
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from app.engine.audio import decode_audio
from app.engine.speakers import TooLittleSpeech
from app.runtime.contract import SAMPLE_RATE
from app.runtime.speaker_contract import EMBEDDING_FILE, FOLDER
from app.service.diarize.activity import speech_seconds
from app.service.diarize.clustering import SpeakerHints
from app.service.diarize.job import LazyDiarizer, lasting
from app.service.errors import Rejected
from app.service.voices.store import MAX_NAME, Voice, VoiceStore

ENROL_S = (2.0, 30.0)  # the enrolment clip's bounds, seconds
NAMES = "known_speaker_names[]"


@dataclass(frozen=True)
class Enrolment:
    """What a client asks to enrol: the name, the audio (any upload format) and optionally the
    part of it to take (seconds), and whether to keep that audio with the voice."""

    name: str
    audio: bytes
    start: float | None = None
    end: float | None = None
    keep_audio: bool = False


@dataclass(frozen=True)
class VoiceStatus:
    """A voice and whether the speaker models of this server can use it."""

    voice: Voice
    stale: bool


class VoiceRegistry:
    """The registry over `store`, with the server's speaker models (`diarizer`, loaded on first
    use; `models_dir` holds them)."""

    def __init__(self, store: VoiceStore, diarizer: LazyDiarizer, models_dir: Path) -> None:
        self.store = store
        self.diarizer = diarizer
        self.models_dir = Path(models_dir)

    def model_id(self) -> str:
        """The digest of the speaker embedding graph the server runs now."""
        path = self.models_dir / FOLDER / EMBEDDING_FILE
        try:
            stat = path.stat()
        except OSError:
            self.diarizer.get()  # refuses with the reason: the speaker models are not built
            raise
        return _digest(path, stat.st_mtime_ns, stat.st_size)

    def enrol(self, enrolment: Enrolment) -> Voice:
        """Check and store a new voice (the clip's refusals name the field at fault)."""
        name = voice_name(enrolment.name)
        model = self.model_id()
        clip = _part(decode_audio(enrolment.audio, SAMPLE_RATE), enrolment.start, enrolment.end)
        lasting(clip, ENROL_S, "The enrolment audio", "file")
        diarizer = self.diarizer.get()
        found = diarizer(clip, SpeakerHints())
        speech = sorted(speech_seconds(found.turns, len(found.centroids)), reverse=True)
        check_one_speaker(speech)
        try:
            embedding = diarizer.reference(clip)
        except TooLittleSpeech as e:
            raise _no_speech() from e
        audio = _wav_bytes(clip) if enrolment.keep_audio else None
        return self.store.add(name, model, embedding, sum(speech), audio)

    def statuses(self) -> list[VoiceStatus]:
        model = self._model_or_none()
        return [self._status(v, model) for v in self.store.all()]

    def status(self, voice_id: str) -> VoiceStatus:
        return self._status(self.store.get(voice_id), self._model_or_none())

    def delete(self, voice_id: str) -> None:
        self.store.delete(voice_id)

    def known(self, names: Sequence[str]) -> tuple[tuple[str, np.ndarray], ...]:
        """Each named voice's name and its embedding by today's speaker model (made again from
        its kept audio where the model changed); a name that is not enrolled, or a stale voice,
        is refused."""
        model = self.model_id()
        found = []
        for name in names:
            voice = self.store.named(name)
            if voice is None:
                raise Rejected(
                    "invalid_value",
                    f"{NAMES} names {name!r}, which has no reference clip and is not an "
                    "enrolled voice (GET /v1/voices lists them)",
                    param=NAMES,
                )
            found.append((name, self._current(voice, model)))
        return tuple(found)

    def enrolled(self) -> tuple[tuple[str, np.ndarray], ...]:
        """Every voice these speaker models can use, with its embedding (a live session names
        any of them); stale ones are left out."""
        model = self.model_id()
        usable = [v for v in self.store.all() if v.model == model or v.has_audio]
        return tuple((voice.name, self._current(voice, model)) for voice in usable)

    def _current(self, voice: Voice, model: str) -> np.ndarray:
        if voice.model == model:
            return voice.embedding
        audio = self.store.audio(voice.id)
        if audio is None:
            raise Rejected(
                "voice_stale",
                f"The voice {voice.name!r} was enrolled with other speaker models and its audio "
                "was not kept: enrol it again",
                param=NAMES,
                kind="conflict",
            )
        embedding = self.diarizer.get().reference(decode_audio(audio, SAMPLE_RATE))
        self.store.remade(voice.id, model, embedding)
        return embedding

    def _model_or_none(self) -> str | None:
        path = self.models_dir / FOLDER / EMBEDDING_FILE
        return self.model_id() if path.is_file() else None

    @staticmethod
    def _status(voice: Voice, model: str | None) -> VoiceStatus:
        return VoiceStatus(voice, stale=model is not None and voice.model != model and not
                           voice.has_audio)  # fmt: skip


def voice_name(name: str) -> str:
    """A voice's name, trimmed; empty or too long is refused."""
    cleaned = name.strip()
    if not cleaned or len(cleaned) > MAX_NAME:
        raise Rejected(
            "invalid_value", f"A voice's name must hold 1 to {MAX_NAME} characters", param="name"
        )
    return cleaned


def check_one_speaker(speech: Sequence[float]) -> None:
    """An enrolment clip holds one speaker's speech: none, or a second speaker, is refused."""
    if not speech:
        raise _no_speech()
    if len(speech) > 1:
        talk = ", ".join(f"{s:.1f} s" for s in speech)
        raise Rejected(
            "invalid_value",
            f"The enrolment audio holds {len(speech)} speakers ({talk} of speech): enrol each "
            "voice from a clip of that person alone",
            param="file",
        )


def _no_speech() -> Rejected:
    return Rejected("invalid_value", "The enrolment audio holds no speech", param="file")


def _part(clip: np.ndarray, start: float | None, end: float | None) -> np.ndarray:
    """The clip between `start` and `end` seconds (either open); outside the clip is refused."""
    duration = len(clip) / SAMPLE_RATE
    first = 0.0 if start is None else start
    last = duration if end is None else end
    if not 0.0 <= first < last <= duration + 1e-3:
        raise Rejected(
            "invalid_value",
            f"start {first:g} s and end {last:g} s must lie inside the audio (0 to "
            f"{duration:.2f} s), start before end",
            param="start" if start is not None and not 0.0 <= first < duration else "end",
        )
    return clip[round(first * SAMPLE_RATE) : round(last * SAMPLE_RATE)]


def _wav_bytes(clip: np.ndarray) -> bytes:
    """The clip as 16-bit mono WAV (what a kept enrolment is stored as)."""
    pcm = (np.clip(clip, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLE_RATE)
        wav.writeframes(pcm)
    return out.getvalue()


@cache
def _digest(path: Path, mtime_ns: int, size: int) -> str:
    """The first 16 hex digits of the file's SHA-256 (cached per file version)."""
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()[:16]
