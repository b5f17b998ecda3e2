"""When a window is decoded again at the next temperature
(`app.service.transcription.fallback.FallbackRule`): decoding results in, decisions out; no
model."""

from __future__ import annotations

import pytest

from app.engine.decoding_types import DecodingResult
from app.service.transcription.fallback import FallbackRule

RULE = FallbackRule(compression_ratio_threshold=2.4, log_prob_threshold=-1.0,
                    no_speech_threshold=0.6)  # fmt: skip


def result(logprob: float = -0.3, compression: float = 1.5, no_speech: float = 0.1,
           *, looped: bool = False, temperature: float = 0.0) -> DecodingResult:  # fmt: skip
    return DecodingResult(
        tokens=(1, 2), text=" a", avg_logprob=logprob, sum_logprob=3 * logprob,
        no_speech_prob=no_speech, temperature=temperature, compression_ratio=compression,
        language="en", looped=looped,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("attempt", "retry"),
    [
        (result(), False),  # likely, not repetitive: taken
        (result(logprob=-1.2), True),  # too unlikely
        (result(compression=2.6), True),  # too repetitive
        (result(looped=True), True),  # the repetition guard ended it
        (result(logprob=-1.2, no_speech=0.9), False),  # silence: the caller skips the window
        (result(compression=2.6, no_speech=0.9), True),  # probably silent but likely: a loop
    ],
)
def test_retry(attempt: DecodingResult, retry: bool) -> None:
    assert RULE.retry(attempt) is retry


def test_thresholds_set_to_none_turn_their_test_off() -> None:
    off = FallbackRule(None, None, None)
    assert not off.retry(result(logprob=-3.0, compression=9.0))
    assert off.retry(result(looped=True))  # the guard's verdict stands
    assert not off.maybe_silent(0.99)


def test_best_of_failed_attempts_is_the_likeliest_not_repetitive_one() -> None:
    loop = result(logprob=-0.1, looped=True)
    repetitive = result(logprob=-0.2, compression=3.0)
    unlikely = [result(logprob=-1.5, temperature=0.2), result(logprob=-1.3, temperature=0.4)]
    assert RULE.best([loop, repetitive, *unlikely]).temperature == 0.4
    assert RULE.best([loop, repetitive]) is repetitive  # never the loop
    assert RULE.best([loop]) is loop  # nothing else
