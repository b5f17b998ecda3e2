"""A two-speaker conversation made from the repository's LibriSpeech clips (issue 33's tests):
speaker 1089 ("stuff it into you ..."), speaker 2412 ("if the reader will excuse me ..."),
speaker 1089 again ("he could wait no longer"), 0.6 s apart."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import soundfile as sf

from tests.conftest import AUDIO

RATE = 16000
GAP_S = 0.6
PARTS = ("1089-134686-0001.flac", "2412-153948-0000.flac", "1089-134691-0000.flac")


@dataclass(frozen=True)
class Conversation:
    wav: bytes
    spans: tuple[tuple[float, float], ...]  # each part's (start, end) seconds

    def part_at(self, start: float, end: float) -> int:
        """The part a stretch lies in most."""
        shared = [min(end, b) - max(start, a) for a, b in self.spans]
        return int(np.argmax(shared))


def read_clip(name: str) -> np.ndarray:
    audio, rate = sf.read(AUDIO / name, dtype="float32")
    assert rate == RATE
    return audio


def wav_bytes(audio: np.ndarray) -> bytes:
    out = io.BytesIO()
    sf.write(out, audio, RATE, format="WAV", subtype="PCM_16")
    return out.getvalue()


def two_speakers() -> Conversation:
    pieces, spans, t = [], [], 0.0
    for name in PARTS:
        audio = read_clip(name)
        pieces += [audio, np.zeros(int(GAP_S * RATE), np.float32)]
        spans.append((t, t + len(audio) / RATE))
        t += len(audio) / RATE + GAP_S
    return Conversation(wav_bytes(np.concatenate(pieces)), tuple(spans))
