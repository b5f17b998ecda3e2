"""The one window decode (`Transcriber.decode_window`) with the real tiny.en: a rejected attempt
is decoded again at the next temperature, and the stream is told which attempt it may show."""

from __future__ import annotations

import pytest

from app.engine.mel import HOP_LENGTH
from app.runtime.contract import N_SAMPLES_PER_WINDOW, SAMPLE_RATE
from app.service.options import TranscriptionOptions
from app.service.transcriber import Transcriber
from app.service.window_decode import file_plan
from tests.engine.conftest import JFK, clip


@pytest.fixture(scope="module")
def jfk_cross(tiny_tr: Transcriber) -> list:
    audio = clip(JFK)  # 11 s: one window, as the file path cuts it
    mel = tiny_tr.log_mel(audio, padding=N_SAMPLES_PER_WINDOW)
    return tiny_tr.encode(mel[:, : audio.shape[0] // HOP_LENGTH])


def decode(tr: Transcriber, cross: list, **options) -> tuple:
    plan = file_plan(TranscriptionOptions(beam_size=1, **options), "en", (), None)
    streams: list[bool] = []
    decoded = tr.decode_window(cross, plan, clip(JFK).shape[0] / SAMPLE_RATE,
                               on_attempt=streams.append)  # fmt: skip
    return decoded, streams


def test_a_likely_first_attempt_stands(tiny_tr: Transcriber, jfk_cross: list) -> None:
    decoded, streams = decode(tiny_tr, jfk_cross, temperature=(0.0, 0.5))
    assert [r.temperature for r in decoded.attempts] == [0.0]
    assert decoded.result is decoded.attempts[0] and decoded.verdict == "speech"
    assert streams == [True]
    assert "ask not what your country" in decoded.result.text


def test_a_rejected_attempt_is_decoded_again_at_the_next_temperature(
    tiny_tr: Transcriber, jfk_cross: list
) -> None:
    # no text is likely enough for a log-prob threshold of 0: every attempt is rejected
    decoded, streams = decode(tiny_tr, jfk_cross, temperature=(0.0, 0.5), log_prob_threshold=0.0)
    assert [r.temperature for r in decoded.attempts] == [0.0, 0.5]
    assert streams == [True, False]  # the retry's text is held until the window is accepted
    best = max(decoded.attempts, key=lambda r: r.avg_logprob)  # neither is repetitive
    assert decoded.result is best and decoded.verdict == "speech"
