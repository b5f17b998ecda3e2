"""Audio input: decode files or raw PCM to float32 mono samples at 16 kHz.

Files are decoded with libsndfile where it can (through `soundfile`; the wheel bundles libsndfile
1.2 with MP3 via mpg123, Vorbis and Opus): WAV, FLAC, MP3, OGG (Vorbis/Opus), AIFF, fast and exact.
What libsndfile does not recognise (MP4/M4A/AAC, WebM/Matroska, MPEG, AMR, a video file's audio
track, ...) goes to FFmpeg through PyAV (`app.engine.container`), bounded while it decodes.
Channels are averaged to mono, and any sample rate is resampled with soxr (quality "HQ").

Every failure raises `AudioDecodeError` (a `ValueError`) whose message a person can act on.
"""

from __future__ import annotations

import io
import logging
import os
import time
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
import soundfile as sf
import soxr

from app.engine.container import decode_container
from app.engine.errors import SUPPORTED_FORMATS, AudioDecodeError, AudioTooLongError
from app.runtime.contract import SAMPLE_RATE

logger = logging.getLogger(__name__)

AudioSource = bytes | bytearray | memoryview | str | os.PathLike[str] | BinaryIO
PcmEncoding = Literal["pcm_s16le", "pcm_f32le", "g711_ulaw", "g711_alaw"]

RESAMPLE_QUALITY = "HQ"
# quiet input is lifted for the model (see `lift_quiet`)
QUIET_PEAK = 0.05  # -26 dBFS: audio whose loud samples stay below it is lifted to it
PEAK_QUANTILE = 0.999  # "loud samples": this quantile of |x| (one click does not count)
MAX_LIFT = 3000.0  # +70 dB at most
# narrowband input (a telephone line, an 8 kHz recording): see `is_narrowband`
NARROWBAND_HZ = 4200.0
NARROWBAND_SHARE = 1e-4  # of the power above NARROWBAND_HZ
_BAND_BLOCKS = 64  # 1 s blocks the check looks at, spread over the clip


__all__ = [
    "SUPPORTED_FORMATS",
    "AudioDecodeError",
    "AudioSource",
    "AudioTooLongError",
    "PcmEncoding",
    "decode_audio",
    "is_narrowband",
    "lift_quiet",
    "pcm_to_float",
    "resample",
]


def decode_audio(
    source: AudioSource,
    sampling_rate: int = SAMPLE_RATE,
    *,
    max_duration_s: float | None = None,
) -> np.ndarray:
    """Decode an audio file (bytes, path or binary file object) to mono float32 samples.

    Returns f32 [N] at `sampling_rate` Hz (N samples; seconds = N / sampling_rate), values as
    decoded (nominally in [-1, 1]). With `max_duration_s`, audio longer than that many seconds
    raises `AudioTooLongError` before it is decoded (when the header tells the length).
    A file whose data is shorter than its header says (a cut-off WAV or MP3) is decoded as far
    as it goes, with a warning in the log; a header or stream that cannot be decoded is an error.
    """
    if sampling_rate <= 0:
        raise ValueError(f"sampling_rate must be positive, got {sampling_rate}")
    start = time.perf_counter()
    name, handle, offset = _open_source(source)
    try:
        mono, rate, channels, fmt = _read(name, handle, offset, max_duration_s)
    finally:
        if handle is not source and not isinstance(handle, str):
            handle.close()  # a BytesIO made here
    if max_duration_s is not None and mono.shape[0] / rate > max_duration_s:
        raise AudioTooLongError(
            f"the audio is {mono.shape[0] / rate:.1f} s long; the limit is {max_duration_s:g} s"
        )
    _check_finite(mono)
    audio = resample(mono, rate, sampling_rate)
    if audio.shape[0] == 0:
        raise AudioDecodeError(
            f"could not decode the audio: it is too short to use ({mono.shape[0]} samples at "
            f"{rate} Hz)"
        )
    logger.debug(
        "decoded %s: %s, %d Hz, %d ch, %.2f s in %.1f ms",
        name,
        fmt,
        rate,
        channels,
        audio.shape[0] / sampling_rate,
        (time.perf_counter() - start) * 1e3,
    )
    return audio


