"""Test media: the containers phones and browsers record in (made with PyAV, FFmpeg), and
seeded synthetic signals (noise, hum, clicks, music) for the non-speech and noisy conditions.

Shared by the unit tests, the fuzz tests, the live API tests and the robustness corpus
(`benchmarks/robustness_corpus.py`). Signals are f64 [N] at RATE (16 kHz).
"""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np

from app.engine.audio import resample

RATE = 16000

# name -> (container format, audio codec, file suffix)
CONTAINERS: dict[str, tuple[str, str, str]] = {
    "m4a": ("ipod", "aac", ".m4a"),
    "mp4": ("mp4", "aac", ".mp4"),
    "webm": ("webm", "libopus", ".webm"),
    "mpeg": ("mpeg", "mp2", ".mpeg"),
    "mkv": ("matroska", "aac", ".mkv"),
}
# rates a codec accepts (others are resampled to 48 kHz)
CODEC_RATES: dict[str, tuple[int, ...]] = {
    "libopus": (48000,),
    "mp2": (16000, 22050, 24000, 32000, 44100, 48000),
}


def encode_container(
    audio: np.ndarray, rate: int, kind: str, *, channels: int = 1, video: bool = False
) -> bytes:
    """f32 [N] (or [N, C]) at `rate` Hz -> the bytes of a `kind` file (see CONTAINERS).

    With `video`, a small black video track goes first, as in a phone's screen recording, so the
    audio is the second stream.
    """
    fmt, codec, _ = CONTAINERS[kind]
    samples = np.asarray(audio, np.float32).reshape(audio.shape[0], -1)
    if samples.shape[1] != channels:
        samples = np.repeat(samples[:, :1], channels, axis=1)
    out = io.BytesIO()
    # bitexact: no creation time or random ids in the header, so a rebuild gives the same bytes
    with av.open(out, mode="w", format=fmt, options={"fflags": "+bitexact"}) as container:
        if video:
            vstream = container.add_stream("mpeg4" if kind != "webm" else "libvpx", rate=10)
            vstream.width, vstream.height, vstream.pix_fmt = 64, 48, "yuv420p"
        out_rate = rate if rate in CODEC_RATES.get(codec, (rate,)) else 48000
        stream = container.add_stream(codec, rate=out_rate)
        stream.layout = "mono" if channels == 1 else "stereo"
        if video:
            seconds = samples.shape[0] / rate
            for i in range(int(seconds * 10)):
                frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")
                frame.pts = i
                container.mux(vstream.encode(frame))
            container.mux(vstream.encode(None))
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples.reshape(1, -1)),  # packed (interleaved) [1, N*C]
            format="flt",
            layout="mono" if channels == 1 else "stereo",
        )
        frame.sample_rate = rate
        frame.time_base = Fraction(1, rate)
        frame.pts = 0
        resampler = av.AudioResampler(
            format=stream.format.name, layout=stream.layout, rate=out_rate
        )
        for piece in resampler.resample(frame) + resampler.resample(None):
            for packet in stream.encode(piece):
                container.mux(packet)
        container.mux(stream.encode(None))
    return out.getvalue()


# ---- signals ----------------------------------------------------------------------------------


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def db(gain_db: float) -> float:
    return float(10 ** (gain_db / 20))


def white(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n)


def coloured(rng: np.random.Generator, n: int, exponent: float) -> np.ndarray:
    """Noise whose power falls as 1/f**exponent (1 = pink, 2 = brown), unit RMS."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.arange(spectrum.shape[0], dtype=np.float64)
    freqs[0] = 1.0
    spectrum /= freqs ** (exponent / 2)
    spectrum[0] = 0.0
    x = np.fft.irfft(spectrum, n)
    return x / (rms(x) or 1.0)


def at_snr(speech: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    scale = rms(speech) / (rms(noise) * db(snr_db))
    return speech + scale * noise


def tone(seconds: float, rate: int, freq: float = 440.0, amp: float = 0.5) -> np.ndarray:
    """A sine of `freq` Hz, f32 [seconds * rate]."""
    t = np.arange(int(seconds * rate)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(audio: np.ndarray, rate: int = RATE) -> float:
    """The frequency (Hz) of the strongest bin of f32 [N] audio's spectrum."""
    spectrum = np.abs(np.fft.rfft(audio))
    return float(np.fft.rfftfreq(audio.size, 1 / rate)[spectrum.argmax()])


def telephone(speech: np.ndarray) -> np.ndarray:
    """300-3400 Hz band at 8 kHz, back to 16 kHz (what a phone line leaves)."""
    narrow = resample(speech.astype(np.float32), RATE, 8000)
    spectrum = np.fft.rfft(narrow)
    freqs = np.fft.rfftfreq(narrow.shape[0], 1 / 8000)
    spectrum[(freqs < 300) | (freqs > 3400)] = 0
    return resample(np.fft.irfft(spectrum, narrow.shape[0]).astype(np.float32), 8000, RATE)


