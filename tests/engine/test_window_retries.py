"""The one window decode (`Transcriber.decode_window`) with the real tiny.en: a rejected attempt
is decoded again at the next temperature, and the stream is told which attempt it may show."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.decoding import DecodingTask, PrefixMemo
from app.engine.decoding_types import DecodingOptions
from app.engine.mel import HOP_LENGTH, log_mel_spectrogram
from app.runtime.contract import N_FRAMES, N_SAMPLES_PER_WINDOW, SAMPLE_RATE
from app.service.transcription.options import TranscriptionOptions
from app.service.transcription.transcriber import Transcriber
from app.service.transcription.window_decode import file_plan
from app.service.transcription.windows import encode_window
from tests.engine.conftest import JFK, clip


@pytest.fixture(scope="module")
def jfk_cross(tiny_tr: Transcriber) -> list:
    audio = clip(JFK)  # 11 s: one window, as the file path cuts it
    mel = tiny_tr.log_mel(audio, padding=N_SAMPLES_PER_WINDOW)
    return tiny_tr.sessions.run_steps(encode_window(mel[:, : audio.shape[0] // HOP_LENGTH]))


@pytest.fixture(scope="module")
def jfk_exact_cross(tiny_exact) -> list:
    audio = clip(JFK)
    mel = log_mel_spectrogram(audio, 80, padding=N_SAMPLES_PER_WINDOW)
    return tiny_exact.encode(mel[None, :, :N_FRAMES])


def decode(tr: Transcriber, cross: list, **options) -> tuple:
    plan = file_plan(TranscriptionOptions(beam_size=1, **options), "en", (), None)
    streams: list[bool] = []
    window = tr.decode_window(cross, plan, clip(JFK).shape[0] / SAMPLE_RATE,
                              on_attempt=streams.append)  # fmt: skip
    decoded = tr.sessions.run_steps(window)
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


def test_fallback_attempts_after_the_first_run_as_one_decode(
    tiny_tr: Transcriber, jfk_cross: list
) -> None:
    """Every attempt rejected (log-prob threshold 0): T = 0 alone, then 0.2 ... 1.0 as the rows
    of one decode; all six results are there, in order, and the best stands."""
    temperatures = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    decoded, streams = decode(tiny_tr, jfk_cross, temperature=temperatures, log_prob_threshold=0.0)
    assert [r.temperature for r in decoded.attempts] == list(temperatures)
    assert streams == [True, False]  # two decodes; only the first may stream
    steps = [r.stats.steps if r.stats else None for r in decoded.attempts]
    assert None not in steps[:2] and steps[2:] == [None] * 4  # counted once
    best = max(decoded.attempts, key=lambda r: r.avg_logprob)
    assert decoded.result is best


def test_attempts_decoded_together_give_what_each_gives_alone(
    tiny_exact, tiny_tok, jfk_exact_cross: list
) -> None:
    """Sampling at four temperatures as one 20-row decode equals four decodes of 5 rows, each
    with the same generator: the same tokens, log-probs and text per attempt."""
    temperatures = (0.4, 0.6, 0.8, 1.0)

    def tasks(memo: PrefixMemo) -> list[DecodingTask]:
        return [
            DecodingTask(
                tiny_exact, jfk_exact_cross, tiny_tok,
                DecodingOptions(language="en", temperature=t, best_of=5),
                memo=memo, rng=np.random.default_rng(seed),
            )
            for seed, t in enumerate(temperatures)
        ]  # fmt: skip

    alone = [task.run() for task in tasks(PrefixMemo())]
    first, *others = tasks(PrefixMemo())
    together = tiny_exact.run_steps(first.together_steps(others))
    assert [r.temperature for r in together] == list(temperatures)
    for a, b in zip(alone, together, strict=True):
        assert a.tokens == b.tokens and a.text == b.text
        assert a.sum_logprob == pytest.approx(b.sum_logprob, abs=1e-3)
    assert len({r.text for r in together}) > 1  # the temperatures really differ
    assert together[0].stats is not None and together[0].stats.calls > 0