def lift_quiet(audio: np.ndarray) -> np.ndarray:
    """f32 [N] with its loud samples lifted to QUIET_PEAK when they are quieter; else unchanged.

    Whisper's features are not level-invariant: the log-mel is floored at 1e-10 and at its
    maximum - 8 and then offset ((log10 + 4) / 4), so speech recorded 50 dB down reaches the
    model as other numbers (tiny.en heard "America" for "Americans"). Ordinary recordings (the
    test clips' loud samples sit at 0.06-0.7) are not touched; quieter ones are brought up to
    their range. Digital silence stays silence.
    """
    if audio.shape[0] == 0:
        return audio
    magnitude = np.abs(audio)
    k = int(PEAK_QUANTILE * (magnitude.shape[0] - 1))
    # the quantile (the k-th smallest |x|) reaches QUIET_PEAK iff N - k samples do: counted, an
    # ordinary recording needs no partition (~5 ms for a minute of audio)
    if np.count_nonzero(magnitude >= QUIET_PEAK) >= magnitude.shape[0] - k:
        return audio
    peak = float(np.partition(magnitude, k)[k])  # the quantile, in O(N) (np.quantile sorts)
    if peak <= 0 or peak >= QUIET_PEAK:
        return audio
    gain = min(QUIET_PEAK / peak, MAX_LIFT)
    logger.debug("quiet audio (loud samples at %.1e): lifted by %.1f dB", peak, 20 * np.log10(gain))
    return (audio * np.float32(gain)).astype(np.float32, copy=False)


def is_narrowband(audio: np.ndarray, rate: int = SAMPLE_RATE) -> bool:
    """True when f32 [N] audio holds (almost) nothing above 4.2 kHz: a telephone line or an
    8 kHz recording resampled. Measured on up to 64 one-second blocks spread over the clip.
    Speech recorded full-band keeps 0.6-1 % of its power above 4.2 kHz, telephone-band speech
    1e-9; silence (no power at all) is not narrowband."""
    n = audio.shape[0] // rate
    if n == 0:
        return False
    picks = np.unique(np.linspace(0, n - 1, min(n, _BAND_BLOCKS)).astype(int))
    blocks = np.stack([audio[i * rate : (i + 1) * rate] for i in picks], dtype=np.float32)
    blocks -= blocks.mean(axis=1, keepdims=True)  # a DC offset is no band: leave it out
    power = np.abs(np.fft.rfft(blocks, axis=1))  # [blocks, rate // 2 + 1]
    np.square(power, out=power)  # in float32: its rounding (~1e-14 of the power) is far below
    total = float(power.sum(dtype=np.float64))  # the decision's 1e-4
    high = float(power[:, int(NARROWBAND_HZ) :].sum(dtype=np.float64))  # 1 Hz bins
    return total > 0 and high < NARROWBAND_SHARE * total