def hum(n: int) -> np.ndarray:
    t = np.arange(n) / RATE
    return sum(a * np.sin(2 * np.pi * f * t) for f, a in ((50, 0.3), (100, 0.1), (150, 0.08)))


def clicks(rng: np.random.Generator, n: int, per_s: float = 3.0) -> np.ndarray:
    x = np.zeros(n)
    for at in rng.integers(0, n - 200, int(per_s * n / RATE)):
        x[at : at + 200] += rng.uniform(-0.8, 0.8) * np.exp(-np.arange(200) / 20.0)
    return x


def clatter(rng: np.random.Generator, n: int) -> np.ndarray:
    """Kitchen-like: low pink background, dish and cutlery transients, a running tap."""
    x = 0.01 * coloured(rng, n, 1.0) + clicks(rng, n, per_s=2.0) * 0.5
    for at in rng.integers(0, n - 4000, int(n / RATE / 2)):  # short bursts of bright noise
        burst = rng.standard_normal(4000) * np.exp(-np.arange(4000) / 600.0) * 0.2
        x[at : at + 4000] += burst
    tap_start = n // 3
    x[tap_start : tap_start + 4 * RATE] += 0.03 * white(rng, 4 * RATE)
    return x


def chords(n: int) -> np.ndarray:
    """Triads with harmonics, one per second, each with an attack/decay envelope."""
    t = np.arange(RATE) / RATE
    envelope = np.minimum(t / 0.02, 1.0) * np.exp(-t * 1.5)
    progression = [(261.6, 329.6, 392.0), (220.0, 261.6, 329.6), (174.6, 220.0, 261.6),
                   (196.0, 246.9, 293.7)]  # fmt: skip
    out = np.zeros(n)
    for i in range(n // RATE):
        triad = progression[i % len(progression)]
        tone = sum(np.sin(2 * np.pi * f * k * t) / k for f in triad for k in (1, 2, 3))
        out[i * RATE : (i + 1) * RATE] = 0.1 * tone * envelope
    return out


def drums(rng: np.random.Generator, n: int, bpm: float = 120.0) -> np.ndarray:
    """Kick on every beat, snare on 2 and 4, closed hi-hat on every eighth."""
    beat = int(RATE * 60 / bpm)
    t = np.arange(beat) / RATE
    kick = np.sin(2 * np.pi * (50 + 100 * np.exp(-t * 30)) * t) * np.exp(-t * 8)
    snare = rng.standard_normal(beat) * np.exp(-t * 20) * 0.5
    hat = rng.standard_normal(beat // 2) * np.exp(-np.arange(beat // 2) / RATE * 60) * 0.15
    out = np.zeros(n + beat)
    for i in range(n // beat + 1):
        at = i * beat
        out[at : at + beat] += 0.6 * kick + (snare if i % 2 else 0)
        out[at : at + beat // 2] += hat
        out[at + beat // 2 : at + beat] += hat
    return out[:n]


# --- reference encoders (ITU-T G.711, as in the classic Sun g711.c) ------------------------


def _segment(value: int, ends: tuple[int, ...]) -> int:
    return next((i for i, end in enumerate(ends) if value <= end), len(ends))


def ulaw_encode(sample: int) -> int:
    """One 16-bit sample -> its µ-law code."""
    value = sample >> 2  # 14 bits
    mask = 0x7F if value < 0 else 0xFF
    value = min(abs(value), 8159) + 0x21  # clip, add the bias
    seg = _segment(value, (0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF))
    if seg >= 8:
        return 0x7F ^ mask
    return ((seg << 4) | ((value >> (seg + 1)) & 0x0F)) ^ mask


def alaw_encode(sample: int) -> int:
    """One 16-bit sample -> its A-law code."""
    value = sample >> 3  # 13 bits
    if value >= 0:
        mask = 0xD5
    else:
        mask, value = 0x55, -value - 1
    seg = _segment(value, (0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF))
    if seg >= 8:
        return 0x7F ^ mask
    shift = 1 if seg < 2 else seg
    return ((seg << 4) | ((value >> shift) & 0x0F)) ^ mask


G711_ENCODERS = {"g711_ulaw": ulaw_encode, "g711_alaw": alaw_encode}


def g711_encode(audio: np.ndarray, encoding: str) -> bytes:
    """f32/f64 [N] in [-1, 1] -> G.711 bytes (`encoding` "g711_ulaw" or "g711_alaw")."""
    samples = np.clip(np.round(np.asarray(audio) * 32767.0), -32768, 32767).astype(int)
    encode = G711_ENCODERS[encoding]
    return bytes(encode(int(x)) for x in samples)
