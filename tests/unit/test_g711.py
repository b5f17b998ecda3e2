"""app.engine.audio: G.711 µ-law / A-law bytes decoded by `pcm_to_float`.

The lookup tables are checked against `audioop` (the C reference shipped with Python up to 3.12)
when it can be imported, and against values worked out by hand from ITU-T G.711 either way; a
tone encoded by the reference encoders below must come back within the quantisation step.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

import numpy as np
import pytest

from app.engine.audio import pcm_to_float
from tests.media import G711_ENCODERS


def _audioop() -> ModuleType | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return importlib.import_module("audioop")
        except ImportError:  # removed in Python 3.13
            return None


AUDIOOP = _audioop()
ALL_CODES = bytes(range(256))


# --- the tables --------------------------------------------------------------------------


@pytest.mark.skipif(AUDIOOP is None, reason="audioop is not importable (Python >= 3.13)")
@pytest.mark.parametrize("encoding", ["g711_ulaw", "g711_alaw"])
def test_all_codes_match_audioop(encoding: str) -> None:
    assert AUDIOOP is not None
    expand = AUDIOOP.ulaw2lin if encoding == "g711_ulaw" else AUDIOOP.alaw2lin
    expected = np.frombuffer(expand(ALL_CODES, 2), dtype="<i2").astype(np.float32) / 32768
    np.testing.assert_array_equal(pcm_to_float(ALL_CODES, encoding), expected)


@pytest.mark.parametrize(
    ("encoding", "code", "value"),
    [
        ("g711_ulaw", 0xFF, 0),
        ("g711_ulaw", 0x7F, 0),  # "negative zero"
        ("g711_ulaw", 0x00, -32124),
        ("g711_ulaw", 0x80, 32124),
        ("g711_ulaw", 0xFE, 8),
        ("g711_ulaw", 0xEF, 132),  # segment 1, mantissa 0: (0x84 << 1) - 0x84
        ("g711_alaw", 0xD5, 8),
        ("g711_alaw", 0x55, -8),
        ("g711_alaw", 0xD4, 24),
        ("g711_alaw", 0xAA, 32256),
        ("g711_alaw", 0x2A, -32256),
        ("g711_alaw", 0xC5, 264),  # segment 1, mantissa 0: 0x108
    ],
)
def test_known_codes(encoding: str, code: int, value: int) -> None:
    decoded = pcm_to_float(bytes([code]), encoding)
    assert decoded.dtype == np.float32
    assert decoded.tolist() == [value / 32768]


@pytest.mark.parametrize("encoding", ["g711_ulaw", "g711_alaw"])
def test_tables_are_odd_monotonic_and_in_range(encoding: str) -> None:
    values = pcm_to_float(ALL_CODES, encoding)
    assert values.min() >= -1 and values.max() < 1
    assert len(set(values.tolist())) == (255 if encoding == "g711_ulaw" else 256)  # µ-law: ±0
    assert sorted(values.tolist()) == sorted((-values).tolist())  # symmetric about 0


@pytest.mark.parametrize("encoding", ["g711_ulaw", "g711_alaw"])
def test_reference_encoder_round_trips_every_code(encoding: str) -> None:
    """Each code's value encodes back to the same code (µ-law's two zeros to one of them)."""
    values = np.round(pcm_to_float(ALL_CODES, encoding) * 32768).astype(int)
    back = bytes(G711_ENCODERS[encoding](int(v)) for v in values)
    if encoding == "g711_ulaw":
        back = back.replace(b"\xff", b"\x7f")
        expected = ALL_CODES.replace(b"\xff", b"\x7f")
    else:
        expected = ALL_CODES
    assert back == expected


@pytest.mark.parametrize("encoding", ["g711_ulaw", "g711_alaw"])
def test_tone_decodes_within_quantisation_error(encoding: str) -> None:
    rate = 8000
    t = np.arange(rate) / rate
    tone = np.round(20000 * np.sin(2 * np.pi * 440 * t) * np.linspace(0.01, 1, rate))
    codes = bytes(G711_ENCODERS[encoding](int(s)) for s in tone.astype(int))
    decoded = pcm_to_float(codes, encoding).astype(np.float64) * 32768
    assert decoded.shape == tone.shape
    # half a step: the steps double each segment, 1/16 of the segment's span (about |x| / 16)
    error = np.abs(decoded - tone)
    assert np.all(error <= np.abs(tone) / 32 + 16)
    snr = 10 * np.log10(np.sum(tone**2) / np.sum(error**2))
    assert snr > 30


def test_odd_byte_counts_are_whole_samples() -> None:
    assert pcm_to_float(b"\xff\xff\xff", "g711_ulaw").shape == (3,)
    assert pcm_to_float(b"", "g711_alaw").shape == (0,)
    assert pcm_to_float(memoryview(b"\xd5"), "g711_alaw").tolist() == [8 / 32768]


def test_other_encodings_unchanged() -> None:
    pcm = np.array([0, 1, -1, 32767, -32768], dtype="<i2").tobytes()
    np.testing.assert_array_equal(
        pcm_to_float(pcm, "pcm_s16le"), np.array([0, 1, -1, 32767, -32768]) / np.float32(32768)
    )
    with pytest.raises(ValueError, match="g711_alaw"):
        pcm_to_float(b"\x00", "mp3")  # type: ignore[arg-type]
