"""Audio in containers libsndfile cannot read (MP4/M4A, WebM/Matroska, MPEG, AAC, AMR, video
files' audio tracks), decoded with PyAV (FFmpeg's libraries, bundled in its wheels).

The first audio stream is decoded frame by frame into f32, channels averaged to mono, at the
stream's own rate; the caller resamples. Decoding is bounded while it runs: once the samples
decoded pass `max_duration_s` (or `HARD_LIMIT_S` when the caller sets none) it stops with
`AudioTooLongError`, so a small file that expands to hours of audio costs no more than the limit.
A stream that breaks off after some audio decoded is kept as far as it went (logged); one that
gives no audio is an `AudioDecodeError` whose message says what is wrong.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import BinaryIO

import av
import numpy as np

from app.engine.errors import SUPPORTED_FORMATS, AudioDecodeError, AudioTooLongError

logger = logging.getLogger(__name__)

HARD_LIMIT_S = 4 * 3600.0  # no input decodes past this, whatever the caller allows
# FFmpeg probes at most this much of the input to find its streams (bytes, microseconds)
_OPEN_OPTIONS = {"probesize": str(5 * 2**20), "analyzeduration": str(10_000_000)}


@dataclass(frozen=True)
class DecodedTrack:
    samples: np.ndarray  # f32 [N] mono at `rate` Hz
    rate: int
    channels: int
    format: str  # container and codec, for messages and logs: "mov,mp4,m4a,3gp,3g2,mj2/aac"


def decode_container(
    handle: str | BinaryIO, kind: str | None = None, *, max_duration_s: float | None = None
) -> DecodedTrack:
    """Decode the first audio stream of `handle` (a path or a seekable binary file).

    `kind` names the input in messages when its first bytes told what it is ("MP4/M4A (AAC)
    audio"); None when they did not.
    """
    limit_s = min(max_duration_s, HARD_LIMIT_S) if max_duration_s is not None else HARD_LIMIT_S
    try:
        container = av.open(handle, mode="r", options=_OPEN_OPTIONS, metadata_errors="ignore")
    except (av.FFmpegError, ValueError, OSError) as e:
        if kind is None:
            raise AudioDecodeError(
                f"could not decode the audio: the data is not audio in a supported format "
                f"({SUPPORTED_FORMATS})"
            ) from e
        raise AudioDecodeError(
            f"could not decode the audio: the {kind} file is corrupt or truncated ({_reason(e)})"
        ) from e
    with container:
        if not container.streams.audio:
            raise AudioDecodeError(
                f"could not decode the audio: the {container.format.name} file has no audio track"
            )
        stream = container.streams.audio[0]
        if stream.codec_context is None:  # a truncated header: the track's codec is unknown
            raise AudioDecodeError(
                f"could not decode the audio: the {kind or container.format.name} file is "
                "corrupt or truncated (its audio track names no codec)"
            )
        fmt = f"{container.format.name}/{stream.codec_context.name}"
        announced = _announced_s(container, stream)
        if max_duration_s is not None and announced is not None and announced > limit_s:
            raise AudioTooLongError(
                f"the audio is {announced:.1f} s long; the limit is {max_duration_s:g} s"
            )
        return _decode_stream(container, stream, fmt, limit_s, max_duration_s)


def _decode_stream(
    container: av.container.InputContainer,
    stream: av.AudioStream,
    fmt: str,
    limit_s: float,
    max_duration_s: float | None,
) -> DecodedTrack:
    rate = 0
    channels = 0
    resampler: av.AudioResampler | None = None
    chunks: list[np.ndarray] = []
    total = 0  # samples decoded, at `rate`
    try:
        for frame in container.decode(stream):
            if resampler is None:  # packed f32 in the stream's own layout and rate
                rate, channels = frame.sample_rate, frame.layout.nb_channels
                if rate <= 0 or channels <= 0:
                    raise AudioDecodeError(f"could not decode the audio: the {fmt} stream is empty")
                resampler = av.AudioResampler(format="flt", layout=frame.layout, rate=rate)
            for out in resampler.resample(frame):
                chunks.append(_mono(out, channels))  # [n]
                total += chunks[-1].shape[0]
            if total > limit_s * rate:
                shown = max_duration_s if max_duration_s is not None else limit_s
                raise AudioTooLongError(
                    f"the audio is longer than {shown:g} s (the limit); decoding stopped there"
                )
        if resampler is not None:
            chunks += [_mono(out, channels) for out in resampler.resample(None)]
    except AudioDecodeError:
        raise
    except (av.FFmpegError, ValueError) as e:  # PyAV raises ValueError for some broken frames
        if not chunks:
            raise AudioDecodeError(
                f"could not decode the audio: the {fmt} stream is corrupt or truncated "
                f"({_reason(e)})"
            ) from e
        logger.warning("%s stream broke off (%s); decoded the %d samples before it", fmt, e, total)
    if not chunks:
        raise AudioDecodeError(f"could not decode the audio: the {fmt} file contains no samples")
    return DecodedTrack(np.concatenate(chunks), rate, channels, fmt)


def _mono(frame: av.AudioFrame, channels: int) -> np.ndarray:
    """A packed f32 frame [1, n * channels] -> its channels averaged, f32 [n]."""
    return frame.to_ndarray().reshape(-1, channels).mean(axis=1, dtype=np.float32)


def _announced_s(container: av.container.InputContainer, stream: av.AudioStream) -> float | None:
    """The duration the container announces (seconds), or None when it says nothing."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def _reason(error: Exception) -> str:
    text = getattr(error, "strerror", None) or str(error)
    return str(text).strip().rstrip(".") or type(error).__name__
