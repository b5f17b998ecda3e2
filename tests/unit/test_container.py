"""app.engine.container through decode_audio: MP4/M4A, WebM, MPEG, Matroska and video files'
audio tracks decoded with PyAV; bounded decoding; clear errors for broken containers."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine import container
from app.engine.audio import AudioDecodeError, AudioTooLongError, decode_audio
from tests.conftest import AUDIO
from tests.media import CONTAINERS, encode_container, peak_hz, tone


def rms(audio: np.ndarray) -> float:
    """RMS of the middle half (codecs ring at a tone's abrupt start and end)."""
    n = audio.shape[0]
    return float(np.sqrt(np.mean(np.square(audio[n // 4 : 3 * n // 4]))))


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    return decode_audio(AUDIO / "jfk.wav")


@pytest.mark.parametrize("kind", sorted(CONTAINERS))
@pytest.mark.parametrize("video", [False, True])
def test_containers_decode_to_the_same_audio(kind: str, video: bool) -> None:
    source = tone(2.0, 44100, freq=1000.0)
    audio = decode_audio(encode_container(source, 44100, kind, video=video))
    assert abs(audio.shape[0] - 32000) < 2400  # codec delay and padding, at most 0.15 s
    assert abs(peak_hz(audio) - 1000) < 2
    assert 0.32 < rms(audio) < 0.39  # a 0.5-peak sine: 0.354


def test_speech_survives_an_m4a_round_trip(jfk: np.ndarray) -> None:
    audio = decode_audio(encode_container(jfk, 16000, "m4a"))
    n = min(audio.shape[0], jfk.shape[0])
    # AAC adds a fixed delay: align on the cross-correlation peak, then compare
    lag = int(np.argmax(np.correlate(audio[:16000], jfk[:8000], "valid")))
    aligned = audio[lag : lag + n - lag]
    corr = np.corrcoef(aligned, jfk[: aligned.shape[0]])[0, 1]
    assert corr > 0.98, corr


def test_stereo_is_averaged() -> None:
    left = tone(1.0, 16000, freq=500.0)
    stereo = np.stack([left, np.zeros_like(left)], axis=1)  # right channel silent
    audio = decode_audio(encode_container(stereo, 16000, "mkv", channels=2))
    assert 0.16 < rms(audio) < 0.195  # half the level of the one channel (0.177)


def test_announced_length_over_the_limit_is_refused_before_decoding() -> None:
    data = encode_container(tone(6.0, 16000), 16000, "m4a")
    with pytest.raises(AudioTooLongError, match="the limit is 3 s"):
        decode_audio(data, max_duration_s=3)
    assert decode_audio(data, max_duration_s=7).shape[0] > 6 * 16000 - 2400


def test_decoding_stops_at_the_limit_when_the_container_says_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[int] = []
    real = container._decode_stream

    def counting(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        finally:
            decoded.append(1)

    monkeypatch.setattr(container, "_announced_s", lambda *_: None)
    monkeypatch.setattr(container, "_decode_stream", counting)
    data = encode_container(tone(20.0, 16000), 16000, "webm")
    with pytest.raises(AudioTooLongError, match="decoding stopped there"):
        decode_audio(data, max_duration_s=3)
    assert decoded  # the bound fired inside the decode loop


def test_hard_limit_without_a_caller_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(container, "HARD_LIMIT_S", 1.0)
    with pytest.raises(AudioTooLongError):
        decode_audio(encode_container(tone(3.0, 16000), 16000, "mp4"))


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9])
def test_truncated_m4a_is_a_clear_error(jfk: np.ndarray, keep: float) -> None:
    data = encode_container(jfk, 16000, "m4a")  # moov atom at the end: a cut file has none
    with pytest.raises(AudioDecodeError) as e:
        decode_audio(data[: int(len(data) * keep)])
    message = str(e.value)
    assert "MP4/M4A" in message and "corrupt or truncated" in message, message


def test_m4a_cut_inside_its_header_is_a_clear_error() -> None:
    """Cut where the track is declared but its codec is not yet (found by the truncation fuzz
    test: the decoder had no codec context and the server answered 500)."""
    t = np.arange(400) / 8000
    data = encode_container((0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 8000, "m4a")
    with pytest.raises(AudioDecodeError, match="corrupt or truncated"):
        decode_audio(data[:1351])


def test_truncated_webm_keeps_what_decoded(
    jfk: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    data = encode_container(jfk, 16000, "webm")
    audio = decode_audio(data[: len(data) // 2])
    assert 0.3 * jfk.shape[0] < audio.shape[0] < 0.7 * jfk.shape[0]


def test_corrupted_bytes_inside_an_mp4(jfk: np.ndarray) -> None:
    data = bytearray(encode_container(jfk, 16000, "mp4"))
    rng = np.random.default_rng(1)
    for i in rng.integers(200, len(data) - 200, 400):
        data[i] = int(rng.integers(0, 256))
    try:
        audio = decode_audio(bytes(data), max_duration_s=30)
    except AudioDecodeError as e:
        assert "could not decode the audio" in str(e)
    else:
        assert np.isfinite(audio).all() and audio.shape[0] <= 30 * 16000


def test_video_without_audio_says_so() -> None:
    import io

    import av

    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as c:
        v = c.add_stream("mpeg4", rate=10)
        v.width, v.height, v.pix_fmt = 64, 48, "yuv420p"
        for i in range(5):
            frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")
            frame.pts = i
            c.mux(v.encode(frame))
        c.mux(v.encode(None))
    with pytest.raises(AudioDecodeError, match="has no audio track"):
        decode_audio(out.getvalue())
