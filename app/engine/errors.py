"""Errors of audio input, raised by `app.engine.audio` and `app.engine.container`."""

from __future__ import annotations

SUPPORTED_FORMATS = (
    "WAV, FLAC, MP3, MP4/M4A, MPEG, OGG (Vorbis/Opus), WebM, AIFF or a video file's audio track"
)


class AudioDecodeError(ValueError):
    """The input is not audio this service can decode; the message says why."""


class AudioTooLongError(AudioDecodeError):
    """The audio is longer than the caller allows."""