def resample(audio: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Resample f32 [N] (or [N, C]) from `from_rate` Hz to `to_rate` Hz with soxr "HQ".

    Returns a C-contiguous float32 array; the input itself when the rates are equal and it is
    already contiguous float32.
    """
    if from_rate <= 0 or to_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {from_rate} -> {to_rate}")
    audio = np.ascontiguousarray(audio, dtype=np.float32)
    if from_rate == to_rate:
        return audio
    return soxr.resample(audio, from_rate, to_rate, quality=RESAMPLE_QUALITY)


def pcm_to_float(data: bytes | bytearray | memoryview, encoding: PcmEncoding) -> np.ndarray:
    """Convert raw little-endian mono PCM bytes to f32 [N] samples in [-1, 1].

    `pcm_s16le`: 2 bytes per sample, scaled by 1/32768; `pcm_f32le`: 4 bytes per sample;
    `g711_ulaw` / `g711_alaw`: 1 byte per sample (ITU-T G.711 µ-law / A-law, as telephone audio
    is sent), expanded to the 16-bit value the code stands for and scaled by 1/32768.
    Empty input gives an empty array. A byte count that is not a whole number of samples, or
    NaN/infinite float samples, raise `AudioDecodeError`.
    """
    if encoding in _G711_TABLES:
        return _G711_TABLES[encoding][np.frombuffer(data, dtype=np.uint8)]  # a new array
    if encoding == "pcm_s16le":
        width, dtype = 2, np.dtype("<i2")
    elif encoding == "pcm_f32le":
        width, dtype = 4, np.dtype("<f4")
    else:
        raise ValueError(
            f"unknown PCM encoding {encoding!r}: use 'pcm_s16le', 'pcm_f32le', 'g711_ulaw' or "
            "'g711_alaw'"
        )
    size = memoryview(data).nbytes
    if size % width:
        raise AudioDecodeError(
            f"{encoding} audio must be a whole number of {width}-byte samples; got {size} bytes "
            f"({size % width} byte(s) left over)"
        )
    samples = np.frombuffer(data, dtype=dtype)
    if encoding == "pcm_s16le":
        return samples.astype(np.float32) / np.float32(32768.0)
    audio = samples.astype(np.float32)  # native byte order, writable copy
    _check_finite(audio)
    return audio


def _ulaw_table() -> np.ndarray:
    """f32 [256]: the value of each G.711 µ-law code, as a 16-bit sample / 32768.

    A code is stored inverted; once flipped, bit 7 is the sign (1 = negative), bits 6-4 the
    segment s and bits 3-0 the mantissa m, and the magnitude is ((2m + 33) << s) - 33 in 14-bit
    units (x4 for 16 bits: (((m << 3) + 0x84) << s) - 0x84). Range -32124..32124; 0xFF is 0.
    """
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    magnitude = ((((code & 0x0F) << 3) + 0x84) << ((code & 0x70) >> 4)) - 0x84
    value = np.where(code & 0x80, -magnitude, magnitude)
    return (value / 32768.0).astype(np.float32)


def _alaw_table() -> np.ndarray:
    """f32 [256]: the value of each G.711 A-law code, as a 16-bit sample / 32768.

    A code is stored with its even bits inverted (XOR 0x55); then bit 7 is the sign (1 =
    positive), bits 6-4 the segment s and bits 3-0 the mantissa m. The magnitude in 13-bit units
    is 2m + 1 for s = 0 and (2m + 33) << (s - 1) above, x8 for 16 bits. Range -32256..32256.
    """
    code = np.arange(256, dtype=np.int32) ^ 0x55
    mantissa = (code & 0x0F) << 4
    segment = (code & 0x70) >> 4
    magnitude = np.where(
        segment == 0, mantissa + 8, (mantissa + 0x108) << np.maximum(segment - 1, 0)
    )
    value = np.where(code & 0x80, magnitude, -magnitude)
    return (value / 32768.0).astype(np.float32)


_G711_TABLES: dict[str, np.ndarray] = {"g711_ulaw": _ulaw_table(), "g711_alaw": _alaw_table()}


def _read(
    name: str, handle: str | BinaryIO, offset: int, max_duration_s: float | None
) -> tuple[np.ndarray, int, int, str]:
    """Decode with libsndfile, or with FFmpeg when libsndfile does not recognise the format.

    Returns (f32 [frames] mono, rate Hz, channels, format name).
    """
    try:
        with sf.SoundFile(handle) as f:
            rate, channels, announced, fmt = f.samplerate, f.channels, f.frames, f.format
            if max_duration_s is not None and rate > 0 and announced / rate > max_duration_s:
                raise AudioTooLongError(
                    f"the audio is {announced / rate:.1f} s long; the limit is {max_duration_s:g} s"
                )
            try:
                data = f.read(dtype="float32", always_2d=True)  # [frames, channels]
            except sf.SoundFileError as e:
                raise AudioDecodeError(
                    f"could not decode the audio: the {fmt} stream is truncated or corrupt "
                    f"({_detail(e)})"
                ) from e
            truncation = _truncation(f.extra_info, announced, data.shape[0])
    except sf.SoundFileError as e:
        if getattr(e, "code", None) != 1:  # recognised by libsndfile, but broken
            raise _open_error(e) from e
        kind = _sniff(_head(handle, offset))  # also puts a file handle back at `offset`
        track = decode_container(handle, kind, max_duration_s=max_duration_s)
        return track.samples, track.rate, track.channels, track.format
    if data.shape[0] == 0:
        if truncation:
            raise AudioDecodeError(
                f"could not decode the audio: the {fmt} file is truncated: its header "
                f"announces audio but it holds no samples ({truncation})"
            )
        raise AudioDecodeError(
            f"could not decode the audio: the {fmt} file contains no samples (0 s of audio)"
        )
    if truncation:
        logger.warning(
            "audio %s looks truncated (%s); decoded the %d frames present",
            name,
            truncation,
            data.shape[0],
        )
    mono = data[:, 0] if channels == 1 else data.mean(axis=1, dtype=np.float32)  # [frames]
    return mono, rate, channels, fmt


# --- helpers -------------------------------------------------------------------------------


def _open_source(source: AudioSource) -> tuple[str, str | BinaryIO, int]:
    """Return (name for messages, what `sf.SoundFile` opens, offset where the audio starts).

    Empty input is rejected here.
    """
    if isinstance(source, bytes | bytearray | memoryview):
        payload = bytes(source)
        if not payload:
            raise AudioDecodeError("the audio is empty (0 bytes)")
        return "<bytes>", io.BytesIO(payload), 0
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_file():
            raise AudioDecodeError(f"could not read the audio file {path}: no such file")
        if path.stat().st_size == 0:
            raise AudioDecodeError(f"the audio file {path} is empty (0 bytes)")
        return str(path), str(path), 0
    if hasattr(source, "read"):
        name = str(getattr(source, "name", "<file>"))
        seekable = getattr(source, "seekable", None)
        if seekable is not None and seekable():
            pos = source.tell()
            end = source.seek(0, io.SEEK_END)
            source.seek(pos)
            if end - pos <= 0:
                raise AudioDecodeError("the audio is empty (0 bytes)")
            return name, source, pos
        payload = source.read()
        if not payload:
            raise AudioDecodeError("the audio is empty (0 bytes)")
        return name, io.BytesIO(payload), 0
    raise TypeError(f"decode_audio takes bytes, a path or a binary file, not {type(source)}")


def _detail(error: sf.SoundFileError) -> str:
    text = getattr(error, "error_string", "") or str(error)
    return text.strip().rstrip(".") or "no detail"


def _open_error(error: sf.SoundFileError) -> AudioDecodeError:
    """Turn a libsndfile failure to open the input into a message a person understands."""
    code = getattr(error, "code", None)
    if code == 7:  # "not a regular file": what mpg123 says about a few stray MP3 bytes
        return AudioDecodeError("could not decode the audio: the file is truncated or corrupt")
    return AudioDecodeError(
        f"could not decode the audio: the file is truncated or corrupt ({_detail(error)})"
    )


def _head(handle: str | BinaryIO, offset: int, size: int = 16) -> bytes:
    """The first `size` bytes of the input (libsndfile may have moved the file position)."""
    try:
        if isinstance(handle, str):
            with open(handle, "rb") as f:
                return f.read(size)
        handle.seek(offset)
        head = handle.read(size)
        handle.seek(offset)
        return head
    except (OSError, ValueError):
        return b""


def _sniff(head: bytes) -> str | None:
    """Name a common container that libsndfile does not read, from its first bytes."""
    if head[4:8] == b"ftyp":
        return "MP4/M4A (AAC) audio"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "WebM/Matroska audio"
    if head[:2] in (b"\xff\xf1", b"\xff\xf9"):
        return "raw AAC (ADTS) audio"
    if head.startswith(b"#!AMR"):
        return "AMR audio"
    if head.startswith(b"\x30\x26\xb2\x75"):
        return "WMA/ASF audio"
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return "this WAV encoding"
    return None


def _truncation(log: str, announced: int, decoded: int) -> str:
    """Describe a header/data length mismatch from libsndfile's log, or return ""."""
    notes = [line.strip() for line in log.splitlines() if "(should be" in line]
    if decoded < announced:
        notes.append(f"{decoded} of {announced} announced frames decoded")
    return "; ".join(notes)


def _check_finite(audio: np.ndarray) -> None:
    finite = np.isfinite(audio)
    if not finite.all():
        bad = int(audio.size - np.count_nonzero(finite))
        raise AudioDecodeError(
            f"could not decode the audio: {bad} of {audio.size} samples are NaN or infinite"
        )
