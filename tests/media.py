"""Test media made with PyAV (FFmpeg): the containers phones and browsers record in.

Shared by the unit tests, the fuzz tests, the live API tests and the robustness corpus
(`benchmarks/robustness_corpus.py`).
"""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np

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
    with av.open(out, mode="w", format=fmt) as container:
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
